"""Every launcher's dry run: what it renders parses as bash (`bash -n`) and carries every
setting it must; bad input fails before anything starts, as one `error: ...` line."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO, compose, describe, run_cli, run_dir_of

import ddp_lab
from ddp_lab.world.env import slurm_port
from ddp_lab.launch import mpirun as mpirun_launch
from ddp_lab.launch import slurm as slurm_launch
from ddp_lab.world import ports
from ddp_lab.config.errors import UserError
from ddp_lab.command.submit import submit
from ddp_lab.command.validate import resolve_train as resolve_defaults
from ddp_lab.launch.slurm import duration_s
from fake_runai import parse as runai_parse


def test_tests_import_this_checkout():
    assert Path(ddp_lab.__file__).resolve().is_relative_to(REPO), ddp_lab.__file__


def dry_run(tmp_path: Path, capsys, *overrides: str) -> tuple[Path, str]:
    cfg = compose(*overrides, "launcher.dry_run=true", f"run.root={tmp_path / 'runs'}",
                  f"data.root={tmp_path / 'data'}")
    assert submit(cfg).rc == 0
    out = capsys.readouterr().out
    run_dir = Path(out.rstrip().splitlines()[-1].removeprefix("run dir: "))
    assert run_dir.is_dir() and (run_dir / "config.yaml").is_file()
    return run_dir, out


def bash_n(path: Path) -> None:
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, f"{path.name}: {res.stderr}"


def resolve_error(*overrides: str) -> str:
    with pytest.raises(UserError) as e:
        resolve_defaults(compose(*overrides))
    return str(e.value)


# --------------------------------------------------------------------- local
def test_local_dry_run(tmp_path, capsys):
    run_dir, out = dry_run(tmp_path, capsys, "launcher.nproc_per_node=3",
                           "launcher.max_restarts=2", "launcher.setup=[echo set-up-line]")
    script = run_dir / "launch.sh"
    bash_n(script)
    text = script.read_text()
    assert text.rstrip() in out
    for must in ("NPROC_PER_NODE:-3", "MAX_RESTARTS:-2", "--rdzv_backend=c10d",
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "--rdzv_conf=join_timeout=300",
                 f"-m ddp_lab.worker {run_dir}", f"PYTHONPATH={REPO}", "echo set-up-line"):
        assert must in text, must


def test_local_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        msg = resolve_error(f"launcher.master_port={port}")
    assert f"port {port} is in use" in msg


def test_local_checks_the_port_the_script_will_use(monkeypatch):
    # launch.sh's MASTER_PORT knob wins over the rendered port, and the job inherits it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        msg = resolve_error("launcher.nproc_per_node=2")
    assert msg.startswith(f"MASTER_PORT={port}: port {port} is in use") and "unset MASTER_PORT" in msg


def test_a_previous_stores_time_wait_leaves_its_port_free():
    # the store binds with SO_REUSEADDR: when it closed first, its side of a connection sits
    # in TIME_WAIT for a minute, and a new store on that port binds all the same
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((ports.WILDCARD, 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = server.accept()
            conn.close()  # the server's side first: its end goes to TIME_WAIT
    assert not ports.port_in_use(port)


def test_local_rejects_nodes():
    assert "runs on this machine only" in resolve_error("launcher.nodes=2")


# -------------------------------------------------------------------- mpirun
def test_mpirun_dry_run_lab_hosts(tmp_path, capsys):
    run_dir, out = dry_run(tmp_path, capsys, "launcher=mpirun",
                           "launcher.hosts=[red01:2,orange07:1,purple11:1]",
                           "launcher.setup=['source ~/venv/bin/activate']")
    for name in ("launch.sh", "mpi_rank.sh"):
        bash_n(run_dir / name)
        assert os.access(run_dir / name, os.X_OK)
    launch = (run_dir / "launch.sh").read_text()
    rank = (run_dir / "mpi_rank.sh").read_text()
    assert (run_dir / "hostfile").read_text() == "red01 slots=2\norange07 slots=1\npurple11 slots=1\n"
    assert "-np 4" in launch
    assert "MASTER_ADDR=${MASTER_ADDR:-red01}" in launch  # the first host
    assert re.search(r"MASTER_PORT=\$\{MASTER_PORT:-\d+\}", launch)
    assert "-x MASTER_ADDR -x MASTER_PORT -x DDP_LAB_RUN_DIR" in launch
    assert f"DDP_LAB_RUN_DIR={run_dir}" in launch
    assert ("--allow-run-as-root" in launch) == (os.geteuid() == 0)
    assert "--oversubscribe" not in launch  # remote hosts: only when asked
    assert "source ~/venv/bin/activate" in rank and "exec " in rank and "-m ddp_lab.worker" in rank
    assert "SLOTS=(2 1 1)" in rank
    cfg = (run_dir / "config.yaml").read_text()
    assert "nodes: 3" in cfg and "red01:2" in cfg  # config.yaml records the resolved hosts
    assert "# $DDP_LAB_RUN_DIR/hostfile: red01:2, orange07:1, purple11:1; " in out
    assert "export OMPI_MCA_rtc_hwloc_vmhole=${OMPI_MCA_rtc_hwloc_vmhole:-none}" in out


def test_mpirun_rank_wrapper_node_index(tmp_path, capsys):
    """mpi_rank.sh turns OMPI_COMM_WORLD_RANK into the node index from the slots."""
    fake_py = tmp_path / "fakepy"
    # (its `-c` is the check that it can import what the ranks run: it can)
    fake_py.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 0\necho "$DDP_LAB_NODE_RANK/$DDP_LAB_NUM_NODES"\n')
    fake_py.chmod(0o755)
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=mpirun", "launcher.hosts=[a:2,b:1,c:1]",
                         f"launcher.python={fake_py}")
    got = [subprocess.run(["bash", str(run_dir / "mpi_rank.sh")], capture_output=True, text=True,
                          env=dict(os.environ, OMPI_COMM_WORLD_RANK=str(r))).stdout.strip()
           for r in range(4)]
    assert got == ["0/3", "0/3", "1/3", "2/3"]


def test_mpirun_oversubscribe_and_root_flags(tmp_path, capsys):
    cores = os.cpu_count() or 1
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=mpirun", f"launcher.hosts=[localhost:{cores + 1}]")
    launch = (run_dir / "launch.sh").read_text()
    assert "--oversubscribe" in launch and "MASTER_ADDR:-127.0.0.1" in launch
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=mpirun", "launcher.hosts=[localhost:1]",
                         "launcher.oversubscribe=true", "launcher.allow_run_as_root=false")
    launch = (run_dir / "launch.sh").read_text()
    assert "--oversubscribe" in launch and "--allow-run-as-root" not in launch


def test_mpirun_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        msg = resolve_error("launcher=mpirun", "launcher.hosts=[localhost:2]",
                            f"launcher.master_port={port}")
    assert f"port {port} is in use" in msg


def test_mpirun_hostfile_notebook_format(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# lab machines\nred01 max_slots = 2\norange07\npurple11 slots=3\n")
    assert mpirun_launch.read_hostfile(str(hostfile), 1) == ["red01:2", "orange07:1", "purple11:3"]
    hostfile.write_text("red01 slots=4 max_slots=2\n")
    with pytest.raises(UserError, match="red01 has slots=4 > max_slots=2"):
        mpirun_launch.read_hostfile(str(hostfile), 1)


def test_mpirun_np_over_the_notebooks_max_slots(tmp_path, capsys):
    """The notebook's lab recipe: `red01 max_slots = 2`, `orange07 max_slots = 1`,
    `purple11 max_slots = 3`, then `mpirun -np 4`: 4 ranks, the slots filled host by host."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("red01 max_slots = 2\norange07 max_slots = 1\npurple11 max_slots = 3\n")
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=mpirun", f"launcher.hostfile={hostfile}",
                         "launcher.np=4")
    assert (run_dir / "hostfile").read_text() == "red01 slots=2\norange07 slots=1\npurple11 slots=1\n"
    assert "-np 4" in (run_dir / "launch.sh").read_text()
    assert "SLOTS=(2 1 1)" in (run_dir / "mpi_rank.sh").read_text()
    # fewer ranks than the first host's slots: one host, the others unused
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=mpirun", f"launcher.hostfile={hostfile}",
                         "launcher.np=2", f"run.dir={tmp_path / 'two'}")
    assert (run_dir / "hostfile").read_text() == "red01 slots=2\n"
    assert mpirun_launch.place([("a", 2), ("b", 1), ("c", 3)], 6) == [("a", 2), ("b", 1), ("c", 3)]


