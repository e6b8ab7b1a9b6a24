"""The entry every rank of the doctor's job runs: `python -m ddp_lab.doctor.probe RUN_DIR`.

First, with no process group, what the rank sees (`rank_facts`) into RUN_DIR/doctor/rank<N>.json:
a wrong interface or an unreachable rendezvous is then still reported. Then, as a training rank
joins (`run_rank`), an all-reduce timed within each node and across nodes, NCCL's transport
from its INFO log, and rank 0's fingerprint of the allocation (as a run's).
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from ddp_lab.folder.files import write_json
from ddp_lab.predict.costmodel import busbw_factor
from ddp_lab.rank.main import rank_main, run_rank
from ddp_lab.world import fingerprint
from ddp_lab.world.env import detect_env, EnvError, host_address, hostname
from ddp_lab.world.ports import answers


# the scheduler's variables that say what it gave this task
SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS",
              "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
              "SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE",
              "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURMD_NODENAME", "SLURM_NODEID",
              "SLURM_LOCALID", "SLURM_PROCID", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_SIZE",
              "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
IF_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


# ------------------------------------------------------------------ cores and NUMA
def ranges(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the kernel's cpulist format)."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b != a else f"{a}" for a, b in runs)


def parse_cpulist(text: str) -> set[int]:
    """"0-2,5" -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def numa_of(cpus: Iterable[int], root: str = "/sys/devices/system/node") -> Optional[list[int]]:
    """The NUMA nodes holding `cpus`, where sysfs shows nodes; None where it does not."""
    nodes = {}
    for d in sorted(Path(root).glob("node[0-9]*")):
        try:
            nodes[int(d.name[4:])] = parse_cpulist((d / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    if not nodes:
        return None
    cpus = set(cpus)
    return sorted(n for n, members in nodes.items() if members & cpus)


def affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


# ------------------------------------------------------------------ interfaces
def interfaces() -> list[str]:
    """This network namespace's interfaces (the kernel's own list, not sysfs)."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def resolve_ifname(key: str, spec: str, names: list[str]) -> list[str]:
    """The interfaces `spec` selects among `names`, as gloo / NCCL read the variable:
    GLOO_SOCKET_IFNAME is exact names (comma separated); NCCL_SOCKET_IFNAME prefixes, `=` for
    exact names, `^` to exclude (then every other interface but lo is a candidate)."""
    spec = spec.strip()
    if key == "GLOO_SOCKET_IFNAME":
        return [n for n in (s.strip() for s in spec.split(",")) if n in names]
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    wanted = [s.strip() for s in spec.lstrip("=").split(",") if s.strip()]
    match = (lambda n: n in wanted) if exact else (lambda n: any(n.startswith(w) for w in wanted))
    if exclude:
        return [n for n in names if not match(n) and n != "lo"]
    return [n for n in names if match(n)]


def chosen_ifaces(environ: Mapping[str, str], names: list[str]) -> dict[str, dict]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME where set: {key: {spec, resolved}}."""
    return {key: {"spec": environ[key], "resolved": resolve_ifname(key, environ[key], names)}
            for key in IF_KEYS if environ.get(key)}


def network(environ: Mapping[str, str]) -> dict[str, Any]:
    """The node's interfaces, those named, and the link its collectives use (fingerprint.link's
    iface, speed and tbf, with the MTU and state `ip` reports) where the named ones exist."""
    names = interfaces()
    chosen = chosen_ifaces(environ, names)
    lk = None
    if not any(c["spec"] and not c["resolved"] for c in chosen.values()):
        lk = fingerprint.link(environ)
    if lk:
        info = (fingerprint._json_of("ip", "-j", "link", "show", "dev", lk["iface"]) or [{}])[0]
        lk = {**lk, "mtu": info.get("mtu"), "state": info.get("operstate")}
    # the interface gloo takes when none is named: the hostname's address's, else the route's
    default = fingerprint.uplink({k: v for k, v in environ.items() if k not in IF_KEYS})
    return {"interfaces": names, "chosen": chosen, "link": lk, "default": default,
            "address": host_address(), "rdma_devices": rdma_devices()}


def rdma_devices(sysfs_root: str = "/sys") -> list[str]:
    """The node's fast network devices, as ddp_lab.nccl_env reads sysfs: Slingshot (cxi0, ...:
    NCCL should use the aws-ofi-nccl plugin there) or InfiniBand / RoCE (mlx5_0, ...: NET/IB);
    [] where only sockets exist."""
    from ..nccl_env import network_kind

    try:
        kind, devices = network_kind(sysfs_root)
    except Exception:  # noqa: BLE001 -- an odd sysfs: the check says nothing of it
        return []
    return [] if kind == "sockets" else [f"{d} ({kind})" for d in devices]


# ------------------------------------------------------------------ software and data
def software() -> dict[str, Any]:
    import ddp_lab

    # imports torch: after rank_main (module docstring)
    v = fingerprint.versions()
    return {"python": platform.python_version(), "torch": str(v["torch"]), "cuda": v["cuda"],
            "nccl": v["nccl"], "ddp_lab": ddp_lab.__version__, "executable": sys.executable}


def data(root: str) -> dict[str, Any]:
    """The extracted MNIST files under `root` (MNIST/raw): each one's MD5, or absent."""
    from ..data_fetch import EXTRACTED_MD5, md5sum, raw_folder

    raw = raw_folder(root)
    files = {}
    for name in sorted(EXTRACTED_MD5):
        path = raw / name
        try:
            files[name] = md5sum(path) if path.is_file() else None
        except OSError:
            files[name] = None
    return {"root": str(Path(root).expanduser()), "files": files,
            "expected": dict(EXTRACTED_MD5)}


def gpus() -> dict[str, Any]:
    import torch  # lazy: after rank_main

    if not torch.cuda.is_available():
        return {"count": 0, "names": []}
    n = torch.cuda.device_count()
    return {"count": n, "names": [torch.cuda.get_device_name(i) for i in range(n)]}


def topo_text() -> Optional[str]:
    """`nvidia-smi topo -m`, where nvidia-smi exists (None elsewhere)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


# ------------------------------------------------------------------ per rank, per node
def node_name(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def rank_facts(env, environ: Mapping[str, str]) -> dict[str, Any]:
    """What one rank sees before any process group: its place, cores and NUMA nodes, the
    scheduler's counts, its GPUs (plain dicts: JSON)."""
    cpus = affinity()
    return {
        "rank": env.rank, "local_rank": env.local_rank, "world_size": env.world_size,
        "local_world_size": env.local_world_size, "node_rank": env.node_rank,
        "num_nodes": env.num_nodes, "source": env.source, "master_addr": env.master_addr,
        "master_port": env.master_port, "node": node_name(environ), "pid": os.getpid(),
        "address": host_address(), "cpus": ranges(cpus), "ncpus": len(cpus),
        "numa": numa_of(cpus), "cores_online": os.cpu_count(),
        "scheduler": {k: environ[k] for k in SLURM_KEYS if k in environ},
        "gpus": gpus(),
    }


# all-reduce sizes (bytes), each timed ITERS times after one warm-up, until a level has spent
# BUDGET_S: a slow link stops early, a fast one reaches the largest size
SIZES = (1 << 18, 1 << 20, 1 << 22, 1 << 24)
ITERS = 3
BUDGET_S = 3.0
# a rank that cannot join waits this long at most for the others' facts
FACTS_WAIT_S = 30.0


def run(run_dir: Path) -> int:
    from ddp_lab.config import load_run_config

    cfg = load_run_config(run_dir)
    out = run_dir / "doctor"
    environ = dict(os.environ)
    try:
        env = detect_env()
    except EnvError as e:
        write_json(out / f"unplaced-{hostname()}-{os.getpid()}.json",
                   {"error": str(e), "node": node_name(environ)})
        print(f"[ddp_lab] doctor: cannot place this process: {e}", file=sys.stderr)
        return 1
    mine = rank_facts(env, environ)
    mine["master"] = _master(env)
    if env.is_local_main:
        # the node's own facts, from its local rank 0
        mine["node_facts"] = {"software": software(), "data": data(cfg.data.root),
                              "network": network(environ), "topo": topo_text(),
                              "cpu_model": fingerprint.cpu_model()}
    names = interfaces()
    missing = [k for k, c in chosen_ifaces(environ, names).items() if not c["resolved"]]
    mine["skipped_group"] = bool(missing)
    write_json(out / f"rank{env.rank}.json", mine)
    # gloo / NCCL would fail on it after a timeout: say it now instead,
    if missing:
        # once every rank has written its facts (the launcher ends the others as this one
        # leaves, maybe before local rank 0 has read its node)
        end = time.monotonic() + FACTS_WAIT_S
        while len(list(out.glob("rank*[0-9].json"))) < env.world_size and time.monotonic() < end:
            time.sleep(0.2)
        print(f"[ddp_lab] doctor rank {env.rank}: {missing[0]}={environ[missing[0]]} is no "
              f"interface here ({', '.join(names)}): not joining", file=sys.stderr)
        return 1
    return run_rank(run_dir, cfg, lambda ctx: _measure(ctx, cfg, run_dir, out),
                    cfg.train.threads, failure={"kind": "doctor"})


def _master(env) -> dict:
    """Whether the rendezvous host answers this node (any reply; the port is only bound as the
    group starts, under torchrun before the ranks do)."""
    if env.world_size == 1 or env.rank == 0:
        return {"answers": True}
    ok = answers(env.master_addr)
    return {"answers": ok, "why": None if ok else "no reply within 2 s: no route, or a "
            "firewall"}


def _measure(ctx, cfg, run_dir: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from ddp_lab.world.topology import build_groups, detect_topology

    env = ctx.env
    topo = detect_topology(ctx)
    # every rank makes every group, in one order (new_group is collective)
    groups = build_groups(topo, ["intra_node", "leaders"], env.rank)
    result: dict = {"rank": env.rank, "backend": ctx.backend, "device": str(ctx.device)}
    for key, kind in (("intra", "intra_node"), ("cross", "leaders")):
        members = groups[kind].ranks
        if len(members) > 1:
            result[key] = _time(groups[kind].handle, len(members), ctx, torch, dist)
        ctx.barrier()
    detail = None
    if ctx.backend == "nccl":
        from ddp_lab.doctor.verdicts import nccl_transport

        result["nccl"] = nccl_transport(fingerprint.nccl_lines(run_dir) or [])
        detail = ctx.gather_objects(fingerprint.read_nccl_transport(run_dir))
    write_json(out / f"rank{env.rank}.measure.json", result)
    # the allocation's fingerprint, as a run's telemetry makes it
    if env.is_main:
        fp = fingerprint.collect(ctx.backend, ctx.device, list(dict.fromkeys(topo.hosts)),
                                 cfg.launcher.name, env.num_nodes, env.local_world_size,
                                 nccl_transport=fingerprint.transport_label(detail or []),
                                 nccl_detail=detail)
        write_json(out / "fingerprint.json", {"fingerprint": fp,
                                              "fingerprint_id": fingerprint.fingerprint_id(fp)})


def _time(group, n: int, ctx, torch, dist) -> dict:
    """The all-reduce's bus bandwidth in `group` (n ranks), at the largest size the budget
    allows; every rank of the group takes the same decisions (the slowest rank's times)."""
    spent, row = 0.0, None
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
        dist.all_reduce(t, group=group)
        ctx.synchronize()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(t, group=group)
        ctx.synchronize()
        took = torch.tensor([(time.perf_counter() - t0) / ITERS], dtype=torch.float64,
                            device=ctx.device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
        each = float(took.item())
        spent += each * (ITERS + 1)
        row = {"bytes": nbytes, "seconds": each, "ranks": n, "backend": ctx.backend,
               "busbw_Bps": nbytes * busbw_factor("all_reduce", n) / max(each, 1e-9)}
        if spent >= BUDGET_S or each * (ITERS + 1) * 4 > BUDGET_S - spent:
            break
    return row


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, "ddp_lab.doctor.probe", "python -m ddp_lab.doctor", run)


if __name__ == "__main__":
    sys.exit(main())
