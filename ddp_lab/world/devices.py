"""The GPUs this machine shows, asked without importing torch where it has none."""

from __future__ import annotations

from pathlib import Path


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
