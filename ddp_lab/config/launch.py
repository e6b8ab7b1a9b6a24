"""The launcher section's schemas: how the ranks are started (local, mpirun, slurm, runai)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from omegaconf import MISSING

from .help import doc


@dataclass
class LauncherConfig:
    """How the ranks are started."""

    name: str = doc(MISSING, "launcher kind: local | mpirun | slurm | runai")
    nodes: int = doc(1, "number of machines (nodes, pods)")
    nproc_per_node: Optional[int] = doc(None, "processes per node; null = one "
                                              "per GPU, else 2 on CPU")
    dry_run: bool = doc(False, "render and print what would be run, write it "
                               "into the run folder, start nothing")
    max_restarts: int = doc(0, "torchrun restarts of the whole worker group "
                               "after a failure (resumes from checkpoint)")
    setup: List[str] = doc([], "shell lines run on every node before the ranks start "
                               "(module load ..., source venv/bin/activate)")
    python: Optional[str] = doc(None, "the python that runs the ranks; null = this "
                                      "interpreter (runai: `python` of the image)")
    venv: Optional[str] = doc(None, "a virtual environment whose python runs the ranks "
                                    "(launcher.python then unused): made over a container's "
                                    "torch with --system-site-packages, on storage every "
                                    "node sees (docs/launchers.md, Containers)")
    required: List[str] = doc([], "launcher keys a real submission needs set (a "
                                  "site preset names them, e.g. [account, "
                                  "environment]); a dry run renders without them")


@dataclass
class LocalLauncherConfig(LauncherConfig):
    """torchrun on this machine."""

    master_port: Optional[int] = doc(None, "rendezvous port; null = a free one")
    oversubscribe: bool = doc(False, "allow more than 4 ranks a core: refused without it, "
                                     "as Open MPI refuses without --oversubscribe")


@dataclass
class ContainerLauncherConfig(LauncherConfig):
    """An Apptainer/Singularity image the ranks run in (launcher=slurm and mpirun)."""
    image: Optional[str] = doc(None, "an Apptainer/Singularity image every node's python runs "
                                     "in (`<runtime> exec --nv --bind ... <image> python`): a "
                                     ".sif file on storage every node sees, or a docker:// "
                                     "reference; null = none (docs/launchers.md, Containers)")
    runtime: str = doc("apptainer", "apptainer | singularity: the command that runs "
                                    "launcher.image")
    bind: List[str] = doc([], "more --bind entries (src[:dest[:ro]]) for launcher.image; the "
                              "run folder, data.root, the ddp_lab checkout and launcher.venv "
                              "are bound already")


@dataclass
class MpirunLauncherConfig(ContainerLauncherConfig):
    """Open MPI's mpirun starts one process per slot (the lab-machines recipe)."""

    hosts: Optional[List[str]] = doc(None, "`name:slots` entries (`name` alone = nproc_per_node "
                                           "slots); null = hostfile, else [localhost]")
    hostfile: Optional[str] = doc(None, "an existing Open MPI hostfile (`name slots=N` or "
                                        "`name max_slots=N` lines) instead of hosts")
    np: Optional[int] = doc(None, "ranks in all (mpirun's -np), placed slot by "
                                  "slot, host by host; null = every slot")
    master_addr: Optional[str] = doc(None, "rendezvous address every rank reaches: the "
                                           "first host (rank 0's); null = that host")
    master_port: Optional[int] = doc(None, "rendezvous port; null = a free one "
                                           "(checked on this machine)")
    allow_run_as_root: Optional[bool] = doc(None, "pass --allow-run-as-root; null = "
                                                  "when running as root")
    oversubscribe: Optional[bool] = doc(None, "pass --oversubscribe; null = when a local "
                                              "host gets more slots than it has cores")
    mpirun: str = doc("mpirun", "the mpirun executable")
    extra_args: List[str] = doc([], "more mpirun arguments, e.g. [--mca, btl_tcp_if_include, "
                                    "eth0]; ssh's options: [--mca, plm_rsh_args, \"-F "
                                    "SSH_CONFIG\"] (docs/launchers.md, mpirun)")


