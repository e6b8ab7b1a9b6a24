"""The doctor's submitting side: the run's config with the doctor's entry, one short job
through the launcher (`ddp_lab.command.job.launch_job`), then the verdicts printed and kept."""

from __future__ import annotations

import datetime
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, open_dict

from ..command.job import launch_job, Outcome
from ..command.validate import resolve_train
from ..config.errors import UserError
from ..folder import doctor as records
from ..folder.files import read_json_or_empty
from ..folder.rundir import read_summary, world_size
from ..launch.local import OVER_LIMIT
from ..world.env import process_start
from .verdicts import Check, Facts, verdicts


ENTRY = "ddp_lab.doctor.probe"
# the doctor's own bounds: a rank that cannot join, or a collective that hangs (the
# tasks/devices mismatch), ends the job within these rather than the run's
INIT_TIMEOUT_S = 20.0
TIMEOUT_S = 60.0
# and the whole job, in the foreground (local, mpirun): ranks that never started (a daemon of
# mpirun's that never called back) reach none of their own bounds
JOB_LIMIT_S = 180.0


def resolve_doctor(cfg: DictConfig) -> DictConfig:
    """A run's config, checked as a run's, with the doctor's entry and time bounds."""
    if cfg.run.get("dir"):
        raise UserError(f"run.dir={cfg.run.dir}: the doctor makes its own folder under "
                        "run.root (doctor_<date>_<time>); drop run.dir")
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.run.entry = ENTRY
    cfg = resolve_train(cfg)
    with open_dict(cfg):
        cfg.dist.init_timeout_s = min(float(cfg.dist.init_timeout_s or TIMEOUT_S), INIT_TIMEOUT_S)
        cfg.dist.timeout_s = min(float(cfg.dist.timeout_s), TIMEOUT_S)
        # the verdicts need the job's end
        if "wait" in cfg.launcher:
            cfg.launcher.wait = True
    return cfg


def settings(cfg: DictConfig) -> dict:
    lc = cfg.launcher
    return {"launcher": lc.name, "nodes": lc.nodes, "nproc_per_node": lc.nproc_per_node,
            "world_size": world_size(cfg), "per_task": bool(lc.get("per_task")),
            "gpus_per_node": lc.get("gpus_per_node"), "device": cfg.dist.device,
            "backend": cfg.dist.backend, "data_root": cfg.data.root,
            "node_local": bool(cfg.data.node_local),
            # mpirun: each host's slots, in rank order (its nodes may differ)
            "slots": [int(str(h).rpartition(":")[2]) for h in lc.hosts] if lc.name == "mpirun"
            else None}


def read_facts(run_dir: Path, sets: dict, rc: int) -> Facts:
    folder = run_dir / "doctor"
    ranks = [read_json_or_empty(p) for p in sorted(folder.glob("rank*[0-9].json"))]
    ranks += [read_json_or_empty(p) for p in sorted(folder.glob("unplaced-*.json"))]
    measures = {m["rank"]: m for m in map(read_json_or_empty,
                                          sorted(folder.glob("rank*.measure.json"))) if "rank" in m}
    if sets["device"] == "auto" and measures:
        sets = {**sets, "device": "cuda" if any(str(m.get("device", "")).startswith("cuda")
                                                for m in measures.values()) else "cpu"}
    return Facts(sets, [r for r in ranks if r], measures,
                 str(read_summary(run_dir).get("status", "")), rc)


def submit_doctor(cfg: DictConfig, argv: Optional[list[str]] = None,
                  t0: Optional[float] = None) -> Outcome:
    began = process_start() or time.time()
    cfg = resolve_doctor(cfg)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m ddp_lab.doctor " + " ".join(shlex.quote(a) for a in argv) + "\n"
    run_dir, rc = launch_job(cfg, label="doctor", files={"command.txt": command}, t0=t0,
                             limit_s=JOB_LIMIT_S)
    if rc is None:
        return Outcome(0, "ok (dry run)", run_dir)
    facts = read_facts(run_dir, settings(cfg), rc)
    checks = verdicts(facts)
    ended = (f"still running after {JOB_LIMIT_S:.0f} s: ended by the doctor" if rc == OVER_LIMIT
             else f"ended with exit status {rc}: {facts.status or '?'}"
             if rc != 0 and all(c.ok for c in checks) else None)
    if ended:
        checks.append(Check("job", False, ended, f"read {run_dir / 'logs'}"))
    fp = read_json_or_empty(run_dir / "doctor" / "fingerprint.json")
    elapsed = time.time() - began
    failed = [c for c in checks if not c.ok]
    doc = {"finished": datetime.datetime.now().isoformat(timespec="seconds"),
           "healthy": not failed, "elapsed_s": round(elapsed, 2), "job_rc": rc,
           "settings": facts.settings, "command": command.strip(),
           "checks": [c.as_dict() for c in checks],
           "fingerprint_id": fp.get("fingerprint_id"), "fingerprint": fp.get("fingerprint"),
           "nodes": {facts.label(n): x for n, x in facts.node_facts().items()}}
    path = records.write(run_dir, json.loads(json.dumps(doc, default=str)))
    for c in checks:
        print(c.line())
    print(f"doctor: {len(checks)} checks, {len(failed)} failed, in {elapsed:.1f} s "
          f"(fingerprint {fp.get('fingerprint_id') or '?'}); {path}")
    print(f"run dir: {run_dir}")
    if failed:
        return Outcome(1, f"failed: {failed[0].line()}", run_dir)
    return Outcome(0, f"ok: {len(checks)} checks", run_dir)
