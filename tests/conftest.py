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
    that needs the SLURM cluster runs on one worker, so one cluster serves the session."""
    for item in items:
        slurm = "slurm_cluster" in getattr(item, "fixturenames", ()) or item.get_closest_marker("cluster")
        group = "slurm-cluster" if slurm else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))


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
