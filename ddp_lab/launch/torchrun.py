"""`python -m ddp_lab.launch.torchrun --log=FILE [torchrun's arguments]`: torchrun's own `main`,
with its ~30-line `ChildFailedError` traceback kept in FILE (logs/torchrun.log) and one line on the
console saying where (which rank failed, the console said already). CPU ranks start as forks of
this process, which has imported torch (`fork_ranks`); DDP_LAB_FRESH_RANKS=1 starts them as fresh
interpreters, as on a GPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

from ..world import cpu
from ..world.env import AGENT_SIGNALS, set_parent_death_signal

# the entries this torchrun may fork ranks of, with what each imports first, once here (torch,
# torch._dynamo: ~5 s of CPU a rank; docs/performance.md)
FORK_PRELOAD = {"ddp_lab.worker": ("torch._dynamo", "ddp_lab.train", "ddp_lab.rank.checkpoint"),
                "ddp_lab.bench.worker": ("torch._dynamo", "ddp_lab.bench.harness")}
FRESH_RANKS = "DDP_LAB_FRESH_RANKS"  # "1": never fork, ranks start as on a GPU


def fork_ranks(args) -> bool:
    """Start CPU ranks of ddp_lab's entries as forks of this process (`--run-path`, `--start-method
    fork`), after importing what they would import first. GPU ranks stay fresh interpreters: CUDA
    cannot be used in a fork of a process that touched it."""
    preload = FORK_PRELOAD.get(args.training_script) if args.module else None
    if preload is None or os.environ.get(FRESH_RANKS) == "1" or len(args.training_script_args) != 1:
        return False
    from ..config import device_type, load_run_config
    from ..world.env import gpu_devices_present

    run_dir = Path(args.training_script_args[0])
    try:
        device = load_run_config(run_dir).dist.device
    except Exception:  # noqa: BLE001 -- the rank will say what is wrong with the folder
        return False
    if device_type(device, gpu_devices_present()) != "cpu":
        return False
    for module in preload:
        importlib.import_module(module)
    args.training_script = importlib.util.find_spec(args.training_script).origin
    args.module, args.run_path, args.start_method = False, True, "fork"
    _forked_entry()
    # a forked rank that fails is logged with torch's own traceback of noticing it (a
    # ProcessExitedException); a fresh interpreter's, in one line: keep the line
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_no_traceback)
    return True


def _forked_entry() -> None:
    """The entry each forked rank runs: this process's signal handlers first (the ones a fresh
    interpreter would have: the agent installs its own once it starts), and `sys.exit(rc)`'s 0
    turned into a return (torch 2.2 lets `SystemExit(0)` end a forked rank with no result, and its
    agent waits for ever)."""
    from torch.distributed import run as torchrun

    run_path = torchrun.run_script_path
    if getattr(run_path, "forked_entry", False):
        return
    before = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}

    def run_script_path(training_script: str, *training_script_args: str):
        for sig, handler in before.items():
            signal.signal(sig, handler)
        try:
            return run_path(training_script, *training_script_args)
        except SystemExit as e:
            if e.code not in (0, None):
                raise
            return None

    run_script_path.forked_entry = True  # type: ignore[attr-defined]
    torchrun.run_script_path = run_script_path  # read by torchrun's config_from_args


def _no_traceback(record: logging.LogRecord) -> bool:
    record.exc_info, record.exc_text = None, None
    return True


def one_line(e: BaseException, entry: str, forked: bool = False) -> str:
    """What went wrong, in one line: a `ChildFailedError` by its first failed rank, any other
    exception by its type and first line. With forked ranks torchrun may name a rank other than the
    root cause (the ranks' own lines name that)."""
    failures = getattr(e, "failures", None)
    if failures:
        rank, first = e.get_first_failure()  # type: ignore[attr-defined]
        how = (f"signal {first.signal_name()}" if first.exitcode < 0
               else f"exit code {first.exitcode}")
        if forked:
            return f"{entry} failed: rank {rank} ended with {how} (the first exit torchrun saw)"
        return f"{entry} failed: rank {rank} first ({how}), {len(failures)} process(es) in all"
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def nproc_per_node(args: list[str]) -> int:
    """torchrun's --nproc-per-node among `args`, before torch loads; 1 if absent or no number."""
    found = re.search(r"(?:^| )--nproc(?:-per-|_per_)node[= ](\S*)", " ".join(args))
    return int(found.group(1)) if found and found.group(1).isdigit() else 1


def training_run(args: list[str]) -> tuple[Optional[Path], int]:
    """The CPU training run whose folder ends torchrun's arguments (None: no run folder there,
    one that trains no model, as the bench's, or one that trains on a GPU, whose CPU threads
    are not its step) and its train.threads (0: not asked), read before torch loads."""
    config = Path(args[-1]) / "config.yaml" if args else None
    if config is None or not config.is_file():
        return None, 0
    from omegaconf import OmegaConf

    from ..config import device_type
    from ..world.env import gpu_devices_present

    cfg = OmegaConf.load(config)
    threads = OmegaConf.select(cfg, "train.threads", default=0)
    threads = threads if isinstance(threads, int) and threads > 0 else 0
    device = str(OmegaConf.select(cfg, "dist.device", default="auto"))
    if OmegaConf.select(cfg, "model.name") is None or \
            device_type(device, gpu_devices_present()) != "cpu":
        return None, threads
    return config.parent, threads


def probe_waits(run_dir: Path, threads: int, world: int,
                timeout_s: float = 60.0) -> Optional[list[float]]:
    """A step of the run in `run_dir` at `threads` threads in a world of `world`, in seconds,
    under each of `cpu.WAITS`: one `python -m ddp_lab.launch.wait_probe` each, one after the
    other, before any rank runs (libgomp reads its wait once, as torch loads). None if one fails."""
    base = {k: v for k, v in os.environ.items() if k not in cpu.USER_WAIT_VARS}
    seconds = []
    for _, wait in cpu.WAITS:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "ddp_lab.launch.wait_probe", str(run_dir), str(threads),
                 str(world)], env={**base, **wait}, capture_output=True, text=True,
                timeout=timeout_s, check=True,
                preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL))
            seconds.append(float(done.stdout.split()[-1]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None
    return seconds


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or not argv[0].startswith("--log="):
        sys.exit("usage: python -m ddp_lab.launch.torchrun --log=FILE [torchrun arguments]")
    path, args = Path(argv[0].removeprefix("--log=")), argv[1:]
    path.parent.mkdir(parents=True, exist_ok=True)
    # before torch loads (libgomp reads its variables once) and before any rank runs: this
    # machine's cores free now, shared among its ranks, and where each thread has a core of its
    # own, the wait that runs the run's step fastest (ddp_lab/world/cpu.py); the forks inherit it
    ranks = nproc_per_node(args)
    run_dir, asked = training_run(args)
    probe = (lambda threads: probe_waits(run_dir, threads, ranks)) if run_dir else None
    cpu.apply(cpu.look(ranks, asked, probe))
    # the agent looks at its ranks every 0.1 s, as torch >= 2.4 does (2.2, 2.3: 5 s); a
    # PET_MONITOR_INTERVAL set by the user wins
    os.environ.setdefault("PET_MONITOR_INTERVAL", "0.1")
    from torch.distributed import run as torchrun  # torch loads only in the job, not at import
    from torch.distributed.elastic.multiprocessing.errors import record

    parsed = torchrun.parse_args(args)
    entry = parsed.training_script  # the module the ranks run: how failures name them

    # appended: a restart or `bash launch.sh` again adds to it
    with open(path, "a") as log:
        log.write(f"--- torchrun {' '.join(args)}  ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        log.flush()
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("torch.distributed.elastic").addHandler(handler)
        forked = False
        try:
            forked = fork_ranks(parsed)
            # a fresh `python -u -m ENTRY`: whole lines too
            if not forked and parsed.module:
                parsed.training_script_args = [parsed.training_script, *parsed.training_script_args]
                parsed.training_script = "ddp_lab.rank.main"
            # nothing buffered here may be written again by the forks
            sys.stdout.flush()
            sys.stderr.flush()
            record(torchrun.run)(parsed)  # torchrun's main: its own error goes to its file
        except Exception as e:  # ChildFailedError, SignalException, a rendezvous error, ...
            traceback.print_exc(file=log)
            log.flush()
            print(f"[torchrun] {one_line(e, entry, forked)}; torchrun's traceback: {path}",
                  file=sys.stderr, flush=True)
            return 1  # what torchrun exits with when its main raises
    return 0


if __name__ == "__main__":
    sys.exit(main())
