"""The ranks' start as on a GPU, run on CPU. On CPU, `python -m ddp_lab`'s torchrun starts
every rank as a fork of itself (launch/torchrun.py `fork_ranks`); on a GPU each rank is a
fresh interpreter (`python -u -m ddp_lab.worker RUN_DIR`), which imports torch and ddp_lab
itself. DDP_LAB_FRESH_RANKS=1 makes CPU ranks start that way: this test trains so, and
watches /proc while it runs to see the fresh interpreters, not forks."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PY, child_env, describe, run_dir_of

from ddp_lab.launch.torchrun import FRESH_RANKS


def _argvs() -> dict[int, tuple[int, list[str]]]:
    """Every process's (parent pid, command line), by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
                # the field after the command's name, which may hold spaces and parentheses
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found[int(entry.name)] = (ppid, argv)
    return found


@pytest.mark.dist
def test_ranks_start_as_fresh_interpreters_as_on_a_gpu(tmp_path, shared_data_root):
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [PY, "-m", "ddp_lab", "launcher.nproc_per_node=2", "train.epochs=1",
         "train.max_steps_per_epoch=10", "train.eval_batch_size=2000", "log.progress=lines",
         "train.checkpoint=false", f"run.root={runs}", f"data.root={shared_data_root}"],
        cwd=tmp_path, env=child_env({FRESH_RANKS: "1"}), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # every command line each of the job's processes showed, by pid: a process started with
    # fork + exec shows its parent's command line until its exec, so one look can catch a
    # fresh rank still wearing torchrun's
    ranks: dict[int, list[list[str]]] = {}
    parents: dict[int, int] = {}
    try:
        while proc.poll() is None:
            for pid, (ppid, argv) in _argvs().items():
                if "ddp_lab.worker" in argv and str(runs) in " ".join(argv):
                    parents[pid] = ppid
                    seen = ranks.setdefault(pid, [])
                    if argv not in seen:
                        seen.append(argv)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert proc.returncode == 0, describe(done)
    # a fork shows torchrun's command line; a fresh rank its own: `python -u -m MODULE ...`
    # (the worker, started through the module that writes its console a line at a time)
    fresh = {pid: a for pid, argvs in ranks.items() for a in argvs
             if a[1:3] == ["-u", "-m"] and "ddp_lab.launch.torchrun" not in a}
    # a rank's own child (a tool it runs), caught between its fork and its exec, wears the
    # rank's command line: not a rank
    fresh = {pid: a for pid, a in fresh.items() if parents[pid] not in fresh}
    assert len(fresh) == 2, ranks
    run_dir = run_dir_of(done)
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed" and s["world_size"] == 2, s
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1] and records[0]["test_accuracy"] > 0.3, records
