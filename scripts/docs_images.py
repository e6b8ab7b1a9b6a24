#!/usr/bin/env python3
"""Regenerate every picture in docs/img from real runs made here and now.

    python scripts/docs_images.py                      # all of them, into docs/img
    python scripts/docs_images.py --only tensorboard_compare --out /tmp/img
    python scripts/docs_images.py --list               # each picture and how it is made

What it runs, in a work folder of its own (`--work`, default a temporary one, removed at the
end unless `--keep`):

- **training runs** (`outputs/`): 16 runs, the synchronisers ddp, ring, tree and allreduce
  at worlds 2 and 3, each with 20 and 40 steps per epoch (`train.max_steps_per_epoch`),
  2 epochs, a per-step TensorBoard point every 2 steps; and a 17th run, ring at world 2 and
  30 steps per epoch, stopped after 1 epoch and resumed to 2 (`train.resume=true
  train.epochs=2`): TensorBoard over one folder of 17 runs, one of them resumed;
- **bench runs** (`python -m ddp_lab.bench`): the three of docs/bench.md, and two small ones
  at worlds 2 and 3 in `outputs/` for the report's alpha-beta fits;
- **the report** (`python -m ddp_lab.report outputs`): its three PNGs;
- **a profiled run** (`timing.profile=true`, ring, world 2): its rank 0 trace, drawn;
- **the network claims** (`python -m ddp_lab.bench.suite network`): only with `--network`,
  since it needs the network lab (root, network namespaces, SLURM) and about 9 minutes idle;
  without it those three pictures are left as they are and the script says so;
- **TensorBoard screenshots**: `tensorboard --logdir outputs --port <free>` and headless
  Chromium (Debian's `chromium` package: `apt-get install -y chromium`), stopped at the end.

Every picture has a recipe in `IMAGES`; tests/test_docs_images.py checks that every file in
docs/img has one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
IMG = REPO / "docs" / "img"
PY = sys.executable

SYNCS = ("ddp", "ring", "tree", "allreduce")
WORLDS = (2, 3)
CAPS = (20, 40)
EPOCHS = 2
WAIT_S = 180  # a screenshot waits at most this long for TensorBoard to draw every chart
MIN_WAIT_S = 20
# the loading spinners turning in TensorBoard's page, through every shadow root
SPINNERS = """(function count(root) { let n = 0;
  for (const el of root.querySelectorAll('*')) {
    if (/SPINNER/.test(el.tagName) && (el.active || el.hasAttribute('active'))
        && el.getClientRects().length > 0) n++;
    if (el.shadowRoot) n += count(el.shadowRoot); }
  return n; })(document)"""


@dataclass(frozen=True)
class Image:
    name: str  # docs/img/<name>.png
    needs: str  # the step that makes what it is drawn from (`Work` method)
    what: str  # how it is made, said by --list


IMAGES = (
    Image("tensorboard_compare", "tensorboard",
          "Custom Scalars over the 17 training runs: the workload's runs compared, x = epoch"),
    Image("tensorboard_compare_steps", "tensorboard",
          "Custom Scalars: compute and comm per step against the step within its epoch"),
    Image("tensorboard_hparams", "tensorboard", "HParams' table view over the 17 training runs"),
    Image("tensorboard_compute_comm_one_run", "tensorboard",
          "one run's compute-vs-comm band chart (its folded category shown unfolded)"),
    Image("report_epoch_time_vs_world", "report", "python -m ddp_lab.report outputs: epoch_time_vs_world.png"),
    Image("report_phases", "report", "python -m ddp_lab.report outputs: phases.png"),
    Image("report_bench_all_reduce", "report", "python -m ddp_lab.report outputs: bench_all_reduce.png"),
    Image("bench_all_reduce_idle_2ranks", "bench",
          "python -m ddp_lab.bench bench.impl=[torch,ring,butterfly]: plots/all_reduce.png"),
    Image("bench_all_reduce_impls_4ranks", "bench",
          "python -m ddp_lab.bench bench.impl=[torch,ring,butterfly] launcher.nproc_per_node=4 "
          "bench.max_elements=16777216 bench.points=8: plots/all_reduce.png"),
    Image("bench_handin_4ranks_simulated", "bench",
          "python -m ddp_lab.bench bench=handin launcher.nproc_per_node=4 bench.node_size=2 "
          "bench.max_elements=16777216 bench.points=8: plots/all_reduce.png"),
    Image("profile_ring_rank0", "profile",
          "a 2-rank sync=ring run with timing.profile=true: two profiled steps of "
          "profile/rank0.pt.trace.json, drawn"),
    Image("network_epoch_vs_link", "network", "python -m ddp_lab.bench.suite network (--network)"),
    Image("network_exposed_inflight", "network", "python -m ddp_lab.bench.suite network (--network)"),
    Image("network_compression", "network", "python -m ddp_lab.bench.suite network (--network)"),
)
BY_NAME = {i.name: i for i in IMAGES}

BENCHES = {  # picture -> the bench command's overrides (docs/bench.md)
    "bench_all_reduce_idle_2ranks": ["bench.impl=[torch,ring,butterfly]"],
    "bench_all_reduce_impls_4ranks": ["bench.impl=[torch,ring,butterfly]", "launcher.nproc_per_node=4",
                                      "bench.max_elements=16777216", "bench.points=8"],
    "bench_handin_4ranks_simulated": ["bench=handin", "launcher.nproc_per_node=4", "bench.node_size=2",
                                      "bench.max_elements=16777216", "bench.points=8"],
}
REPORT = {"report_epoch_time_vs_world": "epoch_time_vs_world.png", "report_phases": "phases.png",
          "report_bench_all_reduce": "bench_all_reduce.png"}
NETWORK = ("network_epoch_vs_link", "network_exposed_inflight", "network_compression")


def say(text: str) -> None:
    print(f"[docs_images {time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(cmd: list[str], log: Path, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    """`cmd` in the repository, its output to `log` (appended); a failure is said with its tail."""
    say("$ " + " ".join(cmd))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Work:
    """The work folder and what has been made in it (each step once)."""

    def __init__(self, root: Path, out: Path, data: Path, network: bool):
        self.root, self.out, self.data, self.network = root, out, data, network
        self.outputs = root / "outputs"
        self.log = root / "commands.log"
        self.done: dict[str, object] = {}
        self.skipped: dict[str, str] = {}

    def train(self, *overrides: str, root: Optional[Path] = None, sweep: bool = False) -> None:
        run([PY, "-m", "ddp_lab", *(["-m"] if sweep else []), f"run.root={root or self.outputs}",
             f"data.root={self.data}", "train.threads=1", "log.progress=lines", *overrides], self.log)

    # ---------------------------------------------------------------- the steps
    def runs(self) -> None:
        """The 16 training runs and the resumed 17th, in outputs/."""
        if "runs" in self.done:
            return
        resumed = self.outputs / "ring_w2_mlp_resumed"
        if (resumed / "summary.json").is_file() and \
                json.loads((resumed / "summary.json").read_text()).get("epochs") == EPOCHS:
            self.done["runs"] = True  # made by an earlier call (--work)
            return
        self.train(f"sync={','.join(SYNCS)}",
                   f"launcher.nproc_per_node={','.join(map(str, WORLDS))}",
                   f"train.max_steps_per_epoch={','.join(map(str, CAPS))}",
                   f"train.epochs={EPOCHS}", "timing.tb_every=2", sweep=True)
        common = ("sync=ring", "launcher.nproc_per_node=2", "train.max_steps_per_epoch=30",
                  "timing.tb_every=2", f"run.dir={resumed}")
        self.train(*common, "train.epochs=1")
        self.train(*common, "train.epochs=2", "train.resume=true")
        self.done["runs"] = True

    def tensorboard(self) -> None:
        self.runs()

    def report(self) -> None:
        if "report" in self.done:
            return
        self.runs()
        for world in WORLDS if not list(self.outputs.glob("bench_*")) else ():  # the fits
            run([PY, "-m", "ddp_lab.bench", f"run.root={self.outputs}", f"launcher.nproc_per_node={world}",
                 "bench.impl=[torch,ring]", "bench.max_elements=4194304", "bench.points=6"], self.log)
        report = self.root / "report"
        run([PY, "-m", "ddp_lab.report", str(self.outputs), "-o", str(report)], self.log)
        for name, png in REPORT.items():
            self.done[name] = report / png
        self.done["report"] = report

    def bench(self) -> None:
        if "bench" in self.done:
            return
        for name, overrides in BENCHES.items():
            folder = self.root / "bench" / name
            if list(folder.glob("*/plots/all_reduce.png")):  # made by an earlier call (--work)
                self.done[name] = next(folder.glob("*/plots/all_reduce.png"))
                continue
            run([PY, "-m", "ddp_lab.bench", f"run.root={folder}", *overrides], self.log)
            (plot,) = folder.glob("*/plots/all_reduce.png")
            self.done[name] = plot
        self.done["bench"] = True

    def profile(self) -> None:
        if "profile" in self.done:
            return
        folder = self.root / "profile"
        if not list(folder.glob("*/profile/rank0.pt.trace.json")):  # else made earlier (--work)
            self.train("sync=ring", "launcher.nproc_per_node=2", "train.max_steps_per_epoch=20",
                       "train.epochs=1", "timing.profile=true", root=folder)
        (trace,) = folder.glob("*/profile/rank0.pt.trace.json")
        self.done["profile"] = trace

    def network_step(self) -> None:
        if "network" in self.done or "network" in self.skipped:
            return
        why = network_missing() if self.network else (
            "needs the network lab (root, network namespaces, SLURM) and ~9 minutes: "
            "pass --network to run `python -m ddp_lab.bench.suite network`")
        if why:
            self.skipped["network"] = why
            return
        plots = self.root / "network"
        plots.mkdir(parents=True, exist_ok=True)
        run([PY, "-m", "ddp_lab.bench.suite", "network", "--sweep-rounds", "2", "--data-root",
             str(self.data), "--plots", str(plots), "--out", str(self.root / "net_claims.json")],
            self.log, timeout=3600)
        for name in NETWORK:
            self.done[name] = plots / f"{name}.png"
        self.done["network"] = True


def network_missing() -> str:
    """Why the network lab cannot be made here ('' when it can)."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces)"
    for tool in ("ip", "tc", "slurmctld", "slurmd", "sbatch"):
        if shutil.which(tool) is None:
            return f"the network lab needs `{tool}` (scripts/install_system_deps.sh)"
    return ""


