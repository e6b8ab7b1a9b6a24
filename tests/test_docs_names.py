"""Every example run-folder name in the guide (README.md, docs/*.md; docs/log/ keeps its runs
as they were named then) is one today's naming gives: `<label>_<YYYY-mm-dd>_<HH-MM-SS>`, the
label made by the code that names the folder, for a config with the settings the label
reads as:

- a training run (folder/rundir.make_run_dir): its run description's label
  (rundir.describe_config, ddp_lab/folder/description.py), `ring-prepost_w2_mlp_sgd`;
- a study (under `studies/`): study.label_of, `ring_mlp_local`;
- a benchmark: `bench_<launcher>` (bench/submit.py);
- a doctor's check of an allocation: `doctor` (doctor/submit.py, folder/doctor.KIND).

The label is read part by part as Description.parts writes it (the sync and its options,
w<world>[n<nodes>], the model, then optim, launcher, batch, lr, entry), the config composed
with those overrides, and named by the code: the name must come back the same. A date-first
name (`2026-11-23_10-43-20_ddp_mlp_local`, the old naming), a placeholder of that shape
(`<date>_<time>_bench_<launcher>`) or a label no config gets (`adam_<date>_<time>`) fails,
with its page and line. Composes configs only; starts no process.
"""

from __future__ import annotations

import datetime
import re
from functools import cache
from pathlib import Path
from typing import Optional

from helpers import REPO, compose

from ddp_lab.folder.description import sync_options

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
STAMP = r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}"
WORD = r"[A-Za-z0-9][A-Za-z0-9._-]*"
# a word holding a time stamp, or a name's placeholder `<date>_<time>`, with what precedes it
STAMPED = re.compile(rf"(?P<before>\S*?)(?P<name>(?:{WORD})?{STAMP}[A-Za-z0-9._-]*)")
PLACEHOLDER = re.compile(rf"(?P<before>\S*?)(?P<name>(?:{WORD}_)?<date>_<time>(?:_{WORD}|_<\w+>)*)")
NAME = re.compile(rf"(?P<label>{WORD})_(?P<stamp>{STAMP}|<date>_<time>)(?:_\d+)?")


def examples() -> list[tuple[str, str, str]]:
    """(page:line, the name, the text before it on its word) of every example name."""
    found = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for rx in (STAMPED, PLACEHOLDER):
                for m in rx.finditer(line):
                    if m["name"].startswith("<date>") and m["before"].endswith(">_"):
                        continue  # `<what differs>_<date>_<time>`: the label a placeholder too
                    found.append((f"{page.relative_to(REPO)}:{n}", m["name"].rstrip(".,;:)"),
                                  m["before"]))
    return found


@cache
def options(group: str) -> tuple[str, ...]:
    """conf/<group>/'s options, longest first (a prefix match takes the longest)."""
    names = [p.stem for p in (REPO / "conf" / group).glob("*.yaml")]
    return tuple(sorted(names, key=len, reverse=True))


def _option(text: str, group: str) -> Optional[str]:
    """The option of `group` that `text` starts with, as a whole part (`_` or end after it)."""
    return next((o for o in options(group) if text == o or text.startswith(o + "_")
                 or (group == "sync" and text.startswith(o + "-"))), None)


def _sync_option(rest: str, sync: str) -> Optional[tuple[str, str, str]]:
    """(override, what is left) for the option token `rest` starts with, as
    description._token writes it: `prepost`, `noprepost`, `fp16`, `bucket_mb0`, `inter-library`."""
    end = r"(?=[-_]|$)"
    for key, default in sorted(sync_options(sync).items(), key=lambda kv: -len(kv[0])):
        if isinstance(default, bool):
            forms = [(key, "true"), ("no" + key, "false")]
            for word, value in forms:
                m = re.match(re.escape(word) + end, rest)
                if m:
                    return f"sync.{key}={value}", rest[m.end():], word
        elif key == "compress":
            m = re.match(r"(fp16|bf16|powersgd)" + end, rest)
            if m:
                return f"sync.compress={m[1]}", rest[m.end():], m[1]
        else:
            m = re.match(re.escape(key) + r"-?([A-Za-z0-9.]+)" + end, rest)
            if m:
                return f"sync.{key}={m[1]}", rest[m.end():], m[0]
    return None


