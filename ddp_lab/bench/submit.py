"""The submitting side of a benchmark: check, launch, report.

The same machinery as a training run (`ddp_lab.command.validate`, `ddp_lab.command.job`); only the
rules of the `bench` section (BENCH, here), the entry each rank runs (`run.entry`) and the folder's
name (`bench_<launcher>_<date>_<time>`) differ.
"""

from __future__ import annotations

import json
import shlex
import sys
from itertools import takewhile
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, open_dict

from ..command.job import Outcome, collect, launch_job
from ..command.validate import COMMON, Rule, above, at_least, known_sections, one_of, resolve
from ..config.student import absolute_spec, find_functions, is_spec, split_spec
from .config import DTYPES, GROUPS, IMPLS, OPS


# ------------------------------------------------------------------ check
# the bench's own rules, before any process starts; the launcher's and every job's
# (validate.COMMON) come from ddp_lab.command.validate
def _names(cfg: DictConfig) -> Optional[str]:
    b = cfg.bench
    OPS.check(b.ops)
    builtin = [i for i in b.impl if not is_spec(i)]
    if builtin or not b.impl:
        IMPLS.check(builtin)
    GROUPS.check(b.groups)
    DTYPES.check([b.dtype])
    for spec in [i for i in b.impl if is_spec(i)]:
        problem = _student(spec, list(b.ops))
        if problem:
            return problem
    for impl in builtin:
        if not set(IMPLS[impl]) & set(b.ops):
            return (f"bench.impl={impl}: none of bench.ops={list(b.ops)} has it "
                    f"({impl} exists for {', '.join(IMPLS[impl])})")
    return None


#: the ops a student's function can join (bench/ops.py CALLS)
STUDENT_OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")


def _student(spec: str, ops: list[str]) -> Optional[str]:
    """bench.impl=[FILE.py:function]: one function, of a collective the bench measures."""
    found = find_functions(spec, "bench.impl")
    if len(found) != 1 or split_spec(spec)[1] is None:
        names = ", ".join(f.name for f in found)
        return (f"bench.impl={spec}: name one function as {split_spec(spec)[0]}:FUNCTION "
                f"(it has {names})")
    kind = found[0].collective
    if kind not in STUDENT_OPS:
        return (f"bench.impl={spec}: {found[0].name} is a {kind}; the bench measures a "
                f"student's {', '.join(STUDENT_OPS)}")
    if kind not in ops:
        return (f"bench.impl={spec}: {found[0].name} is a {kind}, which bench.ops={ops} does not "
                f"measure: add bench.ops=[{kind}]")
    return None


def _students_pass(cfg: DictConfig) -> Optional[str]:
    """Every student's function passes its check at this world size before the bench starts (a dry
    run starts nothing: not checked)."""
    if cfg.launcher.get("dry_run"):
        return None
    from ..command.validate import student_refusal

    world = cfg.launcher.nodes * cfg.launcher.nproc_per_node
    for spec in [i for i in cfg.bench.impl if is_spec(i)]:
        kind = find_functions(spec, "bench.impl")[0].collective
        problem = student_refusal(spec, kind, world, "bench.impl")
        if problem:
            return problem
    return None


def _gpus(cfg: DictConfig) -> Optional[str]:
    """The hand-in measures NCCL between GPUs: on SLURM it asks for them, and never ends up on CPUs
    (gloo) by accident."""
    lc = cfg.launcher
    if (cfg.bench.name == "handin" and lc.name == "slurm" and not lc.gpus_per_node
            and cfg.dist.device != "cpu"):
        return ("bench=handin on SLURM measures NCCL between GPUs: set launcher.gpus_per_node "
                "(4 on Alps: cluster=alps sets it), or dist.device=cpu to measure gloo on CPUs")
    return None