@pytest.mark.parametrize("overrides, message", [
    (["launcher.hosts=[]"], "lists no host"),
    (["launcher.hosts=[red01:2,orange07:1]", "launcher.np=4"],
     "launcher.np=4: launcher.hosts offers 3 slot(s); choose 1 to 3"),
    (["launcher.hosts=[red01:2]", "launcher.np=0"], "launcher.np=0"),
    (["launcher.hosts=[red01:2,orange07:1]", "launcher.master_addr=orange07"],
     "launcher.master_addr=orange07 is not red01, the host of rank 0"),
    (["launcher.hosts=[localhost:2]", "launcher.master_addr=192.0.2.1"],
     "launcher.master_addr=192.0.2.1 is not localhost"),
    (["launcher.hosts=[red01:0]"], "slots must be >= 1"),
    (["launcher.hosts=[red01:x]"], "slots must be an integer"),
    (["launcher.hosts=[red01:1,red01:2]"], "more than once"),
    (["launcher.hosts=[localhost:1,red01:1]"], "cannot reach"),
    (["launcher.hosts=[red01:1]", "launcher.hostfile=/nonexistent"], "not both"),
    (["launcher.hostfile=/nonexistent/hosts"], "no such file"),
    (["launcher.hosts=[a:1,b:1]", "launcher.nodes=3"], "the hosts decide"),
    (["launcher.max_restarts=1"], "cannot restart"),
])
def test_mpirun_bad_input(overrides, message):
    assert message in resolve_error("launcher=mpirun", *overrides)


