"""The Hydra entry of `python -m ddp_lab` and `python -m ddp_lab.bench`: the one place where a user
mistake (a `UserError`, Hydra's composition errors) becomes `error: <one line>` on stderr and exit 2
(the lines: mistakes.py). A -m sweep is Hydra's; `SweepTable` prints one row per job.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType
from typing import Callable, Optional, Sequence

import hydra
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from ..config import CONF_DIR
from ..config.errors import UserError
from ..folder.description import describe_run, differing_labels, sweep_extra, sweep_name
from ..folder.rundir import describe_config, read_summary
from .job import Outcome
from .paste import override_key
from .status import run_config
from .mistakes import (command_line_mistake, group_value_mistake, hydra_message, one_line,
    override_parser)


def cli(config_name: str, submit_fn: Callable[..., Outcome],
        check_fn: Callable[[DictConfig], object], schemas: Sequence[ModuleType] = ()) -> None:
    """Compose `conf/<config_name>.yaml`, run `submit_fn(cfg, t0=...)` per job (one, or each of a
    -m sweep; every job checked by `check_fn` before the first starts; `t0` as command/job.py's
    launch_job takes it), and exit with the failed job's status (2 for a user mistake). `schemas`:
    the dataclass modules that type the config, for "did you mean" hints."""
    flags = (command_line_mistake(sys.argv[1:], lambda: _defaults(config_name))
             or group_value_mistake(sys.argv[1:]))
    if flags:
        print(f"error: {flags}", file=sys.stderr)
        sys.exit(2)
    failed: list[int] = []
    # when the next job began: with the command (None) for the first, else when the one before ended
    t0: float | None = None
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    swept = _swept_keys(sys.argv[1:])

    # Hydra hands the Outcome to SweepTable
    def task(cfg: DictConfig) -> Outcome:
        nonlocal t0
        # the job's processes see the user's env
        _restore_env("HYDRA_FULL_ERROR", full_error)
        # a sweep's job is named by what it varies
        if swept and not cfg.run.get("name"):
            cfg.run.name = job_name(cfg, [o for o in HydraConfig.get().overrides.task
                                          if override_key(o) in swept])
        try:
            outcome = submit_fn(cfg, t0=t0)
        except (UserError, HydraException, OmegaConfBaseException) as e:
            # also the config read as the job starts (`~sync`, an interpolation to no key): one
            # line, where Hydra adds its own "Error executing job with overrides"
            error = _error_line(e, schemas)
            print(error, file=sys.stderr)
            outcome = Outcome(2, error)
        finally:
            os.environ["HYDRA_FULL_ERROR"] = "1"
            t0 = time.time()
        if outcome.rc != 0:
            failed.append(outcome.rc)
        return outcome

    # with HYDRA_FULL_ERROR Hydra raises its errors to us instead of printing them: we print one
    # line of our own (and no traceback, whatever the user's setting)
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        if _plain_run(sys.argv[1:]):
            _run_once(config_name, task, sys.argv[1:])
        else:
            if {"-m", "--multirun"} & set(sys.argv[1:]):
                _check_sweep(config_name, sys.argv[1:], check_fn)
            hydra.main(version_base=None, config_path=str(CONF_DIR), config_name=config_name)(task)()
    except (UserError, HydraException, OmegaConfBaseException) as e:  # UserError: _check_sweep's
        print(_error_line(e, schemas), file=sys.stderr)
        sys.exit(2)
    finally:
        _restore_env("HYDRA_FULL_ERROR", full_error)
    sys.exit(failed[0] if len(failed) == 1 else (1 if failed else 0))


def _error_line(e: Exception, schemas: Sequence[ModuleType]) -> str:
    return f"error: {one_line(str(e)) if isinstance(e, UserError) else hydra_message(e, schemas)}"


def _defaults(config_name: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name=config_name)


def _swept_keys(argv: list[str]) -> set[str]:
    """The keys a -m sweep varies (`sync=ddp,ring` -> sync): its jobs are named by their values
    (description.sweep_name). Empty for a plain run or one Hydra cannot parse (it says why)."""
    if not {"-m", "--multirun"} & set(argv):
        return set()
    try:
        overrides = override_parser().parse_overrides([a for a in argv if a[:1] != "-"])
    except HydraException:
        return set()
    return {o.key_or_group for o in overrides if o.is_sweep_override()}


def _plain_run(argv: list[str]) -> bool:
    """Overrides only: no Hydra flag (-m, --help, --cfg, ...) and no hydra.* key."""
    return not any(a.startswith("-") or a.lstrip("+~").startswith(("hydra.", "hydra/"))
                   for a in argv)


def _run_once(config_name: str, task: Callable[[DictConfig], Outcome], overrides: list[str]) -> None:
    """What `hydra.main` does for a plain run, with the config composed once: Hydra's own path
    composes it twice (first only to read `hydra.mode`), about 0.5 s each."""
    app = Hydra.create_main_hydra2(task_name="ddp_lab",
                                   config_search_path=create_config_search_path(str(CONF_DIR)))
    try:
        app.run(config_name=config_name, task_function=task,
                overrides=[*overrides, "hydra.mode=RUN"])
    finally:
        GlobalHydra.instance().clear()


def _check_sweep(config_name: str, argv: list[str], check_fn: Callable) -> None:
    """Compose and check every job of a sweep first: Hydra composes each job only when its turn
    comes, after the earlier ones ran (and made their run folders)."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        # other Hydra flags (--cfg, --config-name, ...): Hydra handles those runs
        return
    overrides = override_parser().parse_overrides([a for a in argv if a[:1] != "-"])
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


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def job_name(cfg: DictConfig, swept: list[str]) -> Optional[str]:
    """A sweep job's folder name: a training run's description label (`ring-prepost_w3_mlp`) and
    the swept values it does not show (`seed1`); another entry point's job, the swept values."""
    if cfg.get("sync") is not None and cfg.get("model") is not None:
        label = describe_config(cfg)
        return "_".join(p for p in (label, sweep_extra(swept, label)) if p) or None
    return sweep_name(swept) or None


