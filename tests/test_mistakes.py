"""The mistakes table: each user mistake, through the real command line, is one line on
stderr naming the key (and the fix), exit 2, no traceback, and no run folder left behind.

Every case runs `python -m ddp_lab ...` or `python -m ddp_lab.bench ...` as a user would,
with HYDRA_FULL_ERROR=1 set (so not even Hydra's traceback mode leaks one): the trainer's
through its entry's own `cli` call in the test's process, the others as processes. Only
composition and validation run: no rank starts. Classes of mistakes checked by one rule
(paths, durations, backend x device) are tables of direct calls to that rule at the end,
with one case of each through the command line at most.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import REPO, compose, run_in_process
from omegaconf import OmegaConf

from ddp_lab.command import validate
from ddp_lab.launch.slurm import duration_s
from ddp_lab.config.errors import UserError

TRAIN, BENCH, REPORT = "ddp_lab", "ddp_lab.bench", "ddp_lab.report"

# (id, entry point, arguments, what the one line must contain). In the arguments, {file}
# is an existing file, {ro} a folder the user cannot write, {open} one anyone can write.
MISTAKES = [
    ("override-syntax", TRAIN, ["train.epochs"], "train.epochs"),
    ("list-syntax", TRAIN, ["launcher.nodes=[1"], "launcher.nodes"),
    ("unknown-sync", TRAIN, ["sync=rign"], "sync/rign"),
    ("unknown-cluster", TRAIN, ["cluster=alpss"], "cluster/alpss"),
    ("log-ranks", TRAIN, ["log.ranks=1"], "log.ranks=1: choose 0 or all"),
    # a typo for 10 on a small machine: refused before a thousand ranks start
    ("oversubscribed", TRAIN, ["launcher.nproc_per_node=1000"],
     "launcher.nproc_per_node=1000 starts 1000 ranks"),
    ("unknown-option-in-sweep", TRAIN, ["-m", "sync=ddp,rign", "launcher.dry_run=true"], "sync/rign"),
    ("misspelt-key", TRAIN, ["train.epoch=3"], "did you mean train.epochs?"),
    ("wrong-type", TRAIN, ["train.epochs=many"], "train.epochs=many"),
    ("unknown-entry", TRAIN, ["run.entry=ddp_lab.stop_0"], "run.entry=ddp_lab.stop_0: no such module"),
    ("lesson-sync", TRAIN, ["run.entry=ddp_lab.rank.one_file", "sync=ddp"],
     "sync=ddp: run.entry=ddp_lab.rank.one_file runs stop 0, which has sync=naive and sync=ring"),
    ("lesson-as-entry", TRAIN, ["run.entry=ddp_lab.one_file"],
     "run.entry=ddp_lab.one_file: the lesson takes flags, not a run folder; use run.entry=ddp_lab.rank.one_file"),
    ("key-of-another-option", TRAIN, ["optim=adam", "optim.momentum=0.9"], "optim.momentum"),
    ("unknown-section", TRAIN, ["+foo=1"], "foo: not a config section"),
    ("bench-group-in-trainer", TRAIN, ["+bench=sweep"], "bench/sweep"),
    ("epochs-zero", TRAIN, ["train.epochs=0"], "train.epochs=0: must be >= 1"),
    ("lr-zero", TRAIN, ["train.lr=0"], "train.lr=0.0: must be > 0"),
    ("backend", TRAIN, ["dist.backend=mpi"], "dist.backend=mpi"),
    ("sync-value", TRAIN, ["sync=allreduce", "sync.bucket_mb=-1"], "sync.bucket_mb=-1.0"),
    ("sync-root-not-a-rank", TRAIN, ["sync=reduce_broadcast", "sync.root=5"], "sync.root=5"),
    ("cnn-width", TRAIN, ["model=cnn", "model.hidden=-1"], "model.hidden=-1: must be an integer >= 1"),
    ("mlp-width", TRAIN, ["model.hidden=[64,0]"], "model.hidden=[64, 0]: give a width >= 1"),
    ("cnn-width-in-sweep", TRAIN, ["-m", "model=cnn", "model.hidden=16,-1,8"],
     "model.hidden=-1: must be an integer >= 1"),  # before the first job starts
    ("global-batch-not-divisible", TRAIN, ["train.global_batch=63", "launcher.nproc_per_node=2"],
     "train.global_batch=63 is not divisible by the world size 2"),
    ("global-batch-mpirun-slots", TRAIN, ["launcher=mpirun", "launcher.hosts=[localhost:3]",
                                          "train.global_batch=64"],
     "train.global_batch=64 is not divisible by the world size 3"),
    ("global-batch-negative", TRAIN, ["train.global_batch=-64"], "train.global_batch=-64: must be >= 0"),
    ("micro-batch-not-a-divisor", TRAIN, ["train.global_batch=64", "launcher.nproc_per_node=2",
                                          "train.micro_batch=12"],
     "train.micro_batch=12 does not divide the per-rank batch 32"),
    ("micro-batch-weak", TRAIN, ["train.batch_size=100", "train.micro_batch=30"],
     "train.micro_batch=30 does not divide the per-rank batch 100 (train.batch_size)"),
    ("cuda-graph-on-cpu", TRAIN, ["train.cuda_graph=true", "dist.device=cpu"],
     "CUDA graphs capture CUDA kernels: needs dist.device=cuda and dist.backend=nccl"),
    ("resume-without-run-dir", TRAIN, ["train.resume=true"], "train.resume=true needs run.dir"),
    ("resume-value", TRAIN, ["train.resume=later"], "train.resume=later: choose auto, true or false"),
    ("resume-empty-folder", TRAIN, ["train.resume=true", "run.dir={open}/empty"],
     "train.resume=true but {open}/empty/checkpoints holds no checkpoint"),
    ("stop-signal-uncatchable", TRAIN, ["train.stop_signal=SIGKILL"], "train.stop_signal=SIGKILL"),
    ("stop-signal-name", TRAIN, ["train.stop_signal=USR2"], "train.stop_signal=USR2: not a signal"),
    ("stop-check-zero", TRAIN, ["train.stop_check_s=0"], "train.stop_check_s=0.0: must be > 0"),
    ("local-several-nodes", TRAIN, ["launcher.nodes=2"], "launcher.nodes=2"),
    ("slurm-tasks", TRAIN, ["launcher=slurm", "launcher.ntasks_per_node=2"],
     "launcher.ntasks_per_node=2"),
    ("slurm-sbatch-option", TRAIN, ["launcher=slurm", "launcher.sbatch_extra=[mem=0]",
                                    "launcher.dry_run=true"], "launcher.sbatch_extra"),
    ("mpirun-no-hosts", TRAIN, ["launcher=mpirun", "launcher.hosts=[]"], "launcher.hosts"),
    ("runai-no-image", TRAIN, ["launcher=runai"], "launcher.image is not set"),
    ("alps-no-account", TRAIN, ["cluster=alps", "launcher.environment=/e.toml"],
     "launcher.account is not set"),
    ("alps-no-environment", TRAIN, ["cluster=alps", "launcher.account=a-x"],
     "launcher.environment is not set"),
    # paths: one rule, the OS's reason (more reasons at unit level: test_folder_problem)
    ("run-root-unwritable", TRAIN, ["run.root={ro}/runs"],
     "run.root={ro}/runs cannot be made or written: Permission denied"),
    ("run-root-name-too-long", TRAIN, ["run.root={open}/new/" + "x" * 256 + "/runs"],
     "cannot be made or written: File name too long"),  # and {open}/new made, then removed
    ("data-root-unwritable", TRAIN, ["data.root={ro}/data", "run.root={open}/runs"],
     "data.root={ro}/data cannot be made or written: Permission denied"),
    ("bench-unknown-op", BENCH, ["bench.ops=[allreduce]"], "bench.ops: unknown allreduce"),
    ("bench-misspelt-key", BENCH, ["bench.opz=[reduce]"], "did you mean bench.ops?"),
    ("bench-impl-without-op", BENCH, ["bench.ops=[reduce]", "bench.impl=[butterfly]"],
     "bench.impl=butterfly"),
    ("bench-dtype", BENCH, ["bench.dtype=float8"], "bench.dtype: unknown float8"),
    ("bench-unknown-preset", BENCH, ["bench=handinn"], "bench/handinn"),
    ("bench-sizes", BENCH, ["bench.min_elements=4096", "bench.max_elements=1024"],
     "bench.max_elements=1024 is below"),
    ("bench-explicit-size", BENCH, ["bench.sizes=[4096,0]"], "bench.sizes=[4096, 0]: every size"),
    ("bench-trainer-group", BENCH, ["+sync=ring"], "Key 'sync' not in 'BenchRootConfig'"),
    ("bench-alps-no-account", BENCH, ["cluster=alps", "launcher.environment=/e.toml"],
     "launcher.account is not set"),
    # what Hydra itself rejects: its own one line, never its usage block or a traceback
    ("flag-style", TRAIN, ["--sync", "ring"], "--sync ring: not a flag here: settings are "
                                             "key=value overrides: write sync=ring"),
    ("flag-style-in-sweep", TRAIN, ["-m", "--sync=ring,ddp", "--train.epochs", "1"],
     "write sync=ring,ddp train.epochs=1"),
    ("flag-style-key-found", TRAIN, ["--epochs", "3", "--dry-run"],
     "--epochs 3 --dry-run: not a flag here: settings are key=value overrides: write "
     "train.epochs=3 launcher.dry_run=true"),
    ("bench-flag-style", BENCH, ["--ops", "reduce"], "write bench.ops=[reduce]"),
    ("hydra-rerun-no-file", TRAIN, ["--experimental-rerun", "{open}/none.pickle"],
     "--experimental-rerun {open}/none.pickle: no such file"),
    ("hydra-flag-value", TRAIN, ["--cfg", "every"], "argument --cfg/-c: invalid choice: 'every'"),
    ("list-key-given-a-value", TRAIN, ["launcher=mpirun", "launcher.hosts=nohost:2"],
     "launcher.hosts=nohost:2: launcher.hosts is a list: write launcher.hosts=[nohost:2]"),
    ("bench-list-key-given-a-value", BENCH, ["bench.ops=reduce"], "write bench.ops=[reduce]"),
    ("interpolation-to-no-key", TRAIN, ["train.epochs=${{nokey}}"],
     "train.epochs: Interpolation key 'nokey' not found"),
    ("group-deleted", TRAIN, ["~sync"], "Missing mandatory value: sync"),
    ("key-added-to-a-section", TRAIN, ["+sync.foo=1"], "sync.foo: not a key of sync (sync keys: "),
    ("empty-sweep", TRAIN, ["-m", "train.epochs=range(1,1)"],
     "train.epochs=range(1,1): no values, so no jobs"),
    ("report-flag", REPORT, ["--bogus"], "unrecognized arguments: --bogus (usage: "
                                         "python -m ddp_lab.report PATH"),
]


@pytest.fixture
def place():
    """A folder anyone can enter (the unwritable cases run as an unprivileged user when
    the tests run as root, for whom every folder is writable)."""
    path = Path(tempfile.mkdtemp(prefix="ddp_lab_mistakes_"))
    path.chmod(0o755)
    (path / "a_file").write_text("not a folder\n")
    (path / "open").mkdir()
    (path / "open").chmod(0o777)
    ro = path / "read_only"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    yield path
    ro.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def run_as_user(module: str, args: list[str], cwd: Path, unprivileged: bool):
    env = dict(os.environ, HYDRA_FULL_ERROR="1", HOME=str(cwd),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    prefix = []
    if unprivileged and os.geteuid() == 0:  # root writes anywhere: be nobody for this case
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return subprocess.run([*prefix, sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


# one command a case, sharing nothing: in two xdist groups (conftest.py), this file the
# fast tier's largest otherwise
@pytest.mark.parametrize("module, args, expected", [
    pytest.param(*m[1:], marks=pytest.mark.xdist_group(f"mistakes-{i % 2}"))
    for i, m in enumerate(MISTAKES)], ids=[m[0] for m in MISTAKES])
def test_mistake_is_one_line_exit_2_and_leaves_nothing(place, monkeypatch, module, args, expected):
    fill = {"file": str(place / "a_file"), "ro": str(place / "read_only"),
            "open": str(place / "open")}
    args = [a.format(**fill) for a in args]
    expected = expected.format(**fill)
    given = [a.removeprefix("run.root=") for a in args if a.startswith("run.root=")]
    runs = Path(given[0]) if given else place / "runs"
    if not given:
        args.append(f"run.root={runs}")
    if module == TRAIN and not any(a.startswith("data.root=") for a in args):
        args.append(f"data.root={place / 'data'}")
    before = sorted(str(p) for p in place.rglob("*"))
    unprivileged = "read_only" in str(args)
    # +bench=...: the bench's schema nodes, which other tests of this process may have put in
    # Hydra's ConfigStore (helpers.compose), change what the trainer's composition meets
    if module == TRAIN and not unprivileged and not any(a.startswith("+bench") for a in args):
        # the trainer's entry in this process (helpers.run_in_process: the same `cli` call
        # as ddp_lab/__main__.py; ~0.1 s against ~2 s a process); the other entries and
        # the cases run as another user are processes
        monkeypatch.chdir(place)
        rc, stdout, stderr = run_in_process(args, env={"HYDRA_FULL_ERROR": "1", "HOME": str(place)})
    else:
        proc = run_as_user(module, args, place, unprivileged=unprivileged)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    said = f"rc={rc}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    assert rc == 2, said
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), said
    assert expected in lines[0], said
    assert "Traceback" not in stderr + stdout, said
    assert sorted(str(p) for p in place.rglob("*")) == before, "a rejected command made files"
    assert not runs.exists(), "a rejected command must leave no run folder"


def test_the_table_is_long_enough():
    assert len(MISTAKES) >= 20 and len({m[0] for m in MISTAKES}) == len(MISTAKES)


def test_dry_run_of_a_preset_renders_without_its_required_keys(place):
    """A dry run shows the job a real submission would send, so it renders even where
    the preset's required keys (cluster=alps: account, environment) are still missing."""
    proc = run_as_user(TRAIN, ["cluster=alps", "launcher.dry_run=true", f"run.root={place / 'runs'}"],
                       place, unprivileged=False)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=normal" in proc.stdout and "--account" not in proc.stdout


