"""Every check of a command, run before any process starts or any folder is made (`python -m
ddp_lab` and `python -m ddp_lab.bench` both call `resolve`).

A rule is a small function of the composed config that returns None, or one line naming the key and
the fix (or raises a `UserError`); rules sit in tables, one per entry point: COMMON and TRAIN here,
STUDY_PLAN and STUDY in study.py, BENCH in bench/submit.py. The launcher's own checks run first
(`launch.resolve`, which also fills its derived values).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import operator
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from .. import launch
from ..config import batch_plan, check_section, check_sync, cuda_graph_problem, device_type
from ..config.errors import UserError
from ..config.run import debug_problem
from ..config.student import absolute_spec, one_function
from ..config.sync import COMPRESS_MODES
from ..folder.rundir import reuse_problem, world_size
from ..launch.slurm import duration_s
from ..world import cpu
from ..world.env import default_nproc, local_gpus
from .lock import in_use

Rule = Callable[[DictConfig], Optional[str]]


def durations(cfg: DictConfig) -> Optional[str]:
    """launcher.time (slurm only) parses in SLURM's formats, by `duration_s` (the one parser, with
    SLURM's launcher: --time, signal_s), here before any process starts."""
    value = OmegaConf.select(cfg, "launcher.time")
    if value is not None:
        duration_s("launcher.time", value)  # raises the one line
    return None


def required_launcher_keys(cfg: DictConfig) -> Optional[str]:
    """A site preset's `launcher.required` keys must be set for a real submission; a dry run
    renders without them (seeing the script is how a user finds what to fill in)."""
    for key in cfg.launcher.get("required", []):
        if key not in cfg.launcher:
            return f"launcher.required names launcher.{key}, which launcher={cfg.launcher.name} has not"
        if not cfg.launcher.dry_run and cfg.launcher[key] in (None, "", []):
            return (f"launcher.{key} is not set, and this cluster preset needs it: add "
                    f"launcher.{key}=... (or launcher.dry_run=true to only render the job)")
    return None


def known_sections(cfg: DictConfig, prefix: str = "") -> Optional[str]:
    """`+foo=1` adds a top-level key the typed sections cannot catch, and `+sync.foo=1` (Hydra's
    `+` adds a key even to a typed section) would be ignored: refuse a key that is no field of its
    section's dataclass (at the top: of the schema composed from, config.Config or the bench's
    BenchRootConfig), at any depth."""
    kind = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(kind):
        # a plain mapping (a dict-typed key): any key is its content
        return None
    fields = [f.name for f in dataclasses.fields(kind)]
    section = prefix.rstrip(".")
    for key in cfg:
        full = f"{prefix}{key}"
        if key not in fields:
            what = (f"not a key of {section} ({section} keys: " if section
                    else "not a config section (sections: ")
            return f"{full}: {what}{', '.join(fields)}); drop +{full}=..."
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            problem = known_sections(child, full + ".")
            if problem:
                return problem
    return None


def folder_problem(key: str, value: str, fix: str) -> Optional[str]:
    """Why folder `value` (given as `key`) cannot be made and written, or None: a probe folder made
    inside it lets the OS refuse in its own words; what it made is removed."""
    path = Path(value).expanduser().absolute()
    probe = path / f".ddp_lab_probe_{os.getpid()}"
    for _ in range(5):
        error = _probe(probe)
        # another command probing the same new folder removed it as ours went in: again
        if not isinstance(error, FileNotFoundError):
            break
    if error is None:
        return None
    reason = getattr(error, "strerror", None) or str(error)
    where = getattr(error, "filename", None)
    at = f" (making {where})" if where and Path(where) not in (path, probe) else ""
    return f"{key}={value} cannot be made or written: {reason}{at}: {fix}"


def _probe(probe: Path) -> Optional[Exception]:
    """Make the folder `probe` (and the folders on the way), then remove what was made; the OS's
    error if it refused."""
    missing = [probe]
    while not os.path.exists(missing[-1].parent) and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir()
                made.append(folder)
            except FileExistsError:
                # made meanwhile by someone else: theirs, not ours
                if folder == probe or not folder.is_dir():
                    raise
    except (OSError, ValueError) as e:
        return e
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def run_folder(cfg: DictConfig) -> Optional[str]:
    if cfg.run.dir:
        return folder_problem("run.dir", cfg.run.dir, "give a folder you can write (or leave "
                              "run.dir unset for a new folder under run.root)")
    return folder_problem("run.root", cfg.run.root, "give a folder you can write, e.g. "
                          "run.root=$HOME/ddp_lab_runs")


