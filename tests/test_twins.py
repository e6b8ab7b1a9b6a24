"""torch's library twins (sync=torch_zero, sync=fsdp2, sync=ddp sync.hook=...): each ends with
DDP's weights, on real gloo worlds of 2 and 3 ranks; their checkpoints hold a plain
optimiser's state, which any other synchroniser continues from; what they cannot run is
refused in one line before any process starts; and a run of them says no FutureWarning.

Tolerances, and why (docs/twins.md, "Equal to DDP"):
- 2 ranks, fp32 on the wire: one order of the sum (a + b = b + a), bit for bit, except
  fsdp2 under the fused Adam (FUSED_SHARD): its shards cut a parameter where the vectorised
  kernel's tail does not, so a few elements round differently;
- 3 ranks: each algorithm sums in its own order (docs/sync.md, "Why 3 ranks drift from
  DDP"): within ATOL_3; torch_zero still bit for bit (DDP's all-reduce, then a step that
  is element-wise);
- fp16 / bf16 / powersgd: lossy on the wire by design: within LOSSY[hook].
"""

from __future__ import annotations

import copy
import json
import subprocess

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab.sync import SYNCS

from helpers import PY, child_env, run_cli, run_dir_of, run_world, summary
from test_sync import BATCH, STEPS, global_batches, initial_model, sync_cfg

ATOL_3 = 1e-5
FUSED_SHARD = 1e-7  # fsdp2's shards under the fused Adam (2 ranks); measured 1e-9 .. 2e-8
LOSSY = {"fp16": 1e-2, "bf16": 5e-2, "powersgd": 0.2}  # largest weight difference allowed

TWINS = [("ddp", {"hook": h}) for h in ("ring", "ring_prepost", "reduce_broadcast",
                                         "allreduce", "fp16", "bf16", "powersgd")]
TWINS += [("torch_zero", {}), ("fsdp2", {"reshard_after_forward": True}),
          ("fsdp2", {"reshard_after_forward": False})]


def _key(name: str, ov: dict) -> str:
    return " ".join([name, *(f"{k}={v}" for k, v in ov.items())])


def _optim(params):
    return torch.optim.Adam(params, lr=1e-3, fused=True)  # ddp_lab's default on CPU


