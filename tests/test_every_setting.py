"""Every registered synchroniser and every option of its group, through every consumer.

The cases come from the registry, not from a list here: the synchronisers are
ddp_lab.config.sync.SYNC_SCHEMAS, each one's options its schema's keys with their
conf/sync/<name>.yaml defaults (ddp_lab.folder.description.sync_options), and each option's
case is its first other value the submitting side accepts at the world (a bool flipped, a
choice from the value tuples the schemas export, a number 0/1/2). A new synchroniser or
option adds its cases with no edit here; an option whose values the test cannot guess
(a string with no exported tuple of choices) fails the test, naming it.

Each case is a tiny real job (3 steps): the run folder made by the submitting side's own
code (compose, name, check, render: `launcher.dry_run`), then trained by the entry every
rank runs (`ddp_lab.worker`) on a real gloo world. The ranks of one world are shared by
all its jobs (one set of processes per world: starting torch once, not once a job). Every
synchroniser runs at world 1, 2 and 3, every option at world 2 (two ranks on CI's two
cores: the options are most of the jobs). Then the user's commands, as processes: a real sweep of the tour's `sync=ring
sync.prepost=false,true`, its resume, and `run.entry=ddp_lab.one_file` through the
launcher, and every folder fed to the report (exit 0, each setting its own series),
status (completed), TensorBoard (one run each, named by what differs) and the sweep table.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import PY, child_env, compose, free_port, world_context

pytestmark = [pytest.mark.dist, pytest.mark.slow]

QUICK = ["train.epochs=1", "train.max_steps_per_epoch=3", "train.eval_batch_size=5000",
         "log.progress=lines", "dist.init_timeout_s=60", "dist.timeout_s=60"]
WORLDS = (1, 2, 3)
OPTION_WORLD = 2


def _choices() -> dict[str, list[str]]:
    """The values of the string options the sync schemas export, by name (COMPRESS_MODES,
    HIERARCHICAL_INTER, ...): tuples of strings, or dicts keyed by them."""
    import ddp_lab.config.sync as schemas

    return {name: list(v) for name, v in vars(schemas).items()
            if isinstance(v, (tuple, dict)) and v and all(isinstance(x, str) for x in v)}


def _candidates(key: str, default) -> list:
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, str):
        named = sorted(_choices().items(), key=lambda kv: key.upper() not in kv[0])
        for _, values in named:  # the tuple named after the key first (intra: ..._INTRA)
            if default in values:
                return [v for v in values if v != default]
        raise AssertionError(f"sync option {key}={default!r}: no exported tuple of its values "
                             "(export one from ddp_lab/sync/schemas, as COMPRESS_MODES is)")
    if isinstance(default, float):
        return [v for v in (0.0, 1.0) if v != default]
    if isinstance(default, int):
        return [v for v in (1, 2, 0) if v != default]
    raise AssertionError(f"sync option {key}={default!r}: a type the test cannot vary")


def _accepted(sync: str, key: str, value, world: int) -> bool:
    """Whether the synchroniser's own rules (its schema's `check`, what the submitting side
    asks before any process starts) take `sync.<key>=<value>` at `world`."""
    from omegaconf import OmegaConf

    from ddp_lab.config import with_defaults
    from ddp_lab.folder.description import sync_options
    from ddp_lab.config.sync import SYNC_SCHEMAS

    section = with_defaults(OmegaConf.create({**sync_options(sync), "name": sync, key: value}))
    try:
        SYNC_SCHEMAS[sync].check(section, world)
    except ValueError:
        return False
    return True


def cases(root: Path, data: Path) -> dict[int, list[list[str]]]:
    """world -> the override lists of its jobs: each sync as it is, and at OPTION_WORLD
    each option of its group at its first accepted other value."""
    from ddp_lab.folder.description import sync_options
    from ddp_lab.config.sync import SYNC_SCHEMAS

    base = [*QUICK, "train.checkpoint=false", f"data.root={data}", f"run.root={root}"]
    out: dict[int, list[list[str]]] = {w: [] for w in WORLDS}
    for sync in sorted(SYNC_SCHEMAS):
        for w in WORLDS:
            out[w].append([f"sync={sync}"])
        for key, default in sync_options(sync).items():
            for value in _candidates(key, default):
                if _accepted(sync, key, value, OPTION_WORLD):
                    text = str(value).lower() if isinstance(value, bool) else str(value)
                    out[OPTION_WORLD].append([f"sync={sync}", f"sync.{key}={text}"])
                    break
    return {w: [[*base, *job, f"launcher.nproc_per_node={w}"] for job in jobs]
            for w, jobs in out.items()}


def make_folder(overrides: list[str], swept: list[str]) -> Path:
    """The run folder `python -m ddp_lab -m ...` makes for one job of a sweep varying
    `swept`, rendered (launcher.dry_run) and then handed to the ranks as the launcher
    would: the submitting side's code from composition to render, nothing mocked."""
    from ddp_lab.command.cli import job_name
    from ddp_lab.folder.rundir import DRY_RUN
    from ddp_lab.command.submit import submit

    cfg = compose(*overrides, "launcher.dry_run=true")
    cfg.run.name = job_name(cfg, swept)
    with contextlib.redirect_stdout(io.StringIO()):
        outcome = submit(cfg)
    assert outcome.rc == 0, outcome.result
    (outcome.run_dir / DRY_RUN).unlink()  # the launcher's part: it starts the ranks now
    return outcome.run_dir