# ------------------------------------------------------------------- drawing
def draw_profile(trace: Path, png: Path) -> None:
    """Two profiled steps of rank 0's trace: the profiler's step ranges, ddp_lab's phases and
    collectives, and torch's own events beneath them (docs/timing.md)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])[-2:]
    if not steps:
        raise RuntimeError(f"{trace}: no ProfilerStep# ranges")
    t0, t1 = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    main_tid = steps[0]["tid"]
    inside = [e for e in events if e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    phases = ("ddp_lab:data", "ddp_lab:forward", "ddp_lab:backward", "ddp_lab:sync", "ddp_lab:optim")
    rows = [
        ("ProfilerStep#N (torch)", [e for e in steps], lambda e: "step #" + e["name"].split("#")[1]),
        ("ddp_lab phases", [e for e in inside if e["name"] in phases], lambda e: e["name"][8:]),
        ("ddp_lab collectives", [e for e in inside if e["name"].startswith("ddp_lab:")
                                 and e["name"] not in phases], lambda e: e["name"][8:]),
        ("c10d ops (torch)", [e for e in inside if e["name"].startswith("c10d::")], lambda e: e["name"]),
        ("gloo:send (torch)", [e for e in inside if e["name"] == "gloo:send"], lambda e: e["name"]),
        ("gloo:recv (torch)", [e for e in inside if e["name"] == "gloo:recv"], lambda e: e["name"]),
        ("aten ops (torch)", [e for e in inside if e["name"].startswith("aten::")
                              and e.get("tid") == main_tid], lambda e: ""),
    ]
    colours = {"data": "#8dd3c7", "forward": "#80b1d3", "backward": "#fb8072", "sync": "#fdb462",
               "optim": "#b3de69"}
    fig, ax = plt.subplots(figsize=(14.4, 4.6))
    span = (t1 - t0) / 1e3
    for y, (label, evs, text) in enumerate(rows):
        for e in evs:
            x, w = (max(e["ts"], t0) - t0) / 1e3, min(e["dur"], t1 - e["ts"]) / 1e3
            word = text(e)
            colour = colours.get(word, "#cccccc" if y < 3 else "#bcbddc" if y == 3 else
                                 "#ffed6f" if y in (4, 5) else "#dddddd")
            ax.barh(-y, w, left=x, height=0.75, color=colour, edgecolor="#555555", linewidth=0.5)
            if word and w > span * 0.035:
                ax.text(x + w / 2, -y, word, ha="center", va="center", fontsize=8)
    ax.set_yticks([-y for y in range(len(rows))], [r[0] for r in rows], fontsize=9)
    ax.set_xlim(0, span)
    ax.set_xlabel("ms (profiler clock, from the first profiled step)")
    ax.grid(axis="x", alpha=0.4)
    ax.set_title(f"{trace.parent.parent.name}  {trace.name}: 2 profiled steps, main thread", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


class Browser:
    """TensorBoard over a folder and headless Chromium's screenshots of it."""

    def __init__(self, logdir: Path, log: Path):
        self.chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if self.chromium is None:
            raise RuntimeError("no chromium on PATH: apt-get install -y chromium (Debian)")
        self.port = free_port()
        tb = Path(PY).with_name("tensorboard")
        self.proc = subprocess.Popen([str(tb) if tb.exists() else "tensorboard", "--logdir", str(logdir),
                                      "--port", str(self.port), "--host", "127.0.0.1",
                                      "--reload_interval", "0"],
                                     stdout=open(log, "a"), stderr=subprocess.STDOUT)
        self.log = log
        self._wait()

    def _wait(self) -> None:
        import urllib.request

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tensorboard ended ({self.proc.returncode}): see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/data/runs", timeout=5) as r:
                    if json.loads(r.read()):
                        time.sleep(3)
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError("tensorboard did not serve its runs within 120 s")

    def shot(self, fragment: str, png: Path, size: tuple[int, int]) -> None:
        """A screenshot of TensorBoard's `fragment` (`#custom_scalars`) at `size`, smoothing off
        and no outliers left out of a chart's y range (every run's line whole): through the
        DevTools protocol where websocket-client is installed, else Chromium's --screenshot
        (TensorBoard's defaults: smoothing 0.6, outliers ignored)."""
        profile = tempfile.mkdtemp(prefix="docs_images_chromium_")
        url = f"http://127.0.0.1:{self.port}/{fragment}&_smoothingWeight=0"
        try:
            try:
                import websocket  # noqa: F401  (websocket-client)
            except ImportError:
                say("no websocket-client: Chromium's --screenshot, with TensorBoard's chart defaults")
                run([self.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                     f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                     "--virtual-time-budget=30000", f"--screenshot={png}", url], self.log, timeout=180)
                return
            self._devtools(url, png, size, profile)
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    def _devtools(self, url: str, png: Path, size: tuple[int, int], profile: str) -> None:
        import base64
        import itertools
        import urllib.request

        import websocket

        port = free_port()
        proc = subprocess.Popen([self.chromium, "--headless", "--no-sandbox", "--disable-gpu",
                                 "--hide-scrollbars", f"--user-data-dir={profile}",
                                 f"--window-size={size[0]},{size[1]}", f"--remote-debugging-port={port}",
                                 "--remote-allow-origins=*", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=open(self.log, "a"))
        try:
            deadline, page = time.monotonic() + 60, None
            while page is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=5) as r:
                        page = next(t for t in json.loads(r.read()) if t["type"] == "page")
                except (OSError, StopIteration):
                    if time.monotonic() > deadline:
                        raise RuntimeError("chromium's DevTools did not answer within 60 s")
                    time.sleep(0.5)
            ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=120)
            ids = itertools.count(1)

            def call(method: str, **params) -> dict:
                n = next(ids)
                ws.send(json.dumps({"id": n, "method": method, "params": params}))
                while True:
                    answer = json.loads(ws.recv())
                    if answer.get("id") == n:
                        if "error" in answer:
                            raise RuntimeError(f"{method}: {answer['error']}")
                        return answer.get("result", {})

            call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1],
                 deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=f"http://127.0.0.1:{self.port}/")
            time.sleep(3)
            # TensorBoard keeps this setting in the origin's localStorage, not in the URL
            call("Runtime.evaluate", expression="localStorage.setItem('_ignoreYOutliers', 'false')")
            call("Page.navigate", url=url)
            # the dashboard loads, fetches every run's series and draws: wait until no chart's
            # spinner turns (twice in a row), at least MIN_WAIT_S, at most WAIT_S
            started, quiet = time.monotonic(), 0
            while time.monotonic() - started < WAIT_S:
                time.sleep(3)
                spinning = call("Runtime.evaluate", expression=SPINNERS, returnByValue=True)
                n = spinning.get("result", {}).get("value", -1)
                quiet = quiet + 1 if n == 0 else 0
                if quiet >= 2 and time.monotonic() - started >= MIN_WAIT_S:
                    break
            say(f"{png.name}: drawn after {time.monotonic() - started:.0f} s (spinners left: {n})")
            data = call("Page.captureScreenshot", format="png")["data"]
            png.write_bytes(base64.b64decode(data))
            ws.close()
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def one_run_unfolded(work: Work) -> Path:
    """A copy of one run (sync=ring, world 2, 40 steps) whose band categories are open: headless
    Chromium cannot unfold a category, so the copy's layout says what a click would show."""
    from ddp_lab.folder.tensorboard import ONE_RUN, drop_head, layout_summary
    from ddp_lab.folder.tensorboard import workload
    from tensorboard.plugins.hparams import metadata

    (src,) = [p for p in work.outputs.glob("ring_w2_mlp_*")
              if p.is_dir() and (p / "tb" / "40steps").is_dir()]
    shutil.rmtree(work.root / "one_run", ignore_errors=True)  # an earlier call's (--work)
    dst = work.root / "one_run" / src.name
    shutil.copytree(src / "tb", dst / "tb")
    folder = dst / "tb" / "40steps"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    session = metadata.parse_session_start_info_plugin_data(
        acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
    hparams = {k[1:] if k.startswith("~") else k: (v.string_value or v.number_value or v.bool_value)
               for k, v in session.hparams.items()}
    drop_head(folder)
    from torch.utils.tensorboard import SummaryWriter

    summary = layout_summary(src.name, ("step", "epoch"), workload(hparams))
    from tensorboard.plugins.custom_scalar import layout_pb2

    layout = layout_pb2.Layout.FromString(summary.value[0].tensor.string_val[0])
    titles = {t for _, t, *_ in ONE_RUN}
    kept = [c for c in layout.category if c.title in titles]
    for c in kept:
        c.closed = False
    summary.value[0].tensor.string_val[0] = layout_pb2.Layout(category=kept).SerializeToString()
    writer = SummaryWriter(str(folder))
    writer.file_writer.add_summary(summary, 0)
    writer.close()
    return work.root / "one_run"


def make(work: Work, names: list[str]) -> dict[str, str]:
    """Each picture of `names` into work.out; returns name -> what happened."""
    said: dict[str, str] = {}
    work.out.mkdir(parents=True, exist_ok=True)
    steps = {BY_NAME[n].needs for n in names}
    for step in ("bench", "profile", "report", "tensorboard", "network"):
        if step in steps:
            getattr(work, "network_step" if step == "network" else step)()
    for name in names:
        image, png = BY_NAME[name], work.out / f"{name}.png"
        if image.needs == "network" and "network" in work.skipped:
            said[name] = "skipped: " + work.skipped["network"]
            continue
        if image.needs in ("bench", "report", "network"):
            shutil.copyfile(work.done[name], png)
        elif image.needs == "profile":
            draw_profile(work.done["profile"], png)
        said.setdefault(name, "made")
    shots = [n for n in names if BY_NAME[n].needs == "tensorboard"]
    if set(shots) - {"tensorboard_compute_comm_one_run"}:
        browser = Browser(work.outputs, work.log)
        try:
            if {"tensorboard_compare", "tensorboard_compare_steps"} & set(shots):
                # one page for both: the x = epoch category above, the per-step one below
                whole = work.root / "custom_scalars.png"
                browser.shot("#custom_scalars", whole, (1600, 1750))
                if "tensorboard_compare" in shots:
                    crop(whole, work.out / "tensorboard_compare.png", 0, 1075)
                if "tensorboard_compare_steps" in shots:
                    crop(whole, work.out / "tensorboard_compare_steps.png", 1060, 1750)
            if "tensorboard_hparams" in shots:
                browser.shot("#hparams", work.out / "tensorboard_hparams.png", (2100, 950))
        finally:
            browser.close()
    if "tensorboard_compute_comm_one_run" in shots:
        browser = Browser(one_run_unfolded(work), work.log)
        try:
            browser.shot("#custom_scalars", work.out / "tensorboard_compute_comm_one_run.png", (1400, 900))
        finally:
            browser.close()
    return said


def crop(src: Path, dst: Path, top: int, bottom: int) -> None:
    """Rows top..bottom of the picture `src`, to `dst`."""
    import matplotlib.image as mpimg

    mpimg.imsave(dst, mpimg.imread(src)[top:bottom])


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="a picture's name (docs/img/NAME.png; repeatable); default: every one")
    ap.add_argument("--out", default=str(IMG), help="where the PNGs go (default docs/img)")
    ap.add_argument("--work", default="", help="the work folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--data", default="", help="an MNIST data.root (default: fetched into the work folder)")
    ap.add_argument("--network", action="store_true",
                    help="also the network claims' pictures (the network lab: root, namespaces, SLURM)")
    ap.add_argument("--list", action="store_true", help="each picture and how it is made")
    args = ap.parse_args(argv)
    if args.list:
        for image in IMAGES:
            print(f"{image.name}.png: {image.what}")
        return 0
    unknown = [n for n in args.only if n not in BY_NAME]
    if unknown:
        ap.error(f"--only {', '.join(unknown)}: not a picture (--list names them)")
    names = [i.name for i in IMAGES if not args.only or i.name in args.only]
    root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="docs_images_"))
    root.mkdir(parents=True, exist_ok=True)
    data = Path(args.data) if args.data else root / "data"
    if not args.data:
        sys.path.insert(0, str(REPO))
        from ddp_lab.data_fetch import fetch_mnist

        fetch_mnist(data, ["embedded"])
    t0 = time.monotonic()
    work = Work(root, Path(args.out), data, args.network)
    try:
        said = make(work, names)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(root, ignore_errors=True)
    for name in names:
        print(f"  {name}.png: {said.get(name, '?')}")
    say(f"{len(names)} picture(s) in {time.monotonic() - t0:.0f} s"
        + (f"; work folder {root}" if args.keep or args.work else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
