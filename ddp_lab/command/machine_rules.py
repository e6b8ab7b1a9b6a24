"""The rules on this machine: its devices and cores, and what its torch
can run."""

from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

from ..config import device_type
from ..world import cpu
from ..world.devices import local_gpus


def dist_problem(backend: str, device: str, gpus: Optional[int], nproc: int) -> Optional[str]:
    """Why dist.backend with dist.device cannot run, or None. `gpus`:
    the CUDA devices of the machine the ranks run on, when that is this
    one (a local launch); None when they start elsewhere (slurm, runai,
    mpirun: the nodes may have GPUs this machine lacks), where only a
    pair that contradicts itself is refused."""
    if backend == "nccl" and device == "cpu":
        return ("dist.backend=nccl with dist.device=cpu: nccl moves only CUDA tensors; use "
                "dist.backend=gloo (or auto) on CPU, or dist.device=cuda")
    if gpus is None:
        return None
    kind = device_type(device, gpus > 0)
    if kind == "cuda" and not gpus:
        return ("dist.device=cuda but this machine has no CUDA device (launcher=local): "
                "use dist.device=cpu (or auto)")
    if backend == "nccl" and kind != "cuda":
        return ("dist.backend=nccl but this machine has no CUDA device (launcher=local; "
                "dist.device=auto is cpu here): use dist.backend=gloo (or auto)")
    if kind == "cuda" and nproc > gpus:
        return (f"launcher.nproc_per_node={nproc} with dist.device={device}: this machine "
                f"has {gpus} CUDA device(s), one per rank: set launcher.nproc_per_node<={gpus}, "
                "or dist.device=cpu")
    return None


def dist_pair(cfg: DictConfig) -> Optional[str]:
    """dist.backend x dist.device (dist_problem); this machine's GPUs
    count on a local launch that really starts (a dry run only renders:
    it shows the script on any machine)."""
    gpus = local_gpus() if cfg.launcher.name == "local" and not cfg.launcher.dry_run else None
    return dist_problem(cfg.dist.backend, cfg.dist.device, gpus, cfg.launcher.nproc_per_node)


# Ranks a core before a local launch is refused (launcher.oversubscribe
# allows it): 3 or 4 ranks on a 2-core laptop are a lesson in sharing,
# 1000 (a typo for 10) stall the machine for minutes while every rank
# imports torch and waits its turn at every collective.
RANKS_PER_CORE = 4


def oversubscription(cfg: DictConfig) -> Optional[str]:
    """Far more ranks on this machine than it has cores, not asked
    for."""
    lc = cfg.launcher
    if lc.name != "local" or lc.dry_run or lc.get("oversubscribe"):
        return None
    cores = cpu.cores()
    if lc.nproc_per_node <= RANKS_PER_CORE * cores:
        return None
    return (f"launcher.nproc_per_node={lc.nproc_per_node} starts {lc.nproc_per_node} ranks on "
            f"this machine's {cores} core(s), more than {RANKS_PER_CORE} a core: use at most "
            f"{RANKS_PER_CORE * cores}, or launcher.oversubscribe=true to run them anyway")


def fused_support(cfg: DictConfig) -> Optional[str]:
    """optim.fused=true on a local launch where this torch has no fused
    update for the device the ranks will use (torch < 2.4 on CPU).
    Elsewhere the ranks' torch (a cluster's, a container's) is not this
    machine's to judge: a rank that cannot says so itself."""
    if cfg.optim.fused is not True or cfg.launcher.name != "local":
        return None
    # imports torch: only for a run that asks for fused
    from ..world import torch_support

    return torch_support.fused_refusal(cfg.optim.name,
                                       device_type(cfg.dist.device, local_gpus() > 0))


def twin_support(cfg: DictConfig) -> Optional[str]:
    """sync=fsdp2 on a local launch where this torch has no
    torch.distributed.fsdp.fully_shard (torch < 2.6: the oldest ddp_lab
    supports is 2.2). Elsewhere the ranks' torch decides (a rank that
    cannot says so in the same line, sync/fsdp2.py)."""
    if cfg.sync.name != "fsdp2" or cfg.launcher.name != "local":
        return None
    # imports torch: only for sync=fsdp2
    from ..world import torch_support

    return torch_support.fsdp2_refusal()