def _train(name: str, ov: dict, rank: int, world: int, steps: int = STEPS):
    model = initial_model()
    syncer = SYNCS[name](sync_cfg(name, **ov), model, torch.device("cpu"), world)
    opt = syncer.make_optimizer(_optim)
    xs, ys = global_batches(world)
    for k in range(steps):
        x, y = xs[k, rank * BATCH:(rank + 1) * BATCH], ys[k, rank * BATCH:(rank + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(syncer.wrapped(x), y).backward()
        syncer.sync()
        syncer.step(opt)
    return syncer, opt


def _weights(syncer) -> dict | None:
    state = syncer.model_state()  # collective (fsdp2 gathers)
    return None if state is None else {k: v.detach().numpy().copy() for k, v in state.items()}


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    out: dict = {"weights": {}, "state_bytes": {}, "comm_hook": {}}
    ref, ref_opt = _train("ddp", {}, rank, world)
    out["weights"]["ddp"] = _weights(ref)
    ref_state = ref.optimizer_state(ref_opt)
    for name, ov in TWINS:
        syncer, opt = _train(name, ov, rank, world)
        key = _key(name, ov)
        out["weights"][key] = _weights(syncer)
        out["state_bytes"][key] = syncer.memory(opt)["optimizer_state_bytes"]
        ddp = getattr(syncer.wrapped, "_get_ddp_logging_data", None)
        out["comm_hook"][key] = ddp()["comm_hook"] if ddp else None
        if name in ("torch_zero", "fsdp2"):  # checkpoints: a plain optimiser's state
            full = syncer.optimizer_state(opt)  # collective
            if rank == 0:
                out.setdefault("moments", {})[key] = max(
                    float((full["state"][i][m] - ref_state["state"][i][m]).abs().max())
                    for i in ref_state["state"] for m in ("exp_avg", "exp_avg_sq"))
        syncer.close()
    # resume: DDP's checkpoint (weights, optimiser state) into a fresh DDP and into each
    # sharded twin, one more step on each: the twin continues where DDP does
    box = copy.deepcopy([ref.model_state(), ref_state])  # (rank 0's: live tensors)
    dist.broadcast_object_list(box, src=0)
    for name, ov in (("ddp", {}), ("torch_zero", {}), ("fsdp2", {"reshard_after_forward": True})):
        model = initial_model()
        syncer = SYNCS[name](sync_cfg(name, **ov), model, torch.device("cpu"), world)
        opt = syncer.make_optimizer(_optim)
        mine = copy.deepcopy(box)
        syncer.load_model_state(mine[0])
        syncer.load_optimizer_state(opt, mine[1])
        out["state_bytes"]["resumed " + name] = syncer.memory(opt)["optimizer_state_bytes"]
        xs, ys = global_batches(world)
        x, y = xs[0, rank * BATCH:(rank + 1) * BATCH], ys[0, rank * BATCH:(rank + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(syncer.wrapped(x), y).backward()
        syncer.sync()
        syncer.step(opt)
        out["weights"]["resumed " + name] = _weights(syncer)
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def twin_world(request):
    return request.param, run_world(_worker, request.param, timeout=240)


def _diff(a: dict, b: dict) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in b)


def _allowed(key: str, world: int) -> float:
    hook = key.split("hook=")[-1] if "hook=" in key else None
    if hook in LOSSY:
        return LOSSY[hook]
    if key.startswith("torch_zero"):  # DDP's all-reduce, then an element-wise step: any world
        return 0.0
    if world >= 3:
        return ATOL_3
    return FUSED_SHARD if "fsdp2" in key else 0.0


@pytest.mark.dist
def test_every_twin_ends_with_ddps_weights(twin_world):
    world, results = twin_world
    weights = results[0]["weights"]
    ddp = weights["ddp"]
    measured = {}
    for name, ov in TWINS:
        key = _key(name, ov)
        measured[key] = d = _diff(weights[key], ddp)
        assert d <= _allowed(key, world), (key, world, d)
        if d == 0.0:  # bit for bit: the same digest
            assert all(np.array_equal(weights[key][k], ddp[k]) for k in ddp)
    print(f"world {world}: largest difference from ddp: {measured}")
    # resumed from DDP's checkpoint: the next step lands where DDP's does
    for name in ("torch_zero", "fsdp2"):
        d = _diff(weights["resumed " + name], weights["resumed ddp"])
        assert d <= _allowed(name, world), (name, world, d)


@pytest.mark.dist
def test_sharded_twins_hold_their_share_of_the_state(twin_world):
    world, results = twin_world
    full = 2 * sum(p.numel() * 4 for p in initial_model().parameters())  # Adam: two moments
    # FSDP2 chunks every parameter's rows: rank 0's part is ceil(rows / world) of each;
    # Adam's two moments of it, and a step counter per parameter (a few bytes)
    params = list(initial_model().parameters())
    most = sum(2 * -(-p.shape[0] // world) * (p.numel() // p.shape[0]) * 4 for p in params)
    for r in results:
        for key in ("fsdp2 reshard_after_forward=True", "resumed fsdp2"):
            assert r["state_bytes"][key] <= most + 16 * len(params), (key, r["state_bytes"])
    zero = [r["state_bytes"]["torch_zero"] for r in results]
    # whole parameters placed greedily: every rank holds something, together the whole
    assert sum(zero) >= full and min(zero) > 0 and max(zero) < full, zero
    assert [r["state_bytes"]["resumed torch_zero"] for r in results] == zero
    # the gathered state equals DDP's moments (a checkpoint any sync loads)
    for key, d in results[0]["moments"].items():
        assert d <= _allowed(key, world), (key, d)


@pytest.mark.dist
def test_ddp_logging_names_the_hook(twin_world):
    """The behaviour probe for sync.hook: DDP's own logging data names the hook that ran."""
    _, results = twin_world
    for name, ov in TWINS:
        if name == "ddp":
            assert results[0]["comm_hook"][_key(name, ov)] == f"ddp_lab_{ov['hook']}_hook"


# ----------------------------------------------------------------- refusals, in one line
@pytest.mark.parametrize("overrides, words", [
    (["sync=ddp", "sync.hook=ring", "sync.compress=fp16"], "both choose the comm hook"),
    (["sync=ddp", "sync.hook=fp16", "sync.compress=bf16"], "set one of them"),
    (["sync=ddp", "sync.hook=rign"], "sync.hook=rign: choose one of none, ring"),
    (["sync=torch_zero", "sync.compress=fp16"], "sync=torch_zero sync.compress=fp16"),
    (["sync=fsdp2", "sync.compress=bf16"], "sync=fsdp2 sync.compress=bf16"),
    (["sync=fsdp2", "sync.overlap=false"], "FSDP2 always reduce-scatters"),
])
def test_what_a_twin_cannot_run_is_refused_in_one_line(tmp_path, overrides, words):
    proc = subprocess.run([PY, "-m", "ddp_lab", *overrides, "launcher.nproc_per_node=2",
                           f"run.root={tmp_path}"], cwd=tmp_path, env=child_env(), text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert not any(tmp_path.iterdir()), "refused before any run folder"


def test_fsdp2_refusal_names_the_torch_it_needs():
    """On this torch fully_shard exists (no refusal); the line for one without it is
    tests/oldest_torch.py's, on the oldest torch ddp_lab supports."""
    from ddp_lab.world import torch_support

    assert torch_support.has_fully_shard() is hasattr(torch.distributed.fsdp, "fully_shard")
    if torch_support.has_fully_shard():
        assert torch_support.fsdp2_refusal() is None


# ----------------------------------------------------------------- no FutureWarning
def _collectives(rank: int, world: int) -> list[str]:
    import warnings

    from ddp_lab.collectives import torch_all_gather, torch_reduce_scatter

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, chunk = torch.zeros(4 * world), torch.full((4,), float(rank + 1))
        torch_all_gather(out, chunk)
        assert out.tolist() == [float(r + 1) for r in range(world) for _ in range(4)]
        mine = torch.zeros(4)
        torch_reduce_scatter(mine, torch.ones(4 * world))
        assert mine.tolist() == [float(world)] * 4
    return [f"{w.category.__name__}: {w.message}" for w in caught]


@pytest.mark.dist
def test_the_library_collectives_warn_nothing():
    """all_gather_single / reduce_scatter_single where torch has them (2.14 marks the
    *_into_tensor / *_tensor names deprecated): no warning at all."""
    for caught in run_world(_collectives, 2):
        assert caught == [], caught


# ----------------------------------------------------------------- through the CLI
@pytest.mark.dist
@pytest.mark.slow
def test_cli_twins_resume_match_ddp_and_the_report_compares_them(tmp_path, shared_data_root):
    """One epoch, then a second from the checkpoint: torch_zero and fsdp2 end where an
    uninterrupted DDP run ends; no run says FutureWarning; the report's twin table compares
    them with DDP (model.pt) and gives every rank's optimiser state."""
    base = ["launcher.nproc_per_node=2", "train.max_steps_per_epoch=6", "log.progress=lines",
            "train.eval_batch_size=5000", f"data.root={shared_data_root}"]
    root = tmp_path / "runs"
    dirs = {}
    for sync in ("ddp", "torch_zero", "fsdp2"):
        folder = root / sync
        if sync != "ddp":  # one epoch first, then continued to two
            proc = run_cli(f"sync={sync}", *base, "train.epochs=1", f"run.dir={folder}",
                           cwd=tmp_path)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        proc = run_cli(f"sync={sync}", *base, "train.epochs=2", f"run.dir={folder}",
                       cwd=tmp_path, env={"PYTHONWARNINGS": "default"})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        dirs[sync] = run_dir_of(proc)
        logs = proc.stdout + proc.stderr + "".join(
            p.read_text(errors="replace") for p in (dirs[sync] / "logs").glob("*"))
        assert "FutureWarning" not in logs, logs[-3000:]
    ddp = torch.load(dirs["ddp"] / "model.pt")
    for sync in ("torch_zero", "fsdp2"):
        s = summary(dirs[sync])
        assert s["epochs_done"] == 2 and len(s["memory_optimizer_state_bytes_per_rank"]) == 2
        twin = torch.load(dirs[sync] / "model.pt")
        d = max(float((twin[k] - ddp[k]).abs().max()) for k in ddp)
        assert d <= (FUSED_SHARD if sync == "fsdp2" else 0.0), (sync, d)
    assert summary(dirs["torch_zero"])["weights_sha256"] == summary(dirs["ddp"])["weights_sha256"]
    rep = subprocess.run([PY, "-m", "ddp_lab.report", str(root)], cwd=tmp_path, env=child_env(),
                         text=True, capture_output=True, timeout=300)
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    doc = json.loads((root / "report" / "report.json").read_text())
    rows = {r["sync"]: r for r in doc["twins"]["rows"]}
    assert rows["torch_zero"]["max_abs_diff_vs_ddp"] == 0.0
    assert rows["fsdp2"]["max_abs_diff_vs_ddp"] <= FUSED_SHARD
    assert "## Library twins" in (root / "report" / "report.md").read_text()
    assert "Library twins" in rep.stdout