# --------------------------------------------------------------------- slurm
def sbatch_header_ok(text: str) -> list[str]:
    """All #SBATCH lines come before the first command (sbatch stops reading there)."""
    lines = text.splitlines()
    first_cmd = next(i for i, ln in enumerate(lines[1:], 1) if ln.strip() and not ln.startswith("#"))
    sb = [i for i, ln in enumerate(lines) if ln.startswith("#SBATCH")]
    assert sb and max(sb) < first_cmd, "an #SBATCH line after the first command is ignored"
    return [lines[i].removeprefix("#SBATCH ").strip() for i in sb]


def test_slurm_dry_run_torchrun(tmp_path, capsys):
    run_dir, out = dry_run(
        tmp_path, capsys, "launcher=slurm", "launcher.nodes=4", "launcher.account=a-xyz",
        "launcher.partition=normal", "launcher.qos=debug", "launcher.gpus_per_node=4",
        "launcher.cpus_per_task=72", "launcher.time=00:10:00", "launcher.job_name=lsaie",
        "launcher.environment=/capstor/env/ngc.toml", "launcher.contiguous=true",
        "launcher.sbatch_extra=['--mem=0','#SBATCH --exclusive']", "launcher.rdzv=static",
        "launcher.setup=[module load cuda]", "dist.device=cuda")
    script = run_dir / "job.sbatch"
    bash_n(script)
    text = script.read_text()
    assert text.rstrip() in out and f"sbatch --parsable {script}" in out
    opts = sbatch_header_ok(text)
    for must in ("--job-name=lsaie", "--account=a-xyz", "--partition=normal", "--qos=debug",
                 "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=4", "--cpus-per-task=72",
                 "--time=00:10:00", f"--output={run_dir}/logs/%x_%j.out",
                 f"--error={run_dir}/logs/%x_%j.err", "--environment=/capstor/env/ngc.toml",
                 "--contiguous", "--mem=0", "--exclusive"):
        assert must in opts, must
    assert 'HOSTS=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))' in text
    assert "MASTER_ADDR=${HOSTS[0]}" in text  # not `| head -n 1`: pipefail + SIGPIPE
    assert "$(( 20000 + SLURM_JOB_ID % 20000 ))" in text
    assert "srun --kill-on-bad-exit=1" in text
    assert '--cpus-per-task="$SLURM_CPUS_PER_TASK"' in text
    assert "--node_rank=\\$SLURM_NODEID" in text  # escaped: expands on each node
    assert "--nproc_per_node=$NPROC_PER_NODE" in text and "NPROC_PER_NODE=4" in text
    assert "--rdzv_backend=static --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT" in text
    assert "module load cuda" in text and "-m ddp_lab.worker \\\"$RUN_DIR\\\"" in text
    # no restarts: the workers share torchrun's store (no port left free between pick and bind)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in text
    assert (run_dir / "logs").is_dir()  # sbatch --output does not create folders


def test_slurm_port_formula_matches_env():
    for job in (1, 19999, 20000, 123456):
        res = subprocess.run(["bash", "-c", f"SLURM_JOB_ID={job}; echo $(( 20000 + SLURM_JOB_ID % 20000 ))"],
                             capture_output=True, text=True)
        assert int(res.stdout) == slurm_port(job)


def test_slurm_dry_run_c10d_and_fixed_port(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", "launcher.nodes=2",
                         "launcher.master_port=12345", "launcher.max_restarts=1")
    text = (run_dir / "job.sbatch").read_text()
    bash_n(run_dir / "job.sbatch")
    assert "export MASTER_PORT=12345" in text and "SLURM_JOB_ID % 20000" not in text
    assert "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT --rdzv_id=$SLURM_JOB_ID" in text
    assert "--max_restarts=1" in text and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text
    assert "\\$SLURM_NODEID" in text  # the per-node echo still expands on each node


