"""The allocation's fingerprint: what a run's timings depend on besides its config.

`collect(...)` gives summary.json's `fingerprint` (hosts, CPU model and the cores this
process may use, GPU name, torch / CUDA /
NCCL versions, gloo availability, backend, device, the NCCL transport in use, the NCCL /
RDMA / threading variables in effect, python, launcher, nodes x procs); `fingerprint_id`
hashes the fields that make timings comparable (CPU/GPU model, host count, backend, torch,
NCCL, transport, env) into a short stable id. The report groups repeats by it and flags a
comparison across two ids, naming the fields that differ (`differences`).

The NCCL transport comes from NCCL's own INFO lines. On nccl, `enable_nccl_debug` (called
before init_process_group) sets NCCL_DEBUG=INFO with NCCL_DEBUG_FILE=RUN_DIR/logs/nccl.%h.%p.log
(a user's own NCCL_DEBUG wins: then no transport is read); after the first collectives
`read_nccl_transport` parses this process's file: "Using network IB", "NET/IB : Using ...",
and the channel lines "... via P2P/CUMEM", "via SHM/direct/direct", "via NET/IB/0/GDRDMA".
The variables ddp_lab.nccl_env exports (NCCL_IB_GID_INDEX, NCCL_IB_HCA, NCCL_SOCKET_NTHREADS,
NCCL_NSOCKS_PERTHREAD) are among ENV_PREFIXES' and land in `env`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

# the variables that change how collectives run: NCCL's, UCX's and libfabric's (RDMA),
# gloo's, the thread counts, torch's NCCL knobs
ENV_PREFIXES = ("NCCL_", "UCX_", "FI_", "GLOO_", "TORCH_NCCL_", "OMP_", "MKL_")
# set by ddp_lab itself for its own logs (paths change with every run): not part of the id
NOT_IN_ID = {"NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS", "TORCH_FR_DUMP_TEMP_FILE",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
             "TORCH_NCCL_DUMP_ON_TIMEOUT"}
# What makes two allocations' timings comparable: the kind of machine and software, not
# the shape of the run (nodes x procs, hence hosts and NCCL's P2P/SHM/NET mix, which the
# report groups by already: a study's world 1 on one node and world 4 on two are one
# allocation). NCCL's network (IB, Socket, a plugin) is the allocation's: it is in.
ID_FIELDS = ("cpu", "gpu", "backend", "torch", "nccl", "nccl_network", "env")

_VIA = re.compile(r"\bvia (NET/[A-Za-z0-9_]+|[A-Za-z0-9]+)")
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")  # IB, Socket, AWS Libfabric
_NET_DEVICES = re.compile(r"NCCL INFO (NET/[A-Za-z0-9_]+) ?: Using (.+)$")


# ------------------------------------------------------------------ NCCL's INFO lines
def nccl_debug_env(run_dir: Path) -> dict[str, str]:
    """NCCL_DEBUG=INFO into RUN_DIR/logs/nccl.<host>.<pid>.log (INIT, NET and ENV lines)."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
            "NCCL_DEBUG_FILE": str(Path(run_dir) / "logs" / "nccl.%h.%p.log")}


def enable_nccl_debug(run_dir: Path, environ: Optional[dict] = None) -> bool:
    """Set `nccl_debug_env` in `environ` (os.environ) before init_process_group. False (and
    nothing set) when the user chose NCCL_DEBUG themselves: their choice stands."""
    environ = os.environ if environ is None else environ
    if environ.get("NCCL_DEBUG"):
        return False
    (Path(run_dir) / "logs").mkdir(parents=True, exist_ok=True)
    environ.update(nccl_debug_env(run_dir))
    return True


def parse_nccl_info(lines: Iterable[str]) -> dict[str, Any]:
    """What NCCL's INFO lines say about its transport: the network it chose ("IB",
    "Socket", a plugin's name), the devices of that network, and how many channel
    connections went over each transport (P2P, SHM, NET/IB, NET/Socket, ...)."""
    network, devices, conns = None, {}, {}
    for line in lines:
        if "NCCL INFO" not in line:
            continue
        m = _NETWORK.search(line)
        if m:
            network = m.group(1)
        m = _NET_DEVICES.search(line.rstrip())
        if m:
            devices[m.group(1)] = m.group(2).strip()
        if " Channel " in line:
            m = _VIA.search(line)
            if m:
                conns[m.group(1)] = conns.get(m.group(1), 0) + 1
    return {"network": network, "net_devices": devices.get(f"NET/{network}") if network else None,
            "connections": dict(sorted(conns.items()))}


def transport_label(parsed: Iterable[Mapping[str, Any]]) -> Optional[str]:
    """One label for the ranks' parsed logs: the transports their peer connections used
    ("NET/IB+P2P"), else "none (network X)" when no rank connected to a peer (one rank);
    None when no log was read."""
    parsed = [p for p in parsed if p]
    if not parsed:
        return None
    kinds = sorted({k for p in parsed for k in p.get("connections", {})})
    if kinds:
        return "+".join(kinds)
    nets = sorted({p["network"] for p in parsed if p.get("network")})
    return f"none (network {'+'.join(nets) or '?'})"


def read_nccl_transport(run_dir: Path, pid: Optional[int] = None) -> Optional[dict]:
    """Parse this process's NCCL debug file (RUN_DIR/logs/nccl.<host>.<pid>.log); None
    when there is none (gloo, or the user's own NCCL_DEBUG)."""
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
    return parse_nccl_info(lines)


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


def cpu_count() -> int:
    """The cores this process may run on (its affinity: a SLURM task's cpus, a container's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def applied_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES)}


def _versions(backend: str) -> dict[str, Any]:
    # lazy, as in `collect`: the report imports this module to compare fingerprints, which
    # needs no torch; only the ranks, which have it loaded, collect one
    import torch
    import torch.distributed as dist

    nccl = None
    if dist.is_available() and dist.is_nccl_available():
        try:  # a CPU-only build has no NCCL; a CUDA build without a GPU still reports it
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
    import torch  # lazy: see _versions

    dev = torch.device(device) if not isinstance(device, torch.device) else device
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    return {
        "hosts": list(hosts), "cpu": cpu_model(), "cpu_count": cpu_count(), "gpu": gpu,
        **_versions(backend),
        "backend": backend, "device": str(dev), "nccl_transport": nccl_transport,
        "nccl_detail": nccl_detail, "env": applied_env(environ),
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
        "env": {k: v for k, v in sorted((fp.get("env") or {}).items()) if k not in NOT_IN_ID},
    }


def fingerprint_id(fp: Mapping[str, Any]) -> str:
    """A short stable hash (10 hex digits) of `id_fields(fp)`."""
    blob = json.dumps(id_fields(fp), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints, in words ("cpu: X vs Y", "env NCCL_IB_HCA:
    mlx5_0 vs unset"): the line the report prints under a cross-fingerprint comparison."""
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
