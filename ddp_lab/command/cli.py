"""The Hydra entry of `python -m ddp_lab` and `python -m ddp_lab.bench`.

The one place where a user mistake (ddp_lab's `UserError`, Hydra's composition errors)
becomes `error: <one line>` on stderr and exit 2, where Hydra would print several lines and
exit 1. A -m sweep is Hydra's; `SweepTable` (a Hydra callback) prints one row per job.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from types import ModuleType
from typing import Callable, Optional, Sequence

import hydra
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from ..config.errors import UserError
from ..config import CONF_DIR
from .job import Outcome
from ..folder.description import describe_run, differing_labels, sweep_extra
from ..folder.names import sweep_name
from ..folder.rundir import describe_config, read_summary

# Hydra's lines that are noise once its message is one line
_NOISE = re.compile(r"^(Set the environment variable HYDRA_FULL_ERROR|See https://hydra\.cc|"
                    r"reference_type=|object_type=|full_key:|To append to your config use)")


def cli(config_name: str, submit_fn: Callable[[DictConfig], Outcome],
        check_fn: Callable[[DictConfig], object], schemas: Sequence[ModuleType] = ()) -> None:
    """Compose `conf/<config_name>.yaml`, run `submit_fn` per job (one, or each of a -m
    sweep; every job checked by `check_fn` before the first starts), and exit with the
    failed job's status (2 for a user mistake). `schemas`: the dataclass modules that type
    the config, for "did you mean" hints."""
    flags = (command_line_mistake(sys.argv[1:], lambda: _defaults(config_name))
             or group_value_mistake(sys.argv[1:]))
    if flags:
        print(f"error: {flags}", file=sys.stderr)
        sys.exit(2)
    failed: list[int] = []
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    swept = _swept_keys(sys.argv[1:])

    def task(cfg: DictConfig) -> Outcome:  # Hydra hands the Outcome to SweepTable
        _restore_env("HYDRA_FULL_ERROR", full_error)  # the job's processes see the user's env
        if swept and not cfg.run.get("name"):  # a sweep's job is named by what it varies
            cfg.run.name = job_name(cfg, [o for o in HydraConfig.get().overrides.task
                                          if _key(o) in swept])
        try:
            outcome = submit_fn(cfg)
        except UserError as e:
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            outcome = Outcome(2, f"error: {one_line(str(e))}")
        except (HydraException, OmegaConfBaseException) as e:
            # the config read as the job starts (`~sync`, an interpolation to no key):
            # one line, where Hydra adds its own "Error executing job with overrides"
            print(f"error: {hydra_message(e, schemas)}", file=sys.stderr)
            outcome = Outcome(2, f"error: {hydra_message(e, schemas)}")
        finally:
            os.environ["HYDRA_FULL_ERROR"] = "1"
        if outcome.rc != 0:
            failed.append(outcome.rc)
        return outcome

    # with HYDRA_FULL_ERROR Hydra raises its errors to us instead of printing them: we
    # print one line of our own (and no traceback, whatever the user's setting)
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        if _plain_run(sys.argv[1:]):
            _run_once(config_name, task, sys.argv[1:])
        else:
            if {"-m", "--multirun"} & set(sys.argv[1:]):
                _check_sweep(config_name, sys.argv[1:], check_fn)
            hydra.main(version_base=None, config_path=str(CONF_DIR), config_name=config_name)(task)()
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {hydra_message(e, schemas)}", file=sys.stderr)
        sys.exit(2)
    except UserError as e:  # from _check_sweep
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(2)
    finally:
        _restore_env("HYDRA_FULL_ERROR", full_error)
    sys.exit(failed[0] if len(failed) == 1 else (1 if failed else 0))


def job_name(cfg: DictConfig, swept: list[str]) -> Optional[str]:
    """A sweep job's folder name: a training run's description label (what sets it apart
    from any other run: `ring-prepost_w3_mlp`, `ddp_w2_mlp_wide`) and the swept values it
    does not show (`seed1`); another entry point's job (a bench), the swept values."""
    if cfg.get("sync") is not None and cfg.get("model") is not None:
        label = describe_config(cfg)
        return "_".join(p for p in (label, sweep_extra(swept, label)) if p) or None
    return sweep_name(swept) or None


class SweepTable(Callback):
    """A -m sweep ends with one row per job (`sweep_table`), so its last lines say what
    failed. Hydra calls it with each job's `Outcome`: conf/config.yaml and conf/bench.yaml
    register it under hydra.callbacks."""

    def __init__(self) -> None:
        self.jobs: list[tuple[int, list[str], Outcome]] = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        # a single run has no table; a task that raised (a bug) has no Outcome: Hydra
        # raises it after the last job
        if config.hydra.mode == RunMode.MULTIRUN and job_return.status == JobStatus.COMPLETED:
            self.jobs.append((config.hydra.job.num, list(job_return.overrides or []),
                              job_return.return_value))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        print("\n" + sweep_table(self.jobs), flush=True)


