"""MNIST on disk: a guarded fetch, every file verified by its MD5 before it is used
(docs/failures.md, "The dataset files are damaged"; reading them into tensors: data.py).

One fetcher per shared `data.root` (global rank 0; with `data.node_local=true` local rank 0 of
each node); the others wait on an all-reduce of a status flag, not a bare barrier, so a failed
fetch fails every rank at once, with the reason. Every file is written under a temporary name,
verified (the archive's MD5, or the extracted content's) and only then renamed into place. Every
start checks the extracted files' MD5 again (0.1 s): a flipped byte keeps the idx header's size,
so a size check would train on it."""

from __future__ import annotations

import gzip
import logging
import math
import os
import shutil
import struct
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

from .world.distributed import DistContext
from .folder.files import atomic_open, file_hash

log = logging.getLogger("ddp_lab")

EMBEDDED = Path(__file__).resolve().parent / "assets" / "mnist"
# (archive, md5) -- the same files and sums as MNIST.resources
RESOURCES = [
    ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
    ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
    ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
    ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
]
# the MD5 of each archive's decompressed content (`gunzip -c NAME.gz | md5sum` of the four
# official files above): the extracted files are checked against these, not against disk
EXTRACTED_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}


class DataError(RuntimeError):
    """The dataset could not be fetched or read; the message says which file and why."""


def raw_folder(root: str | Path) -> Path:
    return Path(root) / "MNIST" / "raw"


def md5sum(path: Path) -> str:
    return file_hash(path, "md5")


def idx_expected_size(path: Path) -> Optional[int]:
    """The size an idx file must have according to its own header (None: bad header)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0:
                return None
            ndim = head[3]
            dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
    except (OSError, struct.error):
        return None
    return 4 + 4 * ndim + math.prod(dims)


def idx_is_valid(path: Path) -> bool:
    return path.is_file() and idx_expected_size(path) == path.stat().st_size


def _fetch_one(name: str, md5: str, mirror: str, dest: Path) -> None:
    """Fetch one archive from one mirror to a temp name, check its MD5, rename into place."""
    # renamed into place only if the MD5 matches
    with atomic_open(dest, "wb") as out:
        if mirror == "embedded" or not mirror.startswith(("http://", "https://")):
            src = EMBEDDED if mirror == "embedded" else Path(mirror.removeprefix("file://"))
            if not (src / name).is_file():
                raise DataError(f"{src / name} does not exist")
            with open(src / name, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
        else:
            # one plain GET (torchvision's download_url adds a redirect probe per file)
            url = mirror.rstrip("/") + "/" + name
            with urllib.request.urlopen(url, timeout=60) as resp:
                shutil.copyfileobj(resp, out, 1 << 20)
        out.flush()
        got = md5sum(Path(out.name))
        if got != md5:
            raise DataError(f"{name} from {mirror} has MD5 {got}, expected {md5} "
                            "(corrupt or partial)")


def _fetch(name: str, md5: str, mirrors: Sequence[str], dest: Path) -> str:
    """Fetch one archive from the first mirror that serves it intact; returns that mirror."""
    errors = []
    for mirror in mirrors:
        try:
            _fetch_one(name, md5, mirror, dest)
            return mirror
        except (DataError, OSError, urllib.error.URLError, RuntimeError) as e:
            errors.append(f"  {mirror}: {e}")
    raise DataError(f"could not fetch {name} into {dest.parent} from any mirror:\n"
                    + "\n".join(errors)
                    + "\nfix: set data.mirrors to a reachable mirror (default: [embedded]), or "
                    "copy the four MNIST .gz files into that folder")


def _extract(archive: Path) -> Path:
    """Decompress an archive to a temp name, check the content's MD5, rename it into place
    (over a damaged file, if there is one)."""
    out = archive.with_suffix("")  # drop .gz
    want = EXTRACTED_MD5[out.name]
    try:
        with atomic_open(out, "wb") as dst, gzip.open(archive, "rb") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            got = md5sum(Path(dst.name))
            if got != want:
                raise DataError(f"{archive} extracts to content with MD5 {got}, expected {want}")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot extract {archive}: {e}") from None
    return out


def fetch_mnist(root: str | Path, mirrors: Sequence[str]) -> int:
    """Make `root/MNIST/raw` hold the four extracted files, each with its content's MD5. A
    damaged one is extracted again from its archive, the archive fetched again first if it is
    missing or fails its own MD5. Returns how many archives were fetched (0 when everything was
    already in place)."""
    raw = raw_folder(root)
    raw.mkdir(parents=True, exist_ok=True)
    fetched = 0
    for name, md5 in RESOURCES:
        archive = raw / name
        extracted = archive.with_suffix("")
        if extracted.exists() and md5sum(extracted) == EXTRACTED_MD5[extracted.name]:
            # intact: its archive is checked only when it is needed
            continue
        # else missing: a first extraction, nothing to report
        damaged = extracted.exists()
        source = name
        if archive.exists() and md5sum(archive) != md5:
            bad = archive.with_name(archive.name + ".corrupt")
            log.warning("%s fails its MD5 check: moved to %s, fetching it again", archive,
                        bad.name)
            os.replace(archive, bad)
        if not archive.exists():
            try:
                source += f" (fetched from {_fetch(name, md5, mirrors, archive)})"
            except DataError as e:
                if damaged:  # say why a fetch was needed
                    raise DataError(f"{extracted}: content MD5 mismatch (damaged?); {e}") from None
                raise
            fetched += 1
        _extract(archive)
        if damaged:
            log.warning("%s: content MD5 mismatch (damaged?): extracted again from %s",
                        extracted, source)
    return fetched


def prepare_mnist(root: str | Path, mirrors: Sequence[str], ctx: DistContext,
                  node_local: bool) -> None:
    """The download guard: one fetcher per shared root, the others wait for its verdict."""
    env = ctx.env
    fetcher = env.is_local_main if node_local else env.is_main
    error: Optional[BaseException] = None
    if fetcher:
        try:
            n = fetch_mnist(root, mirrors)
            if n:
                log.info("fetched %d MNIST archive(s) into %s", n, raw_folder(root))
        except BaseException as e:  # noqa: BLE001 -- reported to every rank below
            error = e
    # a barrier that carries a verdict: every rank learns whether any fetcher failed
    if ctx.any_rank(error is not None):
        if error is not None:
            raise error
        who = "local rank 0 of some node" if node_local else "rank 0"
        raise DataError(f"{who} failed to prepare MNIST in {root}: see its log")
    missing = [n for n, _ in RESOURCES
               if not idx_is_valid(raw_folder(root) / n.removesuffix(".gz"))]
    if missing:
        hint = ("data.root is not shared by all nodes: set data.node_local=true"
                if not node_local else "another job may be modifying it")
        raise DataError(f"MNIST files missing or corrupt in {raw_folder(root)} after the fetch: "
                        f"{', '.join(missing)} ({hint})")
