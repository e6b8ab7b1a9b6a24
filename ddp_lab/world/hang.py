"""What a hung rank leaves behind: PyTorch's NCCL flight recorder (dumped into
RUN_DIR/flight_recorder/ when a collective times out; turned on by `distributed` before
init_process_group) and this rank's watchdog (every thread's stack into its log; made by
`run_rank`, which hands it to the rank's DistContext, re-armed by the stop checks). No torch at
import.
"""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path
from typing import Any, Optional

# ------------------------------------------------------------------ the NCCL flight recorder
# (current name, name before, the torch that reads the current one): the old name warns
FLIGHT_RECORDER_NAMES = {"buffer": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "2.9"),
                         "dump": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "2.5")}


def flight_recorder_env(run_dir: Path, buffer_size: int = 2000,
                        torch_version: Optional[str] = None) -> dict[str, str]:
    """The variables that turn on PyTorch's NCCL flight recorder, its dumps in
    RUN_DIR/flight_recorder/rank_<N> (made here), under the names `torch_version` reads."""
    from torch.torch_version import TorchVersion, __version__

    version = TorchVersion(torch_version or __version__)
    folder = Path(run_dir) / "flight_recorder"
    folder.mkdir(parents=True, exist_ok=True)
    values = {"buffer": str(buffer_size), "dump": str(folder / "rank_")}
    env = {now if version >= since else before: values[kind]
           for kind, (now, before, since) in FLIGHT_RECORDER_NAMES.items()}
    return {**env, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def enable_flight_recorder(run_dir: Path, environ: Optional[dict] = None,
                           torch_version: Optional[str] = None) -> dict[str, str]:
    """Set `flight_recorder_env` before init_process_group, keeping a user's; those in effect."""
    environ = os.environ if environ is None else environ
    aliases = {name: names[:2] for names in FLIGHT_RECORDER_NAMES.values() for name in names[:2]}
    in_effect = {}
    for key, value in flight_recorder_env(run_dir, torch_version=torch_version).items():
        names = aliases.get(key, (key,))
        if not any(n in environ for n in names):
            environ[key] = value
        in_effect.update({n: environ[n] for n in sorted(names) if n in environ})
    return in_effect


# ------------------------------------------------------------------ hang watchdog
class Watchdog:
    """Dumps every thread's stack into the log after `timeout_s` without progress (a C thread: it
    fires inside a stuck collective too); `rearm()`, cheap, starts the wait again."""

    def __init__(self, timeout_s: float, file: Any = None):
        self.timeout_s, self.file, self.armed = float(timeout_s), file, False

    def rearm(self) -> None:
        if self.file is None or self.timeout_s <= 0:
            return
        faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self.file)
        self.armed = True

    def cancel(self) -> None:
        if self.armed:
            faulthandler.cancel_dump_traceback_later()
            self.armed = False
