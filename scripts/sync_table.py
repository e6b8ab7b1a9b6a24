#!/usr/bin/env python
"""Markdown table of run folders' summaries, one row per run, grouped by world size.

    .venv/bin/python scripts/sync_table.py outputs/compare_syncs/w2 outputs/compare_syncs/w3

The synchronisers side by side at each world size, accuracy against ddp's: the view that
`python -m ddp_lab.report` (per sync, across allocations) does not give. Runs are found and
read by the report's own reader (ddp_lab.report.runs).

Arguments are run folders or folders of run folders. Accuracy is compared with the ddp
run of the same world size (in points, i.e. percent): the acceptance bar is 0.5.
Comm columns (ddp_lab.timing): in-flight = the union of the collectives' intervals,
exposed = its part after the step's last gradient was ready (both ms per step, rank 0);
overlap = sync.overlap (ddp always overlaps).
"""

from __future__ import annotations

import sys

from ddp_lab.report.runs import ReportError, find_runs

ORDER = ["ddp", "naive", "allreduce", "reduce_broadcast", "ring", "tree", "butterfly"]


def summaries(paths: list[str]) -> list[dict]:
    # the report's own reader: the same run folders, statuses and skips as `ddp_lab.report`
    return [r.summary for r in find_runs(paths) if r.kind == "train" and r.ok]


def fmt(v, spec: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v * scale, spec)


def main(argv: list[str]) -> int:
    try:
        runs = [r for r in summaries(argv) if r.get("status") == "completed"]
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not runs:
        print("no completed runs found", file=sys.stderr)
        return 1
    runs.sort(key=lambda r: (r["world_size"], bool(r.get("overlap")) and r["sync"] != "ddp",
                             ORDER.index(r["sync"]) if r["sync"] in ORDER else 99))
    ddp = {r["world_size"]: r["test_accuracy"] for r in runs if r["sync"] == "ddp"}
    print("| world | sync | overlap | epochs | test acc (%) | vs ddp (points) | median epoch (s) "
          "| in-flight share | in-flight (ms/step) | exposed share | exposed (ms/step) "
          "| sent (MB/step) | busbw (GB/s) |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        w = r["world_size"]
        delta = 100 * (r["test_accuracy"] - ddp[w]) if w in ddp else None
        n = r.get("steps_run") or None
        comm_ms = 1e3 * r["comm_time_s"] / n if n and r.get("comm_time_s") is not None else None
        exposed_ms = (1e3 * r["comm_exposed_s"] / n if n and r.get("comm_exposed_s") is not None
                      else None)
        sent = r["comm_bytes_sent"] / 1e6 / n if n else None
        overlap = "-" if r.get("overlap") is None else ("yes" if r["overlap"] else "no")
        print(f"| {w} | {r['sync']} | {overlap} | {r['epochs_run']} "
              f"| {100 * r['test_accuracy']:.2f} "
              f"| {fmt(delta, '+.2f')} | {fmt(r['epoch_time_s_median'], '.2f')} "
              f"| {fmt(r.get('comm_fraction'), '.0%')} | {fmt(comm_ms, '.2f')} "
              f"| {fmt(r.get('comm_exposed_fraction'), '.0%')} | {fmt(exposed_ms, '.2f')} "
              f"| {fmt(sent, '.3f')} | {fmt(r.get('comm_busbw_GBps'), '.3f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
