"""sync=zero1's checkpoints: the optimiser state's shards gathered into
the state a plain optimiser over every parameter would hold, and cut
into shards again, so a checkpoint resumes on any world size and under
any synchroniser (docs/sync.md, "ZeRO stage 1"). A parameter's state is
per element (moments, momentum) or a scalar (Adam's step)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist


def gather(z: Any, optimizer: torch.optim.Optimizer) -> Optional[dict]:
    """Collective: the state a plain optimiser over
    `module.parameters()` would hold."""
    index = {id(p): i for i, p in enumerate(z.module.parameters())}
    mine = optimizer.state_dict()
    # which keys are per element (moments, momentum) and the scalars
    # (Adam's step, the same on every piece): from any rank that holds a
    # piece with state
    held = [s for s in mine["state"].values() if s]
    kinds = {
        key: (torch.is_tensor(v) and v.dim() == 1, v)
        for key, v in (held[0] if held else {}).items()
    }
    if z.world_size > 1:
        every: list = [None] * z.world_size
        dist.all_gather_object(every, kinds)
        kinds = next((d for d in every if d), {})
    state: dict[int, dict] = {}
    for k, b in enumerate(z.param_buckets):
        for key, (per_element, scalar) in kinds.items():
            whole = None
            # this rank's chunk of it, then every chunk end to end
            if per_element:
                chunk = torch.zeros_like(z.chunks[k])
                base = len(chunk) * z.rank
                for j, (kk, lo, hi) in enumerate(z.pieces):
                    if kk == k and key in mine["state"].get(j, {}):
                        chunk[lo - base : hi - base] = mine["state"][j][key]
                whole = chunk.clone()
                if z.world_size > 1:
                    whole = torch.empty_like(b.buffer)
                    z._all_gather(whole, chunk)
            for p, o in zip(b.params, b.offsets):
                state.setdefault(index[id(p)], {})[key] = (
                    _own(scalar)
                    if whole is None
                    else whole[o : o + p.numel()].view_as(p).clone()
                )
    group = {**mine["param_groups"][0], "params": list(index.values())}
    return {"state": state, "param_groups": [group]} if z.rank == 0 else None


def cut(z: Any, optimizer: torch.optim.Optimizer, full: dict) -> None:
    """Load a whole-model state (ours, DDP's, any sync's, any world's)
    into `z`'s pieces."""
    index = {id(p): i for i, p in enumerate(z.module.parameters())}
    # (bucket, key): laid out as it
    flats: dict[tuple[int, str], torch.Tensor] = {}
    # Adam's step: the same for every parameter
    scalars: dict = {}
    for k, b in enumerate(z.param_buckets):
        for p, o in zip(b.params, b.offsets):
            for key, v in full["state"].get(index[id(p)], {}).items():
                if not (torch.is_tensor(v) and v.dim() > 0):
                    scalars[key] = v
                    continue
                if (k, key) not in flats:
                    flats[k, key] = torch.zeros_like(b.buffer)
                flats[k, key][o : o + p.numel()] = v.reshape(-1)
    state = {}
    # a piece: elements lo..hi of bucket k
    for j, (k, lo, hi) in enumerate(z.pieces):
        state[j] = {key: _own(v) for key, v in scalars.items()}
        state[j].update(
            {
                key: f[lo:hi].clone()
                for (kk, key), f in flats.items()
                if kk == k
            }
        )
    group = {**full["param_groups"][0], "params": list(range(len(z.pieces)))}
    optimizer.load_state_dict(
        {
            "state": {j: s for j, s in state.items() if s},
            "param_groups": [group],
        }
    )


def _own(v):
    """A copy of a scalar for each parameter: Adam adds 1 to its step in
    place, and a step tensor shared by every parameter would count once
    per parameter."""
    return v.clone() if torch.is_tensor(v) else v