def test_slurm_dry_run_per_task(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", "launcher.nodes=2",
                         "launcher.per_task=true", "launcher.nproc_per_node=4")
    text = (run_dir / "job.sbatch").read_text()
    bash_n(run_dir / "job.sbatch")
    assert "--ntasks-per-node=4" in sbatch_header_ok(text)
    assert "torch.distributed.run" not in text
    # the task count from the allocation at run time (a requeued job may come back smaller)
    assert re.search(r'srun --kill-on-bad-exit=1 --ntasks=\$\(\(\$SLURM_JOB_NUM_NODES \* NPROC_PER_NODE\)\) '
                     r'\\\n\s+\S+ -m ddp_lab.worker "\$RUN_DIR"', text)


def test_slurm_per_task_takes_ntasks_as_nproc():
    cfg = resolve_defaults(compose("launcher=slurm", "launcher.per_task=true",
                                   "launcher.ntasks_per_node=3"))
    assert cfg.launcher.nproc_per_node == 3 and cfg.launcher.ntasks_per_node == 3


def test_site_presets_compose():
    alps = compose("cluster=alps", "launcher.account=a-xyz").launcher
    assert (alps.name, alps.partition, alps.gpus_per_node, alps.account) == ("slurm", "normal", 4, "a-xyz")
    assert alps.python == "python"
    entropy = compose("cluster=entropy", "launcher.nodes=2").launcher
    assert (entropy.name, entropy.partition, entropy.nodes) == ("slurm", "common", 2)
    assert entropy.setup == ["source ~/venv/bin/activate"]
    rcp = compose("cluster=rcp").launcher
    assert rcp.name == "runai" and rcp.rdma and rcp.pvc == ["mlo-scratch:/mloscratch"]
    assert compose().launcher.name == "local"  # no preset by default


def test_site_preset_dry_run(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "cluster=alps", "launcher.account=a-xyz",
                         "launcher.nodes=2")
    opts = sbatch_header_ok((run_dir / "job.sbatch").read_text())
    assert {"--partition=normal", "--gpus-per-node=4", "--account=a-xyz", "--nodes=2"} <= set(opts)


def test_runai_run_folder_and_data_on_the_pvc(tmp_path, monkeypatch):
    """What the RunAI guide does: run.root and data.root under the PVC's mount; data fetched
    per pod (data.node_local) may stay off it."""
    runai = tmp_path / "runai"  # a real submission asks for the CLI on PATH; never run here
    runai.write_text("#!/bin/sh\nexit 1\n")
    runai.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    base = ["launcher=runai", "launcher.image=x", "launcher.pvc=[mlo-scratch:/mloscratch]"]
    resolve_defaults(compose(*base, "run.root=/mloscratch/me/runs", "data.root=/mloscratch/me/data"))
    resolve_defaults(compose(*base, "run.dir=/mloscratch/me/run1", "data.root=/tmp/d",
                             "data.node_local=true"))


@pytest.mark.parametrize("overrides, message", [
    (["launcher.nodes=0"], "must be >= 1"),
    (["launcher.ntasks_per_node=4"], "with torchrun"),
    (["launcher.per_task=true", "launcher.ntasks_per_node=3", "launcher.nproc_per_node=2"],
     "every task is one process"),
    (["launcher.nproc_per_node=0"], "must be >= 1"),
    (["launcher.gpus_per_node=2", "launcher.nproc_per_node=4"], "share a GPU"),
    (["launcher.rdzv=etcd"], "choose c10d or static"),
    (["launcher.rdzv=static", "launcher.max_restarts=1"], "outlives a restart"),
    (["launcher.per_task=true", "launcher.max_restarts=1"], "needs torchrun"),
    (["launcher.job_name='my job'"], "letters, digits"),
    (["launcher.sbatch_extra=['mem=0']"], "expected an sbatch option"),
])
def test_slurm_bad_input(overrides, message, tmp_path, capsys):
    if overrides[0].startswith("launcher.sbatch_extra"):  # caught at render, in the CLI path
        cfg = compose("launcher=slurm", *overrides, "launcher.dry_run=true",
                      f"run.root={tmp_path}")
        with pytest.raises(UserError, match=message):
            submit(cfg)
        return
    assert message in resolve_error("launcher=slurm", *overrides)