@dataclass
class SlurmLauncherConfig(ContainerLauncherConfig):
    """sbatch + srun: one torchrun per node, or one task per process (per_task=true)."""

    job_name: str = doc("ddp_lab", "#SBATCH --job-name (also %x in the log names)")
    output: str = doc("%x_%j", "#SBATCH --output/--error: the logs' name in RUN_DIR/logs, "
                               ".out/.err added; SLURM's %x (job name), %j (job id), %u (user)")
    account: Optional[str] = doc(None, "#SBATCH --account")
    partition: Optional[str] = doc(None, "#SBATCH --partition")
    qos: Optional[str] = doc(None, "#SBATCH --qos")
    time: str = doc("00:30:00", "#SBATCH --time (wall-clock limit)")
    gpus_per_node: Optional[int] = doc(None, "#SBATCH --gpus-per-node; null = no GPU request")
    cpus_per_task: Optional[int] = doc(None, "#SBATCH --cpus-per-task (passed on to srun too)")
    ntasks_per_node: Optional[int] = doc(None, "#SBATCH --ntasks-per-node; null = 1 "
                                               "(torchrun) or nproc_per_node (per_task)")
    environment: Optional[str] = doc(None, "#SBATCH --environment=<toml>: a CSCS "
                                           "container environment (EDF)")
    nccl_env: bool = doc(False, "export the NCCL network settings `python -m ddp_lab.nccl_env` "
                                "reads from the first node's sysfs (Slingshot: CSCS's "
                                "aws-ofi-nccl settings; RoCE/IB: device and GID index)")
    contiguous: bool = doc(False, "#SBATCH --contiguous: nodes next to each other")
    sbatch_extra: List[str] = doc([], "more #SBATCH options, e.g. [--mem=0, --exclusive]")
    srun_extra: List[str] = doc([], "more srun options")
    per_task: bool = doc(False, "true: srun starts one task per process, no "
                                "torchrun (ranks from SLURM_PROCID)")
    rdzv: str = doc("c10d", "torchrun rendezvous: c10d (survives restarts) | "
                            "static (master_addr/port, no restarts)")
    master_port: Optional[int] = doc(None, "rendezvous port; null = 20000 + job id % "
                                           "20000 (the same on every node)")
    wait: Optional[bool] = doc(None, "follow the job to its end and return its exit "
                                     "status; null = when stdin is a terminal")
    wait_timeout_s: Optional[float] = doc(None, "stop following after this long (the job "
                                                "keeps running); null = no limit")
    poll_s: float = doc(2.0, "seconds between squeue/scontrol polls while following")
    signal_s: Optional[int] = doc(None, "#SBATCH --signal=B:USR2@<signal_s>: SLURM signals the "
                                        "batch shell this many seconds before the time limit; "
                                        "its trap writes RUN_DIR/STOP so every rank checkpoints "
                                        "and exits 0, then the shell requeues the job (see "
                                        "requeue, max_requeues). SLURM may signal up to 60 s "
                                        "earlier than asked, never later. null = a quarter of "
                                        "launcher.time, at most 120 s (00:02:00 -> 30 s); 0 = "
                                        "no signal line (the job just ends at its limit). A "
                                        "benchmark has no checkpoint: it gets neither the "
                                        "signal nor a requeue")
    requeue: bool = doc(True, "#SBATCH --requeue: the job may be requeued (by itself after "
                              "the time-limit signal, by an admin's `scontrol requeue`, by "
                              "preemption) and continues from its checkpoint "
                              "(train.resume=auto); false = --no-requeue, and no self-requeue")
    max_requeues: int = doc(3, "self-requeues after the time-limit signal, counted by "
                               "SLURM_RESTART_COUNT (requeues by the scheduler count too); once "
                               "reached the job ends with exit status 75 and says how to "
                               "continue (`sbatch RUN_DIR/job.sbatch`). 0 = never requeue itself")


@dataclass
class RunaiLauncherConfig(LauncherConfig):
    """`runai submit-dist pytorch`: RunAI pods, one torchrun per pod (the RCP recipe)."""

    job_name: Optional[str] = doc(None, "--name; null = derived from the run folder")
    project: Optional[str] = doc(None, "--project; null = the CLI's default project")
    image: Optional[str] = doc(None, "--image: the container image (must hold torch; "
                                     "ddp_lab too, or install it in setup)")
    gpus_per_node: int = doc(1, "--gpu: GPUs per pod")
    pvc: List[str] = doc([], "--pvc entries `claim:/mount`; the run folder "
                             "must be on one, at the same path")
    env: Dict[str, str] = doc({}, "-e NAME=VALUE environment variables of the pods")
    large_shm: bool = doc(True, "--large-shm: a large /dev/shm (NCCL "
                                "and DataLoader workers use it)")
    rdma: bool = doc(False, "RoCE: the network annotation + rdma extended "
                            "resource, and NCCL RDMA settings in the pod")
    rdma_annotation: str = doc("k8s.v1.cni.cncf.io/networks=kube-system/roce",
            "--annotation used when rdma=true")
    rdma_resource: str = doc("rdma/rdma=1", "--extended-resource used when rdma=true")
    extra_args: List[str] = doc([], "more `runai submit-dist pytorch` flags")
    rdzv: str = doc("static", "torchrun rendezvous in the pods: static "
                              "(RunAI's MASTER_ADDR/PORT, RANK as node rank) "
                              "| c10d (needed for max_restarts)")
    wait: Optional[bool] = doc(None, "follow the pods' exit files in the run "
                                     "folder; null = when stdin is a terminal")
    wait_timeout_s: Optional[float] = doc(None, "stop following after this long (the job "
                                                "keeps running); null = no limit")
    poll_s: float = doc(5.0, "seconds between looks at the run folder while following")

