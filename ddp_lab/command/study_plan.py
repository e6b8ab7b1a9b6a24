"""A study's plan: its points (world x repeat, each with its launcher
layout) and each point's ordinary run config, checked by the trainer's
rules (study.py runs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, open_dict

from ..config.errors import UserError
from ..launch.mpirun import parse_hosts, place
from .config_rules import known_sections
from .validate import (COMMON, Rule, at_least, check, one_of, resolve, resolve_train)

ORDERS = ("interleaved", "grouped")
# processes one machine is asked to run for one point
MAX_LOCAL_WORLD = 64


@dataclass
class Point:
    index: int  # 1-based, run order
    world: int
    repeat: int  # 1-based
    nodes: int
    nproc_per_node: int
    folder: str  # relative to the study folder
    # mpirun: the `name:slots` subset this point uses
    hosts: Optional[list] = None


# ------------------------------------------------------------------ the plan
def layout(world: int, lc) -> tuple[int, int, Optional[list]] | str:
    """How `world` ranks fit the launcher: (nodes, processes per node,
    mpirun hosts), or one line saying why they do not (the rule `_fits`
    turns it into the user's error)."""
    name = lc.name
    if name == "local":
        if world > MAX_LOCAL_WORLD:
            return (f"study.worlds has {world}: launcher=local runs one machine's processes, "
                    f"at most {MAX_LOCAL_WORLD}; use launcher=slurm or mpirun for more")
        return 1, world, None
    if name == "slurm":
        nodes, nproc = lc.nodes, lc.nproc_per_node
        # the fewest nodes: intra-node first, as users expect
        for k in range(1, nodes + 1):
            if world % k == 0 and world // k <= nproc:
                return k, world // k, None
        return (f"study.worlds has {world}: the allocation is launcher.nodes={nodes} x "
                f"launcher.nproc_per_node={nproc}; a world must be k nodes x p processes with "
                f"k <= {nodes} and p <= {nproc}: drop {world} or raise launcher.nodes")
    if name == "mpirun":
        hosts = parse_hosts(lc.hosts, 1)
        total = sum(s for _, s in hosts)
        if world > total:
            return (f"study.worlds has {world}: the hosts give {total} slot(s) "
                    f"({', '.join(map(str, lc.hosts))}); drop {world} or add hosts/slots")
        # the first `world` slots, as mpirun's -np fills them
        placed = place(hosts, world)
        return len(placed), max(s for _, s in placed), [f"{n}:{s}" for n, s in placed]
    return f"launcher={name}: a study is not supported yet; use launcher=local, slurm or mpirun"


def plan(cfg: DictConfig) -> list[Point]:
    """Every point in run order: interleaved (1,2,4,1,2,4,...) or
    grouped (1,1,2,2,...)."""
    st = cfg.study
    pairs = ([(w, r) for r in range(1, st.repeats + 1) for w in st.worlds]
             if st.order == "interleaved" else
             [(w, r) for w in st.worlds for r in range(1, st.repeats + 1)])
    points = []
    for i, (w, r) in enumerate(pairs, 1):
        fit = layout(w, cfg.launcher)
        if isinstance(fit, str):
            raise UserError(fit)
        nodes, nproc, hosts = fit
        points.append(Point(i, w, r, nodes, nproc, f"points/w{w}_r{r}", hosts))
    return points


def point_config(base: DictConfig, point: Point, study_dir: Optional[Path],
                 study_id: str) -> DictConfig:
    """The ordinary run config of one point, resolved and checked by the
    trainer's rules."""
    cfg = base.copy()
    with open_dict(cfg):
        cfg.study = None
        cfg.study_point = {"id": study_id, "world": point.world, "repeat": point.repeat,
                           "index": point.index}
        cfg.launcher.nodes = point.nodes
        cfg.launcher.nproc_per_node = point.nproc_per_node
        if point.hosts is not None:
            cfg.launcher.hosts = list(point.hosts)
            cfg.launcher.hostfile = None
            # every slot of the point's hosts
            cfg.launcher.np = None
        cfg.run.dir = str(study_dir / point.folder) if study_dir is not None else None
    return resolve_train(cfg)


# ------------------------------------------------------------------ the study's rules
def _launcher(cfg: DictConfig) -> Optional[str]:
    if cfg.launcher.name == "runai":
        return ("launcher=runai: a study is not supported yet; use launcher=local, slurm or "
                "mpirun (or run each world size as its own runai job)")
    return None


def _worlds(cfg: DictConfig) -> Optional[str]:
    worlds = list(cfg.study.worlds)
    if not worlds:
        return "study.worlds is empty: give the world sizes, e.g. study.worlds=[1,2,4]"
    bad = [w for w in worlds if w < 1]
    if bad:
        return f"study.worlds has {bad[0]}: every world size must be >= 1"
    if len(set(worlds)) != len(worlds):
        return (f"study.worlds={worlds} lists a world twice: give each once "
                "(study.repeats repeats them)")
    return None


def _fits(cfg: DictConfig) -> Optional[str]:
    """Every world fits the (resolved) launcher: slurm k nodes x p,
    mpirun the hosts' slots."""
    for world in cfg.study.worlds:
        fit = layout(world, cfg.launcher)
        if isinstance(fit, str):
            return fit
    return None


# on the composed config, before the launcher resolves it
STUDY_PLAN: list[Rule] = [
    _launcher,
    _worlds,
    at_least("study.repeats", 1),
    one_of("study.order", ORDERS),
]

# on the resolved base config; each point then passes TRAIN
STUDY: list[Rule] = [
    known_sections,
    _fits,
    *COMMON,
]


def resolve_study(cfg: DictConfig) -> DictConfig:
    """The study's base config, resolved and checked (validate.py's
    rules and these), after every point's config was composed and
    checked by TRAIN (in a fresh folder: run_study checks the points'
    own folders again once the study folder is known)."""
    check(cfg, STUDY_PLAN)
    base = resolve(cfg, STUDY)
    for point in plan(base):
        point_config(base, point, None, "")
    return base
