"""launcher=slurm: an sbatch script whose srun starts the ranks (docs/launchers.md, "slurm").

    python -m ddp_lab launcher=slurm launcher.nodes=4 launcher.account=a-xyz sync=ring
    python -m ddp_lab launcher=slurm launcher.dry_run=true          # print the sbatch script

Default: one srun task per node, each a torchrun of nproc_per_node processes (rendezvous at the
first node, port from the job id); per_task=true: srun starts every process. The stop and requeue
machinery is RUN_DIR/slurm_stop.sh, sourced first (docs/launchers.md, "Time limits, preemption,
requeue", says what each signal does). Then the job is submitted and followed (`follow`).
"""

from __future__ import annotations

import getpass
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ..folder.rundir import EXIT_STOPPED
from .base import (check_container, check_torchrun_job, container_folders, diagnose,
    follow_if_waited, LaunchError, python_check, python_exe, pythonpath_line, ranks_python, Rendered,
    require_tool, setup_block, sourced_note, store_line, Tail, template)

_NAME = re.compile(r"[A-Za-z0-9_.+\-]+")
_OUTPUT = re.compile(r"(?:[A-Za-z0-9_.+\-]|%[xju%])+")

DURATION_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED)"
_DURATION = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def duration_s(key: str, value) -> Optional[int]:
    """SLURM's duration (sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) in seconds; None
    for no limit (UNLIMITED, INFINITE, 0). A malformed one is a LaunchError naming `key` and the
    formats (sbatch would refuse it only after the run folder exists)."""
    text = str(value).strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "-1"):
        return None
    m = _DURATION.fullmatch(text)
    if not m:
        raise LaunchError(f"{key}={value}: not a duration; use {DURATION_FORMATS}, "
                          f"e.g. {key}=01:30:00 or {key}=1-00:00:00")
    days, *rest = m.groups()
    parts = [int(x) for x in rest if x is not None]
    # D-HH[:MM[:SS]] and HH:MM:SS count hours first; MM and MM:SS, minutes
    units = (3600, 60, 1) if days is not None or len(parts) == 3 else (60, 1)
    seconds = int(days or 0) * 86400 + sum(p * u for p, u in zip(parts, units))
    return seconds or None  # 0: SLURM imposes no limit


def tool(cfg) -> tuple[str, str]:
    """What a real submission needs on PATH, and where to get it (launch.check_tool)."""
    return "sbatch", "run this on a SLURM login node"


