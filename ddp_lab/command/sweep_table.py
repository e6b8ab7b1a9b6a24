"""A -m sweep's closing table (`SweepTable`, a Hydra callback) and its
jobs' names."""

from __future__ import annotations

from typing import Optional

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from .job import Outcome
from ..folder.description import describe_run, differing_labels, sweep_extra
from ..folder.names import sweep_name
from ..folder.rundir import describe_config, read_summary


def job_name(cfg: DictConfig, swept: list[str]) -> Optional[str]:
    """A sweep job's folder name: a training run's description label
    (what sets it apart from any other run: `ring-prepost_w3_mlp`,
    `ddp_w2_mlp_wide`) and the swept values it does not show (`seed1`);
    another entry point's job (a bench), the swept values."""
    if cfg.get("sync") is not None and cfg.get("model") is not None:
        label = describe_config(cfg)
        return "_".join(p for p in (label, sweep_extra(swept, label)) if p) or None
    return sweep_name(swept) or None


class SweepTable(Callback):
    """A -m sweep ends with one row per job (`sweep_table`), so its last
    lines say what failed. Hydra calls it with each job's `Outcome`:
    conf/config.yaml and conf/bench.yaml register it under
    hydra.callbacks."""

    def __init__(self) -> None:
        self.jobs: list[tuple[int, list[str], Outcome]] = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        # a single run has no table; a task that raised (a bug) has no
        # Outcome: Hydra raises it after the last job
        if config.hydra.mode == RunMode.MULTIRUN and job_return.status == JobStatus.COMPLETED:
            self.jobs.append((config.hydra.job.num, list(job_return.overrides or []),
                              job_return.return_value))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        print("\n" + sweep_table(self.jobs), flush=True)


# what a sweep is run for, per job, from its summary.json (the run's one
# record of them): (heading, summary key, format); a column only where
# some job has the figure (a bench or a dry run has none of them)
FIGURES = (("epoch (median)", "epoch_time_s_median", "{:.2f} s"),
           ("comm in flight", "comm_fraction", "{:.0%}"),
           ("exposed", "comm_exposed_fraction", "{:.0%}"),
           ("test acc", "test_accuracy", "{:.4f}"))


def sweep_table(jobs: list[tuple[int, list[str], Outcome]]) -> str:
    """The table `SweepTable` prints from `jobs` (Hydra's job number,
    overrides, outcome): a job named by the overrides that differ
    between jobs, with its summary.json figures (FIGURES), its run
    folder and how it ended."""
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
    """Each job's run, named by what sets it apart from the sweep's
    other runs (its description's label, cut to the parts that differ:
    description.differing_labels); [] when no job is a training run with
    a config."""
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
