"""The Hydra entry of `python -m ddp_lab` and `python -m ddp_lab.bench`.

The one place where a user mistake (ddp_lab's `UserError`, Hydra's
composition errors) becomes `error: <one line>` on stderr and exit 2,
where Hydra would print several lines and exit 1 (the lines:
mistakes.py). A -m sweep is Hydra's; `SweepTable` (sweep_table.py)
prints one row per job.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType
from typing import Callable, Sequence

import hydra
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from ..config.errors import UserError
from ..config import CONF_DIR
from .job import Outcome
from .mistakes import (command_line_mistake, group_value_mistake, hydra_message, one_line,
                       override_parser)
from .sweep_table import job_name


def cli(config_name: str, submit_fn: Callable[..., Outcome],
        check_fn: Callable[[DictConfig], object], schemas: Sequence[ModuleType] = ()) -> None:
    """Compose `conf/<config_name>.yaml`, run `submit_fn(cfg, t0=...)`
    per job (one, or each of a -m sweep; every job checked by `check_fn`
    before the first starts; `t0` as command/job.py's launch_job takes it), and exit with the failed job's status (2 for a user
    mistake). `schemas`: the dataclass modules that type the config, for
    "did you mean" hints."""
    flags = (command_line_mistake(sys.argv[1:], lambda: _defaults(config_name))
             or group_value_mistake(sys.argv[1:]))
    if flags:
        print(f"error: {flags}", file=sys.stderr)
        sys.exit(2)
    failed: list[int] = []
    # when the job about to start began: with the command (None) for the
    # first, when the one before it ended for each later one of a sweep
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
                                          if _key(o) in swept])
        try:
            outcome = submit_fn(cfg, t0=t0)
        except UserError as e:
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            outcome = Outcome(2, f"error: {one_line(str(e))}")
        except (HydraException, OmegaConfBaseException) as e:
            # the config read as the job starts (`~sync`, an
            # interpolation to no key): one line, where Hydra adds its
            # own "Error executing job with overrides"
            print(f"error: {hydra_message(e, schemas)}", file=sys.stderr)
            outcome = Outcome(2, f"error: {hydra_message(e, schemas)}")
        finally:
            os.environ["HYDRA_FULL_ERROR"] = "1"
            t0 = time.time()
        if outcome.rc != 0:
            failed.append(outcome.rc)
        return outcome

    # with HYDRA_FULL_ERROR Hydra raises its errors to us instead of
    # printing them: we print one line of our own (and no traceback,
    # whatever the user's setting)
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


def _defaults(config_name: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name=config_name)


def _swept_keys(argv: list[str]) -> set[str]:
    """The keys a -m sweep varies (`sync=ddp,ring` -> sync): its jobs
    are named by their values (names.sweep_name). None for a plain run
    or one Hydra cannot parse (it says why)."""
    if not {"-m", "--multirun"} & set(argv):
        return set()
    try:
        overrides = override_parser().parse_overrides([a for a in argv if a[:1] != "-"])
    except HydraException:
        return set()
    return {o.key_or_group for o in overrides if o.is_sweep_override()}


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def _plain_run(argv: list[str]) -> bool:
    """Overrides only: no Hydra flag (-m, --help, --cfg, ...) and no
    hydra.* key."""
    return not any(a.startswith("-") or a.lstrip("+~").startswith(("hydra.", "hydra/"))
                   for a in argv)


def _run_once(config_name: str, task: Callable[[DictConfig], Outcome], overrides: list[str]) -> None:
    """What `hydra.main` does for a plain run, with the config composed
    once: Hydra's own path composes it twice (first only to read
    `hydra.mode`, which ddp_lab's configs never set), about 0.5 s each
    here, half the time to the first line on the console."""
    app = Hydra.create_main_hydra2(task_name="ddp_lab",
                                   config_search_path=create_config_search_path(str(CONF_DIR)))
    try:
        app.run(config_name=config_name, task_function=task,
                overrides=[*overrides, "hydra.mode=RUN"])
    finally:
        GlobalHydra.instance().clear()


def _check_sweep(config_name: str, argv: list[str], check_fn: Callable) -> None:
    """Compose and check every job of a sweep first: Hydra composes each
    job only when its turn comes, after the earlier ones ran (and made
    their run folders)."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        # other Hydra flags (--cfg, --config-name, ...): Hydra handles
        # those runs
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
