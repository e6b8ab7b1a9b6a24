"""What one step of `sync=ring` really runs: traced on rank 0 of a 2-rank training.

docs/tour.md reads a step in a handful of files; this test holds that count. Rank 0 of a
real 2-rank gloo job (the run folder of a dry run, two plain processes, `run_rank` and
`train()` as the worker runs them) traces its fourth step with `sys.setprofile`: every
ddp_lab file whose code runs in it (a function called, or the ddp_lab code calling it),
and the same for `syncer.sync()` alone. That step writes no per-step TensorBoard point, as
49 of 50 steps of a full epoch do not (a run of 200 steps writes every 10th: the traced
fourth is not one of them; a point's step adds the telemetry's files). The bounds are today's counts: a change that adds
a file to the step must say why here (and in the tour's table)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import free_port

REPO = Path(__file__).resolve().parent.parent

#: the step's files and the sync's (docs/tour.md, *What one step runs*)
STEP_FILES_AT_MOST = 12
SYNC_FILES_AT_MOST = 6

HARNESS = r'''
import json, os, sys
from pathlib import Path

import ddp_lab
import ddp_lab.train as T
from ddp_lab.config import load_run_config
from ddp_lab.rank.main import run_rank

run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
TOP = os.path.dirname(os.path.dirname(ddp_lab.__file__))
PKG = os.path.dirname(ddp_lab.__file__)
seen = {"step": set(), "sync": set()}
TRACED = 3  # the fourth step: warm, neither the first nor the last


def tracer(key):
    def on(frame, event, arg):
        if event != "call":
            return
        for fr in (frame, frame.f_back):  # the callee, and the ddp_lab code calling it
            if fr is not None and fr.f_code.co_filename.startswith(PKG):
                for k in {key, "step"}:  # a step holds its sync
                    seen[k].add(os.path.relpath(fr.f_code.co_filename, TOP))
    return on


run_steps = T.run_steps


def traced_run_steps(syncer, optimizer, batches, *args, **kwargs):
    rank0 = int(os.environ["RANK"]) == 0
    sync, at = syncer.sync, {"step": -1}

    def traced_sync(*a, **k):
        if not (rank0 and at["step"] == TRACED):
            return sync(*a, **k)
        outer = sys.getprofile()
        sys.setprofile(tracer("sync"))
        try:
            return sync(*a, **k)
        finally:
            sys.setprofile(outer)

    def steps():
        for at["step"], batch in enumerate(batches):
            if rank0:
                sys.setprofile(tracer("step") if at["step"] == TRACED else None)
            yield batch
        sys.setprofile(None)

    syncer.sync = traced_sync
    try:
        return run_steps(syncer, optimizer, steps(), *args, **kwargs)
    finally:
        del syncer.sync


T.run_steps = traced_run_steps
cfg = load_run_config(run_dir)
rc = run_rank(run_dir, cfg, lambda ctx: T.train(cfg, ctx, run_dir), cfg.train.threads)
if int(os.environ["RANK"]) == 0:
    out.write_text(json.dumps({k: sorted(v) for k, v in seen.items()}))
sys.exit(rc or 0)
'''


def test_a_ring_step_runs_code_in_few_files(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "ddp_lab", "sync=ring", "launcher.nproc_per_node=2",
                    "train.epochs=1", "train.max_steps_per_epoch=200", f"run.dir={run_dir}",
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
        logs = [rank.communicate(timeout=240)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    assert [rank.returncode for rank in ranks] == [0, 0], logs[0][-3000:]
    traced = json.loads((tmp_path / "traced.json").read_text())
    step, sync = traced["step"], traced["sync"]
    assert "ddp_lab/sync/ring.py" in sync and "ddp_lab/step.py" in step, traced
    assert len(sync) <= SYNC_FILES_AT_MOST, f"syncer.sync() runs code in {len(sync)} files: {sync}"
    assert len(step) <= STEP_FILES_AT_MOST, f"one step runs code in {len(step)} files: {step}"
