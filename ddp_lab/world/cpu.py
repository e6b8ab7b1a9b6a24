"""How many CPU threads each rank runs and how its threads wait: decided once per machine, before
torch loads (torch-free). Why and what was measured: docs/performance.md, "What decides the
defaults". `launcher=local` looks at the load first (`busy_cores`, `decide`, passed on by `apply`);
otherwise a rank takes its equal share, its threads sleeping. What you set stands (`train.threads`,
OMP_WAIT_POLICY, GOMP_SPINCOUNT).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import MutableMapping, Optional

THREADS_VAR, WHY_VAR = "DDP_LAB_THREADS", "DDP_LAB_THREADS_WHY"  # the launcher's choice
USER_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass(frozen=True)
class CpuShare:
    threads: int  # torch threads per rank
    spin: bool  # threads spin a moment before sleeping (libgomp's default), else sleep at once
    why: str  # in words, for the run's first line and summary.json


def cores() -> int:
    """The cores this process may run on (its affinity: an allocation's, a container's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def equal_share(local_ranks: int, n_cores: Optional[int] = None) -> int:
    """Each of `local_ranks` ranks' share of `n_cores` (default: this process's), at least 1."""
    return max(1, (cores() if n_cores is None else n_cores) // max(local_ranks, 1))


def busy_cores(window_s: float = 0.2) -> Optional[float]:
    """How many of this process's cores other processes kept busy over `window_s` (sleeping
    meanwhile, so not us), from /proc/stat; None where there is no /proc/stat."""
    def sample() -> dict[int, tuple[int, int]]:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit():
                    ticks = [int(x) for x in fields[:8]]
                    idle = ticks[3] + ticks[4]  # idle + iowait
                    out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
        return out
    try:
        mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        a = sample()
        time.sleep(window_s)
        b = sample()
    except OSError:
        return None
    busy = 0.0
    for cpu in (mine if mine is not None else a):
        if cpu in a and cpu in b and b[cpu][1] > a[cpu][1]:
            busy += (b[cpu][0] - a[cpu][0]) / (b[cpu][1] - a[cpu][1])
    return busy


def decide(n_cores: int, local_ranks: int, busy: Optional[float]) -> CpuShare:
    """Each of `local_ranks` ranks' threads on `n_cores` cores of which `busy` are in use."""
    share = equal_share(local_ranks, n_cores)
    if busy is None:
        return CpuShare(share, False, f"an equal share of {n_cores} cores, load unknown")
    free = max(0, n_cores - round(busy))
    threads = min(share, equal_share(local_ranks, free))
    # spinning only with a core to spare: the job's launcher, the command that follows it and each
    # rank's own helper threads (TensorBoard's writer, gloo's) run beside the ranks
    spin = threads * local_ranks <= free - 1
    return CpuShare(threads, spin, f"{free} of {n_cores} cores free at start")


def look(local_ranks: int) -> CpuShare:
    """`decide` for this machine's `local_ranks` ranks, looking at the load only where it can
    change the answer: with one core or less a rank, each runs 1 thread whatever the load."""
    n = cores()
    if equal_share(local_ranks, n) == 1:
        ranks = f"{local_ranks} rank{'s' if local_ranks > 1 else ''}"
        return CpuShare(1, False, f"{n} cores for {ranks}")
    return decide(n, local_ranks, busy_cores())


def apply(share: CpuShare, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Hand `share` to this machine's ranks: call before torch loads (libgomp reads its variables
    once) and before the ranks start. The user's own OpenMP variables stand."""
    env = os.environ if environ is None else environ
    env[THREADS_VAR], env[WHY_VAR] = str(share.threads), share.why
    if not share.spin and not any(k in env for k in USER_WAIT_VARS):
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def prepare_rank(environ: Optional[MutableMapping[str, str]] = None) -> None:
    """In a rank, before torch: without a launcher's choice, threads sleep (unless you chose)."""
    env = os.environ if environ is None else environ
    if THREADS_VAR not in env and not any(k in env for k in USER_WAIT_VARS):
        env["OMP_WAIT_POLICY"] = "PASSIVE"


@dataclass
class RankThreads:
    """This rank's torch threads, why, and whether `tune_threads` may lower them (run_rank makes
    it, the rank's DistContext holds it)."""

    threads: int
    why: str
    tunable: bool


def rank_threads(local_ranks: int, requested: int = 0, earlier: int = 0,
                 environ: Optional[MutableMapping[str, str]] = None) -> RankThreads:
    """This rank's torch threads: `requested` (train.threads), else `earlier` (a resumed run keeps
    its bits), else the launcher's choice (the only ceiling start-up may lower), else its equal
    share of the cores."""
    env = os.environ if environ is None else environ
    if requested > 0:
        return RankThreads(requested, "train.threads", False)
    if earlier > 0:
        return RankThreads(earlier, "as when the run started", False)
    if env.get(THREADS_VAR, "").isdigit():
        return RankThreads(int(env[THREADS_VAR]), env.get(WHY_VAR, "the launcher's choice"), True)
    # no launcher looked: as before, and not timed
    return RankThreads(equal_share(local_ranks), f"an equal share of {cores()} cores", False)


def wait_policy(environ: Optional[MutableMapping[str, str]] = None) -> str:
    """How this process's OpenMP threads wait, in words (the variables libgomp read)."""
    env = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in env:
        return f"spin {env['GOMP_SPINCOUNT']} times, then sleep"
    return {"PASSIVE": "sleep", "ACTIVE": "spin"}.get(env.get("OMP_WAIT_POLICY", "").upper(),
                                                      "spin a moment, then sleep")
