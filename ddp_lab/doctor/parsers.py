"""What NVIDIA's tools print, read: NCCL's INFO lines (the transport
NCCL chose) and `nvidia-smi topo -m` (how each GPU reaches each NIC).
Pure text in, dicts out: no torch, no GPU; tests feed them the formats
NVIDIA documents.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from ..world.fingerprint import parse_nccl_info

# ------------------------------------------------------------------ NCCL INFO
# "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC", "... via
# NET/IB/0/GDRDMA", "... via NET/Socket/0", "... via SHM/direct/direct"
_CHANNEL = re.compile(r"NCCL INFO Channel \S+ ?: .*\bvia (\S+)")
# "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>" (the interfaces
# NCCL's sockets use)
_SOCKET_IFS = re.compile(r"NCCL INFO NET/Socket ?: Using (.+)$")
_IF_NAME = re.compile(r"\[\d+\]([A-Za-z0-9_.\-]+):")


def nccl_transport(lines: Iterable[str]) -> dict[str, Any]:
    """The transport NCCL chose, from its INFO lines (NCCL_DEBUG=INFO,
    NCCL_DEBUG_SUBSYS INIT,NET): `network` (IB, Socket, a plugin's
    name), `net_devices`, `connections` (per kind: P2P, SHM, NET/IB,
    NET/Socket), `gdrdma` (a NET channel with GPUDirect RDMA) and
    `socket_ifaces` (the interfaces of NET/Socket).
    fingerprint.parse_nccl_info reads the first three; this adds the
    last two."""
    lines = list(lines)
    out = parse_nccl_info(lines)
    gdr, ifaces = False, []
    for line in lines:
        m = _CHANNEL.search(line)
        if m and m.group(1).startswith("NET/") and "GDRDMA" in m.group(1):
            gdr = True
        m = _SOCKET_IFS.search(line.rstrip())
        if m:
            ifaces += [n for n in _IF_NAME.findall(m.group(1)) if n not in ifaces]
    return {**out, "gdrdma": gdr, "socket_ifaces": ifaces}


def uses_sockets_between_nodes(t: dict[str, Any]) -> bool:
    """NCCL crossed nodes over plain TCP sockets (NET/Socket), not
    IB/RoCE or a plugin."""
    conns = t.get("connections") or {}
    return "NET/Socket" in conns or (t.get("network") == "Socket"
                                     and any(k.startswith("NET/") for k in conns))


# ------------------------------------------------------------------ nvidia-smi topo -m
# The legend nvidia-smi prints under the matrix, nearest first
TOPO_KINDS = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS")
TOPO_WORDS = {
    "PIX": "at most one PCIe bridge", "PXB": "several PCIe bridges, no host bridge",
    "PHB": "a PCIe host bridge (the CPU)", "NODE": "host bridges within one NUMA node",
    "SYS": "the interconnect between NUMA nodes (QPI/UPI, Infinity Fabric)",
}


def _rank(kind: str) -> int:
    if kind.startswith("NV"):
        return 1
    return TOPO_KINDS.index(kind) if kind in TOPO_KINDS else len(TOPO_KINDS)


def parse_topo(text: str) -> Optional[dict[str, Any]]:
    """`nvidia-smi topo -m` read: {"gpus": [...], "nics": [...],
    "matrix": {row: {col: kind}}, "cpu_affinity": {gpu: "0-31"},
    "numa_affinity": {gpu: "0"}, "nic_names": {"NIC0": "mlx5_0"}}; None
    when the text holds no matrix. The header row names the columns
    (GPU0.. NIC0.., then CPU Affinity, NUMA Affinity, GPU NUMA ID); each
    row starts with its device name. The header is tab separated;
    columns of two words are kept whole."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    head_i = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\b", ln)), None)
    if head_i is None:
        return None
    header = [h.strip() for h in re.split(r"\t+|\s{2,}", lines[head_i].strip()) if h.strip()]
    devices = [h for h in header if re.fullmatch(r"(GPU|NIC|mlx\w+)\d*\w*", h)]
    extra = header[len(devices):]
    matrix: dict[str, dict[str, str]] = {}
    cpu_aff, numa_aff = {}, {}
    for ln in lines[head_i + 1:]:
        if not ln.strip():
            break
        cells = [c for c in re.split(r"\t+|\s+", ln.strip()) if c]
        name = cells[0]
        if name not in devices:
            break
        values = cells[1:1 + len(devices)]
        matrix[name] = dict(zip(devices, values))
        rest = cells[1 + len(devices):]
        if name.startswith("GPU") and rest:
            for key, value in zip(extra, rest):
                if key.lower().startswith("cpu"):
                    cpu_aff[name] = value
                elif key.lower().startswith("numa"):
                    numa_aff[name] = value
    nic_names = dict(re.findall(r"^\s*(NIC\d+)\s*:\s*(\S+)", text, re.M))
    return {"gpus": [d for d in devices if d.startswith("GPU")],
            "nics": [d for d in devices if not d.startswith("GPU")],
            "matrix": matrix, "cpu_affinity": cpu_aff, "numa_affinity": numa_aff,
            "nic_names": nic_names}


def nearest_nic(topo: dict[str, Any]) -> dict[str, tuple[Optional[str], Optional[str]]]:
    """Each GPU's nearest NIC and the path to it: {"GPU0": ("mlx5_0",
    "PIX")}; (None, None) for a GPU of a node without a NIC in the
    matrix."""
    out = {}
    for gpu in topo["gpus"]:
        row = topo["matrix"].get(gpu, {})
        best = min(topo["nics"], key=lambda n: _rank(row.get(n, "SYS")), default=None)
        out[gpu] = ((topo["nic_names"].get(best, best), row.get(best)) if best else (None, None))
    return out
