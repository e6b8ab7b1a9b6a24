"""The run folder: made once, on the submitting machine, before any rank starts; what it holds, and
when a command may reuse it. And the stop contract both sides read (torch-free): the file
`RUN_DIR/STOP`, the codes of a stop and the exit status of a stopped run. Any process that sees the
folder asks with `request_stop`; rank 0 reads the file at each stop check (`read_stop_file`;
rank/epochs.py agrees with the other ranks); a new segment clears it (`clear_stop_file`).
"""

from __future__ import annotations

import contextlib
import datetime
import re
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from .description import describe_run
from .files import atomic_write_text, read_json_or_empty, write_json
from .records import now_iso, read_metrics


def make_run_dir(cfg: DictConfig, label: Optional[str] = None) -> Path:
    """run.dir if given (reused: that is how a run is resumed), else a fresh unique folder
    `<run.root>/<name>_<date>_<time>`. The name comes first, for TensorBoard's sidebar: `label` and
    run.name, else the run's description's label (`ring_w2_mlp_sgd`)."""
    if cfg.run.dir:
        path = Path(cfg.run.dir).expanduser().resolve()
        _mkdir(path, exist_ok=True)
        return path
    root = Path(cfg.run.root).expanduser().resolve()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    name = "_".join(n for n in (label, cfg.run.get("name")) if n) or describe_config(cfg)
    base = f"{name}_{stamp}"
    for i in range(1000):
        path = root / (base if i == 0 else f"{base}_{i}")
        with contextlib.suppress(FileExistsError):
            _mkdir(path, exist_ok=False)
            return path
    raise RuntimeError(f"cannot make a unique run folder under {root}")


def describe_config(cfg: DictConfig) -> str:
    """The description's label of a training config on the submitting side."""
    if cfg.get("sync") is None or cfg.get("model") is None:
        return "run"
    data = OmegaConf.to_container(cfg, resolve=False)
    try:
        world = world_size(cfg)
    except ValueError:  # a launcher value not resolved yet ("auto")
        world = None
    lc = cfg.launcher
    nodes = len(lc.hosts) if lc.get("hosts") else lc.get("nodes")
    if world is None and lc.get("name") == "local" and lc.get("nproc_per_node") is None:
        from ..world.env import default_nproc  # what the local launcher will start

        world = default_nproc()
    return describe_run(data, {"world_size": world, "nodes": nodes if world else None}).label()


def _mkdir(path: Path, exist_ok: bool) -> None:
    """`mkdir -p`, again if a folder on the way vanished meanwhile: a command starting at the same
    time probes a new run.root by making and removing it (validate.folder_problem), only while it
    is empty, so a few tries win."""
    for attempt in range(100):
        try:
            path.mkdir(parents=True, exist_ok=exist_ok)
            return
        except FileNotFoundError:
            if attempt == 99:
                raise


def write_config(cfg: DictConfig, run_dir: Path) -> Path:
    """The run's config.yaml, resolved, written atomically."""
    path = run_dir / "config.yaml"
    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))
    return path


RESUME_MODES = ("auto", "true", "false")
# settings that change what a run computes: a run folder continues only under the same ones
# (launcher, world size, timing, logging and train.epochs may change between allocations)
SAME_RUN_KEYS = ("model", "optim", "sync", "data.name", "data.normalize", "train.batch_size",
                 "train.global_batch", "train.micro_batch", "train.lr", "train.seed",
                 "train.max_steps_per_epoch")


def resume_mode(value) -> str:
    """train.resume as auto | true | false (YAML may hand a bool or a string)."""
    text = str(value).strip().lower()
    return {"yes": "true", "no": "false", "1": "true", "0": "false"}.get(text, text)


# the marker of a folder a dry run rendered: nothing ever ran in it
DRY_RUN = "DRY_RUN"


def is_dry_run(run_dir: Path) -> bool:
    """A folder that only holds what `launcher.dry_run=true` rendered (one whose script was then
    run by hand has logs or a summary: a run)."""
    run_dir = Path(run_dir)
    if not (run_dir / DRY_RUN).is_file() or (run_dir / "summary.json").exists():
        return False
    try:
        return not any((run_dir / "logs").iterdir())
    except OSError:
        return True


