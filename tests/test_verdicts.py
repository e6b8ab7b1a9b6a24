"""Every verdict `python -m ddp_lab.status` can give, for every way a run reaches it: a local
run, a SLURM job that ends each way (one the scheduler ended before any rank started among
them), a RunAI job. Fast: each case is a run folder as that route leaves it (config.yaml,
summary.json, the job_id file), a real process where the route has one alive here, and, for
SLURM, `scontrol`/`sacct` on PATH answering what the scheduler says in that case (the real
loopback cluster's answers: tests/test_status.py::test_slurm_job_status_and_stop). The
expected verdicts are written here by hand, not computed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_lab.command import status as st
from ddp_lab.launch import sweep
from ddp_lab.status import exit_code

JOB = "4242"
# (case, launcher, summary.json's status (None: no file), what scontrol says (None: not asked;
# "GONE": neither scontrol nor sacct knows the job), a process of the job alive here,
# the state, a piece of the detail, python -m ddp_lab.status's exit code)
CASES = [
    ("local completed", "local", "completed", None, False, "completed", "", 0),
    ("local stopped (SIGTERM, --stop)", "local", "stopped", None, False, "stopped", "", 75),
    ("local preempted (a scheduler's signal)", "local", "preempted", None, False, "preempted", "",
     75),
    ("local failed", "local", "failed: rank 1 raised ValueError", None, False, "failed",
     "rank 1 raised ValueError", 1),
    ("local running", "local", "running", None, True, "running", "process(es) of the job alive",
     1),
    ("local died without a word", "local", "running", None, False, "running",
     "died without a word", 1),
    ("local starting", "local", None, None, True, "pending", "no summary.json yet", 1),
    ("local not started", "local", None, None, False, "not started", "never launched", 1),
    ("slurm pending", "slurm", None, "JobState=PENDING ExitCode=0:0 Reason=Priority", False,
     "pending", "(Priority)", 1),
    ("slurm starting", "slurm", None, "JobState=RUNNING ExitCode=0:0 Reason=None", False,
     "pending", "starting", 1),
    ("slurm running", "slurm", "running", "JobState=RUNNING ExitCode=0:0 Reason=None", False,
     "running", f"SLURM job {JOB} RUNNING", 1),
    ("slurm completed", "slurm", "completed", "JobState=COMPLETED ExitCode=0:0 Reason=None",
     False, "completed", "", 0),
    ("slurm completed, record aged out", "slurm", "completed", "GONE", False, "completed",
     "does not know it any more", 0),
    ("slurm stopped by scancel", "slurm", "stopped", "JobState=CANCELLED ExitCode=0:15 Reason=None",
     False, "stopped", "", 75),
    ("slurm preempted, stop checkpoint saved", "slurm", "preempted",
     "JobState=PREEMPTED ExitCode=0:15 Reason=None", False, "preempted", "", 75),
    ("slurm preempted before the stop checkpoint", "slurm", "running",
     "JobState=PREEMPTED ExitCode=0:15 Reason=None", False, "preempted",
     "resumes from its last epoch checkpoint", 75),
    ("slurm requeued, waiting", "slurm", "preempted",
     "JobState=PENDING ExitCode=0:0 Reason=BeginTime", False, "pending", "the run was preempted",
     1),
    ("slurm failed in a rank", "slurm", "failed: rank 0 raised RuntimeError",
     "JobState=FAILED ExitCode=1:0 Reason=NonZeroExitCode", False, "failed",
     "rank 0 raised RuntimeError", 1),
    ("slurm ended before any rank started", "slurm", None,
     "JobState=FAILED ExitCode=1:0 Reason=NonZeroExitCode", False, "failed",
     "summary.json says nothing", 1),
    ("slurm cancelled while pending", "slurm", None,
     "JobState=CANCELLED ExitCode=0:0 Reason=None", False, "failed", "the run did not finish", 1),
    ("slurm timed out mid-run", "slurm", "running", "JobState=TIMEOUT ExitCode=0:15 Reason=None",
     False, "failed", "the run did not finish", 1),
    ("slurm gone before any rank started", "slurm", None, "GONE", False, "failed",
     "the job ended before the ranks started", 1),
    ("runai running", "runai", "running", None, False, "running", "in its pods", 1),
    ("runai completed", "runai", "completed", None, False, "completed", "", 0),
    ("runai failed", "runai", "failed: rank 1 exited with 137", None, False, "failed",
     "exited with 137", 1),
    ("runai not started", "runai", None, None, False, "not started", "never launched", 1),
]


def _scheduler(bin_dir: Path, said: str) -> None:
    """scontrol and sacct as the scheduler answers in this case."""
    if said == "GONE":
        scontrol = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
        sacct = "exit 0"
    else:
        scontrol = f"echo 'JobId={JOB} JobName=ddp_lab {said}'"
        sacct = "exit 0"
    for name, body in (("scontrol", scontrol), ("sacct", sacct)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)


def _folder(run_dir: Path, launcher: str, status: str | None) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        f"launcher:\n  name: {launcher}\ntrain:\n  epochs: 2\n")
    if launcher == "slurm":
        (run_dir / "job_id").write_text(JOB + "\n")
    if status is not None:
        (run_dir / "summary.json").write_text(json.dumps(
            {"status": status, "launcher": launcher, "epochs": 2,
             "job_id": JOB if launcher == "slurm" else None}))


def _exec_seen(pid: int, word: str, timeout: float = 20.0) -> None:
    """Wait until the child's command line is its own (a loaded machine may not have run its
    exec yet when Popen returns: status would see pytest's)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if word in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never showed {word!r} in its command line")


@pytest.mark.parametrize("case, launcher, status, said, alive, state, detail, rc", CASES,
                         ids=[c[0] for c in CASES])
def test_every_verdict(tmp_path, monkeypatch, case, launcher, status, said, alive, state,
                       detail, rc):
    run_dir = tmp_path / "run"
    _folder(run_dir, launcher, status)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if said is not None:
        _scheduler(bin_dir, said)
    # no real scontrol of this machine's answers a case that asks none
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
                       if said is not None else f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    proc = None
    if alive:
        # a rank of the job: its command line names the entry and the folder, as torchrun's do
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                 "ddp_lab.worker", str(run_dir)])
        _exec_seen(proc.pid, str(run_dir))
    try:
        info = st.inspect(run_dir)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
            sweep(run_dir)
    assert (info["state"], exit_code(info)) == (state, rc), (case, info["state"], info["detail"])
    assert detail in info["detail"], (case, info["detail"])
    # the one line of a folder of runs says the same word
    assert state in st.one_line(info), (case, st.one_line(info))


def test_every_state_and_route_is_a_case():
    """The table covers each state status reports, by each route that can reach it."""
    states = {"completed", "preempted", "stopped", "failed", "not started", "running",
              "pending"}
    by_route: dict[str, set] = {}
    for case in CASES:
        by_route.setdefault(case[1], set()).add(case[5])
    assert by_route["local"] == states
    assert by_route["slurm"] == states - {"not started"}  # a submitted job is known to SLURM
    assert by_route["runai"] >= {"running", "completed", "failed", "not started"}
