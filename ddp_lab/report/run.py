"""One run folder as the report reads it: `Run`, its files and figures."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..folder.description import Description, describe_run, plural
from ..folder.records import EpochRecord

PHASES = ("data", "forward", "backward", "sync", "optim")


@dataclass
class Run:
    path: Path
    kind: str  # train | bench
    ok: bool  # usable for comparison
    status: str  # "completed" or why not
    # summary.json (a training run's: RunSummary's keys)
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    # metrics.jsonl, one per epoch
    records: list[EpochRecord] = field(default_factory=list)
    bench: Optional[dict] = None  # bench.json

    # -------------------------------------------------------------- shared fields
    def get(self, key: str, default: Any = None) -> Any:
        """From summary.json, else from the config (launcher/sync
        sections), else default."""
        if self.summary.get(key) is not None:
            return self.summary[key]
        cfg = self.config
        fallback = {
            "launcher": (cfg.get("launcher") or {}).get("name"),
            "sync": (cfg.get("sync") or {}).get("name"),
            "nodes": (cfg.get("launcher") or {}).get("nodes"),
            "nproc_per_node": (cfg.get("launcher") or {}).get("nproc_per_node"),
            "epochs": (cfg.get("train") or {}).get("epochs"),
        }.get(key)
        return default if fallback is None else fallback

    @property
    def world_size(self) -> Optional[int]:
        ws = self.summary.get("world_size")
        if ws is None and self.get("nodes") and self.get("nproc_per_node"):
            ws = self.get("nodes") * self.get("nproc_per_node")
        return ws

    @property
    def device_kind(self) -> str:
        """What runs must share to be compared: "cpu" (however it is
        spelled: cpu, CPU, cpu:0; or dist.device=cpu in the config of a
        run without a summary), else the GPU's name as the run recorded
        it."""
        d = self.get("device")
        if d is None:
            d = (self.config.get("dist") or {}).get("device")
        d = str(d or "?")
        return "cpu" if d.split(":")[0].strip().lower() == "cpu" else d

    # ------------------------------------------------------------- training runs
    @property
    def description(self) -> Description:
        """What the run is (ddp_lab.folder.description): the one source
        of its series label (`ring prepost=true`: runs whose labels
        differ are never repeats), its workload (a time per step is
        compared within `workload_words()`) and its name."""
        return describe_run(self.config, self.summary)

    @property
    def scaling(self) -> str:
        """strong (train.global_batch fixed) | weak (batch per rank
        fixed): summary.json `scaling`, else the config's
        train.global_batch (> 0: strong), else weak."""
        s = self.summary.get("scaling")
        if s in ("strong", "weak"):
            return s
        return "strong" if int((self.config.get("train") or {}).get("global_batch") or 0) > 0 else "weak"

    @property
    def global_batch(self) -> Optional[int]:
        """Samples of one optimiser step over all ranks (summary.json
        `global_batch`, else the config's, else batch per rank x
        world)."""
        g = self.summary.get("global_batch") or (self.config.get("train") or {}).get("global_batch")
        if g:
            return int(g)
        batch = self.summary.get("batch_size") or (self.config.get("train") or {}).get("batch_size")
        return int(batch) * (self.world_size or 1) if batch else None

    @property
    def fingerprint(self) -> dict:
        return self.summary.get("fingerprint") or {}

    @property
    def fingerprint_id(self) -> str:
        """summary.json `fingerprint_id`; "?" for a run written before
        fingerprints."""
        return self.summary.get("fingerprint_id") or "?"

    @property
    def workload(self) -> tuple:
        """What must match for epoch times to be comparable across world
        sizes: model, optimiser, scaling mode with its batch (per rank
        when weak, global when strong), the micro-batch, the per-epoch
        step cap (0 = the whole shard), epochs, data pipeline."""
        train = self.config.get("train") or {}
        model = (self.config.get("model") or {}).get("name", self.summary.get("model"))
        optim = (self.config.get("optim") or {}).get("name", self.summary.get("optim"))
        pipeline = (self.config.get("data") or {}).get("pipeline", self.summary.get("pipeline"))
        if self.scaling == "strong":
            batch = self.global_batch
        else:
            batch = train.get("batch_size", self.summary.get("batch_size"))
        return (model, optim, self.scaling, batch, int(train.get("micro_batch") or 0),
                train.get("max_steps_per_epoch", 0), self.get("epochs"), pipeline)

    def workload_label(self, epochs: bool = True) -> str:
        """e.g. "mlp, adam, global batch 64 (strong scaling), 20
        steps/epoch, 2 epochs"; without `epochs`, the epoch count left
        out (a figure's panel: a time per epoch compares across it, each
        bar saying its own)."""
        model, optim, scaling, batch, micro, steps, n_epochs, pipeline = self.workload
        epochs = n_epochs if epochs else None
        what = (f"global batch {batch} (strong scaling)" if scaling == "strong"
                else f"batch {batch}/rank (weak scaling)")
        return ", ".join(str(p) for p in (
            model, optim, what, f"micro {micro}" if micro else None,
            f"{steps} steps/epoch" if steps else "full epochs",
            plural(epochs, "epoch") if epochs else None,
            f"{pipeline} pipeline" if pipeline else None) if p)

    def workload_short(self) -> str:
        """The workload as a plot's panel title: "mlp, batch 64/rank,
        100 steps/epoch"."""
        model, _, scaling, batch, _, steps, _, _ = self.workload
        what = f"global batch {batch}" if scaling == "strong" else f"batch {batch}/rank"
        return f"{model}, {what}, " + (f"{steps} steps/epoch" if steps else "full epochs")

    def epoch_time_values(self, warmup: Optional[int] = None) -> tuple[list[float], int]:
        """Epoch times (s) after the warm-up, and the epochs excluded.
        The warm-up: the first `warmup` epochs when the run has more
        than that many timed; by default one when it has more than one.
        An epoch split by a resume is left out (its time spans two
        allocations). A run without per-epoch times gives its summary's
        mean."""
        recs = sorted((r for r in self.records if r.epoch_time_s and not r.resumed_at_step),
                      key=lambda r: r.epoch)
        times = [float(r.epoch_time_s) for r in recs]
        if not times:
            t = self.summary.get("epoch_time_s_mean") or self.summary.get("epoch_time_s_median")
            return ([float(t)] if t else []), 0
        skip = (1 if len(times) > 1 else 0) if warmup is None else warmup
        if skip >= len(times):
            # too few epochs to drop any: every one counts (said in the
            # report)
            skip = 0
        return times[skip:], skip

    def epoch_samples(self) -> Optional[float]:
        """Training samples of one epoch over all ranks: steps per rank
        x batch per rank x world (mean over the epochs logged); None
        when unknown."""
        steps = [r.steps for r in self.records if r.steps]
        batch = self.summary.get("batch_size") or (self.config.get("train") or {}).get("batch_size")
        if self.scaling == "strong" and self.global_batch and self.world_size:
            batch = self.global_batch / self.world_size
        if not steps or not batch:
            return None
        return sum(steps) / len(steps) * float(batch) * (self.world_size or 1)

    def samples_per_s(self) -> Optional[float]:
        """Median training throughput over epochs (metrics.jsonl
        `samples_per_s`)."""
        values = [r.samples_per_s for r in self.records if r.samples_per_s is not None]
        return statistics.median(values) if values else None

    def steps_total(self) -> int:
        return sum(int(r.steps or 0) for r in self.records)

    def phase_ms(self) -> dict[str, Optional[float]]:
        """Mean ms per step of each phase (and the whole step), over
        every epoch."""
        out: dict[str, Optional[float]] = {}
        for p in (*PHASES, "step"):
            num = den = 0.0
            for r in self.records:
                ph = (r.phase_s or {}).get(p)
                steps = r.steps or 0
                if ph and steps:
                    num += ph.get("mean", 0.0) * steps
                    den += steps
            out[p] = 1e3 * num / den if den else None
        return out

    def comm_per_step(self) -> dict[str, Optional[float]]:
        """Measured comm per step: seconds (comm.time_s / steps),
        payload bytes and calls."""
        steps = self.steps_total()
        if not steps:
            return {"time_s": None, "payload_bytes": None, "calls": None}
        tot = {k: sum(float((r.comm or {}).get(k) or 0.0) for r in self.records)
               for k in ("time_s", "payload_bytes", "calls")}
        return {k: v / steps for k, v in tot.items()}
