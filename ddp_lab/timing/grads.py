"""Compute end: the moment the step's last gradient was ready, the line between the
model's own work and the communication that comes after it (ddp_lab/timing/comm.py).

`GradReadyMark` stamps every trainable parameter's `register_post_accumulate_grad_hook`
(the host clock on CPU; on CUDA a preallocated event re-recorded by each hook, so it holds
the last one); the last stamp of the step wins. `StepTimer.watch_grads` sets it up and
hands each step's mark to its `StepTimes.compute_end`. A step whose hooks did not fire
(timing off, no trainable parameter) takes its backward end as compute end.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .clock import Clock


class GradReadyMark:
    """The moment the last gradient of a step was ready: compute end (module docstring).

    One `register_post_accumulate_grad_hook` per trainable parameter stamps it each time
    a gradient is accumulated; `take()` (at the step's end) hands over the last stamp and
    starts the next step's. CPU: the host clock (a float, no allocation). CUDA: the hook
    re-records the step's preallocated event on the stream that produced the gradient
    (re-recording keeps the latest); events come from the clock's pool and go back to it
    once per epoch (`recycle`, after the epoch's stamps were read), so no step allocates one.
    """

    def __init__(self, clock: Clock, module: torch.nn.Module):
        self.clock = clock
        self.cuda = clock.cuda
        self.last: Any = None
        self._used: list = []  # CUDA: events handed out this epoch
        self._event: Any = None
        self.handles = [p.register_post_accumulate_grad_hook(self._hook)
                        for p in module.parameters() if p.requires_grad]

    def _hook(self, _param: torch.Tensor) -> None:
        if not self.cuda:
            self.last = time.perf_counter()
            return
        if self._event is None:
            self._event = self.clock.event()
        self._event.record()  # on the current stream: the one that produced this gradient
        self.last = self._event

    def take(self) -> Any:
        out, self.last = self.last, None
        if self.cuda and self._event is not None:
            self._used.append(self._event)
            self._event = None
        return out

    def recycle(self) -> None:
        """CUDA: the epoch's events were read; they go back to the clock's pool."""
        self.clock.release(self._used)
        self._used = []

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