@pytest.mark.parametrize("module, hidden, listed", [
    (TRAIN, ("bench:", "schema"), ("launcher: local, mpirun, slurm, runai",
                                   "sync: ddp, naive, allreduce, reduce_broadcast, ring, tree, butterfly",
                                   "cluster: alps, entropy, rcp")),
    (BENCH, ("sync:", "model:", "schema"), ("launcher: local, mpirun, slurm, runai",
                                            "bench: handin, sweep")),
])
def test_help_lists_what_the_entry_accepts(place, module, hidden, listed):
    proc = run_as_user(module, ["--help"], place, unprivileged=False)
    assert proc.returncode == 0, proc.stderr
    groups = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    for name in listed:
        assert name in groups, groups
    for name in hidden:
        assert name not in groups, groups


# ------------------------------------------------------------------ classes, unit level
# every model's width keys, each with a value its model cannot be built with
WIDTHS = [("mlp", "hidden", 0), ("mlp", "hidden", [64, -1]), ("mlp", "hidden", []),
          ("mlp_wide", "hidden", [2048, 0]), ("cnn", "channels1", 0),
          ("cnn", "channels2", -3), ("cnn", "hidden", -1)]


@pytest.mark.parametrize("model, key, bad", WIDTHS, ids=lambda v: str(v))
def test_every_width_of_every_model_is_checked(model, key, bad):
    """One line naming the key and the fix (the model's schema check, config/workload.py)."""
    cfg = compose(f"model={model}")
    cfg.model[key] = bad
    said = validate.model_fits(cfg)
    assert said and said.startswith(f"model.{key}=") and "\n" not in said, said
    assert "give a width >= 1" in said or "must be an integer >= 1" in said, said
    assert validate.model_fits(compose(f"model={model}")) is None  # its defaults build


