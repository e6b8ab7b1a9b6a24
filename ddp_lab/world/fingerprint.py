"""The allocation's fingerprint: what a run's timings depend on besides its config.

`collect(...)` gives summary.json's `fingerprint`; `fingerprint_id` hashes `ID_FIELDS` into a short
stable id, by which the report groups repeats (`differences` names what differs). NCCL's transport
is parsed from its INFO log (`enable_nccl_debug`, then `read_nccl_transport`). The node's link
(interface, speed, a root `tbf` rate) is asked of the kernel through `ip`/`tc` in the process's own
namespace; only `link_label` is in the id, never a measured rate (docs/network.md, "The link in the
fingerprint").
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from .cpu import cores
from .env import host_address

# the variables that change how collectives run: NCCL's, UCX's and libfabric's (RDMA), gloo's, the
# thread counts, torch's NCCL knobs
ENV_PREFIXES = ("NCCL_", "UCX_", "FI_", "GLOO_", "TORCH_NCCL_", "OMP_", "MKL_")
# set by ddp_lab itself for its own logs (paths change with every run): not part of the id
NOT_IN_ID = {"NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS", "TORCH_FR_DUMP_TEMP_FILE",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE",
             "TORCH_NCCL_DUMP_ON_TIMEOUT"}
# what makes two allocations' timings comparable (not nodes x procs: the report groups by it)
ID_FIELDS = ("cpu", "gpu", "backend", "torch", "nccl", "nccl_network", "link", "env")

_VIA = re.compile(r"\bvia (NET/[A-Za-z0-9_]+|[A-Za-z0-9]+)")
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")  # IB, Socket, AWS Libfabric
_NET_DEVICES = re.compile(r"NCCL INFO (NET/[A-Za-z0-9_]+) ?: Using (.+)$")


# ------------------------------------------------------------------ NCCL's INFO lines
def enable_nccl_debug(run_dir: Path, environ: Optional[dict] = None) -> bool:
    """NCCL's INFO lines into RUN_DIR/logs, set before init_process_group; False (nothing set)
    where the user chose NCCL_DEBUG: their choice stands."""
    environ = os.environ if environ is None else environ
    if environ.get("NCCL_DEBUG"):
        return False
    (Path(run_dir) / "logs").mkdir(parents=True, exist_ok=True)
    environ.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
                    "NCCL_DEBUG_FILE": str(Path(run_dir) / "logs" / "nccl.%h.%p.log")})
    return True


def parse_nccl_info(lines: Iterable[str]) -> dict[str, Any]:
    """What NCCL's INFO lines say: the network it chose ("IB", "Socket", a plugin), that network's
    devices, and the channel connections over each transport (P2P, NET/IB, ...)."""
    network, devices, conns = None, {}, {}
    for line in lines:
        if "NCCL INFO" not in line:
            continue
        if m := _NETWORK.search(line):
            network = m.group(1)
        if m := _NET_DEVICES.search(line.rstrip()):
            devices[m.group(1)] = m.group(2).strip()
        if " Channel " in line and (m := _VIA.search(line)):
            conns[m.group(1)] = conns.get(m.group(1), 0) + 1
    return {"network": network, "net_devices": devices.get(f"NET/{network}") if network else None,
            "connections": dict(sorted(conns.items()))}


def transport_label(parsed: Iterable[Mapping[str, Any]]) -> Optional[str]:
    """One label for the ranks' parsed logs: the transports their peer connections used
    ("NET/IB+P2P"), else "none (network X)" when no rank connected to a peer (one rank); None when
    no log was read."""
    parsed = [p for p in parsed if p]
    if not parsed:
        return None
    kinds = sorted({k for p in parsed for k in p.get("connections", {})})
    if kinds:
        return "+".join(kinds)
    nets = sorted({p["network"] for p in parsed if p.get("network")})
    return f"none (network {'+'.join(nets) or '?'})"


def nccl_lines(run_dir: Path, pid: Optional[int] = None) -> Optional[list[str]]:
    """The lines of this process's NCCL debug files; None without one (gloo, a user's
    NCCL_DEBUG)."""
    pid = os.getpid() if pid is None else pid
    files = sorted((Path(run_dir) / "logs").glob(f"nccl.*.{pid}.log"))
    if not files:
        return None
    lines: list[str] = []
    for f in files:
        try:
            lines += f.read_text(errors="replace").splitlines()
        except OSError:
            continue
    return lines


def read_nccl_transport(run_dir: Path, pid: Optional[int] = None) -> Optional[dict]:
    """Parse this process's NCCL debug file; None without one (gloo, a user's NCCL_DEBUG)."""
    lines = nccl_lines(run_dir, pid)
    return None if lines is None else parse_nccl_info(lines)


# ------------------------------------------------------------------ the fingerprint
def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "?"


# ------------------------------------------------------------------ the node's link
def _json_of(*argv: str) -> Any:
    """The JSON an iproute2 command prints (`ip -j ...`); None when it is missing or fails."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=5)
        return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def iface_with_address(links: Any, address: str) -> Optional[str]:
    """The interface of `ip -j addr show` output that holds `address`."""
    for link in links or []:
        if any(a.get("local") == address for a in link.get("addr_info", [])):
            return link.get("ifname")
    return None


def chosen_iface(environ: Mapping[str, str]) -> Optional[str]:
    """The interface the user told gloo (or NCCL) to use: GLOO_SOCKET_IFNAME, else
    NCCL_SOCKET_IFNAME (its first name; an exclusion list `^lo,docker` names none)."""
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        first = (environ.get(key) or "").split(",")[0].strip().lstrip("=")
        if first and not first.startswith("^"):
            return first
    return None


