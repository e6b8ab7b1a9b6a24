"""The fixtures every test module shares. Being the rootdir conftest, this file also puts
tests/ on sys.path: test modules import their helpers plainly (`from helpers import ...`,
`from slurm_fixture import ...`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from netlab_fixture import netlab, netlab_factory  # noqa: F401 (fixtures, for every module)
from slurm_fixture import session_cluster


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 3 --dist loadgroup`, pyproject.toml): a file's tests run on one
    worker, so its module fixtures (a reference run, a world) are made once; every test
    that needs the SLURM cluster runs on one worker, so one cluster serves the session. A
    big file whose parts share no module fixture splits itself: `pytest.mark.xdist_group(NAME)`
    on a test puts it in the file's group NAME (`test_docs_commands:tour`), beside the others."""
    for item in items:
        slurm = "slurm_cluster" in getattr(item, "fixturenames", ()) or item.get_closest_marker("cluster")
        own = item.get_closest_marker("xdist_group")
        group = ("slurm-cluster" if slurm else f"{item.module.__name__}:{own.args[0]}" if own
                 else item.module.__name__)
        # the one group it names (xdist joins every xdist_group mark it finds into one name)
        item.own_markers[:] = [m for m in item.own_markers if m.name != "xdist_group"]
        item.add_marker(pytest.mark.xdist_group(group))


# The only skips a CI machine without a GPU may show (.ci/run): each expected reason, word
# for word (a reason that merely starts like one is not it: "needs CUDA 13" is another
# skip), and why it is expected. Any other skip (no sbatch, no mpirun, no network lab, the
# cluster fallen back to loopback, no root...) fails with its reason: a machine missing a
# package is not green. This holds at collection too: a module-level `pytest.skip` or
# `pytest.importorskip` is a collection error unless its reason is one of these. A developer
# without SLURM or Open MPI who wants those tests skipped asks for it: DDP_LAB_ALLOW_SKIPS=1
# (CI never sets it).
EXPECTED_SKIPS = {
    "needs CUDA": "no GPU on the CI machine",
    "CUDA is not available": "no GPU on the CI machine",
    "nccl needs one GPU per rank; fewer than 2 CUDA devices visible": "nccl's test needs two GPUs",
    "this torch build has no nccl": "a CPU-only torch build has no nccl",
    "setup.sh builds a venv and installs torch from the index: bash -n only (the venv running "
    "these tests is what it makes)": "the venv running the suite is what setup.sh makes",
    "not under pytest-xdist (-n 0)": "a test of the xdist groups, run with -n 0",
}
ALLOW_SKIPS = "DDP_LAB_ALLOW_SKIPS"


def skip_reason(report) -> str:
    """The reason a skipped report gives ('Skipped: ' cut)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def _unexpected(report) -> str | None:
    """Why a skipped report fails: its reason is none of EXPECTED_SKIPS; None if it may skip."""
    if not report.skipped or hasattr(report, "wasxfail") or os.environ.get(ALLOW_SKIPS) == "1":
        return None
    reason = skip_reason(report)
    if reason in EXPECTED_SKIPS:
        return None
    return (f"skipped for a reason this suite does not expect: {reason}\n"
            f"(expected skips: tests/conftest.py EXPECTED_SKIPS, matched word for word; to "
            f"skip anyway on a machine without it, {ALLOW_SKIPS}=1)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip whose reason is not one of EXPECTED_SKIPS is a failure, with its reason."""
    report = (yield).get_result()
    why = _unexpected(report)
    if why:
        report.outcome = "failed"
        report.longrepr = why


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same at collection: a module skipped whole (module-level `pytest.skip`,
    `pytest.importorskip`) for an unexpected reason is a collection error."""
    report = (yield).get_result()
    why = _unexpected(report)
    if why:
        report.outcome = "failed"
        report.longrepr = why


FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Every phase's seconds, summed per test file (on the controller under xdist, whose
    reports carry each worker's durations)."""
    path = report.nodeid.split("::", 1)[0]
    FILE_SECONDS[path] = FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The slowest test files, with their share: where the suite's time goes (issue 18)."""
    if not FILE_SECONDS or hasattr(terminalreporter.config, "workerinput"):
        return
    total = sum(FILE_SECONDS.values())
    terminalreporter.section("slowest files (test time, all phases)")
    for path, seconds in sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f} s {seconds / total:6.1%}  {path}")
    terminalreporter.write_line(f"{total:8.1f} s in all, {len(FILE_SECONDS)} files")


@pytest.fixture(scope="session")
def shared_data_root(tmp_path_factory) -> Path:
    """One extracted MNIST for the whole session (runs re-verify it, fetch nothing)."""
    from ddp_lab.data_fetch import fetch_mnist

    root = tmp_path_factory.mktemp("mnist-shared")
    fetch_mnist(root, ["embedded"])
    return root


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """One real 2-node SLURM cluster per test session (see slurm_fixture.py), on free ports
    with its state under this session's tmp folder: two sessions on one machine never collide.
    Its slurmd run in the nodes of an unshaped network lab (scripts/netlab.sh) when root, ip
    and tc are there, else on loopback (a warning says so; DDP_LAB_SLURM_LOOPBACK=1 asks for
    it). Stopped at the end of the session, lab and all, whatever the tests did.

    $SLURM_CLUSTER_STATE_DIR names a state folder instead; a cluster already up there is
    reused and left up (a quicker edit-test loop)."""
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch not installed (run scripts/install_system_deps.sh): "
                    "no SLURM cluster tests")
    reuse = os.environ.get("SLURM_CLUSTER_STATE_DIR")
    # short: slurmstepd's unix sockets live under it (the script checks the 107-byte limit)
    state_dir = Path(reuse) if reuse else tmp_path_factory.mktemp("slurm") / "c"
    with session_cluster(state_dir) as cluster:
        yield cluster
