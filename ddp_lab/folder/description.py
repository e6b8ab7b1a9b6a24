"""One description of a run: what it trains (`workload`: model, data, batch, micro-batch,
optimiser), how (`setting`: sync and its options, world, nodes, launcher, device, entry), its
`length`, and a short label of what sets it apart. The report, status, TensorBoard, run folder
names, the sweep and a study all read it; two runs are repeats of one point only when workload and
setting agree. Only non-default options are named, a default being conf/sync/<name>.yaml over its
schema, so a new option needs no change here. Torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import yaml

from ..config import conf_dir
from ..config.student import is_spec, module_of, spec_label, split_spec
from ..config.sync import SYNC_SCHEMAS

TRAINER = "ddp_lab.worker"  # run.entry of a ddp_lab training run
TRAIN_DEFAULTS = {"batch_size": 64, "global_batch": 0, "micro_batch": 0, "lr": 1e-3}


@functools.lru_cache(maxsize=None)
def group_defaults(group: str, option: str) -> dict:
    """conf/<group>/<option>.yaml's values over its schema's defaults (sync); {} if unknown."""
    out: dict = {}
    schema = SYNC_SCHEMAS.get(option) if group == "sync" else None
    if schema is not None:
        for f in dataclasses.fields(schema):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                out[f.name] = f.default_factory()  # type: ignore[misc]
    try:
        with open(conf_dir() / group / f"{option}.yaml") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError:
        data = {}
    out.update({k: v for k, v in data.items() if k != "defaults"})
    return out


def sync_options(name: str) -> dict:
    """sync=<name>'s option keys and their defaults (the `name` key left out)."""
    return {k: v for k, v in group_defaults("sync", name).items() if k != "name"}


def _differs(value: Any, default: Any) -> bool:
    if isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return abs(float(value) - default) > 1e-12 * max(1.0, abs(default))
    return value != default


def non_default(section: Mapping, group: str) -> dict:
    """The keys of a composed group section that differ from its option's defaults."""
    name = section.get("name")
    if not name:
        return {}
    defaults = group_defaults(group, str(name))
    return {k: v for k, v in section.items()
            if k in defaults and k != "name" and _differs(v, defaults[k])}


def _token(key: str, value: Any) -> str:
    """An option in a name: `prepost`, `noprepost`, `fp16`, `bucket_mb0`, `inter-library`."""
    if isinstance(value, bool):
        return key if value else f"no{key}"
    if isinstance(value, str) and is_spec(value):
        # a student's function (sync=custom): its name
        return spec_label(value)
    if key == "compress":
        return str(value)
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{key}{text}" if text[:1].isdigit() or text[:1] == "-" else f"{key}-{text}"


