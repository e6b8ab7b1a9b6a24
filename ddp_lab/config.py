"""The config schema: dataclasses give the types, YAML in conf/ gives the values.

Registered in Hydra's ConfigStore so that a misspelt key or a value of the wrong type
fails at composition, with Hydra's own message, before any process starts. Each config
group option (conf/<group>/<name>.yaml) starts from its schema node `/schema/<group>/<name>`.

Workers do not compose: they read the resolved `config.yaml` of their run folder back
into the same schema with `load_run_config`, so every rank runs exactly one config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


# ---------------------------------------------------------------- launcher
@dataclass
class LauncherConfig:
    """How the ranks are started."""

    name: str = MISSING
    """launcher kind: local | mpirun | slurm | runai"""
    nodes: int = 1
    """number of machines (nodes, pods)"""
    nproc_per_node: Optional[int] = None
    """processes per node; null = one per GPU, else 2 on CPU"""
    dry_run: bool = False
    """render and print what would be run, write it into the run folder, start nothing"""
    max_restarts: int = 0
    """torchrun restarts of the whole worker group after a failure (resumes from checkpoint)"""


@dataclass
class LocalLauncherConfig(LauncherConfig):
    """torchrun on this machine."""

    master_port: Optional[int] = None
    """rendezvous port; null = a free one"""


# -------------------------------------------------------------------- sync
@dataclass
class SyncConfig:
    """How gradients are synchronised across ranks."""

    name: str = MISSING
    """ddp | allreduce | reduce_broadcast | ring | tree | butterfly (ddp_lab/sync/<name>.py)"""


@dataclass
class DDPSyncConfig(SyncConfig):
    """torch.nn.parallel.DistributedDataParallel."""

    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MB"""
    gradient_as_bucket_view: bool = False
    """let .grad alias the bucket memory (saves a copy)"""
    static_graph: bool = False
    """promise DDP the graph never changes (needs every parameter used)"""
    find_unused_parameters: bool = False
    """let DDP look for parameters that got no gradient"""


@dataclass
class BucketSyncConfig(SyncConfig):
    """Flattened gradient buckets, one collective call per bucket (allreduce, ring, tree,
    butterfly)."""

    bucket_mb: float = 25.0
    """bucket size in MB (1e6 bytes); 0 = one call per parameter"""


@dataclass
class ReduceBroadcastSyncConfig(BucketSyncConfig):
    """Reduce gradients to a root, step there, broadcast the parameters."""

    root: int = 0
    """the rank that averages, steps the optimiser and holds its state"""


# ------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    name: str = MISSING
    """mlp | cnn"""


@dataclass
class MLPConfig(ModelConfig):
    """The course notebook's 784-50-10 ReLU network."""

    hidden: int = 50
    """hidden units"""


@dataclass
class CNNConfig(ModelConfig):
    """A small convolutional network."""

    channels1: int = 16
    """channels of the first conv layer"""
    channels2: int = 32
    """channels of the second conv layer"""
    hidden: int = 64
    """units of the fully connected layer"""


# -------------------------------------------------------------------- data
@dataclass
class DataConfig:
    name: str = "mnist"
    """dataset name (only mnist)"""
    root: str = "data"
    """dataset folder; relative paths are resolved on the submitting machine"""
    mirrors: List[str] = field(default_factory=lambda: ["embedded"])
    """where to fetch the raw files from, in order: 'embedded' (the copy in the package),
    a local folder, or an http(s):// base URL"""
    node_local: bool = False
    """true: root is node-local storage, local rank 0 of every node fetches it"""
    pipeline: str = "tensor"
    """tensor: the split as one normalised tensor on the device | dataloader: DataLoader + DistributedSampler"""
    num_workers: int = 0
    """DataLoader worker processes (dataloader pipeline only)"""
    normalize: bool = True
    """standardise pixels with the MNIST mean/std (false: [0,1] as ToTensor gives)"""


# ------------------------------------------------------------------- optim
@dataclass
class OptimConfig:
    name: str = MISSING
    """adam | sgd (the learning rate is train.lr)"""
    weight_decay: float = 0.0
    """L2 penalty"""


@dataclass
class AdamConfig(OptimConfig):
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's moment decay rates"""
    eps: float = 1e-8
    """Adam's denominator epsilon"""


