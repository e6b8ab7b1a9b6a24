"""ddp_lab: learn, run and measure data-parallel training with PyTorch."""

__version__ = "0.1.0"
