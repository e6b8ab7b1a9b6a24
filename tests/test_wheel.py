"""The wheel works without the checkout: built here, installed non-editable into a fresh
folder, and every entry point run from another folder with only that folder on PYTHONPATH.

The build runs without build isolation (the venv's setuptools; pip would otherwise fetch
setuptools from an index) on a copy of the sources, so the checkout gets no build/ folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import describe, run_dir_of

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "ddp_lab", "conf", "launchers")


def build_wheel(tmp: Path) -> tuple[Path, str, float]:
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    env = dict(os.environ)
    # the test environment's PYTHONDONTWRITEBYTECODE makes setuptools warn "byte-compiling is
    # disabled": a property of this shell, not of the build
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    # -v: the backend's own output (setuptools' deprecation warnings) is shown only verbose
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                          "--no-build-isolation", "-w", str(dist), str(src)],
                         capture_output=True, text=True, env=env, timeout=300)
    seconds = time.perf_counter() - t0
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    (wheel,) = dist.glob("ddp_lab-*.whl")
    return wheel, log, seconds


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    wheel, log, seconds = build_wheel(tmp)
    print(f"wheel built in {seconds:.1f} s: {wheel.name}")
    site = tmp / "site"
    # --target installs beside the environment, never into it (no uninstall of the venv's
    # editable ddp_lab)
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
                          str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    work = tmp / "work"
    work.mkdir()
    return {"site": site, "work": work, "log": log}


def run(installed, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DDP_LAB"))}
    env["PYTHONPATH"] = str(installed["site"])  # the installed package only, no checkout
    return subprocess.run([sys.executable, *argv], cwd=installed["work"], env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_not_the_checkout(text: str, where: str) -> None:
    # the interpreter may live in the checkout (CI's .venv/bin/python): naming it is fine,
    # any other path into the checkout (code, conf, templates) is not
    text = text.replace(sys.executable, "<python>")
    for checkout in {str(REPO), str(REPO.resolve())}:
        assert checkout not in text, f"{where} names the checkout {checkout}"


@pytest.mark.slow
def test_build_prints_no_warnings(installed):
    warnings = [line for line in installed["log"].splitlines()
                if re.search(r"warn|deprecat", line, re.IGNORECASE)]
    assert not warnings, "\n".join(warnings)


@pytest.mark.slow
def test_installed_package_imports_from_the_site_folder(installed):
    proc = run(installed, "-c", "import ddp_lab, ddp_lab.config as r; "
               "print(ddp_lab.__file__); print(r.conf_dir()); print(r.launchers_dir())")
    assert proc.returncode == 0, proc.stderr
    site = installed["site"].resolve()
    for line in proc.stdout.split():
        assert Path(line).resolve().is_relative_to(site), line
    assert proc.stdout.split()[1].endswith("_conf")


@pytest.mark.slow
def test_help(installed):
    proc = run(installed, "-m", "ddp_lab", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "launcher: local, mpirun, slurm, runai" in proc.stdout  # the registry's order


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["launcher=local"],
    ["launcher=mpirun", "launcher.hosts=[red01:2,orange07:1]"],
    ["launcher=slurm", "launcher.nodes=2", "launcher.account=a-xyz"],
    ["launcher=runai", "launcher.image=registry.example/ddp:1"],
], ids=lambda o: o[0])
def test_dry_run_of_every_launcher(installed, overrides):
    proc = run(installed, "-m", "ddp_lab", *overrides, "launcher.dry_run=true")
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert run_dir.resolve().is_relative_to(installed["work"].resolve())  # under ./outputs
    rendered = [p for p in run_dir.iterdir() if p.suffix in (".sh", ".sbatch")]
    assert rendered, list(run_dir.iterdir())
    for p in rendered:
        assert subprocess.run(["bash", "-n", str(p)]).returncode == 0, p
        assert_not_the_checkout(p.read_text(), p.name)


@pytest.mark.slow
@pytest.mark.dist
def test_train_bench_report(installed, shared_data_root):
    proc = run(installed, "-m", "ddp_lab", "launcher.nproc_per_node=2", "train.epochs=1",
               "train.max_steps_per_epoch=20", f"data.root={shared_data_root}",
               "log.progress=lines")
    assert proc.returncode == 0, describe(proc)
    train_dir = run_dir_of(proc)
    summary = json.loads((train_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    launch = (train_dir / "launch.sh").read_text()
    assert f"PYTHONPATH={installed['site']}" in launch  # the ranks run the installed code
    assert_not_the_checkout(launch, "launch.sh")

    proc = run(installed, "-m", "ddp_lab.bench", "launcher.nproc_per_node=2",
               "bench.min_elements=1024", "bench.max_elements=4096", "bench.points=2",
               "bench.warmup=1", "bench.iters=3", "bench.min_iters=1", "log.progress=lines")
    assert proc.returncode == 0, describe(proc)
    bench_dir = run_dir_of(proc)
    assert (bench_dir / "bench.json").is_file()

    outputs = installed["work"] / "outputs"
    proc = run(installed, "-m", "ddp_lab.report", "outputs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 training run(s), 1 bench run(s)" in proc.stdout
    assert (outputs / "report" / "report.md").is_file()
    # every command wrote under the output root only
    assert sorted(os.listdir(installed["work"])) == ["outputs"]
