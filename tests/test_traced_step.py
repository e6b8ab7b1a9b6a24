"""What one step of `sync=ring` really runs: traced on rank 0 of a 2-rank training.

docs/tour.md reads a step in a handful of files; this test holds that count. Rank 0 of a
real 2-rank gloo job (the run folder of a dry run, two plain processes, `run_rank` and
`train()` as the worker runs them) traces steps with `sys.setprofile` on the training
thread and `threading.setprofile` on every thread it starts (sync.overlap's collective
thread among them): every ddp_lab file whose code runs in the step on any thread (a
function called, or the ddp_lab code calling it), and the same for `syncer.sync()` with
what the overlap thread runs meanwhile. Two steps are traced: the fourth, which writes no
per-step TensorBoard point (as 49 of 50 steps of a full epoch do not), and the fifth, the
first that does (a run of 100 steps writes every 5th): its telemetry's files are counted
too. Run for sync=ring and for sync=ring sync.overlap=true (whose buckets go out on their
own thread). The bounds are today's counts: a change that adds a file to the step must
say why here (and in the tour's table). The rank's heartbeat record reads on a thread of
its own, outside the step (`NOT_THE_STEP`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import free_port

REPO = Path(__file__).resolve().parent.parent

#: the step's files and the sync's (docs/tour.md, *What one step runs*), by setting: the
#: plain step (the fourth), and the step that writes a TensorBoard point (the fifth)
AT_MOST = {  # setting: {"step": n, "sync": n, "telemetry step": n}
    "ring": {"step": 11, "sync": 6, "telemetry step": 16},
    "ring-overlap": {"step": 11, "sync": 6, "telemetry step": 16},
}
SETTINGS = {"ring": ["sync=ring"], "ring-overlap": ["sync=ring", "sync.overlap=true"]}
#: threads that run beside the step, not in it (their code is not counted)
NOT_THE_STEP = ("ddp_lab heartbeat",)

HARNESS = r'''
import json, os, sys, threading
from pathlib import Path

import ddp_lab
import ddp_lab.train as T
from ddp_lab.config import load_run_config
from ddp_lab.folder.tensorboard import step_stride
from ddp_lab.rank.main import run_rank

run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
TOP = os.path.dirname(os.path.dirname(ddp_lab.__file__))
PKG = os.path.dirname(ddp_lab.__file__)
cfg = load_run_config(run_dir)
EVERY = step_stride(cfg.timing.tb_every, cfg.train.epochs * cfg.train.max_steps_per_epoch)
TRACED = {3: "step", EVERY - 1: "telemetry step"}  # the fourth (no point), the first point
assert EVERY == 5, EVERY  # the fourth step writes no point, the fifth does
seen = {}  # (traced step, thread name) -> files
at = {"step": -1, "in_sync": False}
RANK0 = int(os.environ["RANK"]) == 0


def on(frame, event, arg):
    if event != "call":
        return
    key = TRACED.get(at["step"]) if RANK0 else None
    if key is None:
        return
    thread = threading.current_thread().name
    for fr in (frame, frame.f_back):  # the callee, and the ddp_lab code calling it
        if fr is not None and fr.f_code.co_filename.startswith(PKG):
            name = os.path.relpath(fr.f_code.co_filename, TOP)
            seen.setdefault(f"{key}|{thread}", set()).add(name)
            if at["in_sync"] or thread != "MainThread":  # the sync, and what runs beside it
                seen.setdefault(f"{key}|{thread}|sync", set()).add(name)


threading.setprofile(on)  # every thread started from here on (the overlap's worker too)
run_steps = T.run_steps


def traced_run_steps(syncer, optimizer, batches, *args, **kwargs):
    sync = syncer.sync

    def traced_sync(*a, **k):
        at["in_sync"] = True
        try:
            return sync(*a, **k)
        finally:
            at["in_sync"] = False

    def steps():
        for at["step"], batch in enumerate(batches):
            sys.setprofile(on if at["step"] in TRACED and RANK0 else None)
            yield batch
        sys.setprofile(None)
        at["step"] = -1

    syncer.sync = traced_sync
    try:
        return run_steps(syncer, optimizer, steps(), *args, **kwargs)
    finally:
        del syncer.sync


T.run_steps = traced_run_steps
from ddp_lab.rank.main import run_training
rc = run_rank(run_dir, cfg, lambda ctx: run_training(T.train, cfg, ctx, run_dir), cfg.train.threads)
if RANK0:
    out.write_text(json.dumps({k: sorted(v) for k, v in seen.items()}))
sys.exit(rc or 0)
'''


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_ring_step_runs_code_in_few_files(tmp_path, setting):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "ddp_lab", *SETTINGS[setting],
                    "launcher.nproc_per_node=2", "train.epochs=1",
                    "train.max_steps_per_epoch=100", f"run.dir={run_dir}",
                    "launcher.dry_run=true"], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=120)
    harness = tmp_path / "traced_rank.py"
    harness.write_text(HARNESS)
    port = free_port()
    ranks = [subprocess.Popen(
        [sys.executable, str(harness), str(run_dir), str(tmp_path / "traced.json")], cwd=REPO,
        env=dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                 GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        logs = [rank.communicate(timeout=480)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    assert [rank.returncode for rank in ranks] == [0, 0], logs[0][-3000:]
    traced = json.loads((tmp_path / "traced.json").read_text())
    counted: dict[str, set] = {}
    threads = set()
    for key, files in traced.items():
        step, thread, *sync = key.split("|")
        threads.add(thread)
        if thread in NOT_THE_STEP:
            continue
        counted.setdefault(step, set()).update(files)
        if sync and step == "step":
            counted.setdefault("sync", set()).update(files)
    found = {k: sorted(v) for k, v in counted.items()}
    assert set(found) == {"step", "sync", "telemetry step"}, traced
    step, sync, point = found["step"], found["sync"], found["telemetry step"]
    assert "ddp_lab/sync/ring.py" in sync and "ddp_lab/step.py" in step, found
    assert "ddp_lab/rank/records.py" in point, f"the fifth step wrote no point: {found}"
    if setting == "ring-overlap":  # its buckets went out on a thread of their own
        assert any(t.startswith("ddp_lab-") for t in threads), threads
        assert "ddp_lab/sync/buckets.py" in sync, found
    limit = AT_MOST[setting]
    for what, files in found.items():
        assert len(files) <= limit[what], (f"{setting}: {what} runs code in {len(files)} files "
                                           f"(at most {limit[what]}): {files}")
    print(setting, {k: len(v) for k, v in found.items()}, found, sorted(threads))
