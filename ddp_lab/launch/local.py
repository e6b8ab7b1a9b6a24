"""launcher=local: torchrun on this machine, every rank running the worker entry."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from . import LaunchError, Rendered, check_port_free, free_port

TEMPLATE = Path(__file__).resolve().parents[2] / "launchers" / "local.sh"


def render(cfg, run_dir: Path) -> Rendered:
    lc = cfg.launcher
    if lc.nodes != 1:
        raise LaunchError(f"launcher=local runs on this machine only (launcher.nodes={lc.nodes}): "
                          "use launcher=slurm, mpirun or runai for several nodes")
    if lc.nproc_per_node is None or lc.nproc_per_node < 1:
        raise LaunchError(f"launcher.nproc_per_node={lc.nproc_per_node}: must be >= 1")
    if lc.max_restarts < 0:
        raise LaunchError(f"launcher.max_restarts={lc.max_restarts}: must be >= 0")
    if lc.master_port is None:
        port = free_port()
    else:
        check_port_free(lc.master_port)
        port = lc.master_port
    script = TEMPLATE.read_text().format(
        python=shlex.quote(sys.executable), nproc=lc.nproc_per_node, port=port,
        max_restarts=lc.max_restarts, run_dir=shlex.quote(str(run_dir)),
        entry=shlex.quote(cfg.run.entry))
    path = run_dir / "launch.sh"
    return Rendered(command=["bash", str(path)], files={"launch.sh": script},
                    executable=("launch.sh",), show=script)