def test_slurm_dry_run_stop_and_requeue(tmp_path, capsys):
    """The time-limit signal, requeue and appending logs by default; the batch shell runs srun
    in the background, traps USR2/TERM into the stop file and requeues itself at most
    max_requeues times."""
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", "launcher.nodes=2",
                         "launcher.max_requeues=5", "launcher.time=00:10:00")
    text = (run_dir / "job.sbatch").read_text()
    stop = (run_dir / "slurm_stop.sh").read_text()  # the machinery job.sbatch sources
    bash_n(run_dir / "job.sbatch")
    bash_n(run_dir / "slurm_stop.sh")
    opts = sbatch_header_ok(text)
    assert {"--signal=B:USR2@120", "--requeue", "--open-mode=append"} <= set(opts), opts
    assert "MAX_REQUEUES=5" in stop and "SELF_REQUEUE=1" in stop
    assert "trap 'GOT_USR2=1; request_stop" in stop and "' USR2" in stop and "' TERM" in stop
    assert f'> "$RUN_DIR/.STOP.tmp" && mv -f "$RUN_DIR/.STOP.tmp" "$RUN_DIR/STOP"' in stop
    # the traps are in place before srun starts; srun in the background, the shell waits
    lines = text.splitlines()
    source = lines.index('source "$RUN_DIR/slurm_stop.sh"  # stop and requeue machinery: traps '
                         'first (a stop may come any time)')
    srun = next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    assert source < srun and lines[source - 4:source] == [
        "set -euo pipefail", "export DDP_LAB_T0=$(date +%s.%N)  # the job's own start (a "
        "requeue's too): start-up counts from here", f"RUN_DIR={run_dir}", "NPROC_PER_NODE=2"]
    assert re.search(r'-m ddp_lab\.worker \\"\$RUN_DIR\\"" &\nwait_for_srun \$!', text)
    assert text.rstrip().endswith("with srun's status") and "\nrequeue_or_exit " in text
    assert 'wait "$SRUN_PID"' in stop and 'scontrol requeue "$SLURM_JOB_ID"' in stop
    assert "keep_stop" in stop  # a stop before the ranks start outlives rank 0's clearing
    assert "trap '' TERM" in text and "PET_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT" in text
    assert "SLURM_RESTART_COUNT:-0" in stop and 'AGAIN="sbatch ${AGAIN_SCRIPT:-$RUN_DIR/job.sbatch}"' in stop


JOB_UNDER_SLURM_STOP = """set -euo pipefail
RUN_DIR={run_dir}
SLURM_JOB_ID=7 SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST=node1
source "$RUN_DIR/slurm_stop.sh"
( trap 'echo "{{\\"status\\": \\"preempted\\"}}" > "$RUN_DIR/s.tmp"; mv -f "$RUN_DIR/s.tmp" "$RUN_DIR/summary.json"; exit 0' TERM
  while :; do echo '{{"status": "running"}}' > "$RUN_DIR/s.tmp"; mv -f "$RUN_DIR/s.tmp" "$RUN_DIR/summary.json"; sleep 0.05; done ) &
wait_for_srun $!
requeue_or_exit
"""


