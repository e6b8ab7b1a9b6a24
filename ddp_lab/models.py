"""The models: the course notebook's MLP (any widths: mlp_wide is the
same class), a small CNN, and torchvision's ResNet-18 adapted to 1x28x28
digits."""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from .world import torch_support
from .config import AdamConfig, ModelConfig, OptimConfig, SGDConfig, widths
from .config.registry import Registry


class MLP(nn.Module):
    """784 -> hidden[0] (ReLU) -> hidden[1] (ReLU) ... -> 10. With one
    width it is the notebook's network (784-50-10), parameters named
    fc1, fc2 as before."""

    def __init__(self, hidden=50, in_features: int = 784, classes: int = 10):
        super().__init__()
        sizes = [in_features, *widths(hidden), classes]
        for i, (a, b) in enumerate(zip(sizes, sizes[1:]), start=1):
            self.add_module(f"fc{i}", nn.Linear(a, b))
        self.layers = len(sizes) - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for i in range(1, self.layers):
            x = F.relu(getattr(self, f"fc{i}")(x))
        return getattr(self, f"fc{self.layers}")(x)


class CNN(nn.Module):
    """conv -> pool -> conv -> pool -> fc -> fc, for 1x28x28 inputs."""

    def __init__(
        self,
        channels1: int = 16,
        channels2: int = 32,
        hidden: int = 64,
        classes: int = 10,
    ):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels1, 3, padding=1)
        self.conv2 = nn.Conv2d(channels1, channels2, 3, padding=1)
        self.fc1 = nn.Linear(channels2 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def resnet18(classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 (11.2M parameters) for 1x28x28 input: a
    3x3 stride-1 stem on one channel and no max-pool (the 7x7/2 stem and
    pool would shrink 28x28 to 7x7 before the first block, as CIFAR
    adaptations of ResNet do), `classes` outputs."""
    # lazy: torchvision takes seconds to load (torch._dynamo, sympy) and
    # only resnet18 needs it
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(weights=None, num_classes=classes)
    net.conv1 = nn.Conv2d(
        1, 64, kernel_size=3, stride=1, padding=1, bias=False
    )
    net.maxpool = nn.Identity()
    return net


# model / optim option -> builder from its config section (schemas:
# ddp_lab.config.SCHEMAS)
MODELS: Registry = Registry(
    "model",
    {
        "mlp": lambda cfg: MLP(hidden=cfg.hidden),
        "mlp_wide": lambda cfg: MLP(hidden=cfg.hidden),
        "cnn": lambda cfg: CNN(cfg.channels1, cfg.channels2, cfg.hidden),
        "resnet18": lambda cfg: resnet18(),
    },
)


def _adam(
    cfg: AdamConfig, params, lr: float, **fused
) -> torch.optim.Optimizer:
    return torch.optim.Adam(
        params,
        lr=lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        **fused,
    )


def _sgd(cfg: SGDConfig, params, lr: float, **fused) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params,
        lr=lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
        **fused,
    )


OPTIMIZERS: Registry = Registry("optim", {"adam": _adam, "sgd": _sgd})


def build_model(cfg: ModelConfig) -> nn.Module:
    return MODELS.get(cfg.name)(cfg)


def build_optimizer(
    cfg: OptimConfig, params, lr: float
) -> torch.optim.Optimizer:
    # fused: the whole update in one kernel per dtype/device instead of
    # a Python loop over parameters -- for a small model the step is
    # dispatch-bound, so this matters (null: where the installed torch
    # has it for these parameters' device,
    # ddp_lab/world/torch_support.py)
    params = list(params)
    device = params[0].device.type if params else "cpu"
    sharded = any(type(p).__name__ == "DTensor" for p in params)  # sync=fsdp2
    use = torch_support.fused(cfg.name, device, cfg.fused, sharded)
    fused = {"fused": True} if use else {}
    return OPTIMIZERS.get(cfg.name)(cfg, params, lr, **fused)
