"""What a synchroniser does on the wire and in torch's own objects, read from outside it:
the behaviour probes of tests/test_every_setting.py (one per sync option).

`wire_log` wraps torch.distributed's all_reduce, reduce, broadcast, isend and irecv (ours
call them, and so do torch's DDP comm hooks, which look them up on the module at each call)
so that every tensor handed to them is recorded with its op, elements, dtype, peer or root,
the thread and the step phase; the real calls still run. `observe` builds one synchroniser
on a small model as the trainer does (`build_sync`), trains a few steps and returns what
was seen: the wire calls, the comm records' counts and bytes, DDP's own logging data, the
optimiser state each rank holds. Nothing here reads a run's description.
"""

from __future__ import annotations

import threading
from typing import Any

PROBE_STEPS = 3
#: DistributedDataParallel's own account of how it was built (`_get_ddp_logging_data()`)
DDP_KEYS = ("bucket_cap_bytes", "bucket_sizes", "gradient_as_bucket_view", "static_graph",
            "find_unused_parameters", "comm_hook")


def probe_model():
    """Four parameters (two weights, two biases): a 32x32 weight PowerSGD compresses at
    rank 1 and 2, a bucket of 25 MB holds them all, a bucket of 0 MB one each."""
    from torch import nn

    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


N_PARAMS = 4


def wire_log(log: list, phase: dict) -> None:
    """Record every tensor this process hands to torch.distributed's collectives and
    point-to-point calls in `log` (dicts: op, numel, dtype, peer, main thread, in backward,
    step). Call once per process."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    main = threading.main_thread()

    def logged(op: str, real, peer_key: str | None, peer_pos: int | None):
        def call(tensor, *args, **kwargs):
            peer = None
            if peer_key is not None:
                peer = kwargs.get(peer_key, args[peer_pos] if len(args) > peer_pos else None)
            log.append({"op": op, "numel": tensor.numel(),
                        "dtype": str(tensor.dtype).removeprefix("torch."), "peer": peer,
                        "main": threading.current_thread() is main,
                        "backward": phase["backward"], "step": phase["step"]})
            return real(tensor, *args, **kwargs)
        return call

    for op, key in (("all_reduce", None), ("reduce", "dst"), ("broadcast", "src")):
        setattr(dist, op, logged(op, getattr(dist, op), key, 0))
    for op, key in (("isend", "dst"), ("irecv", "src")):
        f = logged(op, getattr(c10d, op), key, 0)
        # both names: P2POp checks its op against distributed_c10d's isend/irecv
        setattr(c10d, op, f)
        setattr(dist, op, f)


def observe(section: dict, world: int, log: list, phase: dict) -> dict[str, Any]:
    """Build the synchroniser of `section` (a whole sync section) on `probe_model()`, train
    PROBE_STEPS steps, and return what was seen from outside it."""
    import torch
    from omegaconf import OmegaConf

    from ddp_lab.sync.build import build_sync

    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = probe_model()
    syncer = build_sync(OmegaConf.create(section), model, torch.device("cpu"), world)
    opt = syncer.make_optimizer(lambda params: torch.optim.Adam(params, lr=1e-3))
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)

    def loss_fn(m=None):
        return ((m if m is not None else model)(x) - y).pow(2).mean()

    syncer.preflight(loss_fn)
    syncer.collect_comm()
    del log[:]
    for step in range(PROBE_STEPS):
        phase["step"] = step
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(syncer.wrapped)
        phase["backward"] = True
        try:
            loss.backward()
        finally:
            phase["backward"] = False
        syncer.sync()
        syncer.step(opt)
    comm = syncer.collect_comm()
    calls = list(log)
    ddp = getattr(syncer.wrapped, "_get_ddp_logging_data", None)
    data = ddp() if ddp is not None else None
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    out = {"calls": calls,
           "comm": {"calls": comm.calls, "payload": comm.payload_bytes, "sent": comm.bytes_sent},
           "ddp": {k: data.get(k) for k in DDP_KEYS} if data is not None else None,
           "state_bytes": sum(v.numel() * v.element_size() for v in state if v.dim() > 0),
           "grad_storages": None,
           # FSDP2: per sharded child module, whether it reshards after forward (torch keeps
           # a post-forward mesh only then)
           "fsdp_reshard": [m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None
                            for m in model.modules() if m is not model
                            and hasattr(m, "_get_fsdp_state")
                            and m._get_fsdp_state()._fsdp_param_group is not None]}
    if data is not None:  # the storages holding the .grads (gradient_as_bucket_view: 1)
        out["grad_storages"] = len({p.grad.untyped_storage().data_ptr()
                                    for p in model.parameters() if p.grad is not None})
    phase["step"] = -1
    syncer.close()
    del log[:]
    return out


def probe_rank(rank: int, world: int, sections: list[dict]) -> list[dict]:
    """One rank of the probe world: `observe` each section in turn (every rank the same
    order: building a synchroniser can be collective)."""
    log: list = []
    phase = {"backward": False, "step": -1}
    wire_log(log, phase)
    return [observe(s, world, log, phase) for s in sections]
