"""The flat buffers a synchroniser sends: parameters grouped into
contiguous buckets, one collective call per bucket (`make_buckets`), the
dtype they travel in (`WireFormat`), and for sync.overlap the hooks that
launch each bucket once its gradients are ready (`ReadyBuckets`, on a
`SerialWorker`; `unused_parameters` is their preflight).

Parameters go into buckets in `module.parameters()` order; a bucket is
closed when the next parameter would take it past `cap_bytes` (a
parameter larger than the cap gets a bucket of its own) or has another
dtype. `cap_bytes=0` means one bucket per parameter. Each bucket owns
one zero-initialised buffer, padded to a multiple of `pad_to` elements
(ring all-reduce cuts a buffer into world-size equal chunks). The
buffers are allocated once: packing a step's gradients is one
`torch.cat` into it, unpacking one copy per parameter back out.
`align=k` starts every parameter at a multiple of k elements (zeros in
between; sync=zero1: a shard then cuts each parameter where a vectorised
optimiser kernel would cut the whole parameter, so its rounding is the
same).

`WireFormat` is sync.compress for our synchronisers, in one place. In
every mode each bucket is divided by the world size first, as DDP and
torch's fp16/bf16 hooks do: the sum of the shares is then the average,
rounded as DDP's is, and in fp16 the sum of n divided values cannot
overflow where the sum of n raw ones might.

`sync.compress=none`: the divided bucket is reduced as it is.
`sync.compress=fp16|bf16`: the divided bucket is cast into a wire buffer
allocated once per bucket (the same length as the fp32 bucket, padding
included, so the ring's equal chunks stay equal), reduced in that dtype
by the synchroniser's own algorithm, and cast back into the fp32 bucket.
Half the bytes on the wire; the sums are rounded to 16 bits at every
step of the algorithm (gloo's all_reduce and reduce add fp16 and bf16 on
CPU: tests/test_compress.py checks it on real process groups, so no
combination is refused for it). `powersgd` is torch's DDP comm hook: ddp
only (config/sync.py's BucketSyncConfig.check).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn


@dataclass
class Bucket:
    params: list[nn.Parameter]
    offsets: list[int]
    # elements that belong to parameters (the rest is padding)
    numel: int
    buffer: torch.Tensor
    # parameters end to end from 0 (make_buckets' align=1)
    dense: bool = True

    @property
    def nbytes(self) -> int:
        """Payload: the parameters' bytes, padding excluded."""
        return self.numel * self.buffer.element_size()

    def pack_grads(self) -> torch.Tensor:
        """Copy the parameters' gradients into the buffer; a missing
        .grad counts as zeros (every rank must send the same-sized
        buffer, used or not)."""
        grads = [p.grad for p in self.params]
        if self.dense and all(g is not None for g in grads):
            torch.cat([g.reshape(-1) for g in grads], out=self.buffer[: self.numel])
        else:
            for p, o, g in zip(self.params, self.offsets, grads):
                view = self.buffer[o : o + p.numel()]
                view.zero_() if g is None else view.copy_(g.reshape(-1))
        return self.buffer

    def unpack_grads(self) -> None:
        for p, o in zip(self.params, self.offsets):
            src = self.buffer[o : o + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = src.clone()
            else:
                p.grad.copy_(src)

    @torch.no_grad()
    def pack_params(self) -> torch.Tensor:
        if not self.dense:
            for p, o in zip(self.params, self.offsets):
                self.buffer[o : o + p.numel()].copy_(p.detach().reshape(-1))
            return self.buffer
        torch.cat([p.detach().reshape(-1) for p in self.params], out=self.buffer[: self.numel])
        return self.buffer

    @torch.no_grad()
    def unpack_params(self) -> None:
        for p, o in zip(self.params, self.offsets):
            p.copy_(self.buffer[o : o + p.numel()].view_as(p))


def make_buckets(
    params: list[nn.Parameter], cap_bytes: float, pad_to: int = 1, align: int = 1
) -> list[Bucket]:
    if cap_bytes < 0:
        raise ValueError(f"bucket size {cap_bytes} bytes: must be >= 0")
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.nbytes
        if (
            not groups
            or cap_bytes == 0
            or size + nbytes > cap_bytes
            or p.dtype != groups[-1][0].dtype
            or p.device != groups[-1][0].device
        ):
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += nbytes
    buckets = []
    for group in groups:
        offsets, n = [], 0
        for p in group:
            n = -(-n // align) * align
            offsets.append(n)
            n += p.numel()
        padded = -(-n // pad_to) * pad_to
        buf = torch.zeros(padded, dtype=group[0].dtype, device=group[0].device)
        buckets.append(Bucket(group, offsets, sum(p.numel() for p in group), buf, align == 1))
    return buckets


#: sync.compress -> the dtype on the wire (None: the gradients' own)
WIRE_DTYPES: dict[str, Optional[torch.dtype]] = {
    "none": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


class WireFormat:
    """The dtype one synchroniser's gradients travel in (sync.compress),
    with the division by the world size before the sum and the buffers
    it needs (see the module docstring)."""

    def __init__(self, mode: str, world_size: int):
        self.mode = mode
        self.dtype = WIRE_DTYPES[mode]
        self.world_size = world_size
        self._buffers: dict[int, torch.Tensor] = {}

    def add(self, flat: torch.Tensor) -> None:
        """Allocate `flat`'s wire buffer now (a bucket buffer, which
        never moves)."""
        if self.dtype is not None:
            self._buffers[flat.data_ptr()] = torch.zeros(
                flat.numel(), dtype=self.dtype, device=flat.device
            )

    def buffer(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor that goes on the wire for `flat`: `flat` itself
        when uncompressed, its preallocated buffer for a bucket, a new
        one for anything else (a per-parameter .grad, which
        zero_grad(set_to_none) replaces every step)."""
        if self.dtype is None:
            return flat
        wire = self._buffers.get(flat.data_ptr())
        if wire is None or wire.numel() != flat.numel():
            wire = torch.empty(flat.numel(), dtype=self.dtype, device=flat.device)
        return wire

    def pack(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor to reduce: `flat / world`, itself (none) or cast
        to the wire. Divided before the sum, as DDP does: then the sum
        of the shares is the average, and it rounds as DDP's does
        (divided after, a 3-rank run drifts from DDP in the last bits,
        and Adam grows them: docs/sync.md); in fp16 the sum then cannot
        overflow either."""
        flat.div_(self.world_size)
        wire = self.buffer(flat)
        if wire is not flat:
            wire.copy_(flat.view(-1))
        return wire

    def unpack(self, flat: torch.Tensor, wire: torch.Tensor) -> None:
        """`flat` := the average, from the reduced `wire` (cast back
        where it was cast)."""
        if wire is not flat:
            flat.view(-1).copy_(wire)

    def nbytes(self, nbytes: int, flat: torch.Tensor) -> int:
        """`nbytes` of `flat`'s dtype, as bytes on the wire."""
        return nbytes if self.dtype is None else nbytes // flat.element_size() * self.dtype.itemsize


# sync.overlap=true: each gradient bucket's collective starts during
# backward, as DDP's do (docs/compression_overlap.md, "Overlap and exposed
# comm"). `ReadyBuckets`, DDP's reducer in miniature, launches a bucket
# once its gradients are all ready, in bucket order only, so every rank
# starts the same sequence. `SerialWorker` runs a synchroniser's blocking
# collectives on ONE FIFO thread; a failure there is raised in the
# training thread by `wait()` and the buckets queued behind it are
# skipped, so nothing hangs.


class ReadyBuckets:
    """Hooks that pack and launch each bucket as soon as its gradients
    are all ready."""

    def __init__(self, buckets: list[Bucket], launch: Callable[[int, Bucket], None]):
        self.buckets = buckets
        self.launch = launch
        self.armed = True
        self._need = [len(b.params) for b in buckets]
        self._count = [0] * len(buckets)
        self._next = 0  # the first bucket not yet launched
        where = {id(p): i for i, b in enumerate(buckets) for p in b.params}
        self.handles = [
            p.register_post_accumulate_grad_hook(self._hook_for(where[id(p)]))
            for b in buckets
            for p in b.params
        ]

    def _hook_for(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            if not self.armed:
                return
            self._count[i] += 1
            # launch every consecutive ready bucket from the first one
            # not yet launched
            while (
                self._next < len(self.buckets) and self._count[self._next] == self._need[self._next]
            ):
                j = self._next
                self._next += 1
                self.launch(j, self.buckets[j])

        return hook

    @contextmanager
    def disarmed(self) -> Iterator[None]:
        """Backward inside only accumulates .grad (no_sync, preflight
        checks)."""
        was, self.armed = self.armed, False
        try:
            yield
        finally:
            self.armed = was

    def preflight(
        self, module: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], name: str
    ) -> None:
        """A parameter that never gets a gradient would keep its bucket,
        and every bucket after it, from ever starting: refuse it before
        the first step."""
        with self.disarmed():
            unused = unused_parameters(module, loss_fn)
        if unused:
            names = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
            raise ValueError(
                f"sync={name} sync.overlap=true: the model has parameters that "
                f"get no gradient ({names}): set sync.overlap=false"
            )

    def finish(self) -> None:
        """Every bucket was launched this step; reset for the next."""
        launched = self._next
        self._count = [0] * len(self.buckets)
        self._next = 0
        if launched != len(self.buckets):
            missing = [p for b in self.buckets[launched:] for p in b.params if p.grad is None]
            raise RuntimeError(
                f"sync.overlap: only {launched} of {len(self.buckets)} gradient buckets were "
                f"ready after backward ({len(missing)} parameter(s) got no gradient this "
                "step): set sync.overlap=false for a model whose used parameters vary"
            )

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class SerialWorker:
    """One background thread (FIFO) for a synchroniser's blocking
    collectives."""

    def __init__(self, device: torch.device, n_slots: int, name: str):
        self.cuda = device.type == "cuda"
        self.device = device
        self.error: Optional[BaseException] = None
        self.futures: list[Future] = []
        # per thread
        init = (lambda: torch.cuda.set_device(device)) if self.cuda else None
        self.pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"ddp_lab-{name}", initializer=init
        )
        # one side stream; events preallocated, one pair per bucket
        # (reused)
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.ready = [torch.cuda.Event() for _ in range(n_slots)]
            self.done = [torch.cuda.Event() for _ in range(n_slots)]

    def submit(self, slot: int, fn: Callable[[], Any]) -> None:
        """Run `fn` on the worker after what the current stream has
        queued (the packing)."""
        if self.cuda:
            # on the stream that packed the bucket
            self.ready[slot].record()
        self.futures.append(self.pool.submit(self._run, slot, fn))

    def _run(self, slot: int, fn: Callable[[], Any]) -> None:
        # a collective before this one failed: do not start more
        if self.error is not None:
            return
        try:
            if self.cuda:
                with torch.cuda.stream(self.stream):
                    self.stream.wait_event(self.ready[slot])
                    fn()
                    self.done[slot].record()
            else:
                fn()
        except BaseException as e:
            self.error = e
            raise

    def wait(self) -> None:
        """Every submitted collective has finished (CUDA: the current
        stream waits for it); the first failure is raised here, in the
        training thread."""
        futures, self.futures = self.futures, []
        for f in futures:
            # blocks until done (the process group's timeout bounds a
            # dead peer)
            f.exception()
        if self.error is not None:
            e, self.error = self.error, None
            raise RuntimeError(
                f"a gradient bucket's collective failed on the overlap "
                f"thread: {type(e).__name__}: {e}"
            ) from e
        if self.cuda:
            cur = torch.cuda.current_stream(self.device)
            for ev in self.done:
                cur.wait_event(ev)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def unused_parameters(module: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> list[str]:
    """Names of trainable parameters that get no gradient from one
    backward of `loss_fn`.

    Runs on the bare module (no communication), leaves every .grad None
    and the RNG untouched, so training afterwards is exactly as without
    the check.
    """
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    saved = [p.grad for _, p in params]
    devices = (
        [torch.cuda.current_device()]
        if torch.cuda.is_available() and any(p.is_cuda for _, p in params)
        else []
    )
    try:
        for _, p in params:
            p.grad = None
        with torch.random.fork_rng(devices=devices):
            loss_fn().backward()
        return [n for n, p in params if p.grad is None]
    finally:
        for (_, p), g in zip(params, saved):
            p.grad = g