@pytest.mark.parametrize("trial", range(3))
def test_slurm_shell_outlives_the_sigterm_that_reaches_every_process_of_the_job(
        tmp_path, capsys, trial):
    """SLURM's SIGTERM (scancel, scontrol requeue, the limit) goes to every process of the
    job, the batch shell's `$(...)` subshells too. One killed there fails with 143, and under
    `set -e` it ended the shell before (or just after) its trap ran: no stop line, no "srun
    ended", the requeue left to chance (a CI run: the trap's line missing). Here a stand-in
    srun rewrites summary.json every 50 ms (the shell reads the status at each change) and
    the signal goes to the whole process group while the shell's `run_status` python runs."""
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm")
    job = tmp_path / "job.sh"
    job.write_text(JOB_UNDER_SLURM_STOP.format(run_dir=run_dir))
    proc = subprocess.Popen(["bash", str(job)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until run_status's python is alive
            ps = subprocess.run(["ps", "-o", "pid=,args=", "-g", str(proc.pid)],
                                capture_output=True, text=True).stdout
            if "import json, sys" in ps:
                os.killpg(proc.pid, signal.SIGTERM)
                break
            time.sleep(0.002)
        else:
            raise AssertionError("the shell never read the status")
        out, _ = proc.communicate(timeout=20)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert "[sbatch] SIGTERM from SLURM" in out, out
    assert "run status: preempted" in out and "SLURM ended this allocation" in out, out
    assert proc.returncode == 0, out

def test_slurm_first_screen_is_what_a_student_writes(tmp_path, capsys):
    """The rendered SLURM script's first screen (about 40 lines) holds everything a student
    would have written by hand; the stop and requeue machinery comes after, or sourced."""
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", "launcher.nodes=2")
    text = (run_dir / "job.sbatch").read_text()
    screen = text.splitlines()[:40]
    sbatch = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert sbatch and all(ln in screen for ln in sbatch), sbatch
    assert any(ln.startswith("export MASTER_ADDR=") for ln in screen), screen
    assert any(ln.startswith("export MASTER_PORT=") for ln in screen), screen
    assert any(ln.startswith("srun ") for ln in screen), screen
    assert any("-m torch.distributed.run" in ln for ln in screen), screen
    assert not any(w in text for w in ("trap 'GOT", "KEEPER", "scontrol requeue")), text
    for path in run_dir.iterdir():
        if path.suffix in (".sh", ".sbatch"):
            bash_n(path)


def test_slurm_dry_run_no_signal_no_requeue(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", "launcher.signal_s=0",
                         "launcher.requeue=false")
    text = (run_dir / "job.sbatch").read_text()
    bash_n(run_dir / "job.sbatch")
    opts = sbatch_header_ok(text)
    assert not any(o.startswith("--signal") for o in opts) and "--requeue" not in opts
    assert "--no-requeue" in opts and "--open-mode=append" in opts
    assert "SELF_REQUEUE=0" in (run_dir / "slurm_stop.sh").read_text()



@pytest.mark.parametrize("time, lead", [("00:02:00", 30), ("00:03:00", 45), ("01:00:00", 120),
                                        ("UNLIMITED", 120)])
def test_slurm_stop_lead_follows_the_time_limit(tmp_path, capsys, time, lead):
    """The seeds' own limits (00:02:00, 00:03:00) run as written: with signal_s unset the
    stop comes a quarter of the limit before its end, at most 120 s."""
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", f"launcher.time={time}")
    opts = sbatch_header_ok((run_dir / "job.sbatch").read_text())
    assert f"--signal=B:USR2@{lead}" in opts and "--requeue" in opts, opts


def test_slurm_bench_job_gets_no_stop_signal_and_no_requeue(tmp_path):
    """A benchmark has no checkpoint: nothing to stop at or to continue from."""
    proc = run_cli("launcher=slurm", "launcher.time=00:02:00", "launcher.requeue=true",
                   "launcher.dry_run=true", f"run.root={tmp_path}", cwd=tmp_path,
                   module="ddp_lab.bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (run_dir_of(proc) / "job.sbatch").read_text()
    opts = sbatch_header_ok(text)
    assert not any(o.startswith("--signal") for o in opts), opts
    assert "--no-requeue" in opts and "SELF_REQUEUE=0" in (run_dir_of(proc) / "slurm_stop.sh").read_text()


def test_slurm_output_file_names(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", "launcher.output=mnist-%j-%u")
    opts = sbatch_header_ok((run_dir / "job.sbatch").read_text())
    assert f"--output={run_dir}/logs/mnist-%j-%u.out" in opts
    assert f"--error={run_dir}/logs/mnist-%j-%u.err" in opts
    user = __import__("getpass").getuser()
    assert slurm_launch.log_name("%x_%j", "ddp_lab", "42") == "ddp_lab_42"
    assert slurm_launch.log_name("mnist-%j-%u%%", "ddp_lab", "42") == f"mnist-42-{user}%"
    assert "launcher.output='logs/%j': a file name in RUN_DIR/logs" in resolve_error(
        "launcher=slurm", "launcher.output=logs/%j")
    assert "launcher.output='%N'" in resolve_error("launcher=slurm", "launcher.output=%N")


def test_slurm_dry_run_per_task_in_background(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "launcher=slurm", "launcher.per_task=true",
                         "launcher.signal_s=300")
    text = (run_dir / "job.sbatch").read_text()
    bash_n(run_dir / "job.sbatch")
    assert "--signal=B:USR2@300" in sbatch_header_ok(text)
    assert re.search(r'-m ddp_lab\.worker "\$RUN_DIR" &\nwait_for_srun \$!', text)


@pytest.mark.parametrize("overrides, message", [
    (["launcher.signal_s=-1"], "launcher.signal_s=-1: seconds before the time limit"),
    (["launcher.max_requeues=-1"], "launcher.max_requeues=-1: must be >= 0"),
    (["launcher.time=00:02:00", "launcher.signal_s=120"], "would come before the job starts"),
])
def test_slurm_bad_stop_settings(overrides, message):
    assert message in resolve_error("launcher=slurm", *overrides)


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("2:00", 120), ("00:30:00", 1800), ("1-0", 86400), ("1-02:03", 93780),
    ("1-02:03:04", 93784), ("UNLIMITED", None)])
def test_slurm_time_limit_s(text, seconds):
    assert duration_s("launcher.time", text) == seconds


@pytest.mark.parametrize("state, code, rc", [
    ("COMPLETED", "0:0", 0), ("FAILED", "1:0", 1), ("FAILED", "143:0", 143),
    ("CANCELLED", "0:15", 143), ("TIMEOUT", "0:0", 1), ("NODE_FAIL", "", 1)])
def test_slurm_exit_status(state, code, rc):
    assert slurm_launch.exit_status(state, code) == rc


# --------------------------------------------------------------------- runai
def test_runai_dry_run(tmp_path, capsys):
    run_dir, out = dry_run(
        tmp_path, capsys, "launcher=runai", "launcher.nodes=3", "launcher.gpus_per_node=4",
        "launcher.image=registry.rcp.epfl.ch/lab/ddp:1", "launcher.rdma=true",
        "launcher.pvc=[mlo-scratch:/mloscratch]", "launcher.project=lab-me",
        "+launcher.env.HF_HOME=/mloscratch/hf", "launcher.setup=[pip install -e /mloscratch/ddp_lab]")
    for name in ("runai_submit.sh", "pod.sh", "pod_stop.sh"):
        bash_n(run_dir / name)
    argv = subprocess.run(["bash", "-c", f"runai() {{ printf '%s\\n' \"$@\"; }}; source {run_dir / 'runai_submit.sh'}"],
                          capture_output=True, text=True).stdout.splitlines()
    flags, command = runai_parse(argv)  # raises on any flag the RunAI reference does not list
    got = {}
    for k, v in flags:
        got.setdefault(k, []).append(v)
    assert got["--workers"] == ["2"]  # RunAI adds the master pod: 2 workers + 1 = 3 pods
    assert got["--gpu"] == ["4"] and got["--image"] == ["registry.rcp.epfl.ch/lab/ddp:1"]
    assert got["--pvc"] == ["mlo-scratch:/mloscratch"] and got["-e"] == ["HF_HOME=/mloscratch/hf"]
    assert got["--project"] == ["lab-me"] and "--large-shm" in got and "--command" in got
    assert got["--annotation"] == ["k8s.v1.cni.cncf.io/networks=kube-system/roce"]
    assert got["--extended-resource"] == ["rdma/rdma=1"]
    assert command == ["bash", str(run_dir / "pod.sh")]
    pod = (run_dir / "pod.sh").read_text()
    assert pod.rstrip() in out
    assert 'NCCL_EXPORTS="$(python -m ddp_lab.nccl_env)"' in pod and 'eval "$NCCL_EXPORTS"' in pod
    assert ('--nnodes="$PODS" --node_rank="$POD_RANK" --nproc_per_node="$NPROC_PER_NODE"' in pod
            and "NPROC_PER_NODE:-4" in pod and "PODS=$WORLD_SIZE" in pod and "POD_RANK=$RANK" in pod)
    assert '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT"' in pod
    assert "pip install -e /mloscratch/ddp_lab" in pod and "-m ddp_lab.worker \"$RUN_DIR\"" in pod
    # the lesson first: the pod sources its machinery before the setup, torchrun comes next
    lines = pod.splitlines()
    source = lines.index('source "$RUN_DIR/pod_stop.sh"  # the pod\'s log, the graceful stop on '
                         'SIGTERM (traps first), exit status')
    setup = lines.index("pip install -e /mloscratch/ddp_lab")
    torchrun = next(i for i, ln in enumerate(lines) if "-m torch.distributed.run" in ln)
    assert source < setup < torchrun < 40 and "trap '" not in pod
    assert lines[torchrun + 4].endswith('"$RUN_DIR" &') and lines[torchrun + 5].startswith("wait_for_torchrun $!")
    stop = (run_dir / "pod_stop.sh").read_text()
    assert "trap 'on_signal TERM' TERM" in stop and "PREEMPTED_EXIT=143" in stop


def test_runai_dry_run_without_rdma_or_image(tmp_path, capfd):
    proc = run_cli("launcher=runai", "launcher.nodes=1", "launcher.dry_run=true",
                   f"run.root={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    submit_sh = (run_dir / "runai_submit.sh").read_text()
    assert "--annotation" not in submit_sh and "--extended-resource" not in submit_sh
    assert "--workers 0" in submit_sh and "nccl_env" not in (run_dir / "pod.sh").read_text()
    # on the console, not buried in the script
    assert "warning: launcher.image is not set" in proc.stderr, proc.stderr
    assert "warning" not in proc.stdout and "warning" not in submit_sh


@pytest.mark.parametrize("overrides, message", [
    (["launcher.nodes=0"], "must be >= 1"),
    ([], "launcher.image is not set"),
    (["launcher.image=x", "launcher.gpus_per_node=2", "launcher.nproc_per_node=4"], "share a GPU"),
    (["launcher.image=x", "launcher.job_name=My_Job"], "Kubernetes name"),
    (["launcher.image=x", "launcher.pvc=[scratch]"], "claim:/mount"),
    (["launcher.image=x", "launcher.max_restarts=1", "launcher.rdzv=static"], "rdzv=c10d"),
    (["launcher.image=x", "run.root=/tmp/runs"], "run.root=/tmp/runs is on no PVC the pods mount"),
    (["launcher.image=x", "launcher.pvc=[s:/mnt]", "run.root=/mnt/me/runs", "data.root=/tmp/d"],
     "data.root=/tmp/d is on no PVC"),
])
def test_runai_bad_input(overrides, message):
    assert message in resolve_error("launcher=runai", *overrides)


# ------------------------------------------------------- the command line
@pytest.mark.parametrize("args, message", [
    (["launcher=mpirun", "launcher.hosts=[]"], "error: launcher.hosts lists no host"),
    (["launcher=slurm", "launcher.nodes=0"], "error: launcher.nodes=0: must be >= 1"),
    (["launcher=slurm", "launcher.ntasks_per_node=2"], "error: launcher.ntasks_per_node=2 with torchrun"),
])
def test_cli_bad_input_is_one_line(tmp_path, args, message):
    proc = run_cli(*args, f"run.root={tmp_path}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), describe(proc)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not any(tmp_path.iterdir()), "a rejected command must not leave a run folder"


@pytest.mark.parametrize("launcher, tool", [("slurm", "sbatch"), ("mpirun", "mpirun"),
                                            ("runai", "runai")])
def test_cli_missing_tool(tmp_path, launcher, tool):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    extra = ["launcher.image=img", f"launcher.pvc=[scratch:{tmp_path}]",
             f"data.root={tmp_path / 'data'}"] if launcher == "runai" else []
    proc = run_cli(f"launcher={launcher}", *extra, f"run.root={tmp_path / 'runs'}", cwd=tmp_path,
                   env={"PATH": str(empty)}, timeout=120)
    assert proc.returncode == 2, describe(proc)
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tool} not found on PATH"), describe(proc)
    assert "launcher.dry_run=true" in err[0] and "Traceback" not in proc.stderr
    # refused before anything: no "starting" line, no run folder (a dry run prints the job)
    assert proc.stdout == "", describe(proc)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cli_dry_run_prints_script_and_run_dir(tmp_path):
    proc = run_cli("launcher=slurm", "launcher.dry_run=true", f"run.root={tmp_path}",
                   cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert proc.stdout.startswith("#!/usr/bin/env bash") and "#SBATCH --nodes=1" in proc.stdout
    assert (run_dir / "job.sbatch").is_file() and not (run_dir / "job_id").exists()


# ------------------------------------------------ torchrun's ranks: forks on CPU (local.sh)

@pytest.mark.parametrize("device,gpus,entry,forked", [
    ("cpu", True, "ddp_lab.worker", True),
    ("auto", False, "ddp_lab.worker", True),
    ("auto", True, "ddp_lab.worker", False),   # CUDA does not survive a fork
    ("cuda", False, "ddp_lab.worker", False),
    ("cpu", False, "ddp_lab.bench.worker", True),
    ("cpu", False, "my_script", False),        # not one of ours: torchrun as it comes
])
def test_fork_ranks_only_ddp_lab_entries_on_cpu(tmp_path, monkeypatch, device, gpus, entry, forked):
    from omegaconf import OmegaConf
    from torch.distributed import run as torchrun

    from ddp_lab.launch import torchrun as wrapper
    from ddp_lab.world import env

    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(compose(f"dist.device={device}")))
    monkeypatch.setattr(env, "gpu_devices_present", lambda: gpus)
    monkeypatch.setattr(wrapper, "FORK_PRELOAD", {k: ("json",) for k in wrapper.FORK_PRELOAD})
    args = torchrun.parse_args(["--nproc_per_node=2", "-m", entry, str(tmp_path)])
    assert wrapper.fork_ranks(args) is forked
    if forked:  # torchrun's own in-process entry, on the module's file, forked
        assert args.run_path and not args.module and args.start_method == "fork"
        assert args.training_script.endswith(entry.replace(".", "/") + ".py")
    else:
        assert args.module and not args.run_path and args.training_script == entry
