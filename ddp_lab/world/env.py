"""Who am I? Rank, local rank, world size, node rank and master address, from any launcher.

`detect_env` reads the variables of torchrun (RANK, LOCAL_RANK, WORLD_SIZE), srun (SLURM_PROCID,
...; master = first host of SLURM_JOB_NODELIST), Open MPI's mpirun (OMPI_COMM_WORLD_*, the node
from DDP_LAB_NODE_RANK/DDP_LAB_NUM_NODES) and RunAI/Kubeflow pods (PET_NNODES, PET_NODE_RANK), in
that order (docs/launchers.md, "What every launcher shares"); an inconsistent set raises `EnvError`.
The same variables name the job around the rank (`allocation`) and its start (`startup_s`).

And, torch-free: the GPUs this machine shows (`local_gpus`), death with the parent, and the signals
torchrun's agent takes over (`AGENT_SIGNALS`: a rank forked from the agent's process takes the
process's own handlers back, ddp_lab/launch/torchrun.py).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional


class EnvError(ValueError):
    """The launcher's variables do not describe a valid distributed world."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: str  # torchrun | slurm | mpi | runai | single
    restart_count: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0


def _int(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise EnvError(f"{name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list, as `scontrol show hostnames` gives it:
    'nid[001-004,007],login1' -> 'nid001'."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise EnvError("SLURM_JOB_NODELIST is empty")
    # the first comma that is not inside brackets ends the first entry
    first = re.match(r"(?:[^,\[]|\[[^\]]*\]?)*", nodelist).group(0)
    # every bracket range contributes its first value: rack[1-2]-n[3-4] -> rack1-n3
    return re.sub(r"\[([^\]]+)\]", lambda m: m.group(1).split(",")[0].split("-")[0], first)


def _slurm_tasks_per_node(env: Mapping[str, str], node_rank: int) -> Optional[int]:
    # SLURM_TASKS_PER_NODE looks like '2(x3),1': expand and pick this node's count
    spec = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_STEP_TASKS_PER_NODE")
    if not spec:
        v = env.get("SLURM_NTASKS_PER_NODE")
        return int(v) if v else None
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise EnvError(f"SLURM_TASKS_PER_NODE={spec!r} is not understood")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_rank] if node_rank < len(counts) else None


def detect_env(environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Detect this process's place in the distributed world from its environment."""
    env = os.environ if environ is None else environ
    restarts = _int(env, "TORCHELASTIC_RESTART_COUNT", 0)

    if "LOCAL_RANK" in env and "RANK" in env and "WORLD_SIZE" in env:
        # torchrun (or torch.distributed.launch): it also sets GROUP_RANK = node rank
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE", world)
        num_nodes = _int(env, "GROUP_WORLD_SIZE", max(1, world // max(local_world, 1)))
        d = dict(rank=_int(env, "RANK"), local_rank=_int(env, "LOCAL_RANK"), world_size=world,
                 local_world_size=local_world, node_rank=_int(env, "GROUP_RANK", 0),
                 num_nodes=num_nodes, source="torchrun")
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        node_rank = _int(env, "SLURM_NODEID", 0)
        world = _int(env, "SLURM_NTASKS")
        local_world = _slurm_tasks_per_node(env, node_rank) or world
        d = dict(rank=_int(env, "SLURM_PROCID"), local_rank=_int(env, "SLURM_LOCALID", 0),
                 world_size=world, local_world_size=local_world, node_rank=node_rank,
                 num_nodes=_int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", 1)),
                 source="slurm")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not env.get("MASTER_ADDR") and nodelist:
            env = dict(env, MASTER_ADDR=first_slurm_host(nodelist))
        if not env.get("MASTER_PORT") and env.get("SLURM_JOB_ID"):
            env = dict(env, MASTER_PORT=str(slurm_port(_int(env, "SLURM_JOB_ID"))))
    elif "OMPI_COMM_WORLD_RANK" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE")
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", world)
        # Open MPI has no node index (OMPI_COMM_WORLD_NODE_RANK is the rank on the node):
        # launcher=mpirun's wrapper sets DDP_LAB_NODE_RANK/NUM_NODES, else equal slots
        rank = _int(env, "OMPI_COMM_WORLD_RANK")
        d = dict(rank=rank, local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
                 world_size=world, local_world_size=local_world,
                 node_rank=_int(env, "DDP_LAB_NODE_RANK", rank // max(local_world, 1)),
                 num_nodes=_int(env, "DDP_LAB_NUM_NODES", max(1, -(-world // max(local_world, 1)))),
                 source="mpi")
    elif "PET_NNODES" in env or ("WORLD_SIZE" in env and "RANK" in env):
        # RunAI / Kubeflow PyTorchJob: one process per pod; WORLD_SIZE/RANK count pods
        pods = _int(env, "PET_NNODES", _int(env, "WORLD_SIZE", 1)) if "PET_NNODES" in env else _int(env, "WORLD_SIZE")
        pod = _int(env, "PET_NODE_RANK", _int(env, "RANK", 0)) if "PET_NODE_RANK" in env else _int(env, "RANK")
        d = dict(rank=pod, local_rank=0, world_size=pods, local_world_size=1,
                 node_rank=pod, num_nodes=pods, source="runai")
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if f"PET_{key}" in env and not env.get(key):
                env = dict(env, **{key: env[f"PET_{key}"]})
    else:
        d = dict(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                 num_nodes=1, source="single")

    master_addr = env.get("MASTER_ADDR", "")
    if not master_addr:
        if d["num_nodes"] > 1:
            raise EnvError(f"MASTER_ADDR is not set for a {d['num_nodes']}-node world "
                           f"({d['source']}): export MASTER_ADDR=<first node's hostname> before "
                           "starting the ranks")
        master_addr = "127.0.0.1"
    out = DistEnv(master_addr=master_addr, master_port=_int(env, "MASTER_PORT", 29500),
                  restart_count=restarts, **d)
    validate(out)
    return out


def slurm_port(job_id: int) -> int:
    """A port derived from the SLURM job id: the same on every node, rarely in use."""
    return 20000 + job_id % 20000


def validate(e: DistEnv) -> None:
    src = e.source
    if e.world_size < 1:
        raise EnvError(f"world size {e.world_size} from {src} must be >= 1")
    if not 0 <= e.rank < e.world_size:
        raise EnvError(f"rank {e.rank} from {src} is outside the world of size {e.world_size}")
    if e.local_world_size < 1 or e.local_world_size > e.world_size:
        raise EnvError(
            f"local world size {e.local_world_size} from {src} must be in 1..world size {e.world_size}")
    if not 0 <= e.local_rank < e.local_world_size:
        raise EnvError(
            f"local rank {e.local_rank} from {src} is outside 0..{e.local_world_size - 1}")
    if not 0 <= e.node_rank < max(e.num_nodes, 1):
        raise EnvError(f"node rank {e.node_rank} from {src} is outside 0..{e.num_nodes - 1}")
    if not 0 < e.master_port < 65536:
        raise EnvError(f"MASTER_PORT={e.master_port} is not a valid port (1..65535)")


def hostname() -> str:
    return socket.gethostname()


def host_address() -> Optional[str]:
    """The address this machine's hostname resolves to (the one gloo gives peers), or None."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def start_ticks(pid: int | str = "self") -> Optional[str]:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat's field 22, as text),
    None if it is gone: with the pid, it names one process (a pid can be reused)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_start(pid: int | str = "self") -> Optional[float]:
    """When a process started, in seconds since the epoch, to a clock tick: its start in ticks
    since boot (/proc/PID/stat) against the boot clock now (`btime` is whole seconds). None where
    it cannot be read."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    try:
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(ticks) / os.sysconf("SC_CLK_TCK")
    except (AttributeError, OSError, ValueError):
        return None
    return time.time() - age


def allocation(environ=None) -> dict:
    """The scheduler's name for this allocation: job id and restart count (None: local)."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID"):
        return {"job_id": env["SLURM_JOB_ID"], "restart": int(env.get("SLURM_RESTART_COUNT") or 0)}
    job = env.get("DDP_LAB_JOB_ID")  # set by the launchers that have no scheduler id
    return {"job_id": job or None, "restart": int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)}


def startup_s() -> Optional[float]:
    """Seconds from the job's own start to the first step: DDP_LAB_T0 where the job set it
    (ddp_lab.command.job), else this rank's start."""
    t0 = os.environ.get("DDP_LAB_T0")
    start = float(t0) if t0 else process_start()
    return None if start is None else round(time.time() - start, 2)


# ------------------------------------------------------------------ its machine and its parent
def gpu_devices_present() -> bool:
    """Whether this machine shows a GPU driver's device files (/dev/nvidia0, ROCm's /dev/kfd): only
    then is torch asked, which costs seconds of import."""
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists()


def local_gpus() -> int:
    """CUDA devices of this machine; 0 from the device files alone, so no torch import on CPU."""
    if not gpu_devices_present():
        return 0
    import torch  # lazy: see above

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc() -> int:
    """One process per visible GPU, else 2 (CPU ranks)."""
    return local_gpus() or 2


AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Linux: get `sig` when the parent process dies (torchrun SIGKILLed). False elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(1, int(sig), 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