def _ranks(rank: int, world: int, folders: list[str], ports: list[int], queue) -> None:
    """One rank of a world shared by every job of it: `ddp_lab.worker`'s run on each
    folder in turn, a fresh process group (and rendezvous port) each."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1")
    from ddp_lab.worker import run

    rcs = []
    for folder, port in zip(folders, ports):
        os.environ["MASTER_PORT"] = str(port)
        rcs.append(run(Path(folder)))
    queue.put((rank, rcs))


def run_world(world: int, folders: list[Path]) -> list[int]:
    """Each folder's exit status on every rank (the worst of them)."""
    ctx = world_context()
    queue = ctx.Queue()
    ports = [free_port() for _ in folders]
    procs = [ctx.Process(target=_ranks, args=(r, world, [str(f) for f in folders], ports, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict(queue.get(timeout=60 + 30 * len(folders)) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [max(got[r][i] for r in range(world)) for i in range(len(folders))]


def cli(*args: str, module: str = "ddp_lab", cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", module, *args], cwd=cwd, env=child_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)


def _description(folder: Path):
    from ddp_lab.folder.description import describe_run

    summary = json.loads((folder / "summary.json").read_text())
    return describe_run(OmegaConf.to_container(OmegaConf.load(folder / "config.yaml")), summary)


def test_every_sync_and_option_through_every_consumer(tmp_path, shared_data_root):
    from ddp_lab.command.cli import sweep_table
    from ddp_lab.command.job import Outcome

    t0 = time.monotonic()
    root = tmp_path / "outputs"
    jobs = cases(root, shared_data_root)
    print(f"cases: {time.monotonic() - t0:.0f} s", flush=True)
    folders: dict[int, list[Path]] = {}
    outcomes = []
    for w, overrides in jobs.items():
        folders[w] = [make_folder(o, [x for x in o if x.startswith("sync")]) for o in overrides]
        rcs = run_world(w, folders[w])
        print(f"world {w}: {len(rcs)} jobs, {time.monotonic() - t0:.0f} s", flush=True)
        for f, rc, o in zip(folders[w], rcs, overrides):
            assert rc == 0, (o, (f / "logs" / "rank0.log").read_text()[-3000:])
            outcomes.append((len(outcomes), [x for x in o if x.startswith("sync")],
                             Outcome(rc, "ok", f)))
    trained = [f for fs in folders.values() for f in fs]
    n_options = len(jobs[OPTION_WORLD]) - len(jobs[1])
    assert n_options >= 20, jobs[OPTION_WORLD]  # every sync's options, not a handful

    # the user's own commands, as processes: the tour's sweep, its resume, stop 0
    tour = cli("-m", "sync=ring", "sync.prepost=false,true", "launcher.nproc_per_node=2",
               *QUICK, f"data.root={shared_data_root}", f"run.root={root}", cwd=tmp_path)
    assert tour.returncode == 0, tour.stdout[-3000:]
    tour_dirs = [Path(x.removeprefix("run dir: ")) for x in tour.stdout.splitlines()
                 if x.startswith("run dir: ")]
    # folders named by what differs, not `prepost-True_...`; the table names each run
    assert [d.name.split("_20")[0] for d in tour_dirs] == ["ring_w2_mlp", "ring-prepost_w2_mlp"]
    table = tour.stdout[tour.stdout.index("sweep of 2 job(s):"):].splitlines()
    assert [x.lower() for x in table[2].split()[1:3]] == ["sync.prepost=false", "ring"], table
    assert [x.lower() for x in table[3].split()[1:3]] == ["sync.prepost=true", "ring-prepost"], table
    resumed = cli(f"run.dir={tour_dirs[1]}", "sync=ring", "sync.prepost=true",
                  "launcher.nproc_per_node=2", *QUICK[1:], "train.epochs=2",
                  f"data.root={shared_data_root}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert json.loads((tour_dirs[1] / "summary.json").read_text())["epochs_done"] == 2
    one_file = cli("run.entry=ddp_lab.one_file", "sync=ring", "launcher.nproc_per_node=3",
                "train.epochs=1", "train.max_steps_per_epoch=5", f"data.root={shared_data_root}",
                f"run.root={root}", cwd=tmp_path)
    assert one_file.returncode == 0, one_file.stdout[-3000:]
    one_file_dir = Path(one_file.stdout.splitlines()[-1].removeprefix("run dir: "))
    # every rank's line whole: never two run together on one line
    lines = [x for x in one_file.stdout.splitlines() if "[rank" in x]
    assert len(lines) == 3 and all(re.fullmatch(r"\[rank \d\] epoch 1/1: loss \S+, sync \(ring\) "
                                                r"\S+ ms/step", x) for x in lines), lines
    trained += tour_dirs

    # status: every run completed, stop 0 saying it keeps no records
    st = cli(str(root), "--json", module="ddp_lab.status", cwd=tmp_path)
    assert st.returncode == 0, st.stdout[-3000:]
    states = {Path(i["run_dir"]): i for i in json.loads(st.stdout)}
    assert set(states) == {*trained, one_file_dir}
    bad = {p.name: (i["state"], i["detail"]) for p, i in states.items() if i["state"] != "completed"}
    assert not bad, bad
    assert "keeps no records" in states[one_file_dir]["detail"]

    # TensorBoard: one run per folder, `<folder named by its description's label>/tb/<what
    # the label does not say>`; settings that differ, names that differ (a study's repeat
    # aside, two folders never share one)
    from ddp_lab.folder.tensorboard import length_extras, writer_name

    descs = {f: _description(f) for f in trained}
    for f, d in descs.items():
        runs = [p.parent.name for p in (f / "tb").glob("*/events.out.tfevents.*")]
        cap = OmegaConf.load(f / "config.yaml").train.max_steps_per_epoch
        assert set(runs) == {writer_name(d.label(), f.name, length_extras(cap))}, (f.name, runs)
    by_setting = {}
    for f, d in descs.items():
        by_setting.setdefault((d.label()), set()).add((d.setting, d.workload))
    assert all(len(v) == 1 for v in by_setting.values()), by_setting

    # the sweep table of the shared jobs: each run named by what differs from the others
    # (two runs of different settings never one name), its figures shown
    from ddp_lab.command.cli import _run_labels
    from ddp_lab.folder.rundir import read_summary

    names = _run_labels(outcomes, [read_summary(o.run_dir) for _, _, o in outcomes])
    full = [descs[o.run_dir].label() for _, _, o in outcomes]
    assert len(set(zip(names, full))) == len(set(names)) == len(set(full)), list(zip(names, full))
    rows = sweep_table(outcomes).splitlines()[2:-1]
    assert len(rows) == len(outcomes) and all(re.search(r"\d s ", r) for r in rows), rows

    # the report: exit 0, nothing skipped but stop 0 (said why), each setting its own series
    rep = cli(str(root), module="ddp_lab.report", cwd=tmp_path)
    assert rep.returncode == 0, rep.stdout[-5000:]
    doc = json.loads((root / "report" / "report.json").read_text())
    skipped = {Path(s["run"]): s["reason"] for s in doc["skipped"]}
    assert set(skipped) == {one_file_dir}, skipped
    assert "keeps no records" in skipped[one_file_dir]
    series = {}
    for g in doc["scaling"]:
        for row in g["rows"]:
            for run in row["runs"]:
                series[Path(run)] = g["sync"]
    assert set(series) == set(trained)
    for f, d in descs.items():
        assert series[f] == d.series_label(), (f.name, series[f])
    # runs in one series agree on every setting but the world: never an average of two
    labels = {}
    for f, d in descs.items():
        labels.setdefault((series[f], d.workload_words(length=True)), set()).add(d.series)
    assert all(len(v) == 1 for v in labels.values()), labels
    assert {series[tour_dirs[0]], series[tour_dirs[1]]} == {"ring", "ring prepost=true"}
    print(f"{len(trained)} runs, {n_options} option cases, {time.monotonic() - t0:.0f} s")
