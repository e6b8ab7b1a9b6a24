"""Where the Hydra config tree and the launch templates are: the top-level `conf/` and `launchers/`
in a checkout, copies inside the package (`ddp_lab/_conf`, `ddp_lab/_launchers`, setup.py's
build_py) in a wheel.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def _find(name: str) -> Path:
    top = PACKAGE.parent
    # pyproject.toml beside the package marks a checkout: an installed package's parent is
    # site-packages, where a stray top-level `conf/` of another distribution may live
    if (top / "pyproject.toml").is_file() and (top / name).is_dir():
        return top / name
    bundled = PACKAGE / f"_{name}"
    if bundled.is_dir():
        return bundled
    raise FileNotFoundError(f"ddp_lab: neither {top / name} (a checkout) nor {bundled} (an "
                            "installed wheel) exists: reinstall ddp_lab (pip install .)")


def conf_dir() -> Path:
    """The Hydra config tree: config.yaml, bench.yaml and the groups."""
    return _find("conf")


def launchers_dir() -> Path:
    """The templates the launchers render (local.sh, slurm.sbatch, ...)."""
    return _find("launchers")