def data_folder(cfg: DictConfig) -> Optional[str]:
    if cfg.data.node_local:
        # node-local storage: it exists on the compute nodes, not necessarily here
        return None
    root = Path(cfg.data.root).expanduser()
    if root.is_dir() and (root / "MNIST" / "raw").is_dir() and not os.access(root, os.W_OK):
        # a read-only shared copy that is already there: nothing to write
        return None
    return folder_problem("data.root", cfg.data.root, "give a folder you can write (the "
                          "dataset is fetched there), e.g. data.root=$HOME/data")


def dist_problem(backend: str, device: str, gpus: Optional[int], nproc: int) -> Optional[str]:
    """Why dist.backend with dist.device cannot run, or None. `gpus`: this machine's CUDA devices
    on a local launch; None where the ranks start elsewhere (only a contradiction is refused)."""
    if backend == "nccl" and device == "cpu":
        return ("dist.backend=nccl with dist.device=cpu: nccl moves only CUDA tensors; use "
                "dist.backend=gloo (or auto) on CPU, or dist.device=cuda")
    if gpus is None:
        return None
    kind = device_type(device, gpus > 0)
    if kind == "cuda" and not gpus:
        return ("dist.device=cuda but this machine has no CUDA device (launcher=local): "
                "use dist.device=cpu (or auto)")
    if backend == "nccl" and kind != "cuda":
        return ("dist.backend=nccl but this machine has no CUDA device (launcher=local; "
                "dist.device=auto is cpu here): use dist.backend=gloo (or auto)")
    if kind == "cuda" and nproc > gpus:
        return (f"launcher.nproc_per_node={nproc} with dist.device={device}: this machine "
                f"has {gpus} CUDA device(s), one per rank: set launcher.nproc_per_node<={gpus}, "
                "or dist.device=cpu")
    return None


def dist_pair(cfg: DictConfig) -> Optional[str]:
    """dist.backend x dist.device (dist_problem); this machine's GPUs count on a local launch that
    really starts (not a dry run)."""
    gpus = local_gpus() if cfg.launcher.name == "local" and not cfg.launcher.dry_run else None
    return dist_problem(cfg.dist.backend, cfg.dist.device, gpus, cfg.launcher.nproc_per_node)


# Ranks a core before a local launch is refused (launcher.oversubscribe allows it): 3 or 4 ranks on
# a 2-core laptop are a lesson in sharing, 1000 (a typo for 10) stall the machine for minutes while
# every rank imports torch and waits its turn at every collective.
RANKS_PER_CORE = 4


def oversubscription(cfg: DictConfig) -> Optional[str]:
    """Far more ranks on this machine than it has cores, not asked for."""
    lc = cfg.launcher
    if lc.name != "local" or lc.dry_run or lc.get("oversubscribe"):
        return None
    cores = cpu.cores()
    if lc.nproc_per_node <= RANKS_PER_CORE * cores:
        return None
    return (f"launcher.nproc_per_node={lc.nproc_per_node} starts {lc.nproc_per_node} ranks on "
            f"this machine's {cores} core(s), more than {RANKS_PER_CORE} a core: use at most "
            f"{RANKS_PER_CORE * cores}, or launcher.oversubscribe=true to run them anyway")


def torch_lacks(cfg: DictConfig) -> Optional[str]:
    """optim.fused=true or sync=fsdp2 on a local launch where this torch lacks it (a fused update
    for the ranks' device: torch < 2.4 on CPU; torch.distributed.fsdp.fully_shard: torch < 2.6);
    elsewhere the ranks' torch is not this machine's to judge (sync/fsdp2.py says so in the same
    line)."""
    fused, fsdp2 = cfg.optim.fused is True, cfg.sync.name == "fsdp2"
    if fused and fsdp2 and cfg.optim.name == "sgd":
        return ("optim.fused=true with sync=fsdp2 optim=sgd: torch's fused SGD takes no DTensor "
                "(fsdp2's sharded weights): leave optim.fused=null or set it false")
    if not (fused or fsdp2) or cfg.launcher.name != "local":
        return None
    # imports torch: only for a run that asks for one of them
    from ..world import torch_support

    device = device_type(cfg.dist.device, local_gpus() > 0)
    problem = torch_support.fused_refusal(cfg.optim.name, device) if fused else None
    return problem or (torch_support.fsdp2_refusal() if fsdp2 else None)


