"""The submitting side of a training run: check, launch (ddp_lab.command.job), report."""

from __future__ import annotations

from omegaconf import DictConfig

from .job import Outcome, collect, launch_job
from .paste import COMMAND_FILE, command_line, continue_command, job_overrides
from ..folder.rundir import EXIT_STOPPED
from .status import reached
from .study import resolve_study, run_study
from .validate import resolve_train


def check(cfg: DictConfig) -> DictConfig:
    """`python -m ddp_lab`'s config resolved and checked: a run's, or a study's base."""
    if cfg.get("study") is not None:
        return resolve_study(cfg)
    return resolve_train(cfg)


def submit(cfg: DictConfig, t0: float | None = None) -> Outcome:
    """Run one training (or a study) and say how it ended: its Outcome."""
    if cfg.get("study") is not None:
        return run_study(cfg, t0)
    cfg = resolve_train(cfg)
    # kept in the folder: the command that continues it has them
    overrides = job_overrides()
    files = {COMMAND_FILE: command_line(overrides) + "\n"} if overrides is not None else {}
    run_dir, rc = launch_job(cfg, files=files, t0=t0)
    if rc is None:
        return Outcome(0, "ok (dry run)", run_dir)
    summary = collect(run_dir, rc, launcher=cfg.launcher.name, sync=cfg.sync.name,
                      entry=cfg.run.entry)
    status = str(summary.get("status", ""))
    if status in ("stopped", "preempted"):
        where = reached(summary.get("epochs_done"), summary.get("step_in_epoch"))
        result = f"{status} after {where} ({summary.get('stop_reason')}); checkpoint saved"
        print(result + ".")
        if status == "preempted" and cfg.launcher.name == "runai":
            # the PyTorchJob brings its pods back and they continue: a second job would race it
            print(f"RunAI starts the pods again and they continue the run by themselves; "
                  f"follow it with: python -m ddp_lab.status {run_dir} --follow")
        else:
            print("Continue with (the same settings; it resumes from its newest checkpoint):\n  "
                  + continue_command(run_dir, cfg.launcher.name))
        print(f"run dir: {run_dir}")
        return Outcome(rc if rc > 128 else EXIT_STOPPED, result, run_dir)
    result = "ok"
    if rc != 0:
        why = summary["status"].removeprefix("failed: ")
        why = "" if why.startswith("job exit status") else why
        print(f"job failed with exit status {rc}{': ' + why if why else ''} "
              f"(logs in {run_dir / 'logs'})")
        result = f"failed: {why or f'exit status {rc}'}"
    elif summary.get("records_kept") is False:
        print(f"run.entry={cfg.run.entry} ended (exit status 0); it keeps no records "
              "(no metrics.jsonl, no figures for the report)")
    elif summary:
        start = (summary.get("segments") or [{}])[-1].get("startup_s")
        print(f"test accuracy {summary['test_accuracy']:.4f}, "
              f"median epoch {summary['epoch_time_s_median']:.2f} s, "
              f"world size {summary['world_size']} ({summary['backend']}, {summary['device']})"
              + (f", first step {start:.1f} s after start" if start is not None else "")
              + memory_note(summary))
    print(f"run dir: {run_dir}")
    return Outcome(rc, result, run_dir)


def memory_note(summary: dict) -> str:
    """zero1's closing words: what one rank holds (summary.json's memory_* fields)."""
    if summary.get("sync") != "zero1" or summary.get("memory_optimizer_state_bytes") is None:
        return ""
    mb = {k: summary[f"memory_{k}_bytes"] / 1e6 for k in ("param", "grad", "optimizer_state")}
    return (f"; per rank: parameters {mb['param']:.1f} MB, gradients {mb['grad']:.1f} MB, "
            f"optimiser state {mb['optimizer_state']:.1f} MB")