def test_the_width_table_covers_every_model():
    """A model added with a size key must be added to WIDTHS (resnet18 has none)."""
    from ddp_lab.config import SCHEMAS

    for name, schema in SCHEMAS["model"].items():
        sizes = {f.name for f in dataclasses.fields(schema) if f.name != "name"}
        assert sizes == {key for model, key, _ in WIDTHS if model == name}, name


FIX = "give a folder you can write"
LONG = "x" * 256  # one name longer than any filesystem's 255 bytes


@pytest.mark.parametrize("key, value, reason", [
    ("run.dir", "{file}", "Not a directory"),
    ("run.root", "{file}/runs", "Not a directory"),
    ("run.root", "{open}/new/" + LONG + "/runs", "File name too long"),
    ("data.root", "{file}", "Not a directory"),
    ("data.root", "{file}/deeper/data", "Not a directory"),
    ("data.root", "{open}/new/" + LONG, "File name too long"),
    ("run.root", "{open}/new/runs", None),  # missing folders are fine: the run makes them
    ("run.dir", "{open}", None),
    ("data.root", "{open}/new/data", None),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None)
def test_folder_problem(tmp_path, key, value, reason):
    """Every path key, one rule: a probe folder is made where the run will write, and the
    OS's refusal, whatever it is, is the line; what the probe made is removed."""
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "open").mkdir()
    value = value.format(file=tmp_path / "a_file", open=tmp_path / "open")
    section, name = key.split(".")
    cfg = OmegaConf.create({"run": {"root": str(tmp_path / "unused"), "dir": None},
                            "data": {"root": str(tmp_path / "unused"), "node_local": False}})
    cfg[section][name] = value
    before = sorted(tmp_path.rglob("*"))
    rule = validate.data_folder if section == "data" else validate.run_folder
    said = rule(cfg)
    if reason is None:
        assert said is None
    else:
        assert said.startswith(f"{key}={value} cannot be made or written: {reason}"), said
        assert FIX in said and "\n" not in said, said
    assert sorted(tmp_path.rglob("*")) == before, "the check left files behind"


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("2:30", 150), ("00:30:00", 1800), ("1-0", 86400), ("1-02:03", 93780),
    ("2-00:00:01", 172801), ("UNLIMITED", None), ("infinite", None), ("0", None)])
