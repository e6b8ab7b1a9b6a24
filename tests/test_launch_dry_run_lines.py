"""A dry run prints the script a student would write, not the machinery (issue 28): each
launcher's console output stays within a screen, the sourced helpers are named by path and
their functions listed, and the run folder still holds them in full."""

from __future__ import annotations

import subprocess

import pytest
from helpers import run_cli, run_dir_of

MOST_LINES = 60  # a screen and a half; before: 193 (slurm, cluster=alps) and 190 (runai)


@pytest.mark.parametrize("overrides, helper, body", [
    (["launcher=local"], None, None),
    (["launcher=mpirun", "launcher.hosts=[red01:2,orange07:1,purple11:1]"], None, None),
    (["launcher=slurm"], "slurm_stop.sh", "trap 'GOT_USR2=1"),
    (["launcher=slurm", "cluster=alps"], "slurm_stop.sh", "trap 'GOT_USR2=1"),
    (["launcher=slurm", "launcher.per_task=true", "launcher.nodes=2"], "slurm_stop.sh",
     "trap 'GOT_USR2=1"),
    (["launcher=runai"], "pod_stop.sh", "trap 'on_signal TERM' TERM"),
    (["launcher=runai", "cluster=rcp"], "pod_stop.sh", "trap 'on_signal TERM' TERM"),
], ids=["local", "mpirun", "slurm", "slurm-alps", "slurm-per-task", "runai", "runai-rcp"])
def test_dry_run_fits_a_screen(tmp_path, overrides, helper, body):
    proc = run_cli(*overrides, "launcher.dry_run=true", f"run.root={tmp_path / 'runs'}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= MOST_LINES, f"{len(lines)} lines:\n{proc.stdout}"
    if helper is None:
        return
    run_dir = run_dir_of(proc)
    path = run_dir / helper
    full = path.read_text()
    # named by path, its functions listed, its body left in the file
    named = [ln for ln in lines if ln.startswith(f"# ---- {path}: sourced by ")]
    assert len(named) == 1 and f"{len(full.splitlines())} lines not shown" in named[0], named
    assert "#   check_python " in proc.stdout
    assert body in full and body not in proc.stdout
    # what the job script sources still parses as bash (the SLURM and RunAI tests run it)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
