"""The epoch benchmark's own parts (ddp_lab/bench/specs/epoch.py): its CPU hog ends with it,
however it ends, and its settings are named back to the user. The benchmark itself runs in
tests/test_docs_commands.py (its documented quick check)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

import pytest

from ddp_lab.bench.specs.epoch import cpu_hog, omp_env, paired

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hogs_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_the_hog_is_one_busy_process_a_core_and_ends_with_the_block():
    with cpu_hog() as kids:
        assert len(kids) == len(os.sched_getaffinity(0))
        assert set(kids) <= set(_hogs_of(os.getpid()))
    time.sleep(0.2)
    assert not [k for k in kids if os.path.exists(f"/proc/{k}") and
                open(f"/proc/{k}/stat").read().split()[2] != "Z"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_hog_dies_with_the_benchmark(sig):
    # the benchmark killed mid-measure (SIGTERM: its `finally`; SIGKILL: PR_SET_PDEATHSIG)
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from ddp_lab.bench.suite import _exit_on_sigterm\n"
            "import signal; signal.signal(signal.SIGTERM, _exit_on_sigterm)\n"
            "from ddp_lab.bench.specs.epoch import cpu_hog\n"
            "with cpu_hog():\n    print('hogging', flush=True); time.sleep(60)\n" % REPO)
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout.readline().strip() == "hogging"
        kids = _hogs_of(bench.pid)
        assert kids
        bench.send_signal(sig)
        bench.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{k}") for k in kids):
            time.sleep(0.1)
        assert not any(os.path.exists(f"/proc/{k}") for k in kids), kids
    finally:
        bench.kill()
        bench.wait()


def test_waits_name_the_openmp_variables():
    assert omp_env("default") == {}
    assert omp_env("passive") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert omp_env("spin:30000") == {"GOMP_SPINCOUNT": "30000"}
    with pytest.raises(SystemExit, match="--waits spin"):
        omp_env("spin")


def test_timing_on_against_off_is_taken_round_by_round():
    """The VM slows by 40% in round 2, between one row's run and the other's, and stays slow:
    the rounds' ratios are 1.0, 1.4, 1.0, their median 1.0; the medians' ratio would be 1.4,
    the neighbour's and not timing's."""
    ours, loop = [1.0, 1.4, 1.4], [1.0, 1.0, 1.4]
    assert paired(ours, loop) == pytest.approx(1.0)
    assert statistics.median(ours) / statistics.median(loop) == pytest.approx(1.4)
    assert paired([2.0, 4.0], [1.0, 1.0]) == pytest.approx(3.0)  # an even count: the middle two
