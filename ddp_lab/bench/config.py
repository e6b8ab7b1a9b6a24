"""The benchmark's config schema: `conf/bench.yaml` composes it with the launcher group.

The bench shares the trainer's `launcher`, `dist`, `run` and `log` sections (so every launcher
works unchanged) and adds a `bench` section; `run.entry` names the module the launcher starts on
every rank (`ddp_lab.bench.worker`). Presets live in `conf/bench/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ..config import (SCHEMAS, DistConfig, LauncherConfig, LogConfig, RunConfig, doc,
                      register_configs)
from ..config.registry import Registry

# bench.ops -> the implementations each has. The submitting side reads this table and imports no
# torch; the ops themselves (ops.py, which take their algorithms from ddp_lab.collectives' tables)
# check at import that they are exactly these.
OPS: Registry[tuple[str, ...]] = Registry("bench.ops", {
    "all_reduce": ("torch", "linear", "tree", "butterfly", "ring"),
    "reduce": ("torch", "linear", "tree"),
    "broadcast": ("torch", "linear", "tree", "ring"),
    "reduce_broadcast": ("torch", "linear", "tree"),
    "send_recv_ring": ("torch",),
    "isend_irecv_ring": ("torch",),
    "all_gather": ("torch", "ring"),
    "gather": ("linear", "tree", "torch"),
    "reduce_scatter": ("torch", "ring"),
    "ping_pong": ("torch",),
})
# bench.impl option -> the ops that have it
IMPLS: Registry[list[str]] = Registry("bench.impl", {
    impl: [op for op, impls in OPS.items() if impl in impls]
    for impl in dict.fromkeys(i for impls in OPS.values() for i in impls)})
GROUPS: Registry[str] = Registry("bench.groups", {
    "global": "all ranks", "intra_node": "the ranks of one node",
    "cross_node": "one local rank across nodes"})
DTYPES: Registry[str] = Registry("bench.dtype", {n: n for n in (
    "float32", "float64", "float16", "bfloat16", "int32", "int64")})


@dataclass
class BenchConfig:
    """What to measure: ops x implementations x process groups x sizes."""

    name: str = doc("sweep", "the preset this section came from "
                             "(conf/bench/<name>.yaml): sweep | handin")
    ops: List[str] = doc(["all_reduce"], "all_reduce | reduce | broadcast | "
                                         "reduce_broadcast | send_recv_ring (blocking, "
                                         "even ranks send first) | isend_irecv_ring | "
                                         "all_gather | gather | reduce_scatter | ping_pong")
    impl: List[str] = doc(["torch"], "torch (torch.distributed) and/or ddp_lab.collectives' ring "
                                     "| butterfly | tree | linear; an op runs every listed "
                                     "implementation it has")
    groups: List[str] = doc(["global"], "global (all ranks) | intra_node (the ranks of one node) "
                                        "| cross_node (one local rank across nodes); all groups "
                                        "of a kind run at the same time, as in the assignment")
    dtype: str = doc("float32", "element type: float32 | float64 | "
                                "float16 | bfloat16 | int32 | int64")
    min_elements: int = doc(1024, "smallest size, in elements (2^10)")
    max_elements: int = doc(67108864, "largest size, in elements (2^26); capped "
                                      "by free memory, with a message")
    points: int = doc(9, "sizes, evenly spaced on a log scale from min to "
                         "max (powers of two where they fall)")
    sizes: List[int] = doc([], "extra sizes in elements, measured besides the "
                               "log-spaced ones (e.g. a synchroniser's bucket sizes: "
                               "`python -m ddp_lab.bench.suite truth` compares a training step's "
                               "calls with the bench at exactly their size)")
    warmup: int = doc(2, "untimed iterations before every size (connections, allocation, caches)")
    iters: int = doc(20, "most timed iterations per size")
    min_iters: int = doc(3, "fewest timed iterations per size (large sizes stop here)")
    time_per_size_s: float = doc(1.0, "timing budget per size: iterations = budget / "
                                      "warm-up time, within [min_iters, iters]")
    memory_fraction: float = doc(0.5, "share of free memory (host RAM split over local "
                                      "ranks, or this GPU's) sizes may use")
    node_size: int = doc(0, "0: nodes as the launcher reports them; N > 0: pretend each block of "
                            "N consecutive ranks is a node (tries the intra/cross-node groups on "
                            "one machine; then the numbers say nothing about a network)")
    plot_metric: str = doc("busbw", "y axis of the plots: busbw | algbw (GB/s) | throughput "
                                    "(GiB/s: bytes / time, the assignment's figure)")
    title: str = doc("", "plot title prefix (empty: op names)")


@dataclass
class BenchRootConfig:
    launcher: LauncherConfig = MISSING
    bench: BenchConfig = field(default_factory=BenchConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(entry="ddp_lab.bench.worker"))
    log: LogConfig = field(default_factory=LogConfig)


def register_bench_configs() -> None:
    """The trainer's schema nodes (launchers) plus the bench's own."""
    register_configs()
    cs = ConfigStore.instance()
    cs.store(group="schema", name="bench_config", node=BenchRootConfig)
    cs.store(group="schema/bench", name="bench", node=BenchConfig)


def load_bench_config(run_dir: str | Path) -> DictConfig:
    """Read a bench run folder's resolved config.yaml back, typed by the schema."""
    raw = OmegaConf.load(Path(run_dir) / "config.yaml")
    if "bench" not in raw:
        raise ValueError(f"{run_dir}/config.yaml has no 'bench' section: not a bench run folder")
    cfg = OmegaConf.structured(BenchRootConfig)
    launcher: Any = raw.get("launcher")
    if launcher is None:
        raise ValueError(f"{run_dir}/config.yaml has no 'launcher' section")
    name = launcher.get("name")
    cfg.launcher = OmegaConf.structured(
        SCHEMAS["launcher"][name] if name in SCHEMAS["launcher"] else LauncherConfig)
    merged = OmegaConf.merge(cfg, raw)
    OmegaConf.set_readonly(merged, True)
    return merged
