"""Every registered synchroniser and every option of its group, through every consumer.

The cases come from the registry, not from a list here: the synchronisers are
conf/sync/*.yaml (the same names as ddp_lab.config.sync.SYNC_SCHEMAS), each one's options
its schema's fields under its yaml's values, read here (`registry`), and each option's
case is its first other value the submitting side accepts at the world (a bool flipped, a
choice from the value tuples the schemas export, a number 0/1/2). A new synchroniser or
option adds its cases with no edit here; an option whose values the test cannot guess
(a string with no exported tuple of choices) fails the test, naming it.

Each case is a tiny real job (3 steps): the run folder made by the submitting side's own
code (compose, name, check, render: `launcher.dry_run`), then trained by the entry every
rank runs (`ddp_lab.worker`) on a real gloo world. The ranks of one world are shared by
all its jobs (one set of processes per world: starting torch once, not once a job). Every
synchroniser runs at world 1, 2 and 3, every option at world 2 (two ranks on CI's two
cores: the options are most of the jobs). Then the user's commands, as processes: a real
sweep of the tour's `sync=ring sync.prepost=false,true`, its resume, and `run.entry=ddp_lab.rank.one_file` through the
launcher, and every folder fed to the report (exit 0, each setting its own series),
status (completed), TensorBoard (one run each, named by what differs) and the sweep table.

What the consumers show is checked against the override each case passed, never against
`describe_run` (the code that makes the names): `sync.root=1` must read `root=1` in its
report series and `root1` in its TensorBoard run and folder name, and two cases of different
overrides never share a series or a name (`name_problem`, `series_problem`): on the
trained runs (the slow test), and in seconds on each case's dry-run folder
(`test_every_case_named_by_its_override`). The number of cases is the registry's: every
(sync, option) pair less those a synchroniser refuses (`REFUSED`, each with its rule).

And each option does what it says (`test_every_option_changes_what_it_configures`): every
case is built again in one 2-rank gloo world, beside its synchroniser's defaults, and the
difference is read from outside the description (tests/option_probes.py): the tensors on
the wire (their count, size, dtype, root, thread), DDP's own logging data, the optimiser
state each rank holds. An option without a probe in `PROBES` fails, naming it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from omegaconf import OmegaConf

import helpers
from helpers import PY, REPO, child_env, compose, free_port, world_context
from option_probes import N_PARAMS, PROBE_STEPS, probe_rank

QUICK = ["train.epochs=1", "train.max_steps_per_epoch=3", "train.eval_batch_size=5000",
         "log.progress=lines", "dist.init_timeout_s=60", "dist.timeout_s=60"]
WORLDS = (1, 2, 3)
OPTION_WORLD = 2


def _choices() -> dict[str, list[str]]:
    """The values of the string options the sync schemas export, by name (COMPRESS_MODES,
    HIERARCHICAL_INTER, ...): tuples of strings, or dicts keyed by them."""
    import ddp_lab.config.sync as schemas

    return {name: list(v) for name, v in vars(schemas).items()
            if isinstance(v, (tuple, dict)) and v and all(isinstance(x, str) for x in v)}


def _candidates(key: str, default) -> list:
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, str):
        named = sorted(_choices().items(), key=lambda kv: key.upper() not in kv[0])
        for _, values in named:  # the tuple named after the key first (intra: ..._INTRA)
            if default in values:
                return [v for v in values if v != default]
        raise AssertionError(f"sync option {key}={default!r}: no exported tuple of its values "
                             "(export one from ddp_lab/sync/schemas, as COMPRESS_MODES is)")
    if isinstance(default, float):
        return [v for v in (0.0, 1.0) if v != default]
    if isinstance(default, int):
        return [v for v in (1, 2, 0) if v != default]
    raise AssertionError(f"sync option {key}={default!r}: a type the test cannot vary")


@functools.lru_cache(maxsize=None)
def registry() -> dict[str, dict]:
    """sync -> its options and their defaults, read here from the registry: the schema's
    fields (ddp_lab.config.sync.SYNC_SCHEMAS) under conf/sync/<sync>.yaml's values (`name`
    and Hydra's `defaults` left out). The files and the schemas name the same syncs."""
    import dataclasses

    from ddp_lab.config.sync import SYNC_SCHEMAS

    files = {p.stem: p for p in (REPO / "conf" / "sync").glob("*.yaml")}
    assert set(files) == set(SYNC_SCHEMAS), (sorted(files), sorted(SYNC_SCHEMAS))
    out = {}
    for sync, path in sorted(files.items()):
        opts = {f.name: f.default for f in dataclasses.fields(SYNC_SCHEMAS[sync])}
        data = yaml.safe_load(path.read_text()) or {}
        opts.update({k: v for k, v in data.items() if k != "defaults"})
        out[sync] = {k: v for k, v in opts.items() if k != "name"}
    return out