def read_summary(run_dir: Path) -> dict:
    """The folder's summary.json ({} when there is none yet, or it cannot be read)."""
    return read_json_or_empty(run_dir / "summary.json")


def folder_state(run_dir: Path) -> dict:
    """What `run_dir` holds (newest checkpoint, summary, epoch records), from small files only."""
    ckpts = sorted(checkpoints(run_dir / "checkpoints"))
    summary = read_summary(run_dir)
    return {"checkpoint": ckpts[-1][0] if ckpts else None,
            "checkpoint_name": ckpts[-1][1].name if ckpts else None,
            "records": len(read_metrics(run_dir / "metrics.jsonl")[0]),
            "status": summary.get("status"),
            "epochs": summary.get("epochs"), "summary": summary}


_CKPT_NAME = re.compile(r"epoch_(\d+)(?:_step_(\d+))?\.pt$")


def checkpoints(ckpt_dir: Path) -> list[tuple[tuple[int, int], Path]]:
    """The checkpoints of a folder (unordered; none if no folder) with the (epochs done, steps of
    the next epoch) their names stand for: `epoch_0003.pt`, `epoch_0003_step_000120.pt` (a temp
    file's name never matches)."""
    if not ckpt_dir.is_dir():
        return []
    found = ((_CKPT_NAME.match(p.name), p) for p in ckpt_dir.iterdir())
    return [((int(m.group(1)), int(m.group(2) or 0)), p) for m, p in found if m]


def describe_state(state: dict) -> str:
    """`folder_state` in words: `status stopped, checkpoint after 2 epoch(s), 3 epoch record(s)`."""
    parts = [f"status {str(state['status']).split(':')[0]}"] if state["status"] else []
    if state["checkpoint"]:
        e, s = state["checkpoint"]
        parts.append(f"checkpoint after {e} epoch(s)" + (f" + {s} steps" if s else ""))
    if state["records"]:
        parts.append(f"{state['records']} epoch record(s)")
    return ", ".join(parts) or "files of a run"


def world_size(cfg: DictConfig) -> Optional[int]:
    """The ranks a resolved config starts: mpirun's host slots summed, else nodes x processes per
    node; None before the launcher resolved it."""
    lc = cfg.get("launcher") or {}
    if lc.get("hosts"):
        slots = [str(h).rpartition(":")[2] for h in lc.hosts]
        return sum(map(int, slots)) if all(s.isdigit() for s in slots) else None
    if lc.get("nodes") and lc.get("nproc_per_node"):
        return int(lc.nodes) * int(lc.nproc_per_node)
    return None


def reuse_problem(cfg: DictConfig) -> Optional[str]:
    """Why the command may not use cfg.run.dir as it stands (None: it may). A folder that holds a
    run's results is continued (train.resume auto/true) under the same settings, never overwritten;
    a completed run is left as it is."""
    mode = resume_mode(cfg.train.resume)
    if mode not in RESUME_MODES:
        return f"train.resume={cfg.train.resume}: choose auto, true or false"
    if not cfg.run.dir:
        if mode == "true":
            return "train.resume=true needs run.dir=PATH, the run folder to continue"
        return None
    run_dir = Path(cfg.run.dir).expanduser()
    state = folder_state(run_dir) if run_dir.is_dir() else None
    if mode == "true" and (state is None or state["checkpoint"] is None):
        return (f"train.resume=true but {run_dir}/checkpoints holds no checkpoint: point run.dir "
                "at a run that completed at least one epoch (or use train.resume=auto)")
    if state is None:
        return None
    if not (state["checkpoint"] is not None or state["records"] > 0
            or str(state["status"]).split(":")[0] in ("completed", "stopped", "preempted")):
        return None  # no results
    what = describe_state(state)
    if mode == "false":
        return (f"run.dir={run_dir} holds a run ({what}): continue it with train.resume=auto, "
                "or give a new run.dir (or none, for a fresh folder under run.root)")
    if state["checkpoint"] is None:
        return (f"run.dir={run_dir} holds a run's results ({what}) but no checkpoint to continue "
                "from: give a new run.dir (or none, for a fresh folder under run.root)")
    old_path = run_dir / "config.yaml"
    if old_path.is_file():
        old = OmegaConf.load(old_path)
        diffs = setting_differences(old, cfg)
        was, now = world_size(old), world_size(cfg)
        world_changes = bool(was and now and was != now and not cfg.train.global_batch
                             and not cfg.train.get("allow_world_change"))
        b = cfg.train.batch_size
        # every one at once: a user fixes them in one go
        if diffs:
            also = (f"; and it trained on {was} ranks, this command runs {now} (weak scaling: "
                    "train.allow_world_change=true continues anyway)") if world_changes else ""
            return (f"run.dir={run_dir} holds a run with other settings than this command's "
                    f"({len(diffs)} differ): " + ", ".join(
                        f"{key}={_short(w)} (this command: {_short(n)})" for key, w, n in diffs)
                    + f"{also}: continue it with its own settings, or give a new run.dir")
        if world_changes:
            return (f"run.dir={run_dir} trained on {was} ranks, this command runs {now}: under "
                    f"weak scaling its global batch goes from {b * was} to {b * now} samples a "
                    "step; continue anyway with train.allow_world_change=true, or run "
                    f"{was} ranks (or fix the batch with train.global_batch={b * was})")
    epochs, step = state["checkpoint"]
    if step == 0 and epochs >= cfg.train.epochs:
        return (f"run.dir={run_dir} holds a completed run of {epochs} epoch(s) ({what}): "
                f"set train.epochs above {epochs} to train it further, or give a new run.dir")
    return None