# what a sweep is run for, per job, from its summary.json (the run's one record of them):
# (heading, summary key, format); a column only where some job has the figure (a bench
# or a dry run has none of them)
FIGURES = (("epoch (median)", "epoch_time_s_median", "{:.2f} s"),
           ("comm in flight", "comm_fraction", "{:.0%}"),
           ("exposed", "comm_exposed_fraction", "{:.0%}"),
           ("test acc", "test_accuracy", "{:.4f}"))


def sweep_table(jobs: list[tuple[int, list[str], Outcome]]) -> str:
    """The table `SweepTable` prints from `jobs` (Hydra's job number, overrides, outcome): a
    job named by the overrides that differ between jobs, with its summary.json figures
    (FIGURES), its run folder and how it ended."""
    by_key = [{o.split("=", 1)[0]: o for o in overrides} for _, overrides, _ in jobs]
    keys = list(dict.fromkeys(k for d in by_key for k in d))
    varying = [k for k in keys if len({d.get(k) for d in by_key}) > 1] or keys
    names = [" ".join(d[k] for k in varying if k in d) or "(no overrides)" for d in by_key]
    summaries = [read_summary(o.run_dir) if o.run_dir else {} for _, _, o in jobs]
    figures = [(head, key, fmt) for head, key, fmt in FIGURES
               if any(isinstance(s.get(key), (int, float)) for s in summaries)]
    runs = _run_labels(jobs, summaries)  # what each training job is, as its description says
    header = ["", "job", *(["run"] if runs else []), *(head for head, _, _ in figures),
              "run dir", "result"]
    rows = [[f"#{num}", name, *([runs[i]] if runs else []),
             *(fmt.format(s[key]) if isinstance(s.get(key), (int, float)) else "-"
               for _, key, fmt in figures),
             str(o.run_dir) if o.run_dir else "-", o.result]
            for i, ((num, _, o), name, s) in enumerate(zip(jobs, names, summaries))]
    first = 3 if runs else 2
    right = range(first, first + len(figures))  # the figures align right, as numbers do
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"sweep of {len(jobs)} job(s):"]
    for row in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(("  " + "  ".join(cells)).rstrip())
    bad = [f"#{num}" for num, _, o in jobs if o.rc != 0]
    lines.append(f"{len(bad)} of {len(jobs)} job(s) did not end ok: {', '.join(bad)}" if bad
                 else f"all {len(jobs)} job(s) ok")
    return "\n".join(lines)


