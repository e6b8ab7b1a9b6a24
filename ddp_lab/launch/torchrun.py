"""`python -m ddp_lab.launch.torchrun --log=FILE [torchrun's arguments]`: torchrun, with its
own failure traceback kept in FILE (the run folder's logs/torchrun.log), not the console.

When a rank fails, the console has already said which rank and why: the rank's own line,
then `python -m ddp_lab`'s diagnosis. torchrun would end it with a ~30-line traceback of
its `ChildFailedError`. Here that traceback goes to FILE, and the console gets one line
saying where it is. Nothing else changes: this is torchrun's own `main` in this process,
so its signal handling is its own, and the ranks write to the console directly (the
descriptors they inherit), in real time as under plain torchrun. torchrun's log lines
(warnings, "failed (exitcode: ...)") still reach the console, and FILE too.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from pathlib import Path


def one_line(e: BaseException) -> str:
    """What went wrong, in one line: a `ChildFailedError` by its first failed rank (the
    root cause), any other exception by its type and first line."""
    failures = getattr(e, "failures", None)
    if failures:
        rank, first = e.get_first_failure()  # type: ignore[attr-defined]
        how = (f"signal {first.signal_name()}" if first.exitcode < 0
               else f"exit code {first.exitcode}")
        return (f"{e.name} failed: rank {rank} first ({how}), "  # type: ignore[attr-defined]
                f"{len(failures)} process(es) in all")
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or not argv[0].startswith("--log="):
        sys.exit("usage: python -m ddp_lab.launch.torchrun --log=FILE [torchrun arguments]")
    path, args = Path(argv[0].removeprefix("--log=")), argv[1:]
    path.parent.mkdir(parents=True, exist_ok=True)
    from torch.distributed import run as torchrun  # torch loads only in the job, not at import

    with open(path, "a") as log:  # appended: a restart or `bash launch.sh` again adds to it
        log.write(f"--- torchrun {' '.join(args)}  ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        log.flush()
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("torch.distributed.elastic").addHandler(handler)
        try:
            torchrun.main(args)
        except Exception as e:  # ChildFailedError, SignalException, a rendezvous error, ...
            traceback.print_exc(file=log)
            log.flush()
            print(f"[torchrun] {one_line(e)}; torchrun's traceback: {path}",
                  file=sys.stderr, flush=True)
            return 1  # what torchrun exits with when its main raises
    return 0


if __name__ == "__main__":
    sys.exit(main())
