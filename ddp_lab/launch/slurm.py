"""launcher=slurm: an sbatch script whose srun starts the ranks
(docs/launchers.md, "slurm").

    python -m ddp_lab launcher=slurm launcher.nodes=4 launcher.account=a-xyz sync=ring
    python -m ddp_lab launcher=slurm launcher.dry_run=true          # print the sbatch script

Default: one srun task per node, each a torchrun of nproc_per_node
processes (rendezvous at the first node, port from the job id);
per_task=true: srun starts every process. The stop and requeue machinery
is RUN_DIR/slurm_stop.sh, sourced first; submit and follow are
slurm_job.py's ("Time limits, preemption, requeue" there says what each
signal does).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Optional, Sequence

from .base import (LaunchError, Rendered, check_container, container_folders, python_check,
                   python_exe, pythonpath_line, ranks_python, setup_block, sourced_note,
                   store_line, template)
# the rendered job's submit and follow
from .slurm_job import submit_and_follow

_NAME = re.compile(r"[A-Za-z0-9_.+\-]+")
_OUTPUT = re.compile(r"(?:[A-Za-z0-9_.+\-]|%[xju%])+")

DURATION_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED)"
_DURATION = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def duration_s(key: str, value) -> Optional[int]:
    """SLURM's duration (sbatch --time: minutes, MM:SS, HH:MM:SS,
    D-HH[:MM[:SS]]) in seconds; None for no limit (UNLIMITED, INFINITE,
    0). A malformed one is a LaunchError naming `key` and the formats
    (sbatch would refuse it only after the run folder exists)."""
    text = str(value).strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "-1"):
        return None
    m = _DURATION.fullmatch(text)
    if not m:
        raise LaunchError(f"{key}={value}: not a duration; use {DURATION_FORMATS}, "
                          f"e.g. {key}=01:30:00 or {key}=1-00:00:00")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        seconds = ((int(days) * 24 + int(a)) * 60 + int(b or 0)) * 60 + int(c or 0)
    elif b is None:  # MM
        seconds = int(a) * 60
    elif c is None:  # MM:SS
        seconds = int(a) * 60 + int(b)
    else:  # HH:MM:SS
        seconds = (int(a) * 60 + int(b)) * 60 + int(c)
    return seconds or None  # 0: SLURM imposes no limit


def stop_lead_s(limit_s: Optional[int]) -> int:
    """launcher.signal_s when it is null: a quarter of the time limit,
    at most 120 s, so a short job (a course's `--time 00:02:00`) stops
    once, near its end. SLURM may signal up to 60 s earlier than asked
    (sbatch --signal), never later."""
    return 120 if limit_s is None else min(120, limit_s // 4)


def tool(cfg) -> tuple[str, str]:
    """What a real submission needs on PATH, and where to get it
    (launch.check_tool)."""
    return "sbatch", "run this on a SLURM login node"


def resolve(cfg) -> None:
    lc = cfg.launcher
    check_container(cfg)
    if lc.nodes < 1:
        raise LaunchError(f"launcher.nodes={lc.nodes}: must be >= 1")
    if lc.gpus_per_node is not None and lc.gpus_per_node < 0:
        raise LaunchError(f"launcher.gpus_per_node={lc.gpus_per_node}: must be >= 0 (or null)")
    nproc = lc.nproc_per_node
    if lc.per_task:
        if lc.ntasks_per_node is not None:
            if nproc is None:
                nproc = lc.ntasks_per_node
            elif lc.ntasks_per_node != nproc:
                raise LaunchError(
                    f"launcher.ntasks_per_node={lc.ntasks_per_node} but launcher.nproc_per_node="
                    f"{nproc}: with per_task=true every task is one process; set one of them")
        if lc.max_restarts:
            raise LaunchError("launcher.max_restarts needs torchrun: use per_task=false "
                              "(srun alone does not restart ranks)")
    elif lc.ntasks_per_node not in (None, 1):
        raise LaunchError(
            f"launcher.ntasks_per_node={lc.ntasks_per_node} with torchrun: srun starts one "
            "torchrun per node, which starts the processes; set launcher.nproc_per_node="
            f"{lc.ntasks_per_node} instead, or launcher.per_task=true for one task per process")
    if nproc is None:
        nproc = lc.gpus_per_node or 2
    if nproc < 1:
        raise LaunchError(f"launcher.nproc_per_node={nproc}: must be >= 1")
    if lc.gpus_per_node and nproc > lc.gpus_per_node and cfg.dist.device != "cpu":
        raise LaunchError(f"launcher.nproc_per_node={nproc} > launcher.gpus_per_node="
                          f"{lc.gpus_per_node}: ranks would share a GPU (NCCL refuses); "
                          "lower nproc_per_node, or set dist.device=cpu")
    lc.nproc_per_node = nproc
    lc.ntasks_per_node = nproc if lc.per_task else 1
    if lc.rdzv not in ("c10d", "static"):
        raise LaunchError(f"launcher.rdzv={lc.rdzv}: choose c10d or static")
    if lc.rdzv == "static" and lc.max_restarts:
        raise LaunchError("launcher.max_restarts with launcher.rdzv=static: a static store "
                          "outlives a restart and the new ranks hang on the old addresses; "
                          "use launcher.rdzv=c10d")
    if lc.master_port is not None and not 0 < lc.master_port < 65536:
        raise LaunchError(f"launcher.master_port={lc.master_port}: not a port (1..65535)")
    if lc.max_restarts < 0:
        raise LaunchError(f"launcher.max_restarts={lc.max_restarts}: must be >= 0")
    if not _NAME.fullmatch(lc.job_name):
        raise LaunchError(f"launcher.job_name={lc.job_name!r}: letters, digits, _ . + - only")
    if not _OUTPUT.fullmatch(lc.output):
        raise LaunchError(f"launcher.output={lc.output!r}: a file name in RUN_DIR/logs of "
                          "letters, digits, _ . + - and SLURM's %x (job name), %j (job id), "
                          "%u (user), e.g. %x-%j")
    if lc.wait_timeout_s is not None and lc.wait_timeout_s <= 0:
        raise LaunchError(f"launcher.wait_timeout_s={lc.wait_timeout_s}: must be > 0 (or null)")
    if lc.poll_s <= 0:
        raise LaunchError(f"launcher.poll_s={lc.poll_s}: must be > 0")
    if lc.signal_s is not None and lc.signal_s < 0:
        raise LaunchError(f"launcher.signal_s={lc.signal_s}: seconds before the time limit, "
                          ">= 0 (0: no signal; null: a quarter of launcher.time, at most 120)")
    if lc.max_requeues < 0:
        raise LaunchError(f"launcher.max_requeues={lc.max_requeues}: must be >= 0")
    # also a rule of command/validate.py
    limit = duration_s("launcher.time", lc.time)
    # a benchmark: no checkpoint to stop at, nothing to resume
    if "train" not in cfg:
        lc.signal_s, lc.requeue = 0, False
    elif lc.signal_s is None:
        lc.signal_s = stop_lead_s(limit)
    if lc.signal_s and limit is not None and lc.signal_s >= limit:
        raise LaunchError(f"launcher.signal_s={lc.signal_s} >= launcher.time={lc.time} "
                          f"({limit} s): the stop signal would come before the job starts; "
                          "lower signal_s or raise time")


def sbatch_lines(cfg, run_dir: Path) -> list[str]:
    lc = cfg.launcher
    opts = [f"--job-name={lc.job_name}"]
    opts += [f"--{k}={v}" for k, v in (("account", lc.account), ("partition", lc.partition),
                                        ("qos", lc.qos)) if v]
    opts += [f"--nodes={lc.nodes}", f"--ntasks-per-node={lc.ntasks_per_node}"]
    if lc.gpus_per_node:
        opts.append(f"--gpus-per-node={lc.gpus_per_node}")
    if lc.cpus_per_task:
        opts.append(f"--cpus-per-task={lc.cpus_per_task}")
    opts += [f"--time={lc.time}",
             f"--output={run_dir}/logs/{lc.output}.out", f"--error={run_dir}/logs/{lc.output}.err"]
    # B: the batch shell only; its trap writes the stop file (torchrun
    if lc.signal_s:
        # would die of USR2's default action)
        opts.append(f"--signal=B:USR2@{lc.signal_s}")
    opts.append("--requeue" if lc.requeue else "--no-requeue")
    # a requeued job appends to the same logs
    opts.append("--open-mode=append")
    if lc.environment:
        opts.append(f"--environment={lc.environment}")
    if lc.contiguous:
        opts.append("--contiguous")
    for extra in lc.sbatch_extra:
        extra = str(extra).strip().removeprefix("#SBATCH").strip()
        if not extra.startswith("-"):
            raise LaunchError(f"launcher.sbatch_extra entry {extra!r}: expected an sbatch "
                              "option such as --mem=0")
        opts.append(extra)
    lines = [f"#SBATCH {o}" for o in opts]
    # a dry run of a container site
    if not lc.environment and "environment" in lc.required:
        lines.append("##SBATCH --environment=<EDF .toml>  # launcher.environment: required to "
                     "submit (docs/launchers.md, Containers)")
    return lines


def launch_block(cfg, nnodes: str = "$SLURM_JOB_NUM_NODES", rdzv_id: str = "$SLURM_JOB_ID",
                 step: Sequence[str] = ()) -> str:
    """The srun line that starts the ranks of "$RUN_DIR" (one torchrun
    per node, or one task per process); a study's job step passes
    `nnodes`, the rendezvous id and srun's `step`."""
    lc = cfg.launcher
    # launcher.image: under `<runtime> exec ... <image>`
    py = ranks_python(cfg, "$RUN_DIR")
    # the module every rank runs (ddp_lab.worker, ...)
    entry = shlex.quote(cfg.run.entry)
    # the whole allocation, sized from the allocation itself: srun would
    # take
    if not step:
        # the task count from SLURM_NTASKS, which a requeued job keeps
        # from its submission even when it comes back on fewer nodes
        # (`scontrol update JobId=.. NumNodes=1`)
        step = [f"--ntasks=$(({nnodes} * NPROC_PER_NODE))" if lc.per_task else f"--ntasks={nnodes}"]
    srun = ["srun", "--kill-on-bad-exit=1", *step]
    if lc.cpus_per_task:
        # since Slurm 22.05 srun no longer inherits --cpus-per-task from
        # sbatch
        srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
    srun += [shlex.quote(str(a)) for a in lc.srun_extra]
    if lc.per_task:
        return ("# One task per process: srun starts every rank; each reads its rank from\n"
                "# SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID (ddp_lab.world.env).\n"
                f"{' '.join(srun)} \\\n  {py} -m {entry} \"$RUN_DIR\"")
    timeout = max(1, int(cfg.dist.init_timeout_s))
    # node ranks come from the rendezvous order (torchrun ignores
    # --node_rank)
    if lc.rdzv == "c10d":
        rdzv = ("--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT "
                f"--rdzv_id={rdzv_id} --rdzv_conf=join_timeout={timeout}")
    else:
        rdzv = ("--rdzv_backend=static --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT "
                f"--node_rank=\\$SLURM_NODEID --rdzv_conf=timeout={timeout}")
    srun.insert(2, "--ntasks-per-node=1")
    return (
        f"{store_line(lc.max_restarts)}\n"
        "# srun starts one torchrun per node; $VAR expands here, \\$VAR on each node (its own).\n"
        f"{' '.join(srun)} bash -c \"\n"
        "  echo \\\"[srun] node \\$SLURM_NODEID of $SLURM_JOB_NUM_NODES: \\$(hostname)\\\"\n"
        "  trap '' TERM  # SLURM's SIGTERM is for the ranks (they checkpoint): torchrun ignores it\n"
        # its --signals_to_handle; older torch:
        "  export PET_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT"
        " TORCHELASTIC_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT\n"
        f"  exec {py} -m torch.distributed.run \\\n"
        f"    --nnodes={nnodes} --nproc_per_node=$NPROC_PER_NODE \\\n"
        f"    {rdzv} \\\n"
        f"    --max_restarts={lc.max_restarts} \\\n"
        f"    -m {entry} \\\"$RUN_DIR\\\"\"")


def nccl_block(cfg) -> str:
    """launcher.nccl_env: the first node's NCCL settings, exported (srun
    passes them on)."""
    if not cfg.launcher.nccl_env:
        return "# (launcher.nccl_env=false: NCCL picks its network itself)"
    py = ranks_python(cfg, "$RUN_DIR")
    return ("# NCCL's network settings from sysfs (ddp_lab.nccl_env: Slingshot, RoCE/IB; why: stderr)\n"
            f"NCCL_EXPORTS=\"$({py} -m ddp_lab.nccl_env)\"\n"
            "echo \"$NCCL_EXPORTS\"; eval \"$NCCL_EXPORTS\"")


def stop_script(lc, py: Optional[str] = None) -> str:
    """slurm_stop.sh, the stop and requeue machinery a job script
    sources from its folder; `py`: the ranks' python as shell words,
    else launcher.python's."""
    py = py or shlex.quote(python_exe(lc))
    return template("slurm_stop.sh").format(
        python_check=python_check(py), py=py, max_requeues=lc.max_requeues,
        self_requeue=int(bool(lc.requeue)))


def render(cfg, run_dir: Path) -> Rendered:
    lc = cfg.launcher
    if re.search(r"\s", str(run_dir)):
        raise LaunchError(f"run folder {run_dir} has a space: #SBATCH --output cannot carry "
                          "it; pick a run.root without spaces")
    if lc.master_port is not None:
        port_line = f"export MASTER_PORT={lc.master_port}"
    else:
        port_line = ("export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))  # the same on "
                     "every node (ddp_lab.world.env.slurm_port)")
    mode = "one task per process" if lc.per_task else "one torchrun per node"
    summary = f"{lc.nodes} node(s) x {lc.nproc_per_node} process(es), {mode}"
    # what a student would write by hand; the stop and requeue machinery
    # it sources comes apart
    script = template("slurm.sbatch").format(
        summary=summary, run_dir_q=shlex.quote(str(run_dir)), job_name=lc.job_name,
        sbatch_lines="\n".join(sbatch_lines(cfg, run_dir)), nproc=lc.nproc_per_node,
        setup=setup_block(lc.setup), pythonpath=pythonpath_line(), nccl_block=nccl_block(cfg),
        container=container_folders(cfg, "$RUN_DIR"), port_line=port_line,
        launch=launch_block(cfg))
    stop = stop_script(lc, ranks_python(cfg, "$RUN_DIR"))
    path = run_dir / "job.sbatch"
    command = ["sbatch", "--parsable", str(path)]
    show = (f"{script.rstrip()}\n# submit with: {' '.join(command)}\n"
            f"{sourced_note(run_dir / 'slurm_stop.sh', stop, 'job.sbatch')}\n")
    warnings = []
    # a dry run of a container site
    if not lc.environment and "environment" in lc.required:
        warnings.append("launcher.environment is not set: this site needs one to submit "
                        "(launcher.environment=<EDF .toml>, docs/launchers.md, Containers)")
    return Rendered(command=command, files={"job.sbatch": script, "slurm_stop.sh": stop},
                    executable=("job.sbatch",), show=show, warnings=warnings,
                    starter=lambda: submit_and_follow(cfg, run_dir, path, summary))