def resolve(cfg) -> None:
    lc = cfg.launcher
    check_container(cfg)
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
    check_torchrun_job(cfg, nproc)
    lc.nproc_per_node, lc.ntasks_per_node = nproc, nproc if lc.per_task else 1
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
    if lc.poll_s <= 0:
        raise LaunchError(f"launcher.poll_s={lc.poll_s}: must be > 0")
    if lc.signal_s is not None and lc.signal_s < 0:
        raise LaunchError(f"launcher.signal_s={lc.signal_s}: seconds before the time limit, "
                          ">= 0 (0: no signal; null: a quarter of launcher.time, at most 120)")
    if lc.max_requeues < 0:
        raise LaunchError(f"launcher.max_requeues={lc.max_requeues}: must be >= 0")
    limit = duration_s("launcher.time", lc.time)  # also a rule of command/validate.py
    # a benchmark: no checkpoint to stop at, nothing to resume
    if "train" not in cfg:
        lc.signal_s, lc.requeue = 0, False
    elif lc.signal_s is None:
        # a quarter of the time limit, at most 120 s, so a short job (a course's --time 00:02:00)
        # stops once, near its end; SLURM may signal up to 60 s earlier than asked, never later
        lc.signal_s = 120 if limit is None else min(120, limit // 4)
    if lc.signal_s and limit is not None and lc.signal_s >= limit:
        raise LaunchError(f"launcher.signal_s={lc.signal_s} >= launcher.time={lc.time} "
                          f"({limit} s): the stop signal would come before the job starts; "
                          "lower signal_s or raise time")


def sbatch_lines(cfg, run_dir: Path) -> list[str]:
    lc = cfg.launcher
    opts = [f"--job-name={lc.job_name}"]
    opts += [f"--{k}={v}" for k, v in (
        ("account", lc.account), ("partition", lc.partition), ("qos", lc.qos), ("nodes", lc.nodes),
        ("ntasks-per-node", lc.ntasks_per_node), ("gpus-per-node", lc.gpus_per_node),
        ("cpus-per-task", lc.cpus_per_task)) if v]
    opts += [f"--time={lc.time}",
             f"--output={run_dir}/logs/{lc.output}.out", f"--error={run_dir}/logs/{lc.output}.err"]
    if lc.signal_s:  # B: the batch shell alone, whose trap writes the stop file (torchrun dies)
        opts.append(f"--signal=B:USR2@{lc.signal_s}")
    opts.append("--requeue" if lc.requeue else "--no-requeue")
    opts.append("--open-mode=append")  # a requeued job appends to the same logs
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
    if not lc.environment and "environment" in lc.required:  # a dry run of a container site
        lines.append("##SBATCH --environment=<EDF .toml>  # launcher.environment: required to "
                     "submit (docs/launchers.md, Containers)")
    return lines


def launch_block(cfg, nnodes: str = "$SLURM_JOB_NUM_NODES", rdzv_id: str = "$SLURM_JOB_ID",
                 step: Sequence[str] = ()) -> str:
    """The srun line that starts the ranks of "$RUN_DIR" (one torchrun per node, or one task per
    process); a study's job step passes `nnodes`, the rendezvous id and srun's `step`."""
    lc = cfg.launcher
    py = ranks_python(cfg, "$RUN_DIR")  # launcher.image: under `<runtime> exec ... <image>`
    entry = shlex.quote(cfg.run.entry)  # the module every rank runs (ddp_lab.worker, ...)
    # the whole allocation, sized from the allocation itself: srun would take
    if not step:
        # the task count from SLURM_NTASKS, which a requeued job keeps from its submission even
        # when it comes back on fewer nodes (`scontrol update JobId=.. NumNodes=1`)
        step = [f"--ntasks=$(({nnodes} * NPROC_PER_NODE))" if lc.per_task else f"--ntasks={nnodes}"]
    srun = ["srun", "--kill-on-bad-exit=1", *step]
    if lc.cpus_per_task:  # since Slurm 22.05 srun no longer inherits it from sbatch
        srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
    srun += [shlex.quote(str(a)) for a in lc.srun_extra]
    if lc.per_task:
        return ("# One task per process: srun starts every rank; each reads its rank from\n"
                "# SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID (ddp_lab.world.env).\n"
                f"{' '.join(srun)} \\\n  {py} -m {entry} \"$RUN_DIR\"")
    timeout = max(1, int(cfg.dist.init_timeout_s))
    # node ranks come from the rendezvous order (torchrun ignores --node_rank)
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
    """launcher.nccl_env: the first node's NCCL settings, exported (srun passes them on)."""
    if not cfg.launcher.nccl_env:
        return "# (launcher.nccl_env=false: NCCL picks its network itself)"
    py = ranks_python(cfg, "$RUN_DIR")
    return ("# NCCL's network settings from sysfs (ddp_lab.nccl_env: Slingshot, RoCE/IB; why: stderr)\n"
            f"NCCL_EXPORTS=\"$({py} -m ddp_lab.nccl_env)\"\n"
            "echo \"$NCCL_EXPORTS\"; eval \"$NCCL_EXPORTS\"")


def stop_script(lc, py: Optional[str] = None) -> str:
    """slurm_stop.sh, the stop and requeue machinery a job script sources from its folder; `py`:
    the ranks' python as shell words, else launcher.python's."""
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
    # what a student would write by hand; the stop and requeue machinery it sources comes apart
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
    if not lc.environment and "environment" in lc.required:  # a dry run of a container site
        warnings.append("launcher.environment is not set: this site needs one to submit "
                        "(launcher.environment=<EDF .toml>, docs/launchers.md, Containers)")
    return Rendered(command=command, files={"job.sbatch": script, "slurm_stop.sh": stop},
                    executable=("job.sbatch",), show=show, warnings=warnings,
                    starter=lambda _limit_s: submit_and_follow(cfg, run_dir, path, summary))


TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def log_name(pattern: str, job_name: str, job_id: str) -> str:
    """sbatch's name of a `launcher.output` log: %x job name, %j id, %u user, %% '%'."""
    values = {"x": job_name, "j": str(job_id), "u": getpass.getuser(), "%": "%"}
    return re.sub(r"%([xju%])", lambda m: values[m.group(1)], pattern)


def submit_and_follow(cfg, run_dir: Path, script: Path, summary: str) -> int:
    lc = cfg.launcher
    sbatch = require_tool(*tool(cfg))
    try:
        res = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise LaunchError("sbatch did not answer within 120 s: is slurmctld up? (sinfo)") from None
    if res.returncode != 0:
        raise LaunchError(f"sbatch refused the job: {res.stderr.strip() or res.stdout.strip()}")
    job_id = res.stdout.strip().split(";")[0]
    (run_dir / "job_id").write_text(job_id + "\n")
    name = log_name(lc.output, lc.job_name, job_id)
    out, err = run_dir / "logs" / f"{name}.out", run_dir / "logs" / f"{name}.err"
    print(f"submitted SLURM job {job_id}: {summary}\n  output: {out}\n  errors: {err}", flush=True)
    return follow_if_waited(lc.wait, f"squeue -j {job_id}; tail -f {out}; scancel {job_id}",
                            lambda: follow(job_id, out, err, lc.wait_timeout_s, lc.poll_s))


def job_info(job_id: str) -> dict:
    """scontrol's record of the job as a dict (JobState, ExitCode, Reason, Restarts, ...), else
    sacct's (JobState, ExitCode); {"JobState": "GONE"} when neither knows it, {"JobState":
    "UNKNOWN", "Reason": why} when they do not answer."""
    try:
        res = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                             text=True, timeout=15)
    except (subprocess.TimeoutExpired, OSError):
        return {"JobState": "UNKNOWN", "Reason": "scontrol did not answer"}
    if res.returncode == 0 and "JobState=" in res.stdout:
        return dict(tok.split("=", 1) for tok in res.stdout.split() if "=" in tok)
    if "Invalid job id" not in res.stderr:
        return {"JobState": "UNKNOWN", "Reason": res.stderr.strip()}
    # the record aged out of slurmctld (MinJobAge): accounting may still know it
    try:
        acct = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"],
                              capture_output=True, text=True, timeout=15)
        line = acct.stdout.strip().splitlines()[0] if acct.returncode == 0 and acct.stdout.strip() else ""
    except (subprocess.TimeoutExpired, OSError):
        line = ""
    if line and "|" in line:
        state, code = line.split("|", 1)
        return {"JobState": state.split()[0], "ExitCode": code}
    return {"JobState": "GONE"}


