"""How an epoch's record shows: TensorBoard's scalars of an epoch and of
a step (tags with their units, as folder/tensorboard.py charts them) and
the comm part of the epoch line; and the record's timing part.
"""

from __future__ import annotations

from typing import Any

from ..folder.records import EpochRecord
from ..timing import PHASES, CommStats, StepTimes, stragglers


def epoch_scalars(rec: EpochRecord) -> dict[str, float]:
    """TensorBoard scalars of an epoch; tags carry their units."""
    c, steps, phases = rec.comm, rec.steps, rec.phase_s
    out = {
        "loss/train": rec.train_loss, "loss/test": rec.test_loss,
        "accuracy/train[fraction]": rec.train_accuracy,
        "accuracy/test[fraction]": rec.test_accuracy, "time/epoch[s]": rec.epoch_time_s,
        "throughput/train[samples/s]": rec.samples_per_s,
        "comm/bytes_sent[MB/step]": c["bytes_sent"] / 1e6 / steps,
        "comm/bytes_recv[MB/step]": c["bytes_recv"] / 1e6 / steps,
        "comm/calls[per step]": c["calls"] / steps,
    }
    # sync=hierarchical: what left the node
    if c.get("bytes_cross_node") is not None:
        out["comm/bytes_cross_node[MB/step]"] = c["bytes_cross_node"] / 1e6 / steps
    if rec.timing:
        out.update({f"time/{p}[ms/step]": phases[p]["mean"] * 1e3 for p in (*PHASES, "step")})
        out.update({"time/step_p95[ms]": phases["step"]["p95"] * 1e3,
                    "time/step_median[ms]": phases["step"]["median"] * 1e3,
                    "comm/time[ms/step]": c["time_s"] * 1e3 / steps,
                    "comm/algbw[GB/s]": c["algbw_GBps"], "comm/busbw[GB/s]": c["busbw_GBps"],
                    "comm/fraction[of step]": c["fraction"] or 0.0,
                    # in flight (the collectives' union) and exposed
                    # (after compute's end)
                    "comm/inflight[ms/step]": (rec.comm_inflight_s or 0.0) * 1e3 / steps,
                    "comm/exposed[ms/step]": (rec.comm_exposed_s or 0.0) * 1e3 / steps,
                    "comm/exposed_fraction[of step]": rec.comm_exposed_fraction or 0.0,
                    "time/compute[ms/step]": (rec.compute_s or 0.0) * 1e3 / steps})
        spread = rec.stragglers.get("spread")
        if spread:
            out["stragglers/spread[slowest/fastest]"] = spread
        # -1 and 0 ms: no rank named this epoch
        if rec.world_size and rec.world_size > 1:
            named = rec.straggler or {"rank": -1, "late_ms": 0.0}
            out["stragglers/rank"] = float(named["rank"])
            out["stragglers/late[ms]"] = named["late_ms"]
    return out


def step_scalars(step: StepTimes, comm_s: float, exposed_s: float, epoch: int) -> dict[str, float]:
    """One step's TensorBoard scalars: times, comm in flight and
    exposed, its epoch."""
    d = step.durations()
    return {"step/time[ms]": 1e3 * sum(d.values()), "step/sync[ms]": 1e3 * d.get("sync", 0.0),
            "step/compute[ms]": 1e3 * step.compute_seconds(), "step/comm[ms]": 1e3 * comm_s,
            "step/comm_exposed[ms]": 1e3 * exposed_s, "epoch": epoch}


def comm_line(rec: EpochRecord) -> str:
    """The console epoch line's comm part, short: the figures are in
    metrics.jsonl."""
    c, steps = rec.comm, rec.steps
    if c["fraction"] is None:
        return f"{c['bytes_sent'] / steps / 1e6:.2f} MB/step sent (timing off)"
    return (f"{100 * c['fraction']:.0f}% in flight, "
            f"{100 * (rec.comm_exposed_fraction or 0.0):.0f}% exposed")


def timing_fields(t: dict, comm: CommStats, per_rank: list, tally: Any, *,
                  timed: bool, bytes_exact: bool, overlap: bool) -> dict:
    """An epoch record's timing part: phases, comm, stragglers, the
    straggler named (`t`: timing.epoch_timing's; `per_rank`: every
    rank's step, compute and comm per step)."""
    return {
        "phase_s": {p: t["phases"][p] for p in (*PHASES, "step")} if timed else {},
        "comm": {"calls": comm.calls, "payload_bytes": comm.payload_bytes,
                 "bytes_sent": comm.bytes_sent, "bytes_recv": comm.bytes_recv,
                 "bytes_cross_node": comm.bytes_cross_node,
                 "bytes_exact": bytes_exact, "time_s": comm.seconds,
                 "bus_bytes": comm.bus_bytes,
                 "per_step_s": {k: v for k, v in t["comm_step"].items() if k != "total"},
                 "algbw_GBps": comm.algbw, "busbw_GBps": comm.busbw,
                 "fraction": t["comm_fraction"]},
        "comm_fraction": t["comm_fraction"],
        "comm_exposed_s": t["exposed_s"] if timed else None,
        "comm_exposed_fraction": t["exposed_fraction"] if timed else None,
        "comm_inflight_s": comm.seconds if timed else None,
        "compute_s": t["compute_s"] if timed else None,
        "overlap": overlap,
        "stragglers": {**stragglers([r[0] for r in per_rank], tally),
                       "measure": "step time" if timed else "wall time",
                       "per_rank_compute_s": [r[1] for r in per_rank]},
        "straggler": tally.named(),
    }