def setting_differences(old: DictConfig, new: DictConfig) -> list[tuple[str, object, object]]:
    """(key, the folder's value, the command's) for each SAME_RUN_KEYS setting that differs: a
    group by its option where that differs (`sync`), else each option of it that does
    (`sync.bucket_mb`)."""
    out = []
    for key in SAME_RUN_KEYS:
        was, now = (OmegaConf.to_container(v) if isinstance(v, DictConfig) else v
                    for v in (OmegaConf.select(old, key), OmegaConf.select(new, key)))
        if was is None or was == now:
            continue
        if isinstance(was, dict) and isinstance(now, dict) and was.get("name") == now.get("name"):
            out += [(f"{key}.{k}", was.get(k), now.get(k)) for k in dict.fromkeys([*was, *now])
                    if was.get(k) != now.get(k)]
        else:
            out.append((key, was, now))
    return out


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return value.get("name", str(value))
    return str(value)


def mark_failed(run_dir: Path, status: str, fields: Optional[dict] = None) -> dict:
    """summary.json says `status` (a failure), its open segment closed; `fields` fill gaps."""
    summary = read_summary(run_dir)
    summary["status"] = status
    for key, value in (fields or {}).items():
        summary.setdefault(key, value)
    segments = summary.get("segments")
    if isinstance(segments, list) and segments and isinstance(segments[-1], dict) \
            and segments[-1].get("status") == "running":
        segments[-1].update(status="failed", end=now_iso())
    write_json(run_dir / "summary.json", summary)
    return summary


STOP_FILE = "STOP"
# `python -m ddp_lab` after a graceful stop (EX_TEMPFAIL: try again later)
EXIT_STOPPED = 75
# the codes of a stop: the higher wins when ranks disagree
PREEMPTED, STOPPED = 1, 2
STATUS = {PREEMPTED: "preempted", STOPPED: "stopped"}


def request_stop(run_dir: Path, status: str = "stopped", reason: str = "") -> Path:
    """Ask a running job to stop at its next check: stopped (a person) or preempted (continue)."""
    if status not in STATUS.values():
        raise ValueError(f"stop status {status!r}: choose stopped or preempted")
    path = Path(run_dir) / STOP_FILE
    atomic_write_text(path, f"{status} {reason}".strip() + "\n")
    return path


def read_stop_file(run_dir: Path) -> Optional[tuple[int, str]]:
    """The request's code and reason; None when there is none."""
    try:
        text = (Path(run_dir) / STOP_FILE).read_text().strip()
    except OSError:
        return None
    word, _, rest = text.partition(" ")
    code = PREEMPTED if word == "preempted" else STOPPED
    return code, f"stop file ({rest or word})"


def clear_stop_file(run_dir: Path) -> None:
    """A new segment of the run starts: an old request is spent."""
    (Path(run_dir) / STOP_FILE).unlink(missing_ok=True)
