"""The entry every rank of the doctor's job runs: `python -m
ddp_lab.doctor.worker RUN_DIR`.

First, with no process group, what the rank sees (`facts`) into
RUN_DIR/doctor/rank<N>.json: a wrong interface or an unreachable
rendezvous is then still reported. Then, as a training rank joins
(`run_rank`), an all-reduce timed within each node and across nodes,
NCCL's transport from its INFO log, and rank 0's fingerprint of the
allocation (as a run's).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ddp_lab.doctor import facts as gather
from ddp_lab.folder.files import write_json
from ddp_lab.rank.main import rank_main, run_rank
from ddp_lab.world import fingerprint as fingerprints
from ddp_lab.world.env import EnvError, detect_env, hostname
from ddp_lab.world.ports import answers

# all-reduce sizes (bytes), each timed ITERS times after one warm-up,
# until a level has spent BUDGET_S: a slow link stops early, a fast one
# reaches the largest size
SIZES = (1 << 18, 1 << 20, 1 << 22, 1 << 24)
ITERS = 3
BUDGET_S = 3.0
# a rank that cannot join waits this long at most for the others' facts
FACTS_WAIT_S = 30.0


def run(run_dir: Path) -> int:
    from ddp_lab.config import load_run_config

    cfg = load_run_config(run_dir)
    out = run_dir / "doctor"
    environ = dict(os.environ)
    try:
        env = detect_env()
    except EnvError as e:
        write_json(out / f"unplaced-{hostname()}-{os.getpid()}.json",
                   {"error": str(e), "node": gather.node_name(environ)})
        print(f"[ddp_lab] doctor: cannot place this process: {e}", file=sys.stderr)
        return 1
    mine = gather.rank_facts(env, environ)
    mine["master"] = _master(env)
    if env.is_local_main:
        mine["node_facts"] = gather.node_facts(cfg.data.root, environ)
    names = gather.interfaces()
    missing = [k for k, c in gather.chosen_ifaces(environ, names).items() if not c["resolved"]]
    mine["skipped_group"] = bool(missing)
    write_json(out / f"rank{env.rank}.json", mine)
    # gloo / NCCL would fail on it after a timeout: say it now instead,
    if missing:
        # once every rank has written its facts (the launcher ends the
        # others as this one leaves, maybe before local rank 0 has read
        # its node)
        _wait_for(lambda: len(list(out.glob("rank*[0-9].json"))) >= env.world_size, FACTS_WAIT_S)
        print(f"[ddp_lab] doctor rank {env.rank}: {missing[0]}={environ[missing[0]]} is no "
              f"interface here ({', '.join(names)}): not joining", file=sys.stderr)
        return 1
    return run_rank(run_dir, cfg, lambda ctx: _measure(ctx, cfg, run_dir, out),
                    cfg.train.threads, failure={"kind": "doctor"})


def _wait_for(done, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not done() and time.monotonic() < end:
        time.sleep(0.2)


def _master(env) -> dict:
    """Whether the rendezvous host answers this node (any reply; the
    port is only bound as the group starts, under torchrun before the
    ranks do)."""
    if env.world_size == 1 or env.rank == 0:
        return {"answers": True}
    ok = answers(env.master_addr)
    return {"answers": ok, "why": None if ok else "no reply within 2 s: no route, or a "
            "firewall"}


def _measure(ctx, cfg, run_dir: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist

    env = ctx.env
    pairs = ctx.gather_objects((env.node_rank, hostname()))
    nodes: dict[int, list[int]] = {}
    for rank, (node, _) in enumerate(pairs):
        nodes.setdefault(node, []).append(rank)
    # every rank makes every group, in one order (new_group is
    # collective)
    groups = {n: (dist.new_group(rs) if len(rs) > 1 else None) for n, rs in sorted(nodes.items())}
    leaders = [rs[0] for _, rs in sorted(nodes.items())]
    cross = dist.new_group(leaders) if len(leaders) > 1 else None
    result: dict = {"rank": env.rank, "backend": ctx.backend, "device": str(ctx.device)}
    group = groups[env.node_rank]
    if group is not None:
        result["intra"] = _time(group, len(nodes[env.node_rank]), ctx, torch, dist)
    ctx.barrier()
    if cross is not None and env.rank in leaders:
        result["cross"] = _time(cross, len(leaders), ctx, torch, dist)
    ctx.barrier()
    mine = _nccl_lines(run_dir) if ctx.backend == "nccl" else None
    if mine is not None:
        from ddp_lab.doctor.parsers import nccl_transport

        result["nccl"] = nccl_transport(mine)
    detail = None
    if ctx.backend == "nccl":
        detail = ctx.gather_objects(fingerprints.read_nccl_transport(run_dir))
    write_json(out / f"rank{env.rank}.measure.json", result)
    # the allocation's fingerprint, as a run's telemetry makes it
    if env.is_main:
        hosts = list(dict.fromkeys(h for _, h in pairs))
        fp = fingerprints.collect(ctx.backend, ctx.device, hosts, cfg.launcher.name,
                                  env.num_nodes, env.local_world_size,
                                  nccl_transport=fingerprints.transport_label(detail or []),
                                  nccl_detail=detail)
        write_json(out / "fingerprint.json", {"fingerprint": fp,
                                              "fingerprint_id": fingerprints.fingerprint_id(fp)})


def _time(group, n: int, ctx, torch, dist) -> dict:
    """The all-reduce's bus bandwidth in `group` (n ranks), at the
    largest size the budget allows; every rank of the group takes the
    same decisions (the slowest rank's times)."""
    spent, row = 0.0, None
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
        dist.all_reduce(t, group=group)
        ctx.synchronize()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(t, group=group)
        ctx.synchronize()
        took = torch.tensor([(time.perf_counter() - t0) / ITERS], dtype=torch.float64,
                            device=ctx.device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
        each = float(took.item())
        spent += each * (ITERS + 1)
        row = {"bytes": nbytes, "seconds": each, "ranks": n, "backend": ctx.backend,
               "busbw_Bps": nbytes * 2 * (n - 1) / n / max(each, 1e-9)}
        if spent >= BUDGET_S or each * (ITERS + 1) * 4 > BUDGET_S - spent:
            break
    return row


def _nccl_lines(run_dir: Path) -> list[str]:
    lines: list[str] = []
    for f in sorted((run_dir / "logs").glob(f"nccl.*.{os.getpid()}.log")):
        try:
            lines += f.read_text(errors="replace").splitlines()
        except OSError:
            continue
    return lines


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, "ddp_lab.doctor.worker", "python -m ddp_lab.doctor", run)


if __name__ == "__main__":
    sys.exit(main())