#: (sync, option) pairs whose every other value the sync's own `check` refuses, and why:
#: every other pair of the registry is a case (test_cases_are_the_registry)
REFUSED = {
    ("ddp", "overlap"): "DDP always overlaps (sync.overlap=false refused)",
    ("naive", "overlap"): "naive starts its calls after backward",
    ("naive", "compress"): "naive sends each .grad as it is",
    ("zero1", "overlap"): "zero1 reduce-scatters after backward",
    ("zero1", "compress"): "zero1 sends fp32 gradients",
    ("torch_zero", "overlap"): "torch_zero is DDP underneath: it always overlaps",
    ("torch_zero", "compress"): "torch_zero sends fp32 through DDP's plain all-reduce",
    ("torch_zero", "hook"): "torch_zero runs DDP's plain all-reduce, no other hook",
    ("torch_zero", "powersgd_rank"): "torch_zero runs no PowerSGD",
    ("fsdp2", "overlap"): "FSDP2 always reduce-scatters during backward",
    ("fsdp2", "compress"): "fsdp2 runs fp32 (its MixedPrecisionPolicy is not wired)",
}


@dataclass(frozen=True)
class Case:
    """One job's sync part: `sync=<sync>`, and `sync.<key>=<text>` where it varies an option."""

    sync: str
    key: Optional[str] = None
    value: Any = None
    text: Optional[str] = None  # the value as the override writes it

    @property
    def overrides(self) -> list[str]:
        return [f"sync={self.sync}"] + ([f"sync.{self.key}={self.text}"] if self.key else [])


def _text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def _accepted(sync: str, key: str, value, world: int) -> bool:
    """Whether the synchroniser's own rules (its schema's `check`, what the submitting side
    asks before any process starts) take `sync.<key>=<value>` at `world`."""
    from ddp_lab.config import with_defaults
    from ddp_lab.config.sync import SYNC_SCHEMAS

    section = with_defaults(OmegaConf.create({**registry()[sync], "name": sync, key: value}))
    try:
        SYNC_SCHEMAS[sync].check(section, world)
    except ValueError:
        return False
    return True


def option_cases() -> list[Case]:
    """Each option of each sync at its first other value the sync accepts at OPTION_WORLD."""
    out = []
    for sync, options in registry().items():
        for key, default in options.items():
            for value in _candidates(key, default):
                if _accepted(sync, key, value, OPTION_WORLD):
                    out.append(Case(sync, key, value, _text(value)))
                    break
    return out


def cases(root: Path, data: Path) -> dict[int, list[tuple[Case, list[str]]]]:
    """world -> its jobs (case, overrides): each sync as it is at every world, and at
    OPTION_WORLD each option case."""
    base = [*QUICK, "train.checkpoint=false", f"data.root={data}", f"run.root={root}"]
    out: dict[int, list[Case]] = {w: [Case(sync) for sync in registry()] for w in WORLDS}
    out[OPTION_WORLD] += option_cases()
    return {w: [(c, [*base, *c.overrides, f"launcher.nproc_per_node={w}"]) for c in jobs]
            for w, jobs in out.items()}


def test_cases_are_the_registry():
    """Every (sync, option) pair of the registry is a case, but those REFUSED names (their
    own check refuses every other value): an option a check starts refusing, or one that
    vanishes from the schema, is named here, not lost among the cases."""
    reg = registry()
    pairs = {(s, k) for s, opts in reg.items() for k in opts}
    assert set(REFUSED) <= pairs, sorted(set(REFUSED) - pairs)
    got = [(c.sync, c.key) for c in option_cases()]
    assert len(got) == len(set(got))
    missing = sorted(pairs - set(REFUSED) - set(got))
    assert not missing, f"options with no case (their sync refuses every value tried): {missing}"
    assert not set(got) & set(REFUSED), sorted(set(got) & set(REFUSED))
    assert len(got) == sum(len(o) for o in reg.values()) - len(REFUSED)


# ---------------------------------------------------------------- the independent oracles
def expected_tokens(case: Case) -> list[str]:
    """The words of a name that say the case's override (`prepost`, `noprepost`, `fp16`,
    `bucket_mb0`, `inter-library`): the key as written and the value
    as the override gave it; a bool by the key alone (`no` when false); compress by its
    value alone. Written here from the override, not from ddp_lab's naming code."""
    if case.key is None:
        return []
    if isinstance(case.value, bool):
        return [case.key if case.value else f"no{case.key}"]
    if case.key == "compress":
        return [case.text]
    if re.fullmatch(r"[\w./-]+:\w+", case.text):
        # a function (sync.all_reduce=module:function or FILE.py:function): its name
        return [case.text.rpartition(":")[2]]
    if case.text[:1].isdigit() or case.text[:1] == "-":
        return [f"{case.key}{case.text}"]
    return [case.key, case.text]