def exit_status(state: str, exit_code: str) -> int:
    """SLURM's ExitCode `code:signal` -> a shell exit status; non-zero for any failure."""
    try:
        code, sig = (int(x) for x in exit_code.split(":"))
    except ValueError:
        code, sig = 0, 0
    rc = code or (128 + sig if sig else 0)
    return rc if rc or state == "COMPLETED" else 1


# A failed job COMPLETING this long waits for a node that does not answer (it usually takes a
# second): `follow` reports it ended
STUCK_COMPLETING_S = 5.0
# States after which a --requeue job may still come back (PENDING again): wait and see.
MAYBE_REQUEUED = {"PREEMPTED", "NODE_FAIL"}
HINTS = {
    "BeginTime": "a requeued job waits before it starts again; `scontrol update JobId={j} "
                 "StartTime=now` starts it at once",
    "JobHeldUser": "held: `scontrol release {j}` lets it run",
    "JobHeldAdmin": "held by an admin",
}


def follow(job_id: str, out: Path, err: Path, timeout_s: Optional[float], poll_s: float,
           settle_s: float = 30.0) -> int:
    """Stream the job's logs and print each state change until it ends; its exit status. A requeued
    job (PENDING again, Restarts+1) goes on being followed; a requeueable job's PREEMPTED or
    NODE_FAIL (or any end just after a requeue) is final after `settle_s`."""
    tails = [Tail(out, sys.stdout), Tail(err, sys.stderr)]
    t0 = time.monotonic()
    last = restarts = since = requeued_at = completing = None
    unknown, state, code = 0, "", ""
    try:
        while True:
            info = job_info(job_id)
            state, code = info.get("JobState", "UNKNOWN"), info.get("ExitCode", "")
            reason = info.get("Reason", "")
            for t in tails:
                t.poll()
            n = info.get("Restarts")
            if n is not None and n.isdigit():
                if restarts is not None and int(n) > restarts:
                    print(f"[slurm] job {job_id} requeued (restart {n}): it continues from "
                          "its checkpoint when it runs again", flush=True)
                    last = None  # show the state again, even when it did not change
                    requeued_at = time.monotonic()
                restarts = int(n)
            final = state in TERMINAL or state == "GONE"
            # the batch script ended with a failure and SLURM, for seconds on end, still waits to
            # clean up on a node that does not answer (a cut link): over for its user
            if state == "COMPLETING" and code not in ("", "0:0"):
                completing = completing if completing is not None else time.monotonic()
                final = final or time.monotonic() - completing >= STUCK_COMPLETING_S
            else:
                completing = None
            # right after a requeue slurmctld may show the old allocation's end (FAILED, CANCELLED)
            # before the job is PENDING again: that settles too
            just_requeued = requeued_at is not None and time.monotonic() - requeued_at < settle_s
            if final and (state in MAYBE_REQUEUED or just_requeued) and info.get("Requeue") == "1":
                since = since if since is not None else time.monotonic()
                final = time.monotonic() - since >= settle_s
            else:
                since = None
            shown = (state, reason if state == "PENDING" else "")
            if state == "PENDING" and reason in ("", "None") and last and last[0] == "PENDING":
                shown = last  # a reason that clears is no news
            if shown != last and state not in ("UNKNOWN", "GONE") and not final:
                why = f" ({reason})" if reason and reason != "None" and (
                    state == "PENDING" or state in MAYBE_REQUEUED) else ""
                hint = HINTS.get("JobHeldUser" if state == "REQUEUE_HOLD" else reason, "")
                hint = hint.format(j=job_id)
                print(f"[slurm] job {job_id} {state}{why}" + (f": {hint}" if hint else ""),
                      flush=True)
                last = shown
            if final:
                break
            unknown = unknown + 1 if state == "UNKNOWN" else 0
            if unknown * poll_s > 300:
                print(f"[slurm] slurmctld has not answered about job {job_id} for 5 min "
                      f"({reason}); not following it any more", file=sys.stderr)
                return 1
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                print(f"[slurm] job {job_id} still {state} after {timeout_s:.0f} s "
                      f"(launcher.wait_timeout_s): it keeps running; follow it with "
                      f"tail -f {out}, stop it with scancel {job_id}", file=sys.stderr)
                return 124
            time.sleep(poll_s)
    except KeyboardInterrupt:
        print(f"\n[slurm] stopped following; job {job_id} keeps running "
              f"(scancel {job_id} stops it)", file=sys.stderr)
        return 130
    time.sleep(min(poll_s, 1.0))  # slurmd may still be flushing the job's output
    for t in tails:
        t.poll(final=True)
    if state == "GONE":
        print(f"[slurm] job {job_id} ended but neither scontrol nor sacct knows how: "
              f"see {out} and {err}", file=sys.stderr)
        return 1
    rc = exit_status(state, code)
    again = f" after {restarts} requeue(s)" if restarts else ""
    print(f"[slurm] job {job_id} {state}{again}, exit code {code or '?'}", flush=True)
    if state == "COMPLETING":
        print(f"[slurm] job {job_id} has ended; SLURM still cleans up on a node that does not "
              f"answer (squeue -j {job_id} shows it until then)", flush=True)
    if rc == EXIT_STOPPED:  # the batch shell: stopped with a checkpoint, not requeued
        print(f"[slurm] job {job_id} stopped with a checkpoint and was not requeued (its log "
              f"says why): `sbatch` its job.sbatch again to continue", file=sys.stderr)
    elif rc != 0:
        print(f"[slurm] job {job_id} failed: {diagnose([err, out])}", file=sys.stderr)
    return rc
