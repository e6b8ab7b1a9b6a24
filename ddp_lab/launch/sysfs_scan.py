"""What a node's sysfs says about its network: HPE Slingshot's CXI NICs
(`class/cxi`), and every RDMA device under `class/infiniband` with its
ports' link layers and GIDs. Never raises: a problem becomes a warning
of the `Scan`. What NCCL is told: nccl_env.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_GID_RE = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")


@dataclass
class Gid:
    device: str
    port: int
    index: int
    gid: str
    # file content, e.g. "RoCE v2"; None if unreadable
    type: str | None

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
    # "Ethernet" (RoCE) / "InfiniBand"; None if absent
    link_layer: str | None = None
    gids: list[Gid] = field(default_factory=list)


@dataclass
class Scan:
    sysfs_root: str
    ports: list[Port] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def usable(self) -> list[Gid]:
        """GIDs that are IPv4-mapped and RoCE v2, in scan order."""
        return [g for p in self.ports for g in p.gids if g.is_ipv4 and g.is_roce_v2]


def _read(path: Path) -> str:
    """File content, stripped of NULs and whitespace; raises
    OSError/UnicodeError."""
    return path.read_bytes().decode("ascii").replace("\x00", "").strip()


def _numeric_children(d: Path, what: str, warnings: list[str]) -> list[tuple[int, Path]]:
    out = []
    try:
        children = list(d.iterdir())
    except OSError as e:
        warnings.append(f"cannot list {d}: {e.strerror or e}")
        return out
    for c in children:
        if c.name.isdigit():
            out.append((int(c.name), c))
        else:
            warnings.append(f"ignoring {what} entry with non-numeric name: {c}")
    return sorted(out)


def _hca_matches(name: str, spec: str | None) -> bool:
    """NCCL_IB_HCA semantics: comma list, prefix match, '=' exact, '^'
    excludes; ':port' ignored."""
    if not spec:
        return True
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    entries = [e.split(":", 1)[0].strip() for e in spec.split(",") if e.strip()]
    hit = any((name == e) if exact else name.startswith(e) for e in entries)
    return not hit if exclude else hit


def scan(sysfs_root: str | os.PathLike = "/sys", hca: str | None = None) -> Scan:
    """Read every device/port/GID under <sysfs_root>/class/infiniband
    (never raises)."""
    root = Path(sysfs_root)
    ib = root / "class" / "infiniband"
    res = Scan(sysfs_root=str(root))
    try:
        devices = sorted(p for p in ib.iterdir())
    except FileNotFoundError:
        devices = []
    except OSError as e:
        res.warnings.append(f"cannot list {ib}: {e.strerror or e}")
        devices = []
    devices = [d for d in devices if _hca_matches(d.name, hca)]
    res.devices = [d.name for d in devices]
    for dev in devices:
        ports_dir = dev / "ports"
        if not ports_dir.is_dir():
            res.warnings.append(f"{dev.name}: no ports directory ({ports_dir})")
            continue
        for pnum, pdir in _numeric_children(ports_dir, "port", res.warnings):
            port = Port(device=dev.name, port=pnum)
            try:
                port.link_layer = _read(pdir / "link_layer")
            except (OSError, UnicodeError):
                port.link_layer = None
            gids_dir = pdir / "gids"
            if not gids_dir.is_dir():
                res.warnings.append(f"{dev.name} port {pnum}: no gids directory")
                res.ports.append(port)
                continue
            for idx, gpath in _numeric_children(gids_dir, "gid", res.warnings):
                try:
                    gid = _read(gpath).lower()
                except (OSError, UnicodeError) as e:
                    res.warnings.append(f"{dev.name} port {pnum}: unreadable GID {gpath}: "
                                        f"{getattr(e, 'strerror', None) or e}")
                    continue
                if gid == ZERO_GID or gid == "":
                    # unused slot (its type file is usually unreadable:
                    # EINVAL)
                    continue
                if not _GID_RE.match(gid):
                    res.warnings.append(f"{dev.name} port {pnum}: garbled GID {idx} "
                                        f"in {gpath}: {gid[:60]!r}")
                    continue
                tpath = pdir / "gid_attrs" / "types" / str(idx)
                try:
                    gtype: str | None = _read(tpath)
                except (OSError, UnicodeError) as e:
                    gtype = None
                    if gid.startswith(IPV4_MAPPED_PREFIX):
                        res.warnings.append(
                            f"{dev.name} port {pnum}: IPv4 GID {idx} has unreadable type "
                            f"{tpath}: {getattr(e, 'strerror', None) or e}")
                port.gids.append(Gid(dev.name, pnum, idx, gid, gtype))
            res.ports.append(port)
    return res


def network_kind(sysfs_root: str | os.PathLike = "/sys") -> tuple[str, list[str]]:
    """(slingshot | infiniband | roce | sockets, the devices that say
    so) from sysfs."""
    try:
        cxi = sorted(d.name for d in (Path(sysfs_root) / "class" / "cxi").iterdir())
    except OSError:
        cxi = []
    if cxi:
        return "slingshot", cxi
    # the RDMA devices and their ports' link layers
    sc = scan(sysfs_root)
    if not sc.devices:
        return "sockets", []
    layers = {p.link_layer.lower() for p in sc.ports if p.link_layer}
    return ("infiniband" if layers == {"infiniband"} else "roce"), list(sc.devices)