def name_problem(name: str, case: Case, world: int) -> Optional[str]:
    """What is wrong with `name` (a TensorBoard run, a run folder) as the name of `case` at
    `world` ranks (None: nothing): it starts `<sync>[-<override's words>]_w<world>_`."""
    head = "-".join([case.sync, *expected_tokens(case)])
    if not name.startswith(f"{head}_w{world}_"):
        return (f"{name!r} for {' '.join(case.overrides)} at world {world}: "
                f"expected {head}_w{world}_...")
    return None


def series_problem(series: str, case: Case) -> Optional[str]:
    """What is wrong with `series` (a report's series) for `case`: the sync, then the
    override as given less its `sync.` (`reduce_broadcast root=1`), and nothing else."""
    words = [case.sync] + ([f"{case.key}={case.text}"] if case.key else [])
    if series.split() != words:
        return f"series {series!r} for {' '.join(case.overrides)}: expected {' '.join(words)!r}"
    return None


def distinct_problem(named: list[tuple[tuple, str]]) -> Optional[str]:
    """Two different override sets sharing one name (or one set with two names)."""
    by_name: dict[str, set] = {}
    by_key: dict[tuple, set] = {}
    for key, name in named:
        by_name.setdefault(name, set()).add(key)
        by_key.setdefault(key, set()).add(name)
    shared = {n: sorted(k) for n, k in by_name.items() if len(k) > 1}
    split = {k: sorted(n) for k, n in by_key.items() if len(n) > 1}
    return f"shared: {shared}, split: {split}" if shared or split else None


def test_every_case_named_by_its_override(tmp_path):
    """The names of every case, as the submitting side makes its run folder (compose, name,
    check, render: a dry run) and as the ranks name its TensorBoard run and the report its
    series from that folder's config, show the override the case passed."""
    from ddp_lab.folder.description import describe_run
    from ddp_lab.folder.tensorboard import run_name

    jobs = [(c, o) for c, o in cases(tmp_path / "outputs", tmp_path / "data")[OPTION_WORLD]]
    problems, folder_names, tb_names, series = [], [], [], []
    with composer() as compose_one:
        folders = [make_folder(o, c.overrides, dry=True, compose=compose_one) for c, o in jobs]
    for (case, overrides), folder in zip(jobs, folders):
        config = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"), resolve=True)
        # what the ranks and the report read: config.yaml and the world they found
        desc = describe_run(config, {"world_size": OPTION_WORLD, "nodes": 1, "device": "cpu"})
        tb = run_name({**desc.hparams(), "compress": config["sync"]["compress"],
                       "overlap": bool(config["sync"]["overlap"])})
        for what, name in (("folder", folder.name), ("tensorboard", tb)):
            problem = name_problem(name, case, OPTION_WORLD)
            problems += [f"{what}: {problem}"] if problem else []
        problems += [p for p in [series_problem(desc.series_label(), case)] if p]
        key = tuple(case.overrides)
        folder_names.append((key, folder.name.split("_20")[0]))
        tb_names.append((key, tb))
        series.append((key, desc.series_label()))
    for what, named in (("folder", folder_names), ("tensorboard", tb_names), ("series", series)):
        problems += [f"{what}: {p}" for p in [distinct_problem(named)] if p]
    assert not problems, "\n".join(problems)
    assert len(jobs) == len(registry()) + sum(len(o) for o in registry().values()) - len(REFUSED)


@contextlib.contextmanager
def composer():
    """`compose(*overrides)` as helpers.compose, Hydra initialised once for many."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from ddp_lab.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        yield lambda *overrides: hydra_compose(config_name="config", overrides=list(overrides))


def make_folder(overrides: list[str], swept: list[str], dry: bool = False,
                compose=compose) -> Path:
    """The run folder `python -m ddp_lab -m ...` makes for one job of a sweep varying
    `swept`, rendered (launcher.dry_run) and then handed to the ranks as the launcher
    would: the submitting side's code from composition to render, nothing mocked
    (`dry`: left as the dry run leaves it)."""
    from ddp_lab.command.cli import job_name
    from ddp_lab.folder.rundir import DRY_RUN
    from ddp_lab.command.submit import submit

    cfg = compose(*overrides, "launcher.dry_run=true")
    cfg.run.name = job_name(cfg, swept)
    with contextlib.redirect_stdout(io.StringIO()):
        outcome = submit(cfg)
    assert outcome.rc == 0, outcome.result
    if dry:
        return outcome.run_dir
    (outcome.run_dir / DRY_RUN).unlink()  # the launcher's part: it starts the ranks now
    return outcome.run_dir


def _ranks(rank: int, world: int, folders: list[str], ports: list[int], queue) -> None:
    """One rank of a world shared by every job of it: `ddp_lab.worker`'s run on each
    folder in turn, a fresh process group (and rendezvous port) each."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1")
    from ddp_lab.worker import run

    rcs = []
    for folder, port in zip(folders, ports):
        os.environ["MASTER_PORT"] = str(port)
        rcs.append(run(Path(folder)))
    queue.put((rank, rcs))


