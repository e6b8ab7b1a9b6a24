"""A venv over a site's container (NVIDIA's NGC PyTorch builds from 24.01 on) keeps the
container's torch: ddp_lab's declared requirements are met by the torch and torchvision
those containers carry, pre-release versions and all, so pip installs neither.

Real pip, offline (`--no-index`), in a throw-away venv whose installed distributions are
stand-ins: a `.dist-info` with each one's name and version (the NGC releases' torch and
torchvision, and a version of every other requirement that meets it), nothing to import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers import REPO, describe

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own TOML reader there
    import tomli as tomllib

# torch and torchvision as `pip list` shows them in NGC PyTorch containers
NGC = {
    "24.01": {"torch": "2.2.0a0+81ea7a4", "torchvision": "0.17.0a0"},
    "24.03": {"torch": "2.3.0a0+40ec155e58.nv24.3", "torchvision": "0.18.0a0"},
    "25.01": {"torch": "2.6.0a0+ecf3bae40a.nv25.1", "torchvision": "0.20.0a0"},
}
# a release of each other requirement that meets it (only its version is read)
OTHERS = {"hydra-core": "1.3.2", "omegaconf": "2.3.0", "tensorboard": "2.16.2",
          "matplotlib": "3.8.3", "tqdm": "4.66.2", "scipy": "1.12.0", "google-crc32c": "1.5.0"}


def requirements() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def fake_venv(where: Path, installed: dict[str, str]) -> Path:
    """A venv (no pip of its own) holding `installed` as distributions pip sees."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site, = where.glob("lib/python*/site-packages")
    for name, version in installed.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return where / "bin" / "python"


def test_every_requirement_has_a_stand_in():
    assert {Requirement(r).name for r in requirements()} == {"torch", "torchvision", *OTHERS}


@pytest.mark.parametrize("release", sorted(NGC))
def test_pip_over_an_ngc_container_installs_no_torch(tmp_path, release):
    python = fake_venv(tmp_path / "venv", {**NGC[release], **OTHERS})
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run",
         "--no-index", "--disable-pip-version-check", "--report", str(report), *requirements()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, describe(proc)  # offline: anything to fetch fails
    assert json.loads(report.read_text())["install"] == [], describe(proc)
    for name, version in NGC[release].items():
        assert f"Requirement already satisfied: {name}" in proc.stdout, describe(proc)
        assert version in proc.stdout
