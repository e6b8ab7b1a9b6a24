"""OpenMPI as a process launcher: mpirun -np 3 -> gloo all_reduce over OMPI_COMM_WORLD_*.

torch's PyPI wheels have no MPI backend (is_mpi_available() is False): mpirun only starts
the processes; gloo does the communication.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from ddp_lab.world.ports import free_port

pytestmark = [pytest.mark.mpi]

SCRIPT = textwrap.dedent(
    """
    import os, datetime
    import torch
    import torch.distributed as dist

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local))
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} local={local} "
          f"sum={t.item():g} mpi_backend={dist.is_mpi_available()}", flush=True)
    dist.destroy_process_group()
    """
)




@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="mpirun not installed (run scripts/install_system_deps.sh)")
@pytest.mark.slow
def test_mpirun_gloo_allreduce(tmp_path):
    script = tmp_path / "mpi_allreduce.py"
    script.write_text(SCRIPT)
    port = free_port()
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3",
           "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}",
           "-x", "PATH", *(["-x", "PYTHONPATH"] if "PYTHONPATH" in os.environ else []),
           sys.executable, str(script)]
    env = dict(os.environ)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    results = re.findall(r"RESULT rank=(\d+) world=(\d+) local=(\d+) sum=([0-9.]+) mpi_backend=(True|False)", out)
    assert sorted(int(r[0]) for r in results) == [0, 1, 2], out
    assert {int(r[1]) for r in results} == {3}, out
    assert sorted(int(r[2]) for r in results) == [0, 1, 2], out  # one host: local == global
    assert {float(r[3]) for r in results} == {6.0}, out  # 1+2+3
