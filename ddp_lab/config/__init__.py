"""The config schema: dataclasses give the types, YAML in conf/ gives the values.

Registered in Hydra's ConfigStore, so a misspelt key or a wrong type fails at composition. The
sections live in launch.py, workload.py, train.py, run.py and sync.py (torch-free); this module
joins them (`Config`), registers them and reads them back (`load_run_config`: workers do not
compose, they read their run folder's config.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from hydra import compose as hydra_compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, MISSING, OmegaConf

from .help import doc, help_keys
from .launch import (LauncherConfig, LocalLauncherConfig, MpirunLauncherConfig,
    RunaiLauncherConfig, SlurmLauncherConfig)
from .registry import Registry
from .run import (DebugConfig, device_type, DistConfig, LogConfig, RunConfig, StudyConfig,
    TimingConfig)
from .sync import SYNC_SCHEMAS, SyncConfig
from .train import batch_plan, BatchPlan, cuda_graph_problem, CUDA_GRAPH_SYNCS, TrainConfig
from .workload import (AdamConfig, CNNConfig, DataConfig, MLPConfig, ModelConfig, OptimConfig,
    ResNet18Config, SGDConfig, widths)


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
    debug: DebugConfig = field(default_factory=DebugConfig)
    study: Optional[StudyConfig] = doc(None, "`study=scaling`: run a ladder of world sizes "
                                             "(ddp_lab/command/study.py); null = one run")
    study_point: Optional[Dict[str, Any]] = doc(None, "set by a study in each point's config "
                                                      "({id, world, repeat, index}); the "
                                                      "trainer copies it into summary.json "
                                                      "`study`. Not for users.")


PACKAGE = Path(__file__).resolve().parents[1]


def _find(name: str) -> Path:
    top = PACKAGE.parent
    # pyproject.toml beside the package marks a checkout: an installed package's parent is
    # site-packages, where a stray top-level `conf/` of another distribution may live
    if (top / "pyproject.toml").is_file() and (top / name).is_dir():
        return top / name
    bundled = PACKAGE / f"_{name}"
    if bundled.is_dir():
        return bundled
    raise FileNotFoundError(f"ddp_lab: neither {top / name} (a checkout) nor {bundled} (an "
                            "installed wheel) exists: reinstall ddp_lab (pip install .)")


def conf_dir() -> Path:
    """The Hydra config tree: config.yaml, bench.yaml and the groups."""
    return _find("conf")


def launchers_dir() -> Path:
    """The templates the launchers render (local.sh, slurm.sbatch, ...)."""
    return _find("launchers")


# group -> option -> schema. Adding an option = a dataclass + a YAML in conf/ + the implementation
# in its kind's registry (tests/test_registry.py checks they agree).
SCHEMAS: dict[str, Registry[type]] = {
    "launcher": Registry("launcher", {
        "local": LocalLauncherConfig, "mpirun": MpirunLauncherConfig,
        "slurm": SlurmLauncherConfig, "runai": RunaiLauncherConfig}),
    # their keys and rules, torch-free: config/sync.py
    "sync": Registry("sync", SYNC_SCHEMAS),
    "model": Registry("model", {"mlp": MLPConfig, "mlp_wide": MLPConfig, "cnn": CNNConfig,
                                "resnet18": ResNet18Config}),
    "data": Registry("data", {"mnist": DataConfig}),
    "optim": Registry("optim", {"adam": AdamConfig, "sgd": SGDConfig}),
}

# checkout or installed wheel
CONF_DIR = conf_dir()


# the groups each entry point's `--help` lists (`${ddp_lab_groups:<app>}`); Hydra's own listing
# would also show `schema/*` and the bench presets
HELP_GROUPS = {"config": ("launcher", "sync", "model", "data", "optim", "cluster", "study"),
               "bench": ("launcher", "bench", "cluster")}


def group_options(group: str) -> list[str]:
    """A group's options: its registry, or the YAML presets of conf/<group>/ (cluster, bench)."""
    if group in SCHEMAS:
        return list(SCHEMAS[group])
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def help_groups(app: str) -> str:
    return "\n".join(f"{g}: {', '.join(group_options(g))}" for g in HELP_GROUPS[app])


def register_configs() -> None:
    """Register the schema nodes; conf/<group>/<name>.yaml starts from `/schema/<group>/<name>`."""
    OmegaConf.register_new_resolver("ddp_lab_groups", help_groups, replace=True)
    OmegaConf.register_new_resolver("ddp_lab_keys", help_keys, replace=True)
    cs = ConfigStore.instance()
    cs.store(group="schema", name="config", node=Config)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            # kept in their own group so `sync=` error messages list only real options
            cs.store(group=f"schema/{group}", name=option, node=schema)
    # a study is optional (study: null): not in SCHEMAS, whose groups every run has
    cs.store(group="schema/study", name="scaling", node=StudyConfig)


def schema_for(group: str, name: str) -> type:
    """The schema of a group's option (UnknownName, which lists the options, for another)."""
    return SCHEMAS[group].get(name)


def with_defaults(cfg: Any) -> Any:
    """A plain sync section (`OmegaConf.create({"name": "ring"})`, as tests and scripts make)
    completed with its schema's defaults; a composed config comes back as it is."""
    if not isinstance(cfg, DictConfig) or OmegaConf.get_type(cfg) is not dict:
        return cfg
    base = OmegaConf.structured(schema_for("sync", cfg.name))
    # keys the schema lacks stay as given
    OmegaConf.set_struct(base, False)
    return OmegaConf.merge(base, cfg)


def check_section(group: str, cfg: Any) -> None:
    """Raise ValueError (with the fix) if the model section `cfg` cannot be built, or the optim
    section is one torch.optim refuses (`group`: model | optim)."""
    schema_for(group, cfg.name).check(cfg)


def check_sync(cfg: SyncConfig, world_size: int) -> None:
    """Raise ValueError (with the fix) if sync section `cfg` cannot run on `world_size` ranks."""
    schema_for("sync", cfg.name).check(with_defaults(cfg), world_size)


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


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    """The trainer's config as `python -m ddp_lab <overrides>` composes it, from Python."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)
