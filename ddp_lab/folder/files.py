"""Files that matter are written atomically: a reader (or a crash) sees the old file or the new
one, never half of one. Everything in ddp_lab that writes a result goes through here."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any, Iterator, Optional


# what a full disk looks like to a writer, in the words a status line uses
DISK_FULL = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
             errno.EROFS: "read-only file system"}


class DiskFull(OSError):
    """A write failed for want of space (or quota, or a writable file system): its message is the
    one line a user needs, `no space left on <folder> (writing <file>)`."""

    def __str__(self) -> str:
        return f"{DISK_FULL[self.errno]} on {Path(self.filename).parent} (writing {Path(self.filename).name})"


def disk_error(e: Optional[BaseException]) -> Optional[OSError]:
    """The out-of-space (quota, read-only) OSError behind `e`, if that is what `e` is (torch.save
    raises a RuntimeError while handling it)."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return e
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w", fsync: bool = False) -> Iterator[IO]:
    """Open a temp file beside `path` (same folder, so the rename stays on one file system); on a
    clean exit rename it over `path`, on an exception remove it. `fsync=True` also makes the data
    and the rename durable (checkpoints: a power cut keeps one of the two)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX
    except Exception as e:
        full = disk_error(e)
        if full is None:
            raise
        raise DiskFull(full.errno, full.strerror, str(path)) from e
    finally:
        tmp.unlink(missing_ok=True)
    if fsync:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the rename itself
        finally:
            os.close(dfd)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def write_json(path: Path, obj: Any) -> None:
    """`obj` as indented, key-sorted JSON, atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def file_hash(path: Path, algorithm: str) -> str:
    """The hex digest of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json_or_empty(path: Path) -> dict:
    """A JSON object file's content; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
