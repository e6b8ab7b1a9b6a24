"""Every command of the README's runbook and of docs/tour.md, every script in scripts/ and
every benchmark of `python -m ddp_lab.bench.suite`, run as written from a folder outside
the checkout.

The commands are parsed from README.md and docs/tour.md themselves, so a doc edit is
tested. `python` is this interpreter (the runbook activates the venv first). A command
that trains runs as written with only caps appended (one epoch of a few steps, the shared
data: Hydra's last value of a key wins); a dry run is run as written. What cannot run on
this machine (NOT_HERE: a 4-node or GPU SLURM allocation, a RunAI cluster, remote hosts)
says why, and is composed, checked and rendered as a dry run. Everything must land under
./outputs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, child_env, compose, describe, run_dir_of

README = (REPO / "README.md").read_text()
TOUR = (REPO / "docs" / "tour.md").read_text()
# the caps appended to a documented command that trains (its own values of these lose)
CAPS = ["train.epochs=1", "train.max_steps_per_epoch=8", "train.eval_batch_size=2000",
        "log.progress=lines"]
QUICK_BENCH = ["bench.min_elements=1024", "bench.max_elements=4096", "bench.points=2",
               "bench.warmup=1", "bench.iters=3", "bench.min_iters=1", "log.progress=lines"]
REMOTE = ("launcher=slurm", "launcher=mpirun", "launcher=runai", "cluster=")


def runbook_commands() -> list[str]:
    """The ```bash blocks between `## Runbook` and the next `## ` heading, one command a line."""
    section = README.split("\n## Runbook\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(shlex.join(argv))
    return commands


COMMANDS = runbook_commands()


def tour_commands() -> list[str]:
    """docs/tour.md's commands: its indented lines that start with `python -m` or `torchrun`."""
    commands = []
    for line in re.findall(r"^    ((?:python -m|torchrun) .*)$", TOUR, re.M):
        commands.append(shlex.join(shlex.split(line, comments=True)))
    return commands


TOUR_COMMANDS = tour_commands()

# The documented commands that cannot run on this machine, and why: each is composed,
# checked and rendered as a dry run instead. Any other command runs.
NOT_HERE = {
    "python -m ddp_lab launcher=slurm launcher.nodes=4 launcher.account=a-xyz sync=ring":
        "a 4-node SLURM allocation (the test cluster has 2 nodes)",
    "python -m ddp_lab study=scaling 'study.worlds=[1,2,4]' study.repeats=3 launcher=slurm "
    "launcher.nodes=2 launcher.nproc_per_node=2":
        "9 SLURM jobs; tests/test_study_slurm.py runs a study on the test cluster",
    "python -m ddp_lab launcher=mpirun 'launcher.hosts=[red01:2,orange07:1,purple11:1]'":
        "the hosts red01, orange07 and purple11 stand for the user's machines",
    "python -m ddp_lab launcher=runai launcher.nodes=2 launcher.gpus_per_node=4 "
    "launcher.image=...":
        "a RunAI cluster with GPU nodes and an image",
    "python -m ddp_lab.bench bench=handin launcher=slurm launcher.nodes=4 "
    "launcher.gpus_per_node=4":
        "a 4-node SLURM allocation with 4 GPUs a node",
}

# The documented commands whose real run another test holds (each claim held once, by the
# fastest test that can hold it): each runs here as a dry run, composed, checked, named and
# rendered (a doc edit is still tested), and the test named trains what it shows.
HELD_ELSEWHERE = {
    # SGD with momentum 0.9 at lr 0.05, through the CLI, against DDP's weights
    "python -m ddp_lab optim=sgd train.lr=0.05 optim.momentum=0.9":
        ("tests/test_zero1.py", "def test_cli_zero1_trains_to_ddps_weights("),
    # a sweep's jobs one after another, its folders and table (times and all)
    "python -m ddp_lab -m optim=adam,sgd":
        ("tests/test_every_setting.py", "def test_every_sync_and_option_through_every_consumer("),
    # the ring on 3 ranks (its buffer padded), bit for bit stop 0's
    "python -m ddp_lab sync=ring launcher.nproc_per_node=3":
        ("tests/test_one_file.py", "def test_one_file_matches_the_ring_at_3_and_7_ranks("),
    # sync=custom on 3 ranks, then status, the report and TensorBoard naming its function
    "python -m ddp_lab sync=custom launcher.nproc_per_node=3":
        ("tests/test_check.py", "def test_sync_custom_run_named_by_its_function_everywhere("),
    "python -m ddp_lab -m sync=ddp,naive,allreduce,reduce_broadcast,ring,tree,butterfly":
        ("tests/test_every_setting.py", "def test_every_sync_and_option_through_every_consumer("),
    "python -m ddp_lab -m sync=ddp,zero1,torch_zero,fsdp2 model=mlp_wide "
    "launcher.nproc_per_node=2 train.epochs=1 train.max_steps_per_epoch=20 run.root=outputs/twins":
        ("tests/test_twins.py", "def test_cli_twins_resume_match_ddp_and_the_report_compares_them("),
    "python -m ddp_lab -m sync=ddp sync.hook=ring,ring_prepost model=mlp_wide "
    "launcher.nproc_per_node=2 train.epochs=1 train.max_steps_per_epoch=20 run.root=outputs/twins":
        ("tests/test_twins.py", "def test_every_twin_ends_with_ddps_weights("),
    "python -m ddp_lab -m sync=zero1,ddp model=mlp_wide launcher.nproc_per_node=2 "
    "train.epochs=1 train.max_steps_per_epoch=20":
        ("tests/test_zero1.py", "def test_cli_zero1_trains_to_ddps_weights("),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory, shared_data_root):
    """A user's folder outside the checkout, one per xdist group of this file (the runbook,
    the tour, each script and benchmark: conftest.py). At its end no command or script run
    in it left anything outside ./outputs."""
    cwd = tmp_path_factory.mktemp("user")
    env = child_env()  # this checkout first on PYTHONPATH
    yield {"cwd": cwd, "env": env, "data": f"data.root={shared_data_root}"}
    assert sorted(os.listdir(cwd)) in ([], ["outputs"]), sorted(os.listdir(cwd))


def sh(work, argv: list[str], timeout: float = 600, env: dict | None = None):
    return subprocess.run(argv, cwd=work["cwd"], env={**work["env"], **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def ok(proc) -> str:
    assert proc.returncode == 0, describe(proc)
    return proc.stdout


def cheap(argv: list[str], work) -> tuple[list[str], str]:
    """A documented command as it runs here and what to check: 'run', 'help', 'plain'.
    Training and benchmarking commands run as written plus the caps; one that cannot run
    here (NOT_HERE) is a dry run."""
    if argv[:2] != ["python", "-m"]:
        raise AssertionError(f"no rule for this command: {shlex.join(argv)}")
    module, args = argv[2], argv[3:]
    py = [sys.executable, "-m", module, *args]
    if "--help" in args:
        return py, "help"
    if module in ("ddp_lab", "ddp_lab.bench"):
        data = [work["data"]] if module == "ddp_lab" else []  # the bench reads no data
        command = shlex.join(argv)
        if command in NOT_HERE:
            print(f"not run here: {NOT_HERE[command]}; composed, checked and rendered")
            return [*py, "launcher.dry_run=true", *data], "run"
        if command in HELD_ELSEWHERE:
            print(f"a dry run: {'::'.join(HELD_ELSEWHERE[command])} trains what it shows")
            return [*py, "launcher.dry_run=true", *data], "run"
        remote = [a for a in args if a.startswith(REMOTE)]
        assert not remote or "launcher.dry_run=true" in args, (
            f"{command}: {remote} cannot run on this machine; run it as a dry run in the "
            "docs, or say why in NOT_HERE")
        return [*py, *(CAPS if module == "ddp_lab" else QUICK_BENCH), *data], "run"
    return py, "plain"  # ddp_lab.report, ddp_lab.nccl_env: cheap as they are


def sweep_jobs(args: list[str]) -> int:
    """How many jobs a `-m` sweep's overrides make (1: not a sweep)."""
    if "-m" not in args:
        return 1
    return math.prod(len(a.split("=", 1)[1].split(",")) for a in args
                     if "=" in a and "," in a.split("=", 1)[1] and "[" not in a)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.xdist_group("runbook")  # in the README's order: the report and status read the runs above
@pytest.mark.parametrize("command", COMMANDS, ids=[c[:70] for c in COMMANDS])
def test_runbook_command(work, command):
    argv = shlex.split(command)
    if argv[:1] == ["source"]:
        # the venv of this checkout is the interpreter running the tests: `python` below is it
        assert argv == ["source", ".venv/bin/activate"], argv
        print(f"not run: {command} (the commands below run with {sys.executable})")
        return
    if argv[0] == "tensorboard":
        assert argv[1:] == ["--logdir", "outputs"], argv
        tb = Path(sys.executable).with_name("tensorboard")
        assert "--logdir" in ok(sh(work, [str(tb), "--help"], timeout=120))
        print("tensorboard: --help only (serving blocks until stopped)")
        return
    if "run.dir=" in command and "train.resume=true" in command:
        return resume(work, argv)
    if argv[2:3] == ["ddp_lab.status"]:
        return status(work, argv)
    full, kind = cheap(argv, work)
    proc = sh(work, full)
    out = ok(proc)
    if kind == "help":
        assert "launcher" in out
    elif kind == "run" and "-m" in argv[3:]:  # a sweep prints one run dir per job
        assert out.count("run dir: ") == sweep_jobs(argv[3:]), out
    elif kind == "run":
        assert run_dir_of(proc).resolve().is_relative_to((work["cwd"] / "outputs").resolve())
    if argv[2] == "ddp_lab.report":
        assert (work["cwd"] / "outputs" / "report" / "report.md").is_file()


def resume(work, argv):
    """The Resume example: its run folder made first (one epoch), then the command as written."""
    folder = next(a for a in argv if a.startswith("run.dir=")).removeprefix("run.dir=")
    ok(sh(work, [sys.executable, "-m", "ddp_lab", f"run.dir={folder}", *CAPS, work["data"]]))
    ok(sh(work, [sys.executable, "-m", *argv[2:], *CAPS, "train.epochs=2", work["data"]]))
    lines = (work["cwd"] / folder / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2]


def status(work, argv):
    """The reattach example reads the runs the commands above made (a dry run's folder when
    it runs alone): one line per run, then the count."""
    if not any((work["cwd"] / "outputs").rglob("config.yaml")):
        ok(sh(work, [sys.executable, "-m", "ddp_lab", "launcher.dry_run=true", work["data"]]))
    out = ok(sh(work, [sys.executable, "-m", *argv[2:]]))
    assert " run(s) under " in out.splitlines()[-1], out


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.xdist_group("tour")  # in the tour's order: its report reads stop 7's runs
@pytest.mark.parametrize("command", TOUR_COMMANDS, ids=[c[:70] for c in TOUR_COMMANDS])
def test_tour_command(work, command):
    argv = shlex.split(command)
    if argv[0] == "torchrun":  # torch.distributed.run's console script, on a port of its
        from ddp_lab.world import ports  # own (torchrun reads PET_* variables)

        env = {"PET_MASTER_PORT": str(ports.free_port())}
        out = ok(sh(work, [sys.executable, "-m", "torch.distributed.run", *argv[1:]], env=env))
        assert "[rank 0] epoch 1/1: loss" in out and "[rank 1] epoch 1/1: loss" in out, out
        return
    full, kind = cheap(argv, work)
    proc = sh(work, full)
    if argv[2] == "ddp_lab.report" and argv[3] == "outputs/twins":
        # stop 7's sweeps ran as dry runs above (HELD_ELSEWHERE): the report reads their
        # folders and says, in one line, that none was started; its twin table over trained
        # twins: tests/test_twins.py::test_cli_twins_resume_match_ddp_and_the_report_compares_them
        assert proc.returncode == 2 and "holds only dry runs (6)" in proc.stderr, describe(proc)
        return
    out = ok(proc)
    if "-m" in argv[3:]:
        assert out.count("run dir: ") == sweep_jobs(argv[3:]), out
    elif argv[2] == "ddp_lab.report":  # the report of the runs the stop's commands made
        assert (work["cwd"] / argv[3] / "report" / "report.md").is_file(), out
    else:
        assert run_dir_of(proc).resolve().is_relative_to((work["cwd"] / "outputs").resolve())


def test_tour_is_parsed():
    assert len(TOUR_COMMANDS) >= 5 and any(c.startswith("torchrun ") for c in TOUR_COMMANDS)


def test_held_elsewhere_are_documented_commands_and_their_tests_exist():
    assert set(HELD_ELSEWHERE) <= {*COMMANDS, *TOUR_COMMANDS}, set(HELD_ELSEWHERE) - {*COMMANDS, *TOUR_COMMANDS}
    for path, test in HELD_ELSEWHERE.values():
        assert test in (REPO / path).read_text(), (path, test)


def test_runbook_is_parsed():
    assert len(COMMANDS) >= 20 and "python -m ddp_lab.report outputs/" in COMMANDS
    assert any(c.startswith("python -m ddp_lab run.dir=") for c in COMMANDS)  # the Resume example


# ------------------------------------------------------- python -m ddp_lab.bench.suite
SUITE = [sys.executable, "-m", "ddp_lab.bench.suite"]


def bench_epoch(work):
    # 1 rank, idle, one thread count and one wait: every kind of row but the 2-rank ones
    # (four more interpreters that import torch, for rows of the same table code) and the
    # hog's; then the hog that comes mid-run, on ddp_lab's defaults and on spinning
    # threads; --pinned: a count you pin, timing on and off, against the floor at that
    # count (each more count or wait is the same rows again: test_bench_epoch.py holds
    # the ratios' arithmetic)
    out = ok(sh(work, [*SUITE, "epoch", "--epochs", "1", "--ranks", "1", "--rounds", "1",
                       "--max-steps", "5", "--load", "idle", "late", "--pinned",
                       "--threads", "1", "--waits", "default"]))
    for row in ("| 1, (1 thread: none) |", "| tight loop, 1 thread, default, ",
                "| ddp_lab, 1 rank: its defaults: ", "idle, 1 rank: ddp_lab / floor =",
                "## late: a hog starts after epoch 1 of 2", "| its defaults: ",
                "| ddp_lab, 1 rank, train.threads=1, timing.enabled=false: waiting threads ",
                "idle, 1 rank, train.threads=1: ddp_lab / the 1-thread floor = ",
                "idle, 1 rank, train.threads=1: timing on / off = "):
        assert row in out, out
    if len(os.sched_getaffinity(0)) > 1:  # every core's threads, spinning as libgomp would
        assert "default wait (GOMP_SPINCOUNT=300000) | " in out, out
    assert "2 ranks" not in out and "## hog" not in out and "passive" not in out


def bench_syncs(work):
    data = work["data"].removeprefix("data.root=")
    # two of its eleven configurations (the ratio needs both), no paired timer rounds
    out = ok(sh(work, [*SUITE, "syncs", "--world", "2",
                       "--rounds", "1", "--steps", "20", "--only", "ddp,ring", "--no-paired",
                       "--data-root", data]))
    assert "ring / ddp" in out


def bench_overlap(work):
    data = work["data"].removeprefix("data.root=")
    out = ok(sh(work, [*SUITE, "overlap", "--rounds", "1",
                       "--steps", "3", "--model", "mlp", "--bucket-mb", "0.05",
                       "--data-root", data]))
    assert "| allreduce+overlap / ddp |" in out and "| allreduce | " in out


def script_gpu_check(work):
    import torch

    script = str(REPO / "scripts/gpu_check.sh")
    env = {"PYTHON": sys.executable, "OUT": str(work["cwd"] / "outputs" / "gpu_check")}
    if not torch.cuda.is_available():
        out = ok(sh(work, ["bash", script], env=env))
        assert out.strip().splitlines() == [out.strip()] and out.startswith("skipped: no CUDA")
    dry = ok(sh(work, ["bash", script, "--dry"], env=env)).splitlines()
    ours = [shlex.split(x) for x in dry if " -m ddp_lab" in x]
    assert len(ours) == 22, dry  # speed, timing off, cuda graph, eight syncs, eight twins,
    # bench, flight recorder, timing.profile
    for argv in ours:  # every config key is real: Hydra composes each command (in this
        # process: the same schema and conf/ as `python -m ddp_lab ... --cfg job`)
        argv = argv[argv.index(sys.executable):]
        entry, overrides = argv[2], [a for a in argv[3:] if "=" in a]
        compose(*overrides, config_name="bench" if entry == "ddp_lab.bench" else "config")


def script_gpu_session(work):
    """gpu_session.sh's own parts run on the GPU machine; here: its CPU answer, and its
    three helpers on a CPU rank (a rendered run profiled, two profiles compared, the NVTX
    ranges counted: none without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        out = ok(sh(work, ["bash", str(REPO / "scripts/gpu_session.sh")]))
        assert out.strip().splitlines() == [out.strip()] and out.startswith("skipped: no CUDA")
    run = work["cwd"] / "outputs" / "rank"
    ok(sh(work, [sys.executable, "-m", "ddp_lab", "launcher.dry_run=true", f"run.dir={run}",
                 "launcher.nproc_per_node=1", "train.epochs=1", "train.max_steps_per_epoch=5",
                 work["data"], "log.progress=lines"]))
    prof = work["cwd"] / "outputs" / "rank.prof"
    out = ok(sh(work, [sys.executable, str(REPO / "scripts/profile_rank.py"), str(run), str(prof)]))
    assert "rank exit 0" in out and prof.is_file(), out
    out = ok(sh(work, [sys.executable, str(REPO / "scripts/profile_diff.py"), str(prof), str(prof)]))
    assert "own time grown most" in out and "+0.000 s" in out, out
    (run / "checkpoints").exists() and shutil.rmtree(run / "checkpoints")
    (run / "summary.json").unlink(missing_ok=True)
    out = ok(sh(work, [sys.executable, str(REPO / "scripts/nvtx_ranges.py"), str(run)]))
    assert "NVTX ranges pushed: 0" in out, out


def script_setup(work):
    assert subprocess.run(["bash", "-n", str(REPO / "scripts/setup.sh")]).returncode == 0
    pytest.skip("setup.sh builds a venv and installs torch from the index: bash -n only "
                "(the venv running these tests is what it makes)")


def script_install_system_deps(work):
    pkgs = ["slurmctld", "slurmd", "slurm-client", "munge", "openmpi-bin"]
    have = subprocess.run(["dpkg-query", "-W", "-f=${Status}\n", *pkgs], capture_output=True,
                          text=True).stdout.count("install ok installed")
    if have != len(pkgs):
        pytest.skip("the packages are not all installed: installing needs root and the network")
    assert "all installed" in ok(sh(work, ["bash", str(REPO / "scripts/install_system_deps.sh")]))


def script_slurm_cluster(work):
    # `status` of a cluster that was never started: exit 1, quickly, and nothing started
    state = work["cwd"] / "outputs" / "no-cluster"
    proc = sh(work, ["bash", str(REPO / "scripts/slurm_cluster.sh"), "status", str(state)], timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr


def bench_stop(work):
    data = work["data"].removeprefix("data.root=")
    out = ok(sh(work, [*SUITE, "stop", "--rounds", "1",
                       "--steps", "30", "--data-root", data]))
    assert "time inside the check / step" in out and "step bookkeeping / step" in out


def bench_hierarchical(work):
    # 2 local ranks, each its own pretend node: the leaders' ring is the world's
    out = ok(sh(work, [*SUITE, "hierarchical", "--rounds",
                       "1", "--steps", "5", "--node-size", "1", "--only", "ring,hierarchical inter=ring",
                       "--", "launcher.nproc_per_node=2",
                       work["data"]]))
    assert "hierarchical inter=ring / ring: epoch" in out
    assert "2 ranks, 1 launcher node(s)" in out


def bench_compress(work):
    data = work["data"].removeprefix("data.root=")
    out = ok(sh(work, [*SUITE, "compress", "--epochs", "1",
                       "--max-steps", "10", "--only", "ddp none,ddp fp16", "--data-root", data]))
    assert "| ddp | fp16 | 79,520 | 0.500 |" in out  # the MLP's 159,040 gradient bytes, halved


def bench_tensorboard(work):
    out = ok(sh(work, [*SUITE, "tensorboard", "--steps", "200",
                       "--rounds", "1"]))
    assert "| live |" in out and "| naive |" in out


def bench_timing(work):
    data = work["data"].removeprefix("data.root=")
    out = ok(sh(work, [*SUITE, "timing", "--rounds", "1", "--epochs", "1", "--max-steps", "5",
                       "--data-root", data]))
    assert "| 1 | " in out and "timing on / off = " in out and "timing's CPU a step = " in out, out


def bench_start(work):
    data = work["data"].removeprefix("data.root=")
    out = ok(sh(work, [*SUITE, "start", "--rounds", "1",
                       "--pause", "0", "--data-root", data]))
    assert "| first line | " in out and "| report | " in out, out
    proc = sh(work, [*SUITE, "start", "--vs", "nowhere"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


BENCHES = {"start": bench_start, "compress": bench_compress, "tensorboard": bench_tensorboard,
           "stop": bench_stop, "timing": bench_timing,
           "epoch": bench_epoch, "syncs": bench_syncs, "hierarchical": bench_hierarchical,
           "overlap": bench_overlap}
SCRIPTS = {"gpu_check.sh": script_gpu_check, "gpu_session.sh": script_gpu_session,
           "setup.sh": script_setup,
           "install_system_deps.sh": script_install_system_deps,
           "slurm_cluster.sh": script_slurm_cluster}


# scripts whose end-to-end test lives with what they measure (a larger case than the
# cheapest form here, so running them here too would repeat it)
ELSEWHERE = {"netlab.sh": ("tests/test_netlab.py", "def test_up_down_leaves_nothing_and_labs_coexist("),
             "docs_images.py": ("tests/test_docs_images.py", "def test_every_picture_in_docs_img_has_a_recipe("),
             # gpu_session.sh's helpers: its check runs them on a CPU rank
             **{name: ("tests/test_docs_commands.py", "def script_gpu_session(")
                for name in ("profile_rank.py", "profile_diff.py", "nvtx_ranges.py")},
             # CI's last step runs it whole (a 2.5 GB install: nowhere cheaper)
             "oldest_torch.sh": (".ci/run", "bash scripts/oldest_torch.sh"),
             # the suite's own mutants: each patch applies and names its test; the script lists them
             "mutants.py": ("tests/test_mutants.py", "def test_the_script_lists_them("),
             # random command lines by hand; the suite runs the same sets in-process
             "override_fuzz.py": ("tests/test_override_fuzz.py", "def test_the_script_judges_a_few_sets(")}
BENCHES_ELSEWHERE = {"truth": ("tests/test_truth.py", "def test_comm_truth_script_end_to_end("),
                     # minutes on a lab and a cluster: its pure parts only (what it measures: above)
                     "network": ("tests/test_net_claims.py",
                                 "def test_claims_against_their_predictions_and_targets(")}


def test_every_script_has_a_check():
    assert sorted(p.name for p in (REPO / "scripts").iterdir() if p.is_file()) == sorted(
        [*SCRIPTS, *ELSEWHERE])
    for path, test in [*ELSEWHERE.values(), *BENCHES_ELSEWHERE.values()]:
        assert test in (REPO / path).read_text(), (path, test)


def test_every_benchmark_has_a_check():
    from ddp_lab.bench import suite

    assert sorted(suite.NAMES) == sorted([*BENCHES, *BENCHES_ELSEWHERE])
    assert sorted(p.stem for p in (REPO / "ddp_lab/bench/specs").glob("[!_]*.py")) == sorted(
        set(suite.NAMES.values()))
    assert all(suite.load(name).spec.compares for name in suite.NAMES)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.xdist_group("scripts")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script(work, name):
    SCRIPTS[name](work)


# each benchmark its own xdist group: they share nothing, and together they would be the
# longest group of the suite
@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group(f"bench-{n}"))
                                  for n in sorted(BENCHES)])
def test_benchmark(work, name):
    BENCHES[name](work)
