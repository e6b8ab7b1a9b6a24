"""sync.overlap=true: each gradient bucket's collective starts during
backward, as DDP's do (docs/compression_overlap.md, "Overlap and exposed
comm"). `ReadyBuckets`, DDP's reducer in miniature, launches a bucket
once its gradients are all ready, in bucket order only, so every rank
starts the same sequence. `SerialWorker` runs a synchroniser's blocking
collectives on ONE FIFO thread; a failure there is raised in the
training thread by `wait()` and the buckets queued behind it are
skipped, so nothing hangs."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch

from ._buckets import Bucket
from .base import unused_parameters


class ReadyBuckets:
    """Hooks that pack and launch each bucket as soon as its gradients
    are all ready."""

    def __init__(
        self, buckets: list[Bucket], launch: Callable[[int, Bucket], None]
    ):
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
                self._next < len(self.buckets)
                and self._count[self._next] == self._need[self._next]
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
        self,
        module: torch.nn.Module,
        loss_fn: Callable[[], torch.Tensor],
        name: str,
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
            missing = [
                p
                for b in self.buckets[launched:]
                for p in b.params
                if p.grad is None
            ]
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
            max_workers=1,
            thread_name_prefix=f"ddp_lab-{name}",
            initializer=init,
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
