"""`python -m ddp_lab.nccl_env`: NCCL's network settings for this node. Slingshot (CXI NICs: CSCS's
aws-ofi-nccl settings, `SLINGSHOT`), RoCE / InfiniBand (RDMA devices: NCCL_IB_GID_INDEX,
NCCL_IB_HCA, socket threads), or none (sockets); docs/nccl_env.md says how each is chosen.

    eval "$(python -m ddp_lab.nccl_env)"            # export lines on stdout, '# ...' on stderr
    python -m ddp_lab.nccl_env --format json        # {"env": {...}, "warnings": [...], ...}

First what the node's sysfs says (`scan`: `class/cxi`, and every RDMA device under
`class/infiniband` with its ports' link layers and GIDs), then what NCCL is told. A missing or odd
tree gives warnings, never an error: exit status 0 even without a device (informational), 2 on bad
arguments. The launchers' scripts (slurm, runai) run it on every node.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_GID_RE = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")


@dataclass
class Gid:
    device: str
    port: int
    index: int
    gid: str
    type: str | None  # file content, e.g. "RoCE v2"; None if unreadable

    @property
    def is_ipv4(self) -> bool:
        return self.gid.startswith(IPV4_MAPPED_PREFIX)

    @property
    def is_roce_v2(self) -> bool:
        return self.type is not None and self.type.strip().lower() == "roce v2"


@dataclass
class Port:
    device: str
    port: int
    link_layer: str | None = None  # "Ethernet" (RoCE) / "InfiniBand"; None if absent
    gids: list[Gid] = field(default_factory=list)


@dataclass
class Scan:
    ports: list[Port] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def usable(self) -> list[Gid]:
        """GIDs that are IPv4-mapped and RoCE v2, in scan order."""
        return [g for p in self.ports for g in p.gids if g.is_ipv4 and g.is_roce_v2]


def _read(path: Path) -> tuple[str | None, str]:
    """(file content stripped of NULs and whitespace, '') or (None, why it cannot be read)."""
    try:
        return path.read_bytes().decode("ascii").replace("\x00", "").strip(), ""
    except (OSError, UnicodeError) as e:
        return None, str(getattr(e, "strerror", None) or e)


def _numeric_children(d: Path, what: str, warnings: list[str]) -> list[tuple[int, Path]]:
    try:
        children = list(d.iterdir())
    except OSError as e:
        warnings.append(f"cannot list {d}: {e.strerror or e}")
        return []
    warnings += [f"ignoring {what} entry with non-numeric name: {c}"
                 for c in children if not c.name.isdigit()]
    return sorted((int(c.name), c) for c in children if c.name.isdigit())


def _hca_matches(name: str, spec: str | None) -> bool:
    """NCCL_IB_HCA semantics: comma list, prefix match, '=' exact, '^' excludes; ':port' ignored."""
    if not spec:
        return True
    spec = spec.strip()
    exclude, spec = spec.startswith("^"), spec.removeprefix("^")
    exact, spec = spec.startswith("="), spec.removeprefix("=")
    entries = [e.split(":", 1)[0].strip() for e in spec.split(",") if e.strip()]
    hit = any((name == e) if exact else name.startswith(e) for e in entries)
    return not hit if exclude else hit


def scan(sysfs_root: str | os.PathLike = "/sys", hca: str | None = None) -> Scan:
    """Read every device/port/GID under <sysfs_root>/class/infiniband (never raises)."""
    root = Path(sysfs_root)
    ib = root / "class" / "infiniband"
    res = Scan()
    devices = []
    try:
        devices = sorted(d for d in ib.iterdir() if _hca_matches(d.name, hca))
    except FileNotFoundError:
        pass
    except OSError as e:
        res.warnings.append(f"cannot list {ib}: {e.strerror or e}")
    res.devices = [d.name for d in devices]
    for dev in devices:
        ports_dir = dev / "ports"
        if not ports_dir.is_dir():
            res.warnings.append(f"{dev.name}: no ports directory ({ports_dir})")
            continue
        for pnum, pdir in _numeric_children(ports_dir, "port", res.warnings):
            port = Port(device=dev.name, port=pnum)
            res.ports.append(port)
            port.link_layer = _read(pdir / "link_layer")[0]
            gids_dir = pdir / "gids"
            if not gids_dir.is_dir():
                res.warnings.append(f"{dev.name} port {pnum}: no gids directory")
                continue
            for idx, gpath in _numeric_children(gids_dir, "gid", res.warnings):
                gid, why = _read(gpath)
                if gid is None:
                    res.warnings.append(f"{dev.name} port {pnum}: unreadable GID {gpath}: {why}")
                    continue
                gid = gid.lower()
                if gid in (ZERO_GID, ""):  # unused (its type file is usually unreadable: EINVAL)
                    continue
                if not _GID_RE.match(gid):
                    res.warnings.append(f"{dev.name} port {pnum}: garbled GID {idx} "
                                        f"in {gpath}: {gid[:60]!r}")
                    continue
                tpath = pdir / "gid_attrs" / "types" / str(idx)
                gtype, why = _read(tpath)
                if gtype is None and gid.startswith(IPV4_MAPPED_PREFIX):
                    res.warnings.append(f"{dev.name} port {pnum}: IPv4 GID {idx} has unreadable "
                                        f"type {tpath}: {why}")
                port.gids.append(Gid(dev.name, pnum, idx, gid, gtype))
    return res


def network_kind(sysfs_root: str | os.PathLike = "/sys") -> tuple[str, list[str]]:
    """(slingshot | infiniband | roce | sockets, the devices that say so) from sysfs."""
    try:
        cxi = sorted(d.name for d in (Path(sysfs_root) / "class" / "cxi").iterdir())
    except OSError:
        cxi = []
    if cxi:
        return "slingshot", cxi
    sc = scan(sysfs_root)  # the RDMA devices and their ports' link layers
    if not sc.devices:
        return "sockets", []
    layers = {p.link_layer.lower() for p in sc.ports if p.link_layer}
    return ("infiniband" if layers == {"infiniband"} else "roce"), list(sc.devices)


#: CSCS's NCCL settings for Slingshot (docs.cscs.ch, "NCCL"; the container engine's aws_ofi_nccl
#: hook sets the same when the EDF enables it): variable -> (value, why)
SLINGSHOT = {
    "NCCL_NET": ("AWS Libfabric", "the aws-ofi-nccl plugin, or fail at start: no silent "
                                  "fallback to TCP sockets"),
    "NCCL_NET_GDR_LEVEL": ("PHB", "GPUDirect RDMA when GPU and NIC share a PCI host bridge"),
    "NCCL_CROSS_NIC": ("1", "rings and trees may span the node's NICs"),
    "FI_CXI_DISABLE_HOST_REGISTER": ("1", "no host memory registration (hangs with CUDA)"),
    "FI_MR_CACHE_MONITOR": ("userfaultfd", "a memory registration cache that CUDA memory "
                                           "does not break"),
    "FI_CXI_DEFAULT_CQ_SIZE": ("131072", "a completion queue that NCCL's bursts do not overflow"),
    "FI_CXI_DEFAULT_TX_SIZE": ("32768", "a send queue to match"),
    "FI_CXI_RX_MATCH_MODE": ("software", "receives matched in software once the NIC's lists "
                                         "are full"),
}

DEFAULT_SOCKET_NTHREADS = 4
DEFAULT_NSOCKS_PERTHREAD = 8


@dataclass
class NcclEnv:
    """Result; unpacks as ``env, warnings = nccl_rdma_env(...)``."""

    env: dict[str, str]
    warnings: list[str]
    info: list[str] = field(default_factory=list)  # what was chosen and why (not problems)
    devices: list[str] = field(default_factory=list)  # devices scanned (after --hca filter)
    usable: list[Gid] = field(default_factory=list)  # IPv4-mapped RoCE v2 GIDs, scan order
    chosen: Gid | None = None  # the GID that fixed NCCL_IB_GID_INDEX

    def __iter__(self) -> Iterator:
        return iter((self.env, self.warnings))


def nccl_rdma_env(
    sysfs_root: str | os.PathLike = "/sys",
    hca: str | None = None,
    socket_nthreads: int | None = DEFAULT_SOCKET_NTHREADS,
    nsocks_perthread: int | None = DEFAULT_NSOCKS_PERTHREAD,
) -> NcclEnv:
    """NCCL env vars for RDMA over RoCE v2 / IB, plus warnings. `hca`: NCCL_IB_HCA instead of the
    detected devices (detection keeps those it matches); None leaves a variable unset."""
    sc = scan(sysfs_root, hca)
    warnings, env, info = list(sc.warnings), {}, []
    usable = sc.usable()
    chosen = usable[0] if usable else None
    ib_link = sorted({p.device for p in sc.ports if (p.link_layer or "").lower() == "infiniband"})
    same_idx = {g.device for g in usable if g.index == chosen.index} if chosen else set()
    other = sorted({g.device for g in usable} - same_idx)
    hca_devices = [d for d in sc.devices if d in same_idx or d in ib_link]
    if not sc.devices:
        what = f"matching NCCL_IB_HCA={hca!r} " if hca else ""
        warnings.append(f"no RDMA device {what}under {Path(sysfs_root) / 'class' / 'infiniband'}: "
                        "RDMA off, NCCL falls back to sockets")
    elif chosen is not None:
        env["NCCL_IB_GID_INDEX"] = str(chosen.index)
        info.append(f"NCCL_IB_GID_INDEX={chosen.index}: RoCE v2 IPv4-mapped GID of "
                    f"device {chosen.device} port {chosen.port} ({chosen.gid})")
        for d in other:
            idxs = sorted({g.index for g in usable if g.device == d})
            warnings.append(f"{d}: usable RoCE v2 IPv4 GID only at index(es) {idxs}, not "
                            f"{chosen.index}; left out of NCCL_IB_HCA (NCCL_IB_GID_INDEX "
                            "is one value for all devices)")
        warnings += [f"{_why_no_gid(sc, [d])}; left out of NCCL_IB_HCA" for d in sc.devices
                     if d not in hca_devices and d not in other]
    else:
        if ib_link:
            info.append(f"InfiniBand link layer on {','.join(ib_link)}: no GID index needed")
        roce_devices = [d for d in sc.devices if d not in ib_link]
        if roce_devices:
            warnings.append(_why_no_gid(sc, roce_devices)
                            + ": NCCL_IB_GID_INDEX not set (NCCL uses its default; "
                            "RDMA may fail or fall back to sockets)")
    if hca:  # an explicit override is exported even when sysfs shows nothing
        env["NCCL_IB_HCA"] = hca
    elif hca_devices:
        env["NCCL_IB_HCA"] = ",".join(hca_devices)
    elif sc.devices:
        warnings.append("no usable RDMA device: NCCL_IB_HCA not set")
    if socket_nthreads is not None:
        env["NCCL_SOCKET_NTHREADS"] = str(int(socket_nthreads))
    if nsocks_perthread is not None:
        env["NCCL_NSOCKS_PERTHREAD"] = str(int(nsocks_perthread))
    if socket_nthreads and nsocks_perthread and socket_nthreads * nsocks_perthread > 64:
        warnings.append(f"NCCL_SOCKET_NTHREADS*NCCL_NSOCKS_PERTHREAD = "
                        f"{socket_nthreads * nsocks_perthread} > 64: NCCL caps the product at 64")
    if "NCCL_IB_HCA" in env:
        info.append(f"NCCL_IB_HCA={env['NCCL_IB_HCA']}" + (" (override)" if hca else ""))
    return NcclEnv(env, warnings, info=info, devices=sc.devices, usable=usable, chosen=chosen)


def _why_no_gid(sc: Scan, devices: Sequence[str]) -> str:
    gids = [g for p in sc.ports if p.device in devices for g in p.gids]
    if not gids:
        return f"no GID found on {','.join(devices)}"
    v4 = [g for g in gids if g.is_ipv4]
    v2 = [g for g in gids if g.is_roce_v2]
    if not v4 and v2:
        return (f"only IPv6 RoCE v2 GIDs on {','.join(devices)} (indices "
                f"{sorted({g.index for g in v2})}); no IPv4-mapped GID")
    if v4 and not any(g.is_roce_v2 for g in v4):
        types = sorted({g.type or "unreadable" for g in v4})
        return (f"IPv4-mapped GIDs on {','.join(devices)} are not RoCE v2 (types: "
                f"{', '.join(types)}): RoCE v1 only")
    return f"no GID that is both IPv4-mapped and RoCE v2 on {','.join(devices)}"


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {v}")
    return v


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ddp_lab.nccl_env",
        description="Print NCCL env vars for RDMA (RoCE v2 GID index, HCA). "
                    "Use: eval \"$(python -m ddp_lab.nccl_env)\"")
    ap.add_argument("--sysfs-root", default="/sys",
                    help="sysfs mount to read (default /sys; devices under "
                         "<root>/class/infiniband)")
    ap.add_argument("--hca", action="append", metavar="HCA",
                    help="NCCL_IB_HCA override (e.g. mlx5 or mlx5_0,mlx5_1; repeatable); "
                         "also restricts GID detection to matching devices")
    ap.add_argument("--socket-nthreads", type=_positive_int, default=DEFAULT_SOCKET_NTHREADS,
                    help="NCCL_SOCKET_NTHREADS (default %(default)s)")
    ap.add_argument("--nsocks-perthread", type=_positive_int, default=DEFAULT_NSOCKS_PERTHREAD,
                    help="NCCL_NSOCKS_PERTHREAD (default %(default)s)")
    ap.add_argument("--format", choices=("export", "json"), default="export",
                    help="export: shell lines for eval, warnings on stderr as '# ...'; "
                         "json: one object on stdout")
    args = ap.parse_args(argv)

    hca = ",".join(h.strip() for h in args.hca if h.strip()) if args.hca else None
    if args.hca is not None and not hca:
        ap.error("--hca must not be empty")
    kind, devices = network_kind(args.sysfs_root)
    if kind == "slingshot" and not hca:
        res = NcclEnv({k: v for k, (v, _) in SLINGSHOT.items()}, [],
                      info=[f"{k}={v}: {why}" for k, (v, why) in SLINGSHOT.items()])
    else:
        res = nccl_rdma_env(args.sysfs_root, hca=hca, socket_nthreads=args.socket_nthreads,
                            nsocks_perthread=args.nsocks_perthread)
    res.info.insert(0, f"network: {kind}" + (f" ({', '.join(devices)})" if devices else ""))
    if args.format == "json":
        json.dump({"network": kind, "env": res.env, "warnings": res.warnings, "info": res.info,
                   "devices": res.devices, "usable_gids": [asdict(g) for g in res.usable],
                   "chosen": asdict(res.chosen) if res.chosen else None}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join([f"# {line}" for line in res.info]
                        + [f"# WARNING: {w}" for w in res.warnings]), file=sys.stderr)
        sys.stdout.write("".join(f"export {k}={shlex.quote(v)}\n" for k, v in res.env.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