def run_overrides(label: str) -> Optional[list[str]]:
    """The overrides of a training config whose description label reads `label`; None
    where a part is none Description.parts writes."""
    sync = _option(label, "sync")
    if sync is None:
        return None
    over, rest = [f"sync={sync}"], label[len(sync):]
    while rest.startswith("-"):  # the sync's options
        found = _sync_option(rest[1:], sync)
        if found is None:
            return None
        over.append(found[0])
        rest = found[1]
    rest = rest.removeprefix("_")
    m = re.match(r"w(\d+)(?:n(\d+))?(?=_|$)", rest)
    if m:
        world, nodes = int(m[1]), int(m[2] or 1)
        over.append(f"launcher.nproc_per_node={world // nodes}")
        if nodes > 1:
            over.append(f"launcher.nodes={nodes}")
        rest = rest[m.end():].removeprefix("_")
    model = _option(rest, "model")
    if model is None:
        return None
    over.append(f"model={model}")
    rest = rest[len(model):].removeprefix("_")
    if rest.endswith("one_file"):  # the entry's last part, itself with a `_`
        over.append("run.entry=ddp_lab.rank.one_file")
        rest = rest.removesuffix("one_file").rstrip("_")
    for part in filter(None, rest.split("_")):
        simple = {"gb": "train.global_batch", "mb": "train.micro_batch", "b": "train.batch_size",
                  "lr": "train.lr"}
        m = re.fullmatch(r"(gb|mb|b|lr)(\d[\d.e-]*)", part)
        if part in options("optim"):
            over.append(f"optim={part}")
        elif part in options("launcher"):
            over.append(f"launcher={part}")
        elif m:
            over.append(f"{simple[m[1]]}={m[2]}")
        else:
            return None
    return over


def problem(name: str, before: str) -> Optional[str]:
    """Why `name` is not a folder name today's naming gives (None: it is one)."""
    from ddp_lab.command.study import label_of
    from ddp_lab.folder.rundir import describe_config

    m = NAME.fullmatch(name)
    if m is None:
        return "not <label>_<date>_<time> (the label first, as folders are named now)"
    if m["stamp"] != "<date>_<time>":
        try:
            datetime.datetime.strptime(m["stamp"], "%Y-%m-%d_%H-%M-%S")
        except ValueError:
            return f"{m['stamp']} is no date and time"
    label = m["label"]
    if label.startswith("bench_"):
        return None if label[6:] in options("launcher") else f"bench_<launcher>: {label[6:]}?"
    from ddp_lab.folder.doctor import KIND

    if label == KIND:
        return None
    if before.endswith("studies/"):
        parts = label.split("_")
        sync, model = _option(label, "sync"), None
        if sync is not None:
            model = _option(label[len(sync) + 1:], "model")
        if sync is None or model is None:
            return f"no study's label reads {label} (<sync>_<model>_<launcher>)"
        launcher = label[len(sync) + len(model) + 2:]
        if launcher not in options("launcher"):
            return f"no study's label reads {label} (<sync>_<model>_<launcher>)"
        cfg = compose(f"sync={sync}", f"model={model}", f"launcher={launcher}")
        return None if label_of(cfg) == label else f"a study of those settings is {label_of(cfg)}"
    over = run_overrides(label)
    if over is None:
        return f"no run's description label reads {label}"
    made = describe_config(compose(*over))
    return None if made == label else f"a run of {' '.join(over)} is named {made}, not {label}"


def test_the_reader_reads_what_the_namer_writes():
    """The check itself: names the code makes for real configs pass, old and made-up ones
    fail."""
    from ddp_lab.folder.rundir import describe_config

    for over in (["sync=ring", "sync.prepost=true", "optim=sgd"], ["model=mlp_wide"],
                 ["sync=allreduce", "sync.compress=fp16", "sync.bucket_mb=0", "train.lr=0.01"],
                 ["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=4", "model=cnn"],
                 ["sync=reduce_broadcast", "train.batch_size=128", "run.entry=ddp_lab.rank.one_file"],
                 ["sync=hierarchical", "sync.inter=ring"]):
        label = describe_config(compose(*over))
        assert problem(f"{label}_2026-11-21_19-44-55", "") is None, (over, label)
    assert problem("ring_mlp_local_2026-11-23_13-47-41", "outputs/studies/") is None
    assert problem("bench_local_2026-11-23_13-47-41", "") is None
    for bad, before in (("2026-11-23_10-43-20_ddp_mlp_local", ""), ("adam_<date>_<time>", ""),
                        ("ddp_mlp_local_2026-11-23_10-43-20", ""), ("ddp_w2_mlp_local_<date>_<time>", ""),
                        ("<date>_<time>_bench_<launcher>", ""),
                        ("2026-11-23_13-47-41_ring_mlp_local", "studies/")):
        assert problem(bad, before) is not None, bad


def test_every_example_folder_name_is_one_the_naming_gives():
    names = examples()
    assert len(names) >= 3, names  # the README's resume example at least
    wrong = [f"{where}: {name}: {problem(name, before)}" for where, name, before in names
             if problem(name, before)]
    assert not wrong, "\n".join(wrong)
