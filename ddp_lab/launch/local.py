"""launcher=local: torchrun on this machine, every rank running the
worker entry."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Optional

from ..world.ports import FIX, taken
from ..world.devices import default_nproc
from .base import (LaunchError, Rendered, check_port_free, code_dir, python_exe, setup_block, template)

# torchrun's own error (TORCHELASTIC_ERROR_FILE)
ERROR_FILE = "logs/torchrun_error.json"


def rendezvous_port(lc):
    """The port launch.sh's rendezvous binds, and the key that sets it:
    MASTER_PORT from this environment, else launcher.master_port (None:
    port 0, which the OS gives torchrun's store as it binds, so no other
    program can take it in between)."""
    if os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_PORT"], "MASTER_PORT"
    return lc.master_port, "launcher.master_port"


def resolve(cfg) -> None:
    lc = cfg.launcher
    if lc.nodes != 1:
        raise LaunchError(f"launcher=local runs on this machine only (launcher.nodes={lc.nodes}): "
                          "use launcher=slurm, mpirun or runai for several nodes")
    if lc.nproc_per_node is None:
        lc.nproc_per_node = default_nproc()
    if lc.nproc_per_node < 1:
        raise LaunchError(f"launcher.nproc_per_node={lc.nproc_per_node}: must be >= 1")
    if lc.max_restarts < 0:
        raise LaunchError(f"launcher.max_restarts={lc.max_restarts}: must be >= 0")
    port, key = rendezvous_port(lc)
    if key == "MASTER_PORT":
        check_port_free(port, key, "unset MASTER_PORT in this shell (launch.sh prefers it to "
                                   "launcher.master_port) for a free one, or export another")
    elif port is not None:
        check_port_free(port)


def render(cfg, run_dir: Path) -> Rendered:
    lc = cfg.launcher
    # None: port 0, and the store binds whatever port the OS gives it: a
    # port picked free here could be taken by another program before
    # torchrun binds it; port 0 cannot.
    port = lc.master_port if lc.master_port is not None else 0
    script = template("local.sh").format(
        python=shlex.quote(python_exe(lc)), nproc=lc.nproc_per_node, port=port,
        max_restarts=lc.max_restarts, run_dir=shlex.quote(str(run_dir)),
        code_dir=shlex.quote(str(code_dir())), setup=setup_block(lc.setup),
        error_file=shlex.quote(str(run_dir / ERROR_FILE)),
        join_timeout=max(1, int(cfg.dist.init_timeout_s)), entry=shlex.quote(cfg.run.entry))
    path = run_dir / "launch.sh"
    # what the script will bind (rendezvous_port)
    used = os.environ.get("MASTER_PORT") or port
    return Rendered(command=["bash", str(path)], files={"launch.sh": script},
                    executable=("launch.sh",), show=script,
                    explain=lambda: rendezvous_failure(run_dir, "127.0.0.1", int(used)))


def rendezvous_failure(run_dir: Path, host: str, port: int) -> Optional[str]:
    """One line naming the rendezvous when torchrun could not start it,
    else None."""
    try:
        error = json.loads((run_dir / ERROR_FILE).read_text())["message"]
        message, trace = error["message"], error["extraInfo"]["py_callstack"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not message.startswith("Rendezvous"):
        return None
    # another program took the port after ddp_lab checked it
    if "EADDRINUSE" in trace:
        return taken(host, port)
    where = f"{host}:{port}" if port else f"{host} (a port the OS gave it)"
    return f"torchrun's rendezvous at {where} could not start ({message.split(':')[0]}): {FIX}"
