"""Run folders and bench folders for the report's tests, written without training: the
records through the trainer's own types (`EpochRecord`, `RunSummary`, ddp_lab/folder/records.py)
and the bench's own writer (`write_outputs`, ddp_lab/bench/output.py), so the report reads
what the trainer and the bench write. Times are made up, shaped like a 2-core CPU's."""

from __future__ import annotations

import json
import math
from pathlib import Path

from omegaconf import OmegaConf

from ddp_lab.folder.files import atomic_write_text, write_json
from ddp_lab.folder.records import EpochRecord, RunSummary

SYNCS = ("ddp", "naive", "allreduce", "reduce_broadcast", "ring", "tree", "butterfly")
FP = {"hosts": ["h"], "cpu": "Test CPU", "cpu_count": 2, "gpu": None, "torch": "2.x",
      "nccl": None, "backend": "gloo", "nccl_transport": None, "env": {"OMP_NUM_THREADS": "1"}}
PAYLOAD = 159_010 * 4  # the notebook MLP's gradients, bytes


def train_run(root: Path, name: str, *, sync: str = "ddp", world: int = 2, nodes: int = 1,
              epoch_s: tuple[float, ...] = (1.9, 1.2, 1.2), steps: int = 0, model: str = "mlp",
              optim: str = "adam", batch: int = 64, pipeline: str = "tensor",
              comm_ms: float = 1.0, fid: str = "aaaaaaaaaa", fp: dict = FP,
              status: str = "completed") -> Path:
    """A training run folder as the trainer leaves it: config.yaml, metrics.jsonl (one
    EpochRecord per epoch), summary.json (a RunSummary). steps=0: full epochs (60000
    samples over the world), else the per-epoch step cap."""
    d = root / name
    d.mkdir(parents=True)
    OmegaConf.save({"launcher": {"name": "local", "nodes": nodes, "nproc_per_node": world // nodes,
                                 "dry_run": False},
                    "sync": {"name": sync}, "model": {"name": model}, "optim": {"name": optim},
                    "data": {"pipeline": pipeline},
                    "train": {"epochs": len(epoch_s), "batch_size": batch, "max_steps_per_epoch": steps}},
                   d / "config.yaml")
    per_epoch = steps or math.ceil(60000 / (batch * world))
    calls = (per_epoch if world > 1 else 0) * (8 if sync == "naive" else 1)
    comm_s = comm_ms / 1e3 * per_epoch if world > 1 else 0.0
    lines = []
    for i, t in enumerate(epoch_s):
        step = t / per_epoch
        phases = {"data": 0.05 * step, "forward": 0.2 * step, "backward": 0.35 * step,
                  "sync": comm_s / per_epoch, "optim": 0.1 * step}
        rec = EpochRecord(epoch=i + 1, world_size=world, train_loss=0.5, test_accuracy=0.9,
                          epoch_time_s=t, samples_per_s=per_epoch * batch * world / t,
                          steps=per_epoch, timing=True,
                          phase_s={**{p: {"mean": v} for p, v in phases.items()}, "step": {"mean": step}},
                          comm={"time_s": comm_s, "calls": calls, "payload_bytes": PAYLOAD * per_epoch},
                          comm_fraction=comm_s / t)
        lines.append(rec.to_dict())

    atomic_write_text(d / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in lines))
    write_json(d / "summary.json", RunSummary(
        status=status, launcher="local", sync=sync, model=model, optim=optim, backend="gloo",
        device="cpu", nodes=nodes, nproc_per_node=world // nodes, world_size=world,
        epochs=len(epoch_s), batch_size=batch, global_batch=batch * world, scaling="weak",
        pipeline=pipeline, test_accuracy=0.9,
        epoch_time_s_median=sorted(epoch_s)[len(epoch_s) // 2],
        epoch_time_s_mean=sum(epoch_s) / len(epoch_s), comm_fraction=0.3,
        hosts=fp["hosts"], fingerprint=fp, fingerprint_id=fid).to_dict())
    return d


def _bench_row(impl: str, group: str, n: int, elements: int, alpha_s: float, beta: float) -> dict:
    """One all_reduce point as the harness summarises it: time from alpha-beta (ring's
    2(n-1) messages, 2(n-1)/n of the bytes), each implementation a little slower than torch."""
    nbytes = elements * 4
    slower = {"torch": 1.0, "ring": 1.3, "butterfly": 1.2, "tree": 1.5, "linear": 2.0}.get(impl, 1.1)
    t = slower * (2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes * beta)
    algbw = nbytes / t / 1e9
    return {"op": "all_reduce", "impl": impl, "group": group, "group_size": n, "groups": 1,
            "ranks": list(range(n)), "elements": elements, "dtype": "float32", "bytes": nbytes,
            "iters": 5, "time_median_s": t, "time_min_s": 0.9 * t, "time_max_s": 1.2 * t,
            "time_p25_s": 0.95 * t, "time_p75_s": 1.05 * t, "algbw_GBps": algbw,
            "busbw_factor": 2 * (n - 1) / n, "busbw_GBps": algbw * 2 * (n - 1) / n,
            "throughput_GiBps": algbw * 1e9 / 2**30, "correct": True, "error": "",
            "group_medians_s": [t]}


def bench_run(root: Path, name: str, *, impls: tuple[str, ...] = ("torch",), world: int = 2,
              nodes: int = 1, groups: tuple[str, ...] = ("global",), alpha_s: float = 3e-4,
              beta: float = 2e-9, fid: str = "aaaaaaaaaa") -> Path:
    """A bench run folder as the bench's rank 0 leaves it: bench.json, bench.md, bench.csv,
    plots/ (write_outputs) and summary.json. A group kind other than global has half the
    ranks (intra_node) or one per node (cross_node)."""
    from ddp_lab.bench.output import write_outputs  # imports torch (the harness): only here

    d = root / name
    d.mkdir(parents=True)
    sizes = [2 ** k for k in range(10, 21, 2)]
    size_of = {"global": world, "intra_node": world // nodes, "cross_node": nodes}
    rows = [_bench_row(i, g, size_of[g], s, alpha_s, beta) for g in groups for i in impls for s in sizes]
    alloc = f"{world} ranks = {nodes} node{'s' if nodes > 1 else ''} x {world // nodes} ranks, gloo on CPU"
    meta = {"kind": "bench", "launcher": "local", "backend": "gloo", "device": "cpu",
            "nodes": nodes, "nproc_per_node": world // nodes, "simulated_nodes": None,
            "world_size": world, "hosts": ["h"], "allocation": alloc, "dtype": "float32",
            "warmup": 1, "iters": 5, "min_iters": 3, "torch": "2.x", "command": ""}
    result = {"rows": rows, "notes": [], "memory": "plenty", "sizes": sizes, "duration_s": 1.0,
              "topology": {"nodes": [list(range(world))], "hosts": ["h"], "simulated": False,
                           "describe": alloc, "groups": {}}}
    out = write_outputs(d, result, meta)
    OmegaConf.save({"bench": {"impl": list(impls)}, "launcher": {"name": "local"}}, d / "config.yaml")
    write_json(d / "summary.json", {**meta, "status": "completed", "ops": ["all_reduce"],
                                    "impl": list(impls), "groups": list(groups),
                                    "measurements": len(rows), "wrong_results": 0,
                                    "plots": [f"plots/{p['file']}" for p in out["plots"]],
                                    "fingerprint": FP, "fingerprint_id": fid})
    return d


def runbook_folder(root: Path) -> Path:
    """What the README's runbook leaves in outputs/: 21 trainings and 2 benches. The
    7-sync sweep on full epochs and on 20-step epochs, the default run, an optim sweep,
    sgd, a 4-rank cnn, the dataloader pipeline, ring at 3 ranks; the default bench and
    `bench.impl=[torch,ring,butterfly,tree,linear]`."""
    out = root / "outputs"
    for i, s in enumerate(SYNCS):
        train_run(out, f"full_{s}", sync=s, comm_ms=0.8 + 0.3 * i)
        train_run(out, f"capped_{s}", sync=s, steps=20, epoch_s=(0.3, 0.05 + 0.01 * i, 0.05 + 0.01 * i))
    train_run(out, "default", epoch_s=(1.9, 1.25, 1.3))
    train_run(out, "optim_adam", epoch_s=(1.9, 1.1, 1.15))
    train_run(out, "optim_sgd", optim="sgd")
    train_run(out, "sgd_momentum", optim="sgd", epoch_s=(1.8, 1.3, 1.3))
    train_run(out, "cnn_w4", model="cnn", world=4, epoch_s=(9.0,))
    train_run(out, "dataloader", pipeline="dataloader", epoch_s=(2.5, 1.8, 1.8))
    train_run(out, "ring_w3", sync="ring", world=3, epoch_s=(1.5, 0.9, 0.9))
    bench_run(out, "bench_default")
    bench_run(out, "bench_impls", impls=("torch", "ring", "butterfly", "tree", "linear"))
    return out
