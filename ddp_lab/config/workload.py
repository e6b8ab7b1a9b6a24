"""The schemas of what a run trains: model, data and optimiser."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, List, Optional

from omegaconf import MISSING, OmegaConf

from .help import doc


def _size(value: Any) -> bool:
    """Whether `value` is a layer size: an int >= 1 (True is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def widths(hidden: Any) -> list[int]:
    """`model.hidden` as a list of layer widths: one int or a list of them, each >= 1."""
    ws = list(hidden) if isinstance(hidden, Sequence) and not isinstance(hidden, str) else [hidden]
    if not ws or not all(map(_size, ws)):
        raise ValueError(f"model.hidden={hidden}: give a width >= 1 or a list of them, "
                         "e.g. model.hidden=[2048,2048]")
    return ws


@dataclass
class ModelConfig:
    name: str = doc(MISSING, "mlp | mlp_wide | cnn | resnet18")

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ValueError, with the fix, for sizes the model cannot be built with."""

    @classmethod
    def parameters(cls, cfg: ModelConfig) -> int:
        """The model's parameter count, from its sizes (0: not counted here)."""
        return 0


@dataclass
class MLPConfig(ModelConfig):
    """The course notebook's 784-50-10 ReLU network."""

    hidden: Any = doc(50, "hidden layer widths: one int (784-h-10) or a "
                          "list, e.g. [2048,2048] (784-2048-2048-10)")

    @classmethod
    def check(cls, cfg: MLPConfig) -> None:
        cls.widths(cfg)

    @staticmethod
    def widths(cfg: MLPConfig) -> list[int]:
        hidden = cfg.hidden
        return widths(OmegaConf.to_object(hidden) if OmegaConf.is_config(hidden) else hidden)

    @classmethod
    def parameters(cls, cfg: MLPConfig) -> int:
        ws = [784, *cls.widths(cfg), 10]
        return sum(a * b + b for a, b in zip(ws, ws[1:]))


@dataclass
class ResNet18Config(ModelConfig):
    """torchvision's ResNet-18 adapted to 1x28x28 digits (3x3 stem, no max-pool)."""

    @classmethod
    def parameters(cls, cfg: ModelConfig) -> int:
        return 11_172_810


@dataclass
class CNNConfig(ModelConfig):
    """A small convolutional network."""

    channels1: int = doc(16, "channels of the first conv layer")
    channels2: int = doc(32, "channels of the second conv layer")
    hidden: int = doc(64, "units of the fully connected layer")

    @classmethod
    def check(cls, cfg: CNNConfig) -> None:
        for key in ("channels1", "channels2", "hidden"):
            if not _size(cfg[key]):
                raise ValueError(f"model.{key}={cfg[key]}: must be an integer >= 1 "
                                 f"(default {getattr(cls, key)})")

    @classmethod
    def parameters(cls, cfg: CNNConfig) -> int:
        c1, c2, h = cfg.channels1, cfg.channels2, cfg.hidden
        return (9 * c1 + c1) + (9 * c1 * c2 + c2) + (c2 * 49 * h + h) + (h * 10 + 10)


# -------------------------------------------------------------------- data
@dataclass
class DataConfig:
    name: str = doc("mnist", "dataset name (only mnist)")
    root: str = doc("data", "dataset folder; relative paths are "
                            "resolved on the submitting machine")
    mirrors: List[str] = doc(["embedded"], "where to fetch the raw files from, in order: "
                                           "'embedded' (the copy in the package), a local "
                                           "folder, or an http(s):// base URL")
    node_local: bool = doc(False, "true: root is node-local storage, local "
                                  "rank 0 of every node fetches it")
    pipeline: str = doc("tensor", "tensor: the split as one normalised tensor on the device "
                                  "| dataloader: DataLoader + DistributedSampler")
    num_workers: int = doc(0, "DataLoader worker processes (dataloader pipeline only)")
    normalize: bool = doc(True, "standardise pixels with the MNIST mean/std "
                                "(false: [0,1] as ToTensor gives)")


# ------------------------------------------------------------------- optim
@dataclass
class OptimConfig:
    name: str = doc(MISSING, "adam | sgd (the learning rate is train.lr)")
    weight_decay: float = doc(0.0, "L2 penalty")
    fused: Optional[bool] = doc(None, "one fused kernel for the whole update; null = where "
                                      "the installed torch has it for the device (CPU: torch "
                                      ">= 2.4); false = torch's per-tensor loop")

    @classmethod
    def check(cls, cfg: OptimConfig) -> None:
        """Raise ValueError, with the fix, for what torch.optim refuses when the ranks build it."""
        if cfg.weight_decay < 0:
            raise ValueError(f"optim.weight_decay={cfg.weight_decay}: must be >= 0")


@dataclass
class AdamConfig(OptimConfig):
    betas: List[float] = doc([0.9, 0.999], "Adam's moment decay rates")
    eps: float = doc(1e-8, "Adam's denominator epsilon")

    @classmethod
    def check(cls, cfg: AdamConfig) -> None:
        super().check(cfg)
        betas = list(cfg.betas)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"optim.betas={betas}: two decay rates, each in [0, 1), "
                             "e.g. [0.9,0.999]")
        if cfg.eps <= 0:
            raise ValueError(f"optim.eps={cfg.eps}: must be > 0 (e.g. 1e-8)")


@dataclass
class SGDConfig(OptimConfig):
    momentum: float = doc(0.0, "momentum factor")
    nesterov: bool = doc(False, "Nesterov momentum")

    @classmethod
    def check(cls, cfg: SGDConfig) -> None:
        super().check(cfg)
        if cfg.momentum < 0:
            raise ValueError(f"optim.momentum={cfg.momentum}: must be >= 0")