@dataclass
class SGDConfig(OptimConfig):
    momentum: float = 0.0
    """momentum factor"""
    nesterov: bool = False
    """Nesterov momentum"""


# ------------------------------------------------------------ fixed sections
@dataclass
class TrainConfig:
    epochs: int = 5
    """passes over the training set"""
    batch_size: int = 64
    """samples per step and per rank"""
    lr: float = 1e-3
    """learning rate"""
    seed: int = 0
    """seed of weights and shuffling (the same on every rank)"""
    max_steps_per_epoch: int = 0
    """0 = the whole shard; >0 stops each epoch early (quick checks)"""
    eval_batch_size: int = 1000
    """samples per evaluation batch"""
    checkpoint: bool = True
    """write a checkpoint at the end of every epoch"""
    resume: bool = False
    """continue from the last complete checkpoint in run.dir"""
    threads: int = 0
    """torch CPU threads per rank; 0 = cores / local ranks"""


@dataclass
class DistConfig:
    backend: str = "auto"
    """auto (nccl with CUDA, else gloo) | gloo | nccl"""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda"""
    timeout_s: float = 120.0
    """init and collective timeout: a missing peer fails after this, never hangs"""


@dataclass
class RunConfig:
    root: str = "outputs"
    """where run folders are created"""
    dir: Optional[str] = None
    """the run folder; null = <root>/<date>_<time>_<sync>_<model>; set it to resume a run"""


@dataclass
class LogConfig:
    progress: str = "auto"
    """auto (a bar on an interactive terminal) | bar | lines"""
    level: str = "INFO"
    """python logging level of the console"""


@dataclass
class TimingConfig:
    """Per-step phase and communication timing."""

    enabled: bool = True
    """time every phase of every step and every collective (false: only epoch wall time
    and bytes, to measure what the timers themselves cost)"""
    trace: bool = True
    """write trace/rank<N>.json and trace/all.json (Chrome trace events: ui.perfetto.dev)"""
    trace_steps: int = 10
    """steps of each epoch in the trace: the first N and the last N"""
    tb_every: int = 10
    """TensorBoard per-step scalars (step, sync and comm ms) every N steps; 0 = none"""


@dataclass
class Config:
    launcher: LauncherConfig = MISSING
    sync: SyncConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    run: RunConfig = field(default_factory=RunConfig)
    log: LogConfig = field(default_factory=LogConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)


# group -> option -> schema. Adding an option = one dataclass here + one YAML in conf/.
SCHEMAS: dict[str, dict[str, type]] = {
    "launcher": {"local": LocalLauncherConfig},
    "sync": {"ddp": DDPSyncConfig, "allreduce": BucketSyncConfig,
             "reduce_broadcast": ReduceBroadcastSyncConfig, "ring": BucketSyncConfig,
             "tree": BucketSyncConfig, "butterfly": BucketSyncConfig},
    "model": {"mlp": MLPConfig, "cnn": CNNConfig},
    "data": {"mnist": DataConfig},
    "optim": {"adam": AdamConfig, "sgd": SGDConfig},
}

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def register_configs() -> None:
    """Register the schema nodes; conf/<group>/<name>.yaml starts from `/schema/<group>/<name>`."""
    cs = ConfigStore.instance()
    cs.store(group="schema", name="config", node=Config)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            # kept in their own group so `sync=` error messages list only real options
            cs.store(group=f"schema/{group}", name=option, node=schema)


def schema_for(group: str, name: str) -> type:
    try:
        return SCHEMAS[group][name]
    except KeyError:
        valid = ", ".join(sorted(SCHEMAS.get(group, {})))
        raise ValueError(f"unknown {group} '{name}': choose one of {valid}") from None


def load_run_config(run_dir: str | Path) -> DictConfig:
    """Read a run folder's resolved config.yaml back, typed by the schema."""
    raw = OmegaConf.load(Path(run_dir) / "config.yaml")
    cfg = OmegaConf.structured(Config)
    for group in SCHEMAS:
        node: Any = raw.get(group)
        if node is None:
            raise ValueError(f"{run_dir}/config.yaml has no '{group}' section")
        cfg[group] = OmegaConf.structured(schema_for(group, node.get("name", "mnist")))
    merged = OmegaConf.merge(cfg, raw)
    OmegaConf.set_readonly(merged, True)
    return merged
