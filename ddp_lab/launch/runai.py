"""launcher=runai: `runai submit-dist pytorch` (CLI v2.10+) + a pod entry script
(docs/launchers.md, "runai: RunAI pods").

    python -m ddp_lab launcher=runai launcher.nodes=2 launcher.gpus_per_node=4 launcher.image=...

RunAI adds a master pod to `--workers`, so --workers = nodes - 1. Each pod runs `bash
RUN_DIR/pod.sh` (setup, NCCL's RDMA settings, one torchrun; pod_stop.sh holds the stop and exit
machinery): a preempted pod writes RUN_DIR/STOP and exits PREEMPTED_EXIT so that the pods come back
and continue. The run folder must be on a PVC mounted at the same path.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from ..folder.rundir import read_summary
from .base import (check_torchrun_job, LaunchError, Rendered, Tail, diagnose, python_check, python_exe,
                   setup_block, follow_if_waited, sourced_note, store_line, template)

_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# pod.sh's exit status after a graceful stop for preemption: 128 + SIGTERM. Not 0 (a PyTorchJob
# whose master pod succeeds would not come back) and not 1-127 (Kubeflow's ExitCode restart policy
# retries only 128-255).
PREEMPTED_EXIT = 143


def tool(cfg) -> tuple[str, str]:
    """What a real submission needs on PATH, and where to get it (launch.check_tool)."""
    return "runai", "install the RunAI CLI and `runai login`"


def resolve(cfg) -> None:
    lc = cfg.launcher
    if lc.nodes < 1:
        raise LaunchError(f"launcher.nodes={lc.nodes}: must be >= 1 (pods)")
    if lc.gpus_per_node < 0:
        raise LaunchError(f"launcher.gpus_per_node={lc.gpus_per_node}: must be >= 0")
    if lc.nproc_per_node is None:
        lc.nproc_per_node = lc.gpus_per_node or 2
    check_torchrun_job(cfg, lc.nproc_per_node)
    if not lc.image and not lc.dry_run:
        raise LaunchError("launcher.image is not set: give the container image the pods run "
                          "(it needs torch; ddp_lab too, or install it with launcher.setup)")
    if lc.job_name is not None and not (_K8S_NAME.fullmatch(lc.job_name) and len(lc.job_name) <= 50):
        raise LaunchError(f"launcher.job_name={lc.job_name!r}: lowercase letters, digits and '-', "
                          "at most 50 characters (a Kubernetes name)")
    for v in lc.pvc:
        claim, _, mount = str(v).partition(":")
        if not claim or not mount.startswith("/"):
            raise LaunchError(f"launcher.pvc entry {v!r}: expected claim:/mount/path")
    if not lc.dry_run:
        on_pvc(cfg)


def on_pvc(cfg) -> None:
    """Every pod runs RUN_DIR/pod.sh and writes the run folder; rank 0 fetches the data the others
    read: both must be on a PVC the pods mount, at the same path as here."""
    lc = cfg.launcher
    mounts = [Path(str(v).partition(":")[2]) for v in lc.pvc]
    where = {"run.dir" if cfg.run.dir else "run.root": cfg.run.dir or cfg.run.root}
    if "data" in cfg and not cfg.data.node_local:
        where["data.root"] = cfg.data.root
    for key, value in where.items():
        path = Path(str(value)).expanduser().absolute()
        if not any(path == m or m in path.parents for m in mounts):
            raise LaunchError(
                f"{key}={value} is on no PVC the pods mount (launcher.pvc="
                f"{[str(v) for v in lc.pvc]}): the pods could not see it; mount one "
                f"(launcher.pvc=[claim:/mnt]) and put {key} under it at the same path "
                "(e.g. /mnt/$USER/...), as the pods see it")
    for k in lc.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)):
            raise LaunchError(f"launcher.env key {k!r}: not an environment variable name")


def job_name(cfg, run_dir: Path) -> str:
    if cfg.launcher.job_name:
        return cfg.launcher.job_name
    name = re.sub(r"[^a-z0-9]+", "-", run_dir.name.lower()).strip("-")
    return ("ddplab-" + name)[:50].rstrip("-")


def submit_command(cfg, run_dir: Path) -> list[str]:
    lc = cfg.launcher
    cmd = ["runai", "submit-dist", "pytorch", "--name", job_name(cfg, run_dir)]
    if lc.project:
        cmd += ["--project", lc.project]
    cmd += ["--image", lc.image or "IMAGE-NOT-SET",
            # RunAI adds the master pod itself
            "--workers", str(lc.nodes - 1),
            "--gpu", str(lc.gpus_per_node)]
    cmd += [word for v in lc.pvc for word in ("--pvc", str(v))]
    cmd += [word for k, v in lc.env.items() for word in ("-e", f"{k}={v}")]
    if lc.large_shm:
        cmd.append("--large-shm")
    if lc.rdma:  # RoCE: the secondary network and the RDMA device of the node
        cmd += ["--annotation", lc.rdma_annotation, "--extended-resource", lc.rdma_resource]
    cmd += [str(a) for a in lc.extra_args]
    # --command: our script, not appended to the image's entry point
    cmd += ["--command", "--", "bash", str(run_dir / "pod.sh")]
    return cmd


def pod_script(cfg, run_dir: Path) -> tuple[str, str]:
    """pod.sh (what each pod runs: the setup lines, then torchrun) and pod_stop.sh, which pod.sh
    sources first (its log, the graceful stop on SIGTERM, its exit status)."""
    lc = cfg.launcher
    py = shlex.quote(python_exe(lc) if lc.venv else (lc.python or "python"))
    timeout = max(1, int(cfg.dist.init_timeout_s))
    if lc.rdzv == "static":
        rdzv = (f'--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" '
                f'--rdzv_conf=timeout={timeout}')
    else:
        rdzv = (f'--rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" '
                f'--rdzv_conf=join_timeout={timeout}')
    if lc.rdma:
        rdma = ("# RoCE: NCCL's RDMA device (NCCL_IB_HCA), GID index and socket settings from\n"
                "# /sys/class/infiniband (ddp_lab.nccl_env, the RunAI guide's recipe). An assignment,\n"
                "# not eval \"$(...)\": a failure must stop the pod (set -e).\n"
                f"NCCL_EXPORTS=\"$({py} -m ddp_lab.nccl_env)\"\n"
                "echo \"$NCCL_EXPORTS\"; eval \"$NCCL_EXPORTS\"")
    else:
        rdma = "# (launcher.rdma=false: NCCL picks its transport itself)"
    summary = f"{lc.nodes} pod(s) x {lc.nproc_per_node} process(es)"
    pod = template("runai_pod.sh").format(
        summary=summary, run_dir_q=shlex.quote(str(run_dir)), nproc=lc.nproc_per_node,
        setup=setup_block(lc.setup), rdma=rdma, python=py, rdzv=rdzv,
        max_restarts=lc.max_restarts, store_line=store_line(lc.max_restarts),
        entry=shlex.quote(cfg.run.entry), preempted_exit=PREEMPTED_EXIT)
    stop = template("runai_stop.sh").format(
        python_check=python_check(py, fail="finish 3"), python=py,
        job_name=shlex.quote(job_name(cfg, run_dir)), preempted_exit=PREEMPTED_EXIT)
    return pod, stop


def render(cfg, run_dir: Path) -> Rendered:
    lc = cfg.launcher
    cmd = submit_command(cfg, run_dir)
    pretty = " \\\n    ".join(_pairs(cmd))
    submit_sh = ("#!/usr/bin/env bash\n"
                 "# ddp_lab's RunAI submission (launcher=runai); every pod runs pod.sh beside it: on a PVC\n"
                 f"set -euo pipefail\n{pretty}\n")
    pod, stop = pod_script(cfg, run_dir)
    warnings = [] if lc.image else [  # only a dry run gets here without one (resolve)
        "launcher.image is not set: add launcher.image=<registry/image:tag>"]
    show = (f"# ---- runai_submit.sh\n{submit_sh.rstrip()}\n# ---- pod.sh\n{pod.rstrip()}\n"
            f"{sourced_note(run_dir / 'pod_stop.sh', stop, 'pod.sh')}\n")
    return Rendered(command=cmd, files={"runai_submit.sh": submit_sh, "pod.sh": pod,
                                        "pod_stop.sh": stop},
                    executable=("runai_submit.sh", "pod.sh"), show=show, warnings=warnings,
                    starter=lambda _limit_s: submit_and_follow(cfg, run_dir, cmd))


def _pairs(cmd: list[str]) -> list[str]:
    """Quote, and keep each flag on one line with its value, for a readable script."""
    out: list[str] = []
    i = 0
    while i < len(cmd):
        a = cmd[i]
        if a == "--command":
            out.append(" ".join(shlex.quote(x) for x in cmd[i:]))
            break
        if a.startswith("-") and i + 1 < len(cmd) and not cmd[i + 1].startswith("-"):
            out.append(f"{shlex.quote(a)} {shlex.quote(cmd[i + 1])}")
            i += 2
        else:
            out.append(shlex.quote(a))
            i += 1
    # `runai submit-dist pytorch --name x` reads better on the first line
    return [" ".join(out[:4])] + out[4:] if len(out) > 4 else out


# ------------------------------------------------------------------ follow
def submit_and_follow(cfg, run_dir: Path, cmd: list[str]) -> int:
    """Submit the job (its `runai` on PATH: launch.check_tool said so first) and follow it."""
    lc = cfg.launcher
    for old in (run_dir / "logs").glob("pod*.exit"):  # a reused run folder: start afresh
        old.unlink()
    res = subprocess.run(cmd)
    if res.returncode != 0:
        print(f"[runai] submit-dist failed with exit status {res.returncode}", file=sys.stderr)
        return res.returncode
    name = job_name(cfg, run_dir)
    print(f"submitted RunAI job {name}: {lc.nodes} pod(s) x {lc.nproc_per_node} process(es)\n"
          f"  pod logs: {run_dir / 'logs'}/pod<N>.log", flush=True)
    return follow_if_waited(lc.wait, f"runai describe job {name}; runai logs {name} -f",
                            lambda: follow(run_dir, lc.nodes, name, lc.wait_timeout_s, lc.poll_s))


def follow(run_dir: Path, pods: int, name: str, timeout_s, poll_s: float) -> int:
    """Wait for every pod's exit file in the (shared) run folder; stream pod 0's log. 0 when the
    run completed or stopped gracefully (preempted: RunAI brings the pods back without us), else
    the first pod's failure status."""
    logs = run_dir / "logs"
    tail = Tail(logs / "pod0.log", sys.stdout)
    t0 = time.monotonic()
    hinted = False
    try:
        while True:
            tail.poll()
            done = {p.name: p for p in logs.glob("pod*.exit")}
            if len(done) >= pods:
                break
            waited = time.monotonic() - t0
            if not hinted and waited > 120 and not any(logs.glob("pod*.log")):
                print(f"[runai] no pod has written to {logs} after {waited:.0f} s: the pods may "
                      f"be pending (runai describe job {name}), or the run folder is not on the "
                      "PVC they mount", file=sys.stderr)
                hinted = True
            if timeout_s is not None and waited > timeout_s:
                print(f"[runai] {len(done)}/{pods} pod(s) done after {timeout_s:.0f} s "
                      f"(launcher.wait_timeout_s): the job keeps running; runai delete job {name} "
                      "stops it", file=sys.stderr)
                return 124
            time.sleep(poll_s)
    except KeyboardInterrupt:
        print(f"\n[runai] stopped following; job {name} keeps running", file=sys.stderr)
        return 130
    tail.poll(final=True)
    codes = {}
    for p in sorted(done.values()):
        try:
            codes[p.stem] = int(p.read_text().strip() or 1)
        except ValueError:
            codes[p.stem] = 1
    print(f"[runai] job {name}: " + ", ".join(f"{k} exit {v}" for k, v in codes.items()), flush=True)
    stop = graceful_stop(run_dir, codes)
    if stop is not None:
        print(f"[runai] job {name}: {stop}", flush=True)
        return 0  # not a failure: summary.json says preempted/stopped, the CLI reports it
    rc = next((c for c in codes.values() if c != 0), 0)
    if rc != 0:
        bad = [logs / f"{k}.log" for k, v in codes.items() if v != 0]
        print(f"[runai] job {name} failed: {diagnose(bad)}", file=sys.stderr)
    return rc


def graceful_stop(run_dir: Path, codes: dict[str, int]) -> Optional[str]:
    """What to say when the pods ended by a graceful stop (preempted or stopped), else None."""
    summary = read_summary(run_dir)
    status = str(summary.get("status", ""))
    if status not in ("preempted", "stopped") or any(
            c not in (0, PREEMPTED_EXIT) for c in codes.values()):
        return None
    where = f"after {summary.get('epochs_done')} epoch(s)"
    if summary.get("step_in_epoch"):
        where += f" + {summary['step_in_epoch']} step(s)"
    text = f"{status} {where} ({summary.get('stop_reason')}); checkpoint saved"
    if status == "preempted":
        text += (". RunAI starts the pods again when it has the GPUs for them, and the run "
                 f"continues from that checkpoint by itself (logs: {run_dir / 'logs'})")
    return text