def test_duration_formats(text, seconds):
    assert duration_s("launcher.time", text) == seconds


@pytest.mark.parametrize("text", ["1h", "90m", "1:2:3:4", "1-", "-5", "1-2-3", "", "1.5",
                                  "1 day"])
def test_malformed_duration_names_the_key_and_the_formats(text):
    cfg = OmegaConf.create({"launcher": {"name": "slurm", "time": text}})
    with pytest.raises(UserError) as e:
        validate.durations(cfg)
    assert str(e.value).startswith(f"launcher.time={text}: not a duration; use MM, MM:SS, "
                                   "HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"), e.value


def test_a_launcher_without_a_duration_has_nothing_to_parse():
    assert validate.durations(OmegaConf.create({"launcher": {"name": "local"}})) is None


def test_malformed_duration_is_refused_before_the_launcher_uses_it():
    """The slurm launcher reads launcher.time with the same parser, before the rules."""
    with pytest.raises(UserError, match=r"^launcher.time=90m: not a duration"):
        validate.resolve_train(compose("launcher=slurm", "launcher.time=90m"))


@pytest.mark.parametrize("backend, device, gpus, nproc, expected", [
    # contradictory anywhere
    ("nccl", "cpu", None, 1, "dist.backend=nccl with dist.device=cpu"),
    ("nccl", "cpu", 4, 1, "dist.backend=nccl with dist.device=cpu"),
    # ranks elsewhere (slurm, runai, mpirun): their nodes may have GPUs this machine lacks
    ("nccl", "auto", None, 4, None),
    ("auto", "cuda", None, 8, None),
    ("gloo", "cpu", None, 2, None),
    # a local launch: what this machine cannot do
    ("nccl", "auto", 0, 2, "dist.backend=nccl but this machine has no CUDA device"),
    ("auto", "cuda", 0, 1, "dist.device=cuda but this machine has no CUDA device"),
    ("gloo", "cuda", 0, 1, "dist.device=cuda but this machine has no CUDA device"),
    ("nccl", "cuda", 0, 1, "dist.device=cuda but this machine has no CUDA device"),
    ("auto", "auto", 1, 2, "launcher.nproc_per_node=2 with dist.device=auto"),
    ("gloo", "cuda", 2, 4, "launcher.nproc_per_node=4 with dist.device=cuda"),
    ("auto", "auto", 0, 2, None),
    ("gloo", "cpu", 1, 4, None),
    ("nccl", "auto", 2, 2, None),
])
def test_backend_and_device(backend, device, gpus, nproc, expected):
    said = validate.dist_problem(backend, device, gpus, nproc)
    if expected is None:
        assert said is None
    else:
        assert said.startswith(expected) and ("use " in said or "set " in said), said