@dataclass(frozen=True)
class Description:
    workload: tuple  # ((key, value), ...): what is trained
    setting: tuple  # ((key, value), ...): how
    length: tuple  # (epochs, steps per epoch cap): within which epoch times compare

    @property
    def w(self) -> dict:
        return dict(self.workload)

    @property
    def s(self) -> dict:
        return dict(self.setting)

    @property
    def sync(self) -> str:
        return str(self.s.get("sync") or "?")

    @property
    def options(self) -> dict:
        """The sync's options that are not its defaults."""
        return dict(self.s.get("options") or ())

    @property
    def series(self) -> tuple:
        """What a scaling line is: the setting without the world and nodes."""
        return tuple((k, v) for k, v in self.setting if k not in ("world", "nodes"))

    def sync_label(self) -> str:
        """The synchroniser with what is not its default (`ring prepost=true`), and the entry when
        it is not the trainer."""
        entry = self.s.get("entry")
        words = [self.sync] + [f"{k}={_yaml(v)}" for k, v in self.options.items()]
        return " ".join(words + ([f"entry={entry}"] if entry else []))

    def series_label(self) -> str:
        """`sync_label` and a launcher that is not the default, for a report's series."""
        s = self.s
        extra = [f"{k}={s[k]}" for k in ("launcher",) if s.get(k) not in (None, "local")]
        return " ".join([self.sync_label(), *extra])

    def label(self, repeat: Optional[int] = None) -> str:
        """The short name of the run: `ring-prepost_w3_mlp`, `ddp_w2_mlp_wide`,
        `allreduce-fp16-overlap_w8n2_cnn_sgd_b128_r3`, `ring_w2_mlp_one_file`."""
        return safe("_".join(self.parts(repeat)))

    def parts(self, repeat: Optional[int] = None) -> list[str]:
        """The label's parts: the sync with its options, the world, the model, ..."""
        s, w = self.s, self.w
        head = "-".join([self.sync, *(_token(k, v) for k, v in self.options.items())])
        parts = [head]
        if s.get("world"):
            nodes = s.get("nodes") or 1
            parts.append(f"w{s['world']}" + (f"n{nodes}" if nodes > 1 else ""))
        parts.append(str(w.get("model") or "?"))
        parts += [_token(k, v) for k, v in (w.get("model_options") or ())]
        for g, default in DEFAULT_GROUPS.items():
            value = w.get(g) if g in w else s.get(g)
            if value and value != default:
                parts.append(str(value))
        if w.get("global_batch"):
            parts.append(f"gb{w['global_batch']}")
        elif w.get("batch_size") not in (None, TRAIN_DEFAULTS["batch_size"]):
            parts.append(f"b{w['batch_size']}")
        if w.get("micro_batch"):
            parts.append(f"mb{w['micro_batch']}")
        if w.get("lr") is not None and _differs(w["lr"], TRAIN_DEFAULTS["lr"]):
            parts.append(f"lr{w['lr']:g}")
        if s.get("entry"):
            parts.append(str(s["entry"]).rsplit(".", 1)[-1])
        if repeat:
            parts.append(f"r{repeat}")
        return [safe(p) for p in parts]

    def workload_words(self, length: bool = False) -> str:
        """`mlp, adam, batch 64/rank`; with `length`: `, 20 steps/epoch, 2 epochs`."""
        w = self.w
        batch = (f"global batch {w['global_batch']} (strong scaling)" if w.get("global_batch")
                 else f"batch {w.get('batch_size')}/rank")
        model = str(w.get("model"))
        if w.get("model_options"):
            model += " (" + ", ".join(f"{k}={_yaml(v)}" for k, v in w["model_options"]) + ")"
        words = [model, str(w.get("optim")), batch]
        if w.get("micro_batch"):
            words.append(f"micro {w['micro_batch']}")
        if w.get("lr") is not None and _differs(w["lr"], TRAIN_DEFAULTS["lr"]):
            words.append(f"lr {w['lr']:g}")
        if w.get("pipeline") and w["pipeline"] != "tensor":
            words.append(f"{w['pipeline']} pipeline")
        if length:
            epochs, cap = self.length
            words.append(f"{cap} steps/epoch" if cap else "full epochs")
            if epochs:
                words.append(plural(epochs, "epoch"))
        return ", ".join(words)

    def hparams(self) -> dict:
        """Flat name -> value for TensorBoard's HParams: every setting and workload key, and every
        sync option as `sync.<key>`, defaults included (so runs line up in one table)."""
        out: dict[str, Any] = {}
        for k, v in self.setting:
            if k != "options" and v is not None:
                out["world_size" if k == "world" else k] = v
        for k, v in sync_options(self.sync).items():
            v = self.options.get(k, v)
            out[f"sync.{k}"] = v if isinstance(v, (bool, int, float, str)) else str(v)
        out.update((k, v) for k, v in self.workload if v is not None and k != "model_options")
        for k, v in (self.w.get("model_options") or ()):
            out[f"model.{k}"] = v if isinstance(v, (bool, int, float, str)) else str(v)
        out["scaling"] = "strong" if self.w.get("global_batch") else "weak"
        out["epochs"], out["max_steps_per_epoch"] = self.length
        return out

    @classmethod
    def from_hparams(cls, hp: Mapping) -> "Description":
        """The description back from its hparams (the ranks' `world_size` etc. included)."""
        sync = {"name": hp.get("sync")}
        # in the schema's order, as a config has them
        for k in sync_options(str(hp.get("sync"))):
            if f"sync.{k}" in hp or k in hp:
                sync[k] = hp.get(f"sync.{k}", hp.get(k))
        model = {"name": hp.get("model"), **{k[6:]: v for k, v in hp.items() if k.startswith("model.")}}
        strong = hp.get("scaling") == "strong"
        config = {"sync": sync, "model": model, "optim": {"name": hp.get("optim")},
                  "launcher": {"name": hp.get("launcher")},
                  "data": {"name": hp.get("data"), "pipeline": hp.get("pipeline")},
                  "run": {"entry": hp.get("entry")},
                  "train": {"batch_size": hp.get("batch_size"), "lr": hp.get("lr"),
                            "global_batch": hp.get("global_batch") if strong else 0,
                            "micro_batch": hp.get("micro_batch"), "epochs": hp.get("epochs"),
                            "max_steps_per_epoch": hp.get("max_steps_per_epoch")}}
        return describe_run(config, {"world_size": hp.get("world_size", hp.get("world")),
                                     "nodes": hp.get("nodes"), "device": hp.get("device")})