def command_line_mistake(argv: list[str], defaults: Callable[[], DictConfig] = lambda: None
                         ) -> str | None:
    """What is wrong with the command line's flags, in one line, else None. A `--key value`
    flag is not a Hydra override (Hydra would print its usage): it is named with the override
    it meant (`--epochs 3`: train.epochs=3, the key found in `defaults()`); Hydra's own flag
    given a bad value gets argparse's one line."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message: str):
        raise _FlagError(message)

    parser.error = refuse  # argparse would print the usage block and exit
    try:
        known, unknown = parser.parse_known_args(argv)
    except _FlagError as e:
        return f"{e}: see --help"
    rerun = known.experimental_rerun  # Hydra reads it unchecked: a traceback
    if rerun is not None and not os.path.isfile(rerun):
        return f"--experimental-rerun {rerun}: no such file (give a job's .hydra/config.pickle)"
    flags = [a for a in unknown if a.startswith("-") and len(a) > 1]
    if not flags:
        return None
    try:
        keys = _leaves(defaults())
    except (HydraException, OmegaConfBaseException):
        keys = {}  # a config that does not compose: its own error comes once the flags are fixed
    given, fixed, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a in flags:
            key, eq, value = a.lstrip("-").partition("=")
            if not eq and i + 1 < len(argv) and argv[i + 1][:1] != "-" and "=" not in argv[i + 1]:
                value = argv[i + 1]  # `--sync ring`: its value is the next word
                a, i = f"{a} {value}", i + 1
            given.append(a)
            fixed.append(_as_override(key, value, keys))
        i += 1
    return (f"{' '.join(given)}: not a flag here: settings are key=value overrides: write "
            f"{' '.join(fixed)}")


def group_value_mistake(argv: list[str]) -> str | None:
    """A config group given something other than an option's name (`sync=3`, `model=7`,
    `study=[1,2]`, `sync=null`, `launcher=[a,b]`, `-m sync=ddp,4`), in one line naming the
    group and its options, else None. Hydra takes a group's value from the override parser
    as it comes (an int, None, a list) and fails deep in its defaults list with a traceback;
    an option's name is a string, one per group here (no group of ddp_lab's merges several).
    A line Hydra cannot parse is left to Hydra, which says why in one line."""
    words = [a for a in argv if a[:1] != "-"]
    if not words:
        return None
    parser = _parser()
    overrides = []
    for word in words:  # one by one: a word Hydra cannot parse (or `--cfg job`'s job) is
        try:            # Hydra's to refuse, and does not hide a group mistake beside it
            overrides += parser.parse_overrides([word])
        except HydraException:
            continue
    loader = parser.config_loader
    for o in overrides:
        group = o.key_or_group
        if o.is_delete() and o._value is None:
            continue  # `~sync`: no value to judge
        try:
            is_group = loader.repository.group_exists(group)
        except OSError as e:  # Hydra looks the name up as a folder: 300 characters are not one
            name = group if len(group) <= 60 else group[:40] + f"... ({len(group)} characters)"
            return f"{name}: no such key or config group ({e.strerror})"
        if not is_group:
            continue  # a key (train.epochs=3), not a group
        if o.is_sweep_override():
            try:
                values = list(o.sweep_iterator())
            except HydraException:
                continue  # a sweep Hydra cannot expand: its own line
        else:
            values = [o.value()]
        wrong = next((v for v in values if not isinstance(v, str)), _NONE)
        if wrong is _NONE:
            continue
        options = loader.get_group_options(group)
        what = ("null" if wrong is None else "a list" if isinstance(wrong, list)
                else "a mapping" if isinstance(wrong, dict) else f"the {type(wrong).__name__} {wrong}")
        return (f"{o.input_line}: {group} is a config group and takes one option's name, "
                f"not {what}: choose {', '.join(options)}"
                if options else f"{o.input_line}: {group} is a config group and takes one "
                f"option's name, not {what}")
    return None


_NONE = object()


def _defaults(config_name: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name=config_name)


def _leaves(cfg) -> dict[str, object]:
    """Every key of `cfg` (dotted) and its node, groups' keys included."""
    out: dict[str, object] = {}
    if cfg is None:
        return out

    def walk(node, prefix: str) -> None:
        for k in node.keys() if isinstance(node, DictConfig) else ():
            full = f"{prefix}{k}"
            value = node._get_node(k)
            out[full] = value
            if isinstance(value, DictConfig):
                walk(value, full + ".")

    walk(cfg, "")
    return out


def _as_override(key: str, value: str, keys: dict[str, object]) -> str:
    """The override a `--key value` flag meant: the key as the config spells it (the one
    key whose last part it names: `epochs` -> train.epochs; `dry-run` -> launcher.dry_run),
    a list key's value in brackets, a flag without a value true where the key is a bool."""
    from omegaconf import ListConfig

    named = [key, key.replace("-", "_")]
    found = next((k for k in named if k in keys), None)
    if found is None:
        matches = sorted({k for k in keys for n in named if k.rsplit(".", 1)[-1] == n})
        found = matches[0] if len(matches) == 1 else None
    key = found or key
    node = keys.get(key)
    if not value:
        value = "true" if node is not None and isinstance(getattr(node, "_val", None), bool) else "VALUE"
    elif isinstance(node, ListConfig) and value[:1] != "[":
        value = f"[{value}]"
    return f"{key}={value}"


class _FlagError(Exception):
    pass


def _run_labels(jobs: list, summaries: list[dict]) -> list[str]:
    """Each job's run, named by what sets it apart from the sweep's other runs (its
    description's label, cut to the parts that differ: description.differing_labels);
    [] when no job is a training run with a config."""
    from omegaconf import OmegaConf

    descs = []
    for (_, _, o), s in zip(jobs, summaries):
        path = o.run_dir / "config.yaml" if o.run_dir else None
        if path is None or not path.is_file():
            descs.append(None)
            continue
        try:
            config = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception:  # noqa: BLE001 -- a garbled config: the job is named by its overrides
            config = {}
        descs.append(describe_run(config, s) if config.get("sync") and config.get("model") else None)
    known = [d for d in descs if d is not None]
    if not known:
        return []
    labels = iter(differing_labels(known))
    return [next(labels) if d is not None else "-" for d in descs]


def _swept_keys(argv: list[str]) -> set[str]:
    """The keys a -m sweep varies (`sync=ddp,ring` -> sync): its jobs are named by their
    values (names.sweep_name). None for a plain run or one Hydra cannot parse (it says why)."""
    if not {"-m", "--multirun"} & set(argv):
        return set()
    try:
        overrides = _parser().parse_overrides([a for a in argv if a[:1] != "-"])
    except HydraException:
        return set()
    return {o.key_or_group for o in overrides if o.is_sweep_override()}


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def _plain_run(argv: list[str]) -> bool:
    """Overrides only: no Hydra flag (-m, --help, --cfg, ...) and no hydra.* key."""
    return not any(a.startswith("-") or a.lstrip("+~").startswith(("hydra.", "hydra/"))
                   for a in argv)