#: the most ranks the check forks on this machine for a larger run
MOST_RANKS = 16


def student_refusal(spec: str, collective: str, world: int, key: str,
            ops: tuple[str, ...] = ("SUM",)) -> Optional[str]:
    """None when `spec`'s function passes its check at `world` ranks for `ops` (one it does not
    implement at all is fine: a run uses SUM); else the one-line refusal."""
    f = one_function(spec, collective, key)
    w = max(1, min(world, MOST_RANKS))
    with tempfile.TemporaryDirectory(prefix="ddp_lab_precheck_") as tmp:
        cmd = [sys.executable, "-m", "ddp_lab.check", f"{f.path}:{f.name}={collective}",
               f"check.worlds=[{w}]", f"run.root={tmp}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return f"{key}={spec}: its check at world {w} did not end in 600 s"
        found = list(Path(tmp).glob("*/check.json"))
        if not found:
            err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return f"{key}={spec}: the check could not run: {err}"
        record = json.loads(found[0].read_text())["functions"][0]
    verdict = record["verdict"]
    if verdict == "pass" or (verdict == "unsupported" and not set(ops) & set(
            record.get("unsupported") or [])):
        return None
    return (f"{key}={spec}: {f.name} does not pass its check at world {w}: {verdict}: "
            f"{record.get('detail', '')} (python -m ddp_lab.check {f.path}:{f.name} shows every "
            "case)")


def student_code_passes(cfg: DictConfig) -> Optional[str]:
    """sync=custom: the student's all-reduce passes its check at this world size (not on a dry
    run)."""
    if cfg.sync.name != "custom" or cfg.launcher.get("dry_run"):
        return None
    return student_refusal(cfg.sync.all_reduce, "all_reduce", world_size(cfg) or 1,
                           "sync.all_reduce")


def _fix_of(check: Callable[[DictConfig], object]) -> Rule:
    """A rule from a check that raises ValueError with the fix (the config schemas' checks)."""
    def rule(cfg: DictConfig) -> Optional[str]:
        try:
            check(cfg)
        except ValueError as e:
            return str(e)
        return None
    return rule


#: the sync section for this world size; train.global_batch and train.micro_batch splitting
#: evenly over it (config.batch_plan, which every rank applies again); the model's sizes
sync_fits = _fix_of(lambda cfg: check_sync(cfg.sync, world_size(cfg)))
batch_fits = _fix_of(lambda cfg: batch_plan(cfg.train, world_size(cfg)))
model_fits = _fix_of(lambda cfg: check_section("model", cfg.model))
optimiser_fits = _fix_of(lambda cfg: check_section("optim", cfg.optim))


def cuda_graph_fits(cfg: DictConfig) -> Optional[str]:
    """train.cuda_graph=true: what a graph cannot hold (config/train.py cuda_graph_problem), with
    dist.device=auto as this machine makes it on a local launch that starts."""
    device = cfg.dist.device
    if device == "auto" and cfg.launcher.name == "local" and not cfg.launcher.dry_run:
        device = device_type(device, local_gpus() > 0)
    try:
        accumulation = batch_plan(cfg.train, world_size(cfg) or 1).accumulation
    except ValueError:
        # a batch that cannot split: batch_fits says so
        accumulation = 1
    return cuda_graph_problem(cfg, device, accumulation)


def stop_signal(cfg: DictConfig) -> Optional[str]:
    name = cfg.train.stop_signal
    if name and not (name.startswith("SIG") and isinstance(getattr(signal, name, None), signal.Signals)):
        return f"train.stop_signal={name}: not a signal name (e.g. SIGUSR2, SIGTERM; '' = none)"
    if name in ("SIGKILL", "SIGSTOP", "SIGUSR1"):
        return (f"train.stop_signal={name}: cannot be caught" if name != "SIGUSR1" else
                "train.stop_signal=SIGUSR1: NCCL uses it; pick SIGUSR2 (the default)")
    return None


ONE_FILE_SYNCS = ("naive", "ring")


def run_entry(cfg: DictConfig) -> Optional[str]:
    """run.entry is a module this Python finds (not a traceback from every rank)."""
    entry = cfg.run.entry
    # the lesson itself takes flags, never a run folder
    if entry == "ddp_lab.one_file":
        return ("run.entry=ddp_lab.one_file: the lesson takes flags, not a "
                "run folder; use run.entry=ddp_lab.rank.one_file, which "
                "runs it with this run's settings")
    # the lesson's syncs (one_file.SYNCS; the lesson loads torch)
    if entry == "ddp_lab.rank.one_file" and cfg.sync.name not in ONE_FILE_SYNCS:
        return (f"sync={cfg.sync.name}: run.entry=ddp_lab.rank.one_file "
                "runs stop 0, which has sync=naive and sync=ring")
    try:
        if importlib.util.find_spec(entry) is not None:
            return None
    except (ImportError, ValueError):
        pass
    return (f"run.entry={entry}: no such module; give one every rank runs as `python -m "
            "MODULE RUN_DIR` (default ddp_lab.worker; the one-file lesson: ddp_lab.rank.one_file)")


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def _bound(sign: str, holds: Callable[[Any, float], bool], shown: str) -> Callable[..., Rule]:
    """A rule maker: `key`'s value must be `sign` the limit (`shown`: how the limit is written)."""
    def make(key: str, limit: float, note: str = "") -> Rule:
        return lambda cfg: (None if holds(_get(cfg, key), limit) else
                            f"{key}={_get(cfg, key)}: must be {sign} "
                            f"{shown.format(limit)}{note}")
    return make


at_least = _bound(">=", operator.ge, "{}")
above = _bound(">", operator.gt, "{}")
at_most = _bound("<=", operator.le, "{:g}")


def one_of(key: str, choices: Sequence[str]) -> Rule:
    listed = f"{', '.join(choices[:-1])} or {choices[-1]}"
    return lambda cfg: (None if _get(cfg, key) in choices
                        else f"{key}={_get(cfg, key)}: choose {listed}")


# ------------------------------------------------------------ what a rank can take
# Each limit is one a rank would hit as a traceback (or a machine brought to its knees): said here
# with the key and the limit, before any process starts.
WEEK_S, DAY_S, MIN_TIMEOUT_S = 7 * 86400.0, 86400.0, 5.0
# a rank's threads, a node's ranks, a rank's data workers: where this machine is not the one the
# ranks run on (SLURM, RunAI, mpirun's hosts), no node has more
MAX_THREADS, MAX_RANKS_PER_NODE, MAX_WORKERS = 1024, 1024, 256
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def group_names(cfg: DictConfig) -> Optional[str]:
    """Each config group's section names the option Hydra composed it from: `data.name=true`
    would send every rank to look up an option that is not there."""
    from ..config import SCHEMAS

    for group, options in SCHEMAS.items():
        section = cfg.get(group)
        if not isinstance(section, DictConfig) or "name" not in section:
            continue
        name = section.name
        if name not in options or options[name] is not OmegaConf.get_type(section):
            return (f"{group}.name={name}: set by the group, not by hand: choose the option with "
                    f"{group}=<option> (options: {options.choices()}) and drop {group}.name=")
    return None


def finite_numbers(cfg: DictConfig) -> Optional[str]:
    """No key holds nan or inf: a timeout, a rate or a delay a rank cannot turn into a number.
    (Interpolations are left unresolved: a `${...}` is checked where it is resolved.)"""
    def walk(node: Any, prefix: str) -> Optional[str]:
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = ((str(i), v) for i, v in enumerate(node))
        else:
            bad = isinstance(node, float) and not math.isfinite(node)
            return f"{prefix}={node}: must be a finite number" if bad else None
        for key, value in items:
            found = walk(value, f"{prefix}.{key}" if prefix else str(key))
            if found:
                return found
        return None

    return walk(OmegaConf.to_container(cfg, resolve=False), "")


def _local(cfg: DictConfig) -> bool:
    """The ranks run on this machine (its cores are theirs)."""
    return cfg.launcher.name == "local"


def threads_fit(cfg: DictConfig) -> Optional[str]:
    """train.threads: at most the cores the ranks run on (a thread beyond a core only waits, and
    100000 cannot start at all); data.num_workers likewise (torch's DataLoader warns past the
    cores)."""
    for key, remote, zero in (("train.threads", MAX_THREADS, "decided at start"),
                              ("data.num_workers", MAX_WORKERS, "loaded by the rank itself")):
        value = _get(cfg, key)
        limit = cpu.cores() if _local(cfg) else remote
        if value > limit:
            where = (f"this machine's {limit} core(s)" if _local(cfg)
                     else f"{limit}, more than any node has cores")
            return f"{key}={value}: at most {where} (0 = {zero})"
    return None


def ranks_fit(cfg: DictConfig) -> Optional[str]:
    """launcher.nproc_per_node on another machine's nodes: a count no node can hold (this machine's
    own: `oversubscription`)."""
    n = cfg.launcher.nproc_per_node
    if not _local(cfg) and n > MAX_RANKS_PER_NODE:
        return (f"launcher.nproc_per_node={n}: at most {MAX_RANKS_PER_NODE} ranks a node "
                "(one per GPU or per core)")
    return None


# bytes a parameter costs a rank: fp32 weight, gradient, two optimiser moments, a flat bucket
BYTES_A_PARAMETER = 20


def model_memory(cfg: DictConfig) -> Optional[str]:
    """The model's weights, gradients, optimiser state and buckets fit the memory of a local
    launch's ranks (beyond it the kernel kills a rank mid-start, with no line of its own)."""
    from ..config import SCHEMAS

    if not _local(cfg) or cfg.launcher.dry_run:
        return None
    try:
        n = SCHEMAS["model"][cfg.model.name].parameters(cfg.model)
    except ValueError:
        # sizes that are no sizes: model_fits says so
        return None
    ranks = cfg.launcher.nproc_per_node
    need = n * BYTES_A_PARAMETER * ranks
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need <= have:
        return None
    return (f"model={cfg.model.name}: {n:,} parameters, {need / 1e9:.1f} GB for {ranks} rank(s) "
            f"({BYTES_A_PARAMETER} bytes each: weights, gradients, optimiser state, buckets); "
            f"this machine has {have / 1e9:.1f} GB: make the model smaller or use fewer ranks")


# torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: DDP's first bucket
DDP_FIRST_BUCKET_MB = 1024 * 1024 / 1e6


def compiled_ddp_buckets(cfg: DictConfig) -> Optional[str]:
    """train.compile=true with sync=ddp: torch's compiled DDP (dynamo's DDPOptimizer) splits the
    graph at DDP's buckets and refuses a bucket smaller than DDP's first (an AssertionError on
    every rank)."""
    if not (cfg.train.compile and cfg.sync.name == "ddp"):
        return None
    if cfg.sync.bucket_cap_mb >= DDP_FIRST_BUCKET_MB:
        return None
    return (f"sync.bucket_cap_mb={cfg.sync.bucket_cap_mb} with train.compile=true: compiled DDP "
            f"needs buckets of at least DDP's first, {DDP_FIRST_BUCKET_MB} MB (or "
            "train.compile=false)")


def launcher_python(cfg: DictConfig) -> Optional[str]:
    """A local launch's launcher.venv / launcher.python exist here (elsewhere they are the nodes'
    to have): a typo is one line, not `launch.sh: No such file` from the job."""
    lc = cfg.launcher
    if not _local(cfg) or lc.dry_run:
        return None
    if lc.get("venv"):
        python = Path(str(lc.venv)).expanduser() / "bin" / "python"
        if not os.access(python, os.X_OK):
            return f"launcher.venv={lc.venv}: no {python} to run the ranks (fix the path or drop it)"
    elif lc.get("python") and not shutil.which(str(lc.python)):
        return f"launcher.python={lc.python}: no such program here (fix it or drop it)"
    return None


COMMON: list[Rule] = [
    group_names,
    finite_numbers,
    at_least("launcher.nodes", 1),
    at_least("launcher.nproc_per_node", 1),
    oversubscription,
    one_of("dist.backend", ("auto", "gloo", "nccl")),
    one_of("dist.device", ("auto", "cpu", "cuda")),
    dist_pair,
    ranks_fit,
    # a start takes seconds: below MIN_TIMEOUT_S a healthy rank times out waiting for its peers
    at_least("dist.timeout_s", MIN_TIMEOUT_S, " seconds (a rank's start takes longer)"),
    at_most("dist.timeout_s", WEEK_S, " (a week)"),
    at_least("dist.init_timeout_s", MIN_TIMEOUT_S, " seconds (a rank's start takes longer)"),
    at_most("dist.init_timeout_s", WEEK_S, " (a week)"),
    one_of("log.progress", ("auto", "bar", "lines")),
    at_least("log.progress_every_s", 0),
    at_most("log.progress_every_s", DAY_S, " (a day)"),
    one_of("log.ranks", ("0", "all")),
    lambda cfg: (None if str(cfg.log.level).upper() in LOG_LEVELS else
                 f"log.level={cfg.log.level}: choose {', '.join(LOG_LEVELS)}"),
    launcher_python,
    required_launcher_keys,
    durations,
    run_folder,
]


TRAIN: list[Rule] = [
    known_sections,
    at_least("train.epochs", 1),
    at_least("train.batch_size", 1),
    above("train.lr", 0),
    at_least("train.max_steps_per_epoch", 0, " (0 = the whole shard)"),
    at_least("train.eval_batch_size", 1),
    at_least("train.threads", 0, " (0 = decided at start)"),
    *COMMON,
    threads_fit,
    optimiser_fits,
    one_of("data.pipeline", ("tensor", "dataloader")),
    lambda cfg: None if len(cfg.data.mirrors) else
    "data.mirrors is empty: give at least one (default: [embedded])",
    at_least("data.num_workers", 0),
    at_least("timing.trace_steps", 0),
    at_least("timing.tb_every", 0),
    at_least("timing.profile_skip", 0),
    at_least("timing.profile_steps", 1),
    above("train.stop_check_s", 0),
    at_most("train.stop_check_s", DAY_S, " (a day)"),
    stop_signal,
    run_entry,
    # another command's job in run.dir: said before what the folder holds
    in_use,
    reuse_problem,
    batch_fits,
    model_fits,
    model_memory,
    one_of("sync.compress", COMPRESS_MODES),
    sync_fits,
    compiled_ddp_buckets,
    student_code_passes,
    cuda_graph_fits,
    torch_lacks,
    lambda cfg: debug_problem(cfg.debug, world_size(cfg)),
    data_folder,
]


def check(cfg: DictConfig, rules: Sequence[Rule]) -> None:
    """Raise the first broken rule's message as a UserError."""
    for rule in rules:
        if message := rule(cfg):
            raise UserError(message)


def resolve(cfg: DictConfig, rules: Sequence[Rule]) -> DictConfig:
    """A copy of `cfg` with what depends on this machine filled in and paths made absolute (ranks
    may start elsewhere), checked by `rules`."""
    cfg = cfg.copy()
    with open_dict(cfg):
        # the launcher's own defaults and checks (LaunchError)
        launch.resolve(cfg)
        if cfg.launcher.nproc_per_node is None:
            cfg.launcher.nproc_per_node = default_nproc()
        if "data" in cfg:
            cfg.data.root = str(Path(cfg.data.root).expanduser().resolve())
            cfg.data.mirrors = [m if m == "embedded" or "://" in m
                                else str(Path(m).expanduser().resolve()) for m in cfg.data.mirrors]
        # a student's file (sync=custom): ranks may start in another folder
        if "sync" in cfg and cfg.sync.get("all_reduce"):
            cfg.sync.all_reduce = absolute_spec(cfg.sync.all_reduce)
    check(cfg, rules)
    # last: the command's own mistakes are said first
    launch.check_tool(cfg)
    return cfg


def resolve_train(cfg: DictConfig) -> DictConfig:
    """A training run's config resolved and checked (a study's: `study.resolve_study`)."""
    return resolve(cfg, TRAIN)