def describe_run(config: Mapping, summary: Optional[Mapping] = None) -> Description:
    """What a run is, from its config (plain data, resolved or composed) and its summary.json where
    it has one (the world and device as the ranks found them)."""
    config, summary = config or {}, summary or {}
    sync = dict(config.get("sync") or {})
    model = dict(config.get("model") or {})
    train = dict(config.get("train") or {})
    launcher = dict(config.get("launcher") or {})
    sync_name = sync.get("name") or summary.get("sync")
    options = tuple(non_default(sync, "sync").items()) if sync else ()
    if not sync and summary.get("compress") not in (None, "none"):
        options = (("compress", summary["compress"]),)
    nodes = summary.get("nodes") or (len(launcher["hosts"]) if launcher.get("hosts") else launcher.get("nodes"))
    world = summary.get("world_size")
    if world is None and isinstance(launcher.get("nproc_per_node"), int) and isinstance(nodes, int):
        world = nodes * launcher["nproc_per_node"]
    entry = (config.get("run") or {}).get("entry") or summary.get("entry")
    device = summary.get("device") or (config.get("dist") or {}).get("device")
    if device is not None:
        device = "cpu" if str(device).split(":")[0].strip().lower() == "cpu" else str(device)
    if device == "auto":
        device = None
    setting = (("sync", sync_name), ("options", options), ("world", world), ("nodes", nodes),
               ("launcher", launcher.get("name") or summary.get("launcher")), ("device", device),
               ("entry", None if entry in (None, TRAINER) else entry))
    global_batch = int(train.get("global_batch") or summary.get("global_batch") or 0) \
        if (train.get("global_batch") or summary.get("scaling") == "strong") else 0
    model_name = model.get("name") or summary.get("model")
    model_opts = tuple(non_default(model, "model").items()) if model else ()
    data = config.get("data") or {}
    workload = (("model", model_name), ("model_options", model_opts),
                ("data", data.get("name") or "mnist"),
                ("batch_size", None if global_batch else (train.get("batch_size") or summary.get("batch_size"))),
                ("global_batch", global_batch or None),
                # a micro-batch only where one was asked for (summary.json's is the batch as used,
                # the whole one without accumulation)
                ("micro_batch", (int(train.get("micro_batch") or 0) if train else
                                 int(summary.get("micro_batch") or 0)
                                 if (summary.get("accumulation") or 1) > 1 else 0) or None),
                ("optim", (config.get("optim") or {}).get("name") or summary.get("optim")),
                ("lr", train.get("lr")),
                ("pipeline", data.get("pipeline") or summary.get("pipeline")))
    length = (summary.get("epochs") or train.get("epochs"), int(train.get("max_steps_per_epoch") or 0))
    return Description(workload, setting, length)


def differing_labels(descs: list[Description]) -> list[str]:
    """Each run's label cut to the parts that differ among `descs` (the sync always kept):
    `ring-prepost`, `ring` for a prepost sweep; `ddp_mlp`, `ddp_mlp_wide` for two models."""
    parts = [d.parts() for d in descs]
    if len(descs) < 2:
        return ["_".join(p) for p in parts]
    common = set.intersection(*(set(p[1:]) for p in parts))
    return [safe("_".join([p[0], *(x for x in p[1:] if x not in common)])) for p in parts]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _yaml(v: Any) -> str:
    if isinstance(v, str) and is_spec(v) and not module_of(v):
        # a student's file: its name, not its folder
        path, fn, _ = split_spec(v)
        return f"{os.path.basename(path)}:{fn}" if fn else os.path.basename(path)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def sweep_extra(overrides: Iterable[str], label: str) -> str:
    """The swept overrides whose value a run's label does not show already (train.seed,
    train.epochs, ...): `seed1`; '' when the label names them all."""
    parts = []
    have = set(label.split("_")) | set(label.split("_")[0].split("-"))
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        top = key.split(".")[0]
        if top in ("sync", "model", "optim", "launcher") or key in (
                "train.batch_size", "train.global_batch", "train.micro_batch", "train.lr",
                "launcher.nproc_per_node", "launcher.nodes", "run.entry"):
            # the label names these when they differ from the default
            continue
        leaf = key.rsplit(".", 1)[-1]
        v = safe(value)
        token = leaf + (v if v[:1].isdigit() else f"-{v}")
        if token not in have:
            parts.append(token)
    return safe("_".join(parts))


# groups named only when not conf/config.yaml's default (sync and model: always)
DEFAULT_GROUPS = {"optim": "adam", "launcher": "local"}
# a name longer than this is cut: file systems and sidebars both have limits
MAX_LEN = 60


def sweep_name(overrides: Iterable[str]) -> str:
    """A sweep job's name from the overrides the sweep varies, in their order: a group's option as
    it is (`sync=ring` -> `ring`), a key by its last part and value (`train.lr=0.1` -> `lr0.1`,
    `sync.compress=fp16` -> `compress-fp16`)."""
    parts = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        value = safe(value)
        if "." not in key:
            parts.append(value)
        else:
            leaf = key.rsplit(".", 1)[1]
            parts.append(leaf + (value if value[:1].isdigit() else f"-{value}"))
    return safe("_".join(p for p in parts if p))


def safe(text: str) -> str:
    """Letters, digits, `.`, `-` and `_` only (a path and a shell word as it is), at most MAX_LEN
    characters: `[256,256]` -> `256-256`."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return text[:MAX_LEN].rstrip("-._")
