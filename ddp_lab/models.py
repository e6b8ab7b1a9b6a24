"""The models: the course notebook's MLP and a small CNN."""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from .registry import Registry


class MLP(nn.Module):
    """The notebook's network: 784 -> hidden (ReLU) -> 10."""

    def __init__(self, hidden: int = 50, in_features: int = 784, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class CNN(nn.Module):
    """conv -> pool -> conv -> pool -> fc -> fc, for 1x28x28 inputs."""

    def __init__(self, channels1: int = 16, channels2: int = 32, hidden: int = 64, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels1, 3, padding=1)
        self.conv2 = nn.Conv2d(channels1, channels2, 3, padding=1)
        self.fc1 = nn.Linear(channels2 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


# model / optim option -> builder from its config section (schemas: ddp_lab.config.SCHEMAS)
MODELS: Registry = Registry("model", {
    "mlp": lambda cfg: MLP(hidden=cfg.hidden),
    "cnn": lambda cfg: CNN(cfg.channels1, cfg.channels2, cfg.hidden),
})


def _adam(cfg, params, lr: float, **fused) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps,
                            weight_decay=cfg.weight_decay, **fused)


def _sgd(cfg, params, lr: float, **fused) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                           weight_decay=cfg.weight_decay, **fused)


OPTIMIZERS: Registry = Registry("optim", {"adam": _adam, "sgd": _sgd})


def build_model(cfg) -> nn.Module:
    return MODELS.get(cfg.name)(cfg)


def build_optimizer(cfg, params, lr: float) -> torch.optim.Optimizer:
    # fused: the whole update in one kernel per dtype/device instead of a Python loop
    # over parameters -- for a small model the step is dispatch-bound, so this matters
    fused = {"fused": True} if cfg.fused else {}
    return OPTIMIZERS.get(cfg.name)(cfg, params, lr, **fused)
