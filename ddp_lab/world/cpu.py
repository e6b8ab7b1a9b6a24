"""How many CPU threads each rank runs and how its threads wait: decided once per machine, before
torch loads (torch-free). Why and what was measured: docs/performance.md, "What decides the
defaults". `launcher=local` looks at the load first (`busy_cores`, `decide`, passed on by `apply`):
threads sleep where they share cores; where every one has a free core of its own, the launcher
times the run's step under each of `WAITS` before the ranks start (launch/torchrun.py,
`probe_waits`) and keeps the fastest. Otherwise a rank takes its equal share, its threads
sleeping. What you set stands (`train.threads`, OMP_WAIT_POLICY, GOMP_SPINCOUNT).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, MutableMapping, Optional

THREADS_VAR, WHY_VAR = "DDP_LAB_THREADS", "DDP_LAB_THREADS_WHY"  # the launcher's choice
WAIT_WHY_VAR = "DDP_LAB_WAIT_WHY"  # and why its threads wait as they do
USER_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SLEEP = {"OMP_WAIT_POLICY": "PASSIVE"}
# how threads with a free core each may wait, gentlest first, in words and as libgomp's variables:
# the launcher times each (launch/torchrun.py, `probe_waits`) and keeps the fastest, the gentler
# where they are within 5%. The spin is 30,000 rounds, not libgomp's default 300,000: never
# slower idle on the VMs measured, and a third of the cost once load arrives later
# (docs/performance.md, "load that comes later")
WAITS = (("sleeping", SLEEP), ("spinning 30000 times", {"GOMP_SPINCOUNT": "30000"}))


@dataclass(frozen=True)
class CpuShare:
    threads: int  # torch threads per rank
    spin: bool  # every thread has a free core of its own: it may spin before it sleeps
    why: str  # in words, for the run's first line and summary.json
    wait_why: str = ""  # why they spin or sleep, in words
    # the probe's pick of WAITS; None: libgomp's default spin where `spin`, else sleep
    wait: Optional[Mapping[str, str]] = None


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


def decide(n_cores: int, local_ranks: int, busy: Optional[float], asked: int = 0) -> CpuShare:
    """Each of `local_ranks` ranks' threads on `n_cores` cores of which `busy` are in use: `asked`
    (train.threads), else at most its share of the free cores. They spin where every thread
    has a free core of its own, and sleep where they share (a spinning thread holds the core
    a partner needs). The count ddp_lab picks itself leaves one core over for the job's other
    processes (torchrun's agent, the command following the run, each rank's TensorBoard and
    gloo threads) before it spins: load that comes later costs spinning threads 4-20x."""
    share = equal_share(local_ranks, n_cores)
    if busy is None:
        return CpuShare(asked or share, False, f"an equal share of {n_cores} cores, load unknown",
                        "the load is unknown")
    free = max(0, n_cores - round(busy))
    threads = asked or min(share, equal_share(local_ranks, free))
    total = threads * local_ranks
    spin = total <= (free if asked else free - 1)
    many = f"{threads} thread{'s' if threads > 1 else ''}"
    many = f"{local_ranks} ranks x {many}" if local_ranks > 1 else many
    cores_free = f"{free} free core{'s' if free != 1 else ''}"
    if threads == 1:
        wait_why = "1 thread: no team to wait"
    elif spin:
        wait_why = f"{many} on {cores_free}, a core each"
    elif total <= free:
        wait_why = f"{many} on {cores_free}, none over for the job's other processes"
    else:
        wait_why = f"{many} share {cores_free}"
    return CpuShare(threads, spin, f"{free} of {n_cores} cores free at start", wait_why)


def look(local_ranks: int, asked: int = 0,
         probe: Optional[Callable[[int], Optional[list[float]]]] = None) -> CpuShare:
    """`decide` for this machine's `local_ranks` ranks (`asked`: train.threads), looking at the
    load only where it can change the answer: with one core or less a rank and no count asked,
    each runs 1 thread whatever the load. Where the threads may spin, `probe(threads)` (a step's
    seconds under each of WAITS, or None) picks how they wait, unless you set it."""
    n = cores()
    if equal_share(local_ranks, n) == 1 and asked <= 1:
        ranks = f"{local_ranks} rank{'s' if local_ranks > 1 else ''}"
        return CpuShare(1, False, f"{n} cores for {ranks}", "1 thread: no team to wait")
    share = decide(n, local_ranks, busy_cores(), asked)
    if probe is None or not share.spin or share.threads == 1 or wait_is_yours(os.environ):
        return share
    t0 = time.perf_counter()
    seconds = probe(share.threads)
    return pick_wait(share, seconds, time.perf_counter() - t0)


def pick_wait(share: CpuShare, seconds: Optional[list[float]], took_s: float) -> CpuShare:
    """`share` waiting as the fastest of WAITS by `seconds` (a step's, each), or the gentlest
    within 5% of it; where the probe failed (None), libgomp's default spin, and why."""
    if seconds is None:
        return replace(share, wait_why=f"{share.wait_why}; the wait probe failed, libgomp's "
                                       "default")
    best = min(seconds)
    pick = next(i for i, s in enumerate(seconds) if s <= 1.05 * best)
    figures = ", ".join(f"{s * 1e3:.2f} ms {name}" for (name, _), s in zip(WAITS, seconds))
    return replace(share, wait=WAITS[pick][1],
                   wait_why=f"{share.wait_why}; a training step took {figures} (timed before "
                            f"the ranks, {took_s:.1f} s)")


def apply(share: CpuShare, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Hand `share` to this machine's ranks: call before torch loads (libgomp reads its variables
    once) and before the ranks start. The user's own OpenMP variables stand."""
    env = os.environ if environ is None else environ
    env[THREADS_VAR], env[WHY_VAR] = str(share.threads), share.why
    wait = share.wait if share.wait is not None else ({} if share.spin else SLEEP)
    _set_wait(env, wait, share.wait_why)


def prepare_rank(environ: Optional[MutableMapping[str, str]] = None) -> None:
    """In a rank, before torch: without a launcher's choice, threads sleep (unless you chose)."""
    env = os.environ if environ is None else environ
    if THREADS_VAR not in env:
        _set_wait(env, SLEEP, "no launcher looked at the cores (its ranks start beside each other)")


def wait_is_yours(env: Mapping[str, str]) -> bool:
    """Whether `env` sets libgomp's wait itself: then it stands, and nothing is timed."""
    return any(k in env for k in USER_WAIT_VARS)


def _set_wait(env: MutableMapping[str, str], wait: Mapping[str, str], why: str) -> None:
    """Threads wait as libgomp's variables `wait` say, for `why`; the user's own stand."""
    if wait_is_yours(env):
        env[WAIT_WHY_VAR] = "as you set it"
        return
    env[WAIT_WHY_VAR] = why
    env.update(wait)


MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory(environ: Optional[Mapping[str, str]] = None) -> bool:
    """In a rank: glibc's malloc keeps the blocks a step frees for the next step. By its own rule
    it maps blocks over a threshold (128 KB, rising as it frees them, to 32 MB at most) afresh
    and hands freed memory at the heap's top back to the kernel: a forked rank faulted about
    20,000 pages in during the default run's first epoch, 10% of that epoch, and about 1,000
    with the thresholds set here (the kernel's count; docs/performance.md): blocks under 64 MB
    from the heap, up to 256 MB freed at its top kept, as a jemalloc or tcmalloc preload would.
    The user's own malloc variables stand; False where it did nothing (another libc, or
    yours)."""
    env = os.environ if environ is None else environ
    if any(k in env for k in MALLOC_VARS) or "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        # mallopt(3): M_MMAP_THRESHOLD -3, M_TRIM_THRESHOLD -1, M_TOP_PAD -2; each 1 if done
        return all(libc.mallopt(param, value) == 1
                   for param, value in ((-3, 64 << 20), (-1, 256 << 20), (-2, 64 << 20)))
    except (OSError, AttributeError):
        return False


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
    """How this process's OpenMP threads wait, in words (the variables libgomp read), and why
    where the launcher said."""
    env = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in env:
        how = f"spin {env['GOMP_SPINCOUNT']} times, then sleep"
    else:
        how = {"PASSIVE": "sleep", "ACTIVE": "spin"}.get(env.get("OMP_WAIT_POLICY", "").upper(),
                                                         "spin a moment, then sleep")
    return f"{how}: {env[WAIT_WHY_VAR]}" if env.get(WAIT_WHY_VAR) else how