def run_ranks(world: int, folders: list[Path]) -> list[int]:
    """Each folder's exit status on every rank (the worst of them)."""
    ctx = world_context()
    queue = ctx.Queue()
    ports = [free_port() for _ in folders]
    procs = [ctx.Process(target=_ranks, args=(r, world, [str(f) for f in folders], ports, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict(queue.get(timeout=60 + 30 * len(folders)) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [max(got[r][i] for r in range(world)) for i in range(len(folders))]


def cli(*args: str, module: str = "ddp_lab", cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", module, *args], cwd=cwd, env=child_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)


def _description(folder: Path):
    from ddp_lab.folder.description import describe_run

    summary = json.loads((folder / "summary.json").read_text())
    return describe_run(OmegaConf.to_container(OmegaConf.load(folder / "config.yaml")), summary)


@pytest.mark.dist
@pytest.mark.slow
def test_every_sync_and_option_through_every_consumer(tmp_path, shared_data_root):
    from ddp_lab.command.cli import sweep_table
    from ddp_lab.command.job import Outcome

    t0 = time.monotonic()
    root = tmp_path / "outputs"
    jobs = cases(root, shared_data_root)
    print(f"cases: {time.monotonic() - t0:.0f} s", flush=True)
    folders: dict[int, list[Path]] = {}
    outcomes = []
    case_of: dict[Path, tuple[Case, int]] = {}  # each shared job's folder: its case, world
    for w, jobs_w in jobs.items():
        folders[w] = [make_folder(o, c.overrides) for c, o in jobs_w]
        rcs = run_ranks(w, folders[w])
        print(f"world {w}: {len(rcs)} jobs, {time.monotonic() - t0:.0f} s", flush=True)
        for f, rc, (c, o) in zip(folders[w], rcs, jobs_w):
            assert rc == 0, (o, (f / "logs" / "rank0.log").read_text()[-3000:])
            outcomes.append((len(outcomes), c.overrides, Outcome(rc, "ok", f)))
            case_of[f] = (c, w)
    trained = [f for fs in folders.values() for f in fs]
    n_options = len(jobs[OPTION_WORLD]) - len(jobs[1])
    # every option of the registry but the pairs its sync refuses (test_cases_are_the_registry)
    assert n_options == sum(len(o) for o in registry().values()) - len(REFUSED)

    # the user's own commands, as processes: the tour's sweep, its resume, stop 0
    tour = cli("-m", "sync=ring", "sync.prepost=false,true", "launcher.nproc_per_node=2",
               *QUICK, f"data.root={shared_data_root}", f"run.root={root}", cwd=tmp_path)
    assert tour.returncode == 0, tour.stdout[-3000:]
    tour_dirs = [Path(x.removeprefix("run dir: ")) for x in tour.stdout.splitlines()
                 if x.startswith("run dir: ")]
    # folders named by what differs, not `prepost-True_...`; the table names each run
    assert [d.name.split("_20")[0] for d in tour_dirs] == ["ring_w2_mlp", "ring-prepost_w2_mlp"]
    table = tour.stdout[tour.stdout.index("sweep of 2 job(s):"):].splitlines()
    assert [x.lower() for x in table[2].split()[1:3]] == ["sync.prepost=false", "ring"], table
    assert [x.lower() for x in table[3].split()[1:3]] == ["sync.prepost=true", "ring-prepost"], table
    resumed = cli(f"run.dir={tour_dirs[1]}", "sync=ring", "sync.prepost=true",
                  "launcher.nproc_per_node=2", *QUICK[1:], "train.epochs=2",
                  f"data.root={shared_data_root}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert json.loads((tour_dirs[1] / "summary.json").read_text())["epochs_done"] == 2
    one_file = cli("run.entry=ddp_lab.rank.one_file", "sync=ring", "launcher.nproc_per_node=3",
                "train.epochs=1", "train.max_steps_per_epoch=5", f"data.root={shared_data_root}",
                f"run.root={root}", cwd=tmp_path)
    assert one_file.returncode == 0, one_file.stdout[-3000:]
    one_file_dir = Path(one_file.stdout.splitlines()[-1].removeprefix("run dir: "))
    # every rank's line whole: never two run together on one line
    lines = [x for x in one_file.stdout.splitlines() if "[rank" in x]
    assert len(lines) == 3 and all(re.fullmatch(r"\[rank \d\] epoch 1/1: loss \S+, sync \(ring\) "
                                                r"\S+ ms/step", x) for x in lines), lines
    trained += tour_dirs

    # status: every run completed, stop 0 saying it keeps no records
    st = cli(str(root), "--json", module="ddp_lab.status", cwd=tmp_path)
    assert st.returncode == 0, st.stdout[-3000:]
    states = {Path(i["run_dir"]): i for i in json.loads(st.stdout)}
    assert set(states) == {*trained, one_file_dir}
    bad = {p.name: (i["state"], i["detail"]) for p, i in states.items() if i["state"] != "completed"}
    assert not bad, bad
    assert "keeps no records" in states[one_file_dir]["detail"]

    # TensorBoard: one run per folder, `<folder named by its description's label>/tb/<what
    # the label does not say>`; settings that differ, names that differ (a study's repeat
    # aside, two folders never share one)
    from ddp_lab.folder.tensorboard import length_extras, writer_name

    descs = {f: _description(f) for f in trained}
    for f, d in descs.items():
        runs = [p.parent.name for p in (f / "tb").glob("*/events.out.tfevents.*")]
        cap = OmegaConf.load(f / "config.yaml").train.max_steps_per_epoch
        assert set(runs) == {writer_name(d.label(), f.name, length_extras(cap))}, (f.name, runs)
    by_setting = {}
    for f, d in descs.items():
        by_setting.setdefault((d.label()), set()).add((d.setting, d.workload))
    assert all(len(v) == 1 for v in by_setting.values()), by_setting
    # ... and by the override each case passed, read from the event files and the folder
    # names, not from the description (its own code could drop an option from both)
    problems, tb_names, folder_names = [], [], []
    for f, (case, w) in case_of.items():
        # the run as TensorBoard names it over a folder of runs: <run folder>/tb/<name>
        runs = [f"{f.name}/tb/{p.parent.name}" for p in (f / "tb").glob("*/events.out.tfevents.*")]
        problems += [p for p in (name_problem(r, case, w) for r in runs) if p]
        problems += [p for p in [name_problem(f.name, case, w)] if p]
        tb_names += [((tuple(case.overrides), w), r) for r in runs]
        folder_names.append(((tuple(case.overrides), w), f.name.split("_20")[0]))
    problems += [p for p in (distinct_problem(tb_names), distinct_problem(folder_names)) if p]
    assert not problems, "\n".join(problems)

    # the sweep table of the shared jobs: each run named by what differs from the others
    # (two runs of different settings never one name), its figures shown
    from ddp_lab.command.cli import _run_labels
    from ddp_lab.folder.rundir import read_summary

    names = _run_labels(outcomes, [read_summary(o.run_dir) for _, _, o in outcomes])
    full = [descs[o.run_dir].label() for _, _, o in outcomes]
    assert len(set(zip(names, full))) == len(set(names)) == len(set(full)), list(zip(names, full))
    rows = sweep_table(outcomes).splitlines()[2:-1]
    assert len(rows) == len(outcomes) and all(re.search(r"\d s ", r) for r in rows), rows

    # the report: exit 0, nothing skipped but stop 0 (said why), each setting its own series
    rep = cli(str(root), module="ddp_lab.report", cwd=tmp_path)
    assert rep.returncode == 0, rep.stdout[-5000:]
    doc = json.loads((root / "report" / "report.json").read_text())
    skipped = {Path(s["run"]): s["reason"] for s in doc["skipped"]}
    assert set(skipped) == {one_file_dir}, skipped
    assert "keeps no records" in skipped[one_file_dir]
    series = {}
    for g in doc["scaling"]:
        for row in g["rows"]:
            for run in row["runs"]:
                series[Path(run)] = g["sync"]
    assert set(series) == set(trained)
    for f, d in descs.items():
        assert series[f] == d.series_label(), (f.name, series[f])
    # each case's series says its override, and only that; different overrides, different
    # series (the worlds of one setting are one series)
    problems = [p for f, (case, _) in case_of.items()
                for p in [series_problem(series[f], case)] if p]
    problems += [p for p in [distinct_problem([(tuple(c.overrides), series[f])
                                               for f, (c, _) in case_of.items()])] if p]
    assert not problems, "\n".join(problems)
    # runs in one series agree on every setting but the world: never an average of two
    labels = {}
    for f, d in descs.items():
        labels.setdefault((series[f], d.workload_words(length=True)), set()).add(d.series)
    assert all(len(v) == 1 for v in labels.values()), labels
    assert {series[tour_dirs[0]], series[tour_dirs[1]]} == {"ring", "ring prepost=true"}
    print(f"{len(trained)} runs, {n_options} option cases, {time.monotonic() - t0:.0f} s")


# ---------------------------------------------------------------- behaviour probes
# Each case built again beside its sync's defaults in one 2-rank gloo world
# (tests/option_probes.py), and the difference read from outside the description.
# `obs` is one build's observation per rank: the wire calls of PROBE_STEPS steps (op,
# numel, dtype, peer, thread, in backward, step), the comm records' counts and bytes,
# DDP's logging data, the optimiser state bytes, the storages the .grads live in.

def _ops(obs: dict) -> list[str]:
    return [c["op"] for c in obs["calls"]]


def _per_step(obs: dict, ops: tuple = ()) -> int:
    """Wire calls (collectives, sends and receives; only `ops` where given) per step, the
    same every step."""
    counts = {s: sum(c["step"] == s and (not ops or c["op"] in ops) for c in obs["calls"])
              for s in range(PROBE_STEPS)}
    assert len(set(counts.values())) == 1, counts
    return counts[0]


def _largest(obs: dict) -> int:
    return max(c["numel"] for c in obs["calls"])


def probe_overlap(case, base, var):
    """overlap=true: gradient calls start from backward (its hook, or the overlap thread
    it hands them to); false: all on the main thread after backward."""
    def early(obs):
        return [c for c in obs["calls"] if c["backward"] or not c["main"]]
    if case.value and not all(early(o) for o in var):
        return "no call started during backward or off the main thread"
    if not case.value and any(early(o) for o in var):
        return "calls still started during backward"
    if any(early(o) for o in base) == bool(case.value):
        return "the default already does the same"


WIRE_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "none": "float32"}


def probe_compress(case, base, var):
    """compress=fp16|bf16: gradients travel in that dtype, half the comm records' bytes."""
    dtype = WIRE_DTYPES.get(case.text)
    if dtype is None:
        return f"no wire dtype known for compress={case.text}"
    for o in var:
        if dtype not in {c["dtype"] for c in o["calls"]}:
            return f"no {dtype} tensor on the wire: {sorted({c['dtype'] for c in o['calls']})}"
    if any(dtype in {c["dtype"] for c in o["calls"]} for o in base):
        return f"the default sends {dtype} too"
    if not all(v["comm"]["payload"] < b["comm"]["payload"] for b, v in zip(base, var)):
        return "the comm records' payload bytes did not shrink"


def expected_buckets(cap_bytes: float) -> int:
    """How many buckets a cap makes of probe_model's parameters (fp32, in order), greedy:
    a bucket closes when the next parameter would take it past the cap."""
    sizes = [32 * 32 * 4, 32 * 4, 32 * 4 * 4, 4 * 4]
    assert len(sizes) == N_PARAMS
    buckets, size = 0, 0
    for n in sizes:
        if buckets == 0 or cap_bytes == 0 or size + n > cap_bytes:
            buckets, size = buckets + 1, 0
        size += n
    return buckets


def probe_bucket_mb(case, base, var):
    """bucket_mb (ours: MB of 1e6 bytes; ddp's bucket_cap_mb: DDP's MiB): one call per
    bucket in the comm records and as many times the wire calls (every algorithm here
    makes the same number of sends, receives or calls per bucket at a world of 2),
    smaller messages; ddp also in its own logging data."""
    ddp = case.sync in ("ddp", "torch_zero")  # DDP's buckets (torch_zero runs DDP)
    mb = 2 ** 20 if ddp else 1e6
    n_var, n_base = expected_buckets(case.value * mb), expected_buckets(25 * mb)
    # torch_zero also records its parameters' broadcast, one call a step, and sends them
    # on the wire: the buckets are the rest, and the all-reduces
    extra = PROBE_STEPS if case.sync == "torch_zero" else 0
    ops = ("all_reduce",) if case.sync == "torch_zero" else ()
    for b, v in zip(base, var):
        if (v["comm"]["calls"] - extra) * n_base != (b["comm"]["calls"] - extra) * n_var:
            return (f"comm records: {v['comm']['calls']} calls, the default's "
                    f"{b['comm']['calls']}: not {n_var} buckets for {n_base}")
        if _per_step(v, ops) * n_base != _per_step(b, ops) * n_var:
            return f"{_per_step(v, ops)} wire calls a step, the default's {_per_step(b, ops)}"
        if n_var > n_base and not _largest(v) < _largest(b):
            return f"largest message {_largest(v)} elements, the default's {_largest(b)}"
        if ddp and v["ddp"]["bucket_cap_bytes"] != int(case.value * mb):
            return f"DDP's logging data: bucket_cap_bytes={v['ddp']['bucket_cap_bytes']}"


def probe_ddp_flag(case, base, var):
    """gradient_as_bucket_view, static_graph, find_unused_parameters: what DDP says it was
    built with (`_get_ddp_logging_data()`; a flag never set is absent there); the view
    also in memory: every .grad in one storage (the bucket), not one each."""
    def flag(o):
        return int(o["ddp"].get(case.key) or 0)
    if not all(flag(v) == int(case.value) for v in var):
        return f"DDP's logging data: {case.key}={[v['ddp'].get(case.key) for v in var]}"
    if any(flag(b) == int(case.value) for b in base):
        return f"the default also has {case.key}={case.value}"
    if case.key == "gradient_as_bucket_view":
        want = 1 if case.value else N_PARAMS
        if not all(v["grad_storages"] == want for v in var):
            return f".grads in {[v['grad_storages'] for v in var]} storages, not {want}"


def probe_powersgd_rank(case, base, var):
    """powersgd_rank (with compress=powersgd): the low-rank factors on the wire grow with
    the rank, in the compressed steps (PowerSGD starts at DDP's 2nd iteration: the
    preflight's is the 1st)."""
    def elements(o):
        return sum(c["numel"] for c in o["calls"] if c["step"] >= 1)
    for b, v in zip(base, var):
        if (elements(v) > elements(b)) != (case.value > 1):
            return f"{elements(v)} elements on the wire, the default rank's {elements(b)}"


def probe_root(case, base, var):
    """root: every reduce goes to it and every broadcast comes from it; the optimiser state
    lives on it alone (the root's memory)."""
    for o in var:
        peers = {(c["op"], c["peer"]) for c in o["calls"]}
        if peers != {("reduce", case.value), ("broadcast", case.value)}:
            return f"reduces and broadcasts: {sorted(peers)}"
    held = [r for r, o in enumerate(var) if o["state_bytes"] > 0]
    if held != [case.value]:
        return f"optimiser state on ranks {held}, not on the root {case.value} alone"
    if [r for r, o in enumerate(base) if o["state_bytes"] > 0] == held:
        return "the default root holds it too"


def probe_prepost(case, base, var):
    """prepost=true: the next call's receives are posted as a call ends (every step's wire
    calls end with receives); false: each step's receive as the step starts (they end with
    a send)."""
    def posted_ahead(o):
        ops = _ops(o)
        steps = [[c["op"] for c in o["calls"] if c["step"] == s] for s in range(PROBE_STEPS)]
        return bool(ops) and all(s and s[-1] == "irecv" for s in steps)
    if not all(posted_ahead(v) == case.value for v in var):
        return f"receives posted ahead: {[posted_ahead(v) for v in var]}, asked {case.value}"
    if any(posted_ahead(b) == case.value for b in base):
        return "the default does the same"


#: hierarchical's inter / intra -> the calls its phase makes on the wire
LEVEL_OPS = {("inter", "ring"): {"isend", "irecv"}, ("inter", "library"): {"all_reduce"},
             ("intra", "library"): {"reduce", "broadcast"}, ("intra", "tree"): {"isend", "irecv"}}


def probe_level(case, base, var):
    """inter (on 2 nodes of 1 rank: the leaders' phase alone) and intra (on 1 node of 2:
    the node's phases alone): the calls that algorithm makes, and no other."""
    want = LEVEL_OPS.get((case.key, case.text))
    if want is None:
        return f"no calls known for {case.key}={case.text}"
    if not all(set(_ops(v)) == want for v in var):
        return f"calls {[sorted(set(_ops(v))) for v in var]}, not {sorted(want)}"
    if any(set(_ops(b)) == want for b in base):
        return "the default makes the same calls"


def probe_node_size(case, base, var):
    """node_size=k on 2 ranks: nodes of k (0: the launcher's, one node here). Nodes of one
    rank have no in-node reduce or broadcast, only the leaders' ring; one node of two has
    only those."""
    nodes = OPTION_WORLD // case.value if case.value else 1
    want = {"isend", "irecv"} if nodes == OPTION_WORLD else {"reduce", "broadcast"}
    if not all(set(_ops(v)) == want for v in var):
        return (f"calls {[sorted(set(_ops(v))) for v in var]} for {nodes} node(s), "
                f"not {sorted(want)}")
    if any(set(_ops(b)) == want for b in base):
        return "the default's nodes make the same calls"


def probe_hook(case, base, var):
    """hook (ddp): the comm hook DDP's reducer reports running (its logging data's
    `comm_hook`), and, for ddp_lab's send/recv hooks, their calls on the wire."""
    def hook(o):
        return str((o["ddp"] or {}).get("comm_hook"))
    if not all(case.text in hook(v) for v in var):
        return f"DDP's logging data: comm_hook={[hook(v) for v in var]}"
    if any(case.text in hook(b) for b in base):
        return f"the default's hook is {hook(base[0])} too"
    if case.text.startswith("ring") and not all({"isend", "irecv"} <= set(_ops(v)) for v in var):
        return f"a ring hook whose wire calls are {[sorted(set(_ops(v))) for v in var]}"


def probe_reshard(case, base, var):
    """reshard_after_forward (fsdp2): whether the child modules' FSDP states keep a
    post-forward mesh (torch frees the gathered weights after forward only with one)."""
    if not all(v["fsdp_reshard"] == [case.value] * len(v["fsdp_reshard"]) and v["fsdp_reshard"]
               for v in var):
        return f"FSDP's states reshard after forward: {[v['fsdp_reshard'] for v in var]}"
    if any(b["fsdp_reshard"] == v["fsdp_reshard"] for b, v in zip(base, var)):
        return "the default reshards the same way"


def probe_all_reduce(case, base, var):
    """all_reduce (custom): another function's sends and receives on the wire (the
    textbook ring cuts each bucket in n chunks, the butterfly swaps it whole)."""
    def wire(o):
        return sorted((c["op"], c["numel"]) for c in o["calls"] if c["op"] in ("isend", "irecv"))
    if not all(wire(v) for v in var):
        return f"no sends or receives on the wire: {[sorted(set(_ops(v))) for v in var]}"
    if any(wire(v) == wire(b) for b, v in zip(base, var)):
        return "the default's function makes the same calls"


#: option -> (what both builds add to the sync's defaults, so that the option acts; the
#: probe). An option of the registry missing here fails test_every_option_has_a_probe.
PROBES = {
    "overlap": ({}, probe_overlap),
    "compress": ({}, probe_compress),
    "bucket_mb": ({}, probe_bucket_mb),
    "bucket_cap_mb": ({}, probe_bucket_mb),
    "gradient_as_bucket_view": ({}, probe_ddp_flag),
    "static_graph": ({}, probe_ddp_flag),
    "find_unused_parameters": ({}, probe_ddp_flag),
    "powersgd_rank": ({"compress": "powersgd"}, probe_powersgd_rank),
    "root": ({}, probe_root),
    "prepost": ({"node_size": 1}, probe_prepost),  # hierarchical: leaders to ring among
    "inter": ({"node_size": 1}, probe_level),
    "intra": ({}, probe_level),
    "node_size": ({}, probe_node_size),
    "hook": ({}, probe_hook),
    "reshard_after_forward": ({}, probe_reshard),
    "all_reduce": ({}, probe_all_reduce),
}


def _context(case: Case) -> dict:
    """PROBES' additions that are the sync's keys (ring has no node_size)."""
    return {k: v for k, v in PROBES[case.key][0].items() if k in registry()[case.sync]}


def test_every_option_has_a_probe():
    missing = [f"option sync.{c.key} (sync={c.sync}) has no behaviour probe"
               for c in option_cases() if c.key not in PROBES]
    assert not missing, "\n".join(missing)


@pytest.mark.dist
def test_every_option_changes_what_it_configures():
    """Every option case changes what it configures, against its sync's defaults, on a
    2-rank gloo world: one build of each, PROBE_STEPS steps (the builds in one world, in
    one order on every rank)."""
    test_every_option_has_a_probe()
    reg = registry()
    sections: list[dict] = []

    def index(section: dict) -> int:
        if section not in sections:
            sections.append(section)
        return sections.index(section)

    plan = []
    for case in option_cases():
        base = {**reg[case.sync], "name": case.sync, **_context(case)}
        plan.append((case, index(base), index({**base, case.key: case.value})))
    seen = helpers.run_world(probe_rank, OPTION_WORLD, sections, timeout=300)
    problems = []
    for case, b, v in plan:
        problem = PROBES[case.key][1](case, [r[b] for r in seen], [r[v] for r in seen])
        if problem:
            problems.append(f"{' '.join(case.overrides)}: {problem}")
    assert not problems, "\n".join(problems)