def uplink(environ: Mapping[str, str]) -> Optional[str]:
    """The interface this node reaches other nodes through (see the module docstring)."""
    if chosen := chosen_iface(environ):
        return chosen
    address = host_address()
    if address and not address.startswith("127."):
        if name := iface_with_address(_json_of("ip", "-j", "addr", "show"), address):
            return name
    routes = _json_of("ip", "-j", "route", "show", "default") or []
    return routes[0].get("dev") if routes else None


def root_tbf(qdiscs: Any) -> dict[str, Any]:
    """The root tbf qdisc's options in `tc -j qdisc show` output (bytes/s); {} if none."""
    for q in qdiscs or []:
        if q.get("root") and q.get("kind") == "tbf" and (q.get("options") or {}).get("rate"):
            return q["options"]
    return {}


def sysfs_speed(iface: str, mac: Optional[str], root: str = "/sys/class/net") -> Optional[int]:
    """The interface's speed in Mbit/s from sysfs, only if sysfs shows this namespace's interface
    (its MAC address is `mac`) and knows a speed (virtual links say -1 or fail)."""
    base = Path(root) / iface
    try:
        if mac is None or (base / "address").read_text().strip() != mac:
            return None
        speed = int((base / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def link(environ: Optional[Mapping[str, str]] = None) -> Optional[dict[str, Any]]:
    """This node's uplink: iface, speed_mbit, shaped_Bps, shaped_burst_B (None where unknown)."""
    iface = uplink(os.environ if environ is None else environ)
    if not iface:
        return None
    info = _json_of("ip", "-j", "link", "show", "dev", iface) or [{}]
    tbf = root_tbf(_json_of("tc", "-j", "qdisc", "show", "dev", iface))
    return {"iface": iface, "speed_mbit": sysfs_speed(iface, info[0].get("address")),
            "shaped_Bps": float(tbf["rate"]) if tbf else None, "shaped_burst_B": tbf.get("burst")}


def link_label(lk: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The link's limit in words, as the id holds it: "tbf 25 MB/s" where shaped, else "10000
    Mbit/s"; None where neither is known (the id is then what it was before links)."""
    if not lk:
        return None
    if lk.get("shaped_Bps"):
        return f"tbf {lk['shaped_Bps'] / 1e6:.4g} MB/s"
    return f"{lk['speed_mbit']} Mbit/s" if lk.get("speed_mbit") else None


def applied_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The network and thread variables in force, but OMP_WAIT_POLICY: ddp_lab sets it from the
    load at start (summary.json `segments[*].cpu` records it), so it would split repeats."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ)
            if k.startswith(ENV_PREFIXES) and k != "OMP_WAIT_POLICY"}


def versions() -> dict[str, Any]:
    """This process's torch, CUDA, NCCL and gloo versions (the fingerprint's, and the doctor's
    software check)."""
    # lazy, as in `collect`: the report compares fingerprints without torch
    import torch
    import torch.distributed as dist

    nccl = None
    # a CPU-only build has no NCCL; a CUDA build without a GPU still reports it
    if dist.is_available() and dist.is_nccl_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 -- the version is informational
            nccl = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "gloo": bool(dist.is_available() and dist.is_gloo_available())}


def collect(backend: str, device: Any, hosts: list[str], launcher: str, nodes: int,
            nproc_per_node: int, nccl_transport: Optional[str] = None,
            nccl_detail: Optional[list] = None,
            environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The fingerprint of this allocation (see the module docstring)."""
    import torch  # lazy: see versions

    dev = torch.device(device) if not isinstance(device, torch.device) else device
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    return {
        "hosts": list(hosts), "cpu": cpu_model(), "cpu_count": cores(), "gpu": gpu,
        **versions(),
        "backend": backend, "device": str(dev), "nccl_transport": nccl_transport,
        "nccl_detail": nccl_detail, "env": applied_env(environ),
        "link": link(environ),
        "python": sys.version.split()[0], "launcher": launcher, "nodes": nodes,
        "nproc_per_node": nproc_per_node,
    }


def id_fields(fp: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that make timings comparable, as fingerprint_id hashes them."""
    return {
        "cpu": fp.get("cpu"), "gpu": fp.get("gpu"),
        "backend": fp.get("backend"), "torch": fp.get("torch"),
        # the NCCL version matters where NCCL runs; a gloo run's timings do not depend on it
        "nccl": fp.get("nccl") if fp.get("backend") == "nccl" else None,
        "nccl_network": "+".join(sorted({d["network"] for d in fp.get("nccl_detail") or []
                                         if isinstance(d, dict) and d.get("network")})) or None,
        "link": link_label(fp.get("link")),
        "env": {k: v for k, v in sorted((fp.get("env") or {}).items()) if k not in NOT_IN_ID},
    }


def fingerprint_id(fp: Mapping[str, Any]) -> str:
    """A short stable hash (10 hex digits) of `id_fields(fp)` (an unknown link left out, so that
    fingerprints from before links were recorded keep their ids)."""
    fields = id_fields(fp)
    if fields["link"] is None:
        del fields["link"]
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints in words ("cpu: X vs Y"), for the report."""
    fa, fb = id_fields(a), id_fields(b)
    out = []
    for k in ID_FIELDS:
        if k == "env":
            keys = sorted(set(fa["env"]) | set(fb["env"]))
            out += [f"env {e}: {fa['env'].get(e, 'unset')} vs {fb['env'].get(e, 'unset')}"
                    for e in keys if fa["env"].get(e) != fb["env"].get(e)]
        elif fa[k] != fb[k]:
            out.append(f"{k}: {fa[k]} vs {fb[k]}")
    return out