def _run_once(config_name: str, task: Callable[[DictConfig], Outcome], overrides: list[str]) -> None:
    """What `hydra.main` does for a plain run, with the config composed once: Hydra's own
    path composes it twice (first only to read `hydra.mode`, which ddp_lab's configs never
    set), about 0.5 s each here, half the time to the first line on the console."""
    app = Hydra.create_main_hydra2(task_name="ddp_lab",
                                   config_search_path=create_config_search_path(str(CONF_DIR)))
    try:
        app.run(config_name=config_name, task_function=task,
                overrides=[*overrides, "hydra.mode=RUN"])
    finally:
        GlobalHydra.instance().clear()


def _check_sweep(config_name: str, argv: list[str], check_fn: Callable) -> None:
    """Compose and check every job of a sweep first: Hydra composes each job only when
    its turn comes, after the earlier ones ran (and made their run folders)."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return  # other Hydra flags (--cfg, --config-name, ...): Hydra handles those runs
    overrides = _parser().parse_overrides([a for a in argv if a[:1] != "-"])
    batches = BasicSweeper.split_arguments(overrides, None)
    if not any(batches):
        empty = [o.input_line for o in overrides if o.is_sweep_override()
                 and not list(o.sweep_string_iterator())]
        raise UserError(f"{' '.join(empty) or 'the sweep'}: no values, so no jobs: give at "
                        "least one (range(1,4) is 1, 2, 3)")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for batch in batches:
            for job in batch:
                check_fn(compose(config_name=config_name, overrides=list(job)))


def _parser() -> OverridesParser:
    """Hydra's override parser as its sweeper makes it: with a config loader, which
    glob(...) needs to list a group's options."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    return OverridesParser.create(config_loader=ConfigLoaderImpl(
        config_search_path=create_config_search_path(str(CONF_DIR))))


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def hydra_message(e: BaseException, schemas: Sequence[ModuleType] = ()) -> str:
    """Hydra's message and its cause's, on one line, keeping the key they name; a misspelt
    key gets the close matches of its section (a dataclass of `schemas`) instead of Hydra's
    '+key' hint (a typed section refuses new keys too)."""
    text = str(e)
    cause = e.__cause__
    if cause is not None and str(cause) not in text:
        text += "\n" + str(cause)
    text = text.split("\nConfig search path:")[0]
    message = one_line("\n".join(ln.rstrip().rstrip(".") for ln in text.splitlines()
                                 if not _NOISE.match(ln.strip())))
    full_key = getattr(e, "full_key", None)  # OmegaConf's error names the key on a line of its own
    if full_key and full_key not in message:
        message = f"{full_key}: {message}"
    override = getattr(e, "override", None)  # a parse error names the override it could not read
    if override and override not in message:
        message = f"override '{override}': {message}"
    listed = re.search(r"override ([\w.]+)=(.*?); Invalid value assigned: \w+ is not a "
                       r"ListConfig", message)
    if listed:  # a list key given one value: its bracketed form
        key, value = listed[1], re.sub(r"\\(.)", r"\1", listed[2])  # Hydra's escapes (a\:1) off
        return f"{key}={value}: {key} is a list: write {key}=[{value}]"
    missing = re.search(r"Key '(\w+)' not in '(\w+)'", message)
    if missing:
        full_key = getattr(cause, "full_key", None) or missing.group(1)
        message += _did_you_mean(full_key, missing.group(2), schemas)
    return message


def one_line(text: str) -> str:
    """Lines joined with '; '; what follows a line ending in ':' joined to it (an indented
    list by ', ')."""
    parts: list[str] = []
    listing = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if listing:  # a heading's items (indented) or its one sentence
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
            listing = raw[:1] in ("\t", " ") or line.endswith(":")
            continue
        listing = line.endswith(":")
        parts.append(line)
    return "; ".join(parts)


def _did_you_mean(full_key: str, type_name: str, schemas: Sequence[ModuleType]) -> str:
    cls = next((getattr(m, type_name) for m in schemas if hasattr(m, type_name)), None)
    if cls is None or not dataclasses.is_dataclass(cls):
        return ""
    section, _, key = full_key.rpartition(".")
    names = [f.name for f in dataclasses.fields(cls)]
    close = [f"{section}.{n}" if section else n for n in difflib.get_close_matches(key, names, n=3)]
    return (f" (did you mean {' or '.join(close)}?)" if close
            else f" ({section or 'its'} keys: {', '.join(names)})")