class SweepTable(Callback):
    """A -m sweep ends with one row per job (`sweep_table`), each job's `Outcome` (conf/config.yaml
    and conf/bench.yaml register it under hydra.callbacks)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[int, list[str], Outcome]] = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        # a single run has no table; a task that raised (a bug) has no Outcome: Hydra raises it
        # after the last job
        if config.hydra.mode == RunMode.MULTIRUN and job_return.status == JobStatus.COMPLETED:
            self.jobs.append((config.hydra.job.num, list(job_return.overrides or []),
                              job_return.return_value))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        print("\n" + sweep_table(self.jobs), flush=True)


# what a sweep is run for, per job, from its summary.json: (heading, summary key, format); a column
# only where some job has the figure
FIGURES = (("epoch (median)", "epoch_time_s_median", "{:.2f} s"),
           ("comm in flight", "comm_fraction", "{:.0%}"),
           ("exposed", "comm_exposed_fraction", "{:.0%}"),
           ("test acc", "test_accuracy", "{:.4f}"))


def sweep_table(jobs: list[tuple[int, list[str], Outcome]]) -> str:
    """The table `SweepTable` prints from `jobs` (Hydra's job number, overrides, outcome): each job
    by the overrides that differ, its summary.json FIGURES, its run folder and how it ended."""
    by_key = [{o.split("=", 1)[0]: o for o in overrides} for _, overrides, _ in jobs]
    keys = list(dict.fromkeys(k for d in by_key for k in d))
    varying = [k for k in keys if len({d.get(k) for d in by_key}) > 1] or keys
    names = [" ".join(d[k] for k in varying if k in d) or "(no overrides)" for d in by_key]
    summaries = [read_summary(o.run_dir) if o.run_dir else {} for _, _, o in jobs]
    figures = [(head, key, fmt) for head, key, fmt in FIGURES
               if any(isinstance(s.get(key), (int, float)) for s in summaries)]
    # what each training job is, as its description says
    runs = _run_labels(jobs, summaries)
    header = ["", "job", *(["run"] if runs else []), *(head for head, _, _ in figures),
              "run dir", "result"]
    rows = [[f"#{num}", name, *([runs[i]] if runs else []),
             *(fmt.format(s[key]) if isinstance(s.get(key), (int, float)) else "-"
               for _, key, fmt in figures),
             str(o.run_dir) if o.run_dir else "-", o.result]
            for i, ((num, _, o), name, s) in enumerate(zip(jobs, names, summaries))]
    first = 3 if runs else 2
    # the figures align right, as numbers do
    right = range(first, first + len(figures))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"sweep of {len(jobs)} job(s):"]
    for row in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(("  " + "  ".join(cells)).rstrip())
    bad = [f"#{num}" for num, _, o in jobs if o.rc != 0]
    lines.append(f"{len(bad)} of {len(jobs)} job(s) did not end ok: {', '.join(bad)}" if bad
                 else f"all {len(jobs)} job(s) ok")
    return "\n".join(lines)


def _run_labels(jobs: list, summaries: list[dict]) -> list[str]:
    """Each job's run, named by the parts of its description's label that differ
    (description.differing_labels); [] when no job is a training run with a config."""

    # a garbled or missing config ({}): the job is named by its overrides
    configs = [run_config(o.run_dir) if o.run_dir else {} for _, _, o in jobs]
    descs = [describe_run(c, s) if c.get("sync") and c.get("model") else None
             for c, s in zip(configs, summaries)]
    known = [d for d in descs if d is not None]
    if not known:
        return []
    labels = iter(differing_labels(known))
    return [next(labels) if d is not None else "-" for d in descs]