def _sizes(cfg: DictConfig) -> Optional[str]:
    b = cfg.bench
    world = cfg.launcher.nodes * cfg.launcher.nproc_per_node
    if b.max_elements < b.min_elements:
        return f"bench.max_elements={b.max_elements} is below bench.min_elements={b.min_elements}"
    if not 1 <= b.min_iters <= b.iters:
        return f"bench.min_iters={b.min_iters}, bench.iters={b.iters}: need 1 <= min_iters <= iters"
    if any(int(x) < 1 for x in b.sizes):
        return f"bench.sizes={list(b.sizes)}: every size must be >= 1 element"
    if {"all_gather", "reduce_scatter"} & set(b.ops) and min([b.min_elements, *b.sizes]) < world:
        return (f"bench.min_elements={b.min_elements} is below the world size {world}: "
                "all_gather and reduce_scatter need at least one element per rank")
    return None


BENCH: list[Rule] = [
    known_sections,
    _names,
    at_least("bench.min_elements", 1),
    at_least("bench.points", 1),
    at_least("bench.warmup", 0),
    above("bench.time_per_size_s", 0),
    lambda cfg: None if 0 < cfg.bench.memory_fraction <= 1 else
    f"bench.memory_fraction={cfg.bench.memory_fraction}: must be in (0, 1]",
    at_least("bench.node_size", 0, " (0 = real nodes)"),
    one_of("bench.plot_metric", ("busbw", "algbw", "throughput")),
    _gpus,
    _sizes,
    *COMMON,
    _students_pass,
]


def resolve_bench(cfg: DictConfig) -> DictConfig:
    cfg = cfg.copy()
    # a student's file: the ranks may start in another folder
    with open_dict(cfg):
        cfg.bench.impl = [absolute_spec(i) if is_spec(i) else i for i in cfg.bench.impl]
    return resolve(cfg, BENCH)


# ------------------------------------------------------------------ submit
def submit_bench(cfg: DictConfig, argv: list[str] | None = None,
                 t0: float | None = None) -> Outcome:
    cfg = resolve_bench(cfg)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m ddp_lab.bench " + " ".join(shlex.quote(a) for a in argv) + "\n"
    run_dir, rc = launch_job(cfg, label=f"bench_{cfg.launcher.name}",
                             files={"command.txt": command}, t0=t0)
    if rc is None:
        return Outcome(0, "ok (dry run)", run_dir)
    summary = collect(run_dir, rc, kind="bench", launcher=cfg.launcher.name)
    result = "ok"
    if rc != 0:
        print(f"benchmark failed ({summary['status']}): logs in {run_dir / 'logs'}")
        result = f"failed: {summary['status'].removeprefix('failed: ')}"
    elif not summary:
        # submitted without following (launcher.wait=false): still running
        print(f"no results yet: bench.md, bench.csv and plots/ appear in {run_dir} when the "
              "job ends")
    else:
        if summary.get("measurements"):
            print(_peak_table(run_dir))
        else:
            doc = json.loads((run_dir / "bench.json").read_text())
            print("nothing was measured:\n" + "\n".join(f"  {n}" for n in doc.get("notes", [])))
        print(f"{summary.get('measurements', 0)} measurements, "
              f"{summary.get('wrong_results', 0)} wrong; tables: {run_dir / 'bench.md'}; "
              f"plots: {', '.join(str(run_dir / p) for p in summary.get('plots', []))}")
        result = f"ok: {summary.get('measurements', 0)} measurements"
        if summary.get("wrong_results"):
            # a wrong result is a failure of the implementation under test
            rc = 1
            result = f"failed: {summary['wrong_results']} wrong result(s)"
    print(f"run dir: {run_dir}")
    return Outcome(rc, result, run_dir)


def _peak_table(run_dir: Path) -> str:
    """bench.md's peak bus bandwidth table ("" if it has none)."""
    md = (run_dir / "bench.md").read_text().splitlines() if (run_dir / "bench.md").exists() else []
    if "## Peak bus bandwidth" not in md:
        return ""
    rest = md[md.index("## Peak bus bandwidth") + 2:]
    return "\n".join(takewhile(lambda line: line.startswith("|"), rest))