@pytest.mark.parametrize("launcher, dry_run, backend, device, refused", [
    ("slurm", False, "nccl", "auto", False),  # the nodes' GPUs are not this machine's
    ("local", True, "nccl", "cuda", False),  # a dry run only renders, on any machine
    ("slurm", False, "nccl", "cpu", True),
    ("local", False, "nccl", "cpu", True),
])
def test_backend_and_device_rule_by_launcher(launcher, dry_run, backend, device, refused):
    cfg = OmegaConf.create({"launcher": {"name": launcher, "dry_run": dry_run, "nproc_per_node": 1},
                            "dist": {"backend": backend, "device": device}})
    assert (validate.dist_pair(cfg) is not None) == refused


def test_a_new_run_folder_survives_another_commands_check_of_the_same_new_root(tmp_path):
    """Two commands started at once on a run.root that does not exist yet: one's check makes
    run.root for its probe and removes it again, while the other is making its run folder
    in it (seen on CI: `make_run_dir` failed with FileNotFoundError). The run folder is
    made whatever the check does meanwhile."""
    import contextlib
    import threading

    from ddp_lab.folder.rundir import make_run_dir

    root = tmp_path / "runs"
    cfg = OmegaConf.create({"run": {"root": str(root), "dir": None}})
    stop = threading.Event()

    def checking():
        while not stop.is_set():
            validate.run_folder(cfg)

    other = threading.Thread(target=checking)
    other.start()
    try:
        for i in range(300):
            made = make_run_dir(cfg, label=f"run{i}")
            assert made.is_dir() and made.parent == root
            made.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()  # a new root again for the next run
    finally:
        stop.set()
        other.join()
