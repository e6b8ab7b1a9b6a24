"""Issue 22 item 4: two allocations that differ only in their link's rate. The same 2-node
job (2 nodes x 1 rank: every gradient byte crosses the link) on the session's cluster, its
lab shaped to 200 Mbit/s and then to 50 Mbit/s: each run's fingerprint records its node's
link (the tbf rate, read with `tc` inside the node), so the two get different
fingerprint ids, and the report keeps them apart as two points of one series, the slow
link's time per epoch the longer. The link's 4x shows in each step's comm (its median over
every step, which a stall of the loaded machine in a few steps does not move); the epoch,
which holds the compute, the evaluation and those stalls too, is only the longer (a loaded CI
machine once took 3 s more in the fast run's epoch than in the slow one's)."""

from __future__ import annotations

import json

import pytest
from helpers import describe, run_cli, run_dir_of, summary
from netlab_fixture import shaped

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.dist, pytest.mark.netlab]

STEPS = 16
# 784-1024-10: 3.26 MB of gradients a step, each way across the link once: 130 ms at
# 25 MB/s, 520 ms at 6.25 MB/s, far above the compute of a step (~10 ms)
TRAIN = ["train.epochs=1", f"train.max_steps_per_epoch={STEPS}", "train.eval_batch_size=2000",
         "model=mlp", "model.hidden=[1024]", "sync=allreduce", "log.progress=lines"]
SLURM = ["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=1", "launcher.wait=true",
         "launcher.wait_timeout_s=300", "launcher.poll_s=1"]


def test_two_link_rates_two_fingerprints_and_the_report_tells_them_apart(
        slurm_cluster, shared_data_root, tmp_path):
    lab = slurm_cluster.lab_or_skip()
    runs, comm_step = {}, {}
    for link in ("200mbit", "50mbit"):
        with shaped(lab, link) as rate:
            proc = run_cli(*TRAIN, *SLURM, f"run.root={tmp_path / 'runs'}",
                           f"data.root={shared_data_root}", cwd=tmp_path, env=slurm_cluster.env,
                           timeout=400)
        assert proc.returncode == 0, describe(proc)
        runs[rate] = summary(run_dir_of(proc))
        (epoch,) = [json.loads(ln) for ln in (run_dir_of(proc) / "metrics.jsonl").read_text()
                    .splitlines()]
        comm_step[rate] = epoch["comm"]["per_step_s"]["median"]
    fast, slow = runs[25e6], runs[6.25e6]
    for rate, s in runs.items():
        assert s["status"] == "completed" and (s["nodes"], s["world_size"]) == (2, 2), s
        assert s["fingerprint"]["link"]["iface"] == "eth0"
        assert s["fingerprint"]["link"]["shaped_Bps"] == rate, s["fingerprint"]
    assert fast["fingerprint_id"] != slow["fingerprint_id"]

    res = run_cli(str(tmp_path / "runs"), "-o", str(tmp_path / "report"), "--no-plots",
                  cwd=tmp_path, module="ddp_lab.report", timeout=120)
    assert res.returncode == 0, describe(res)
    (series,) = json.loads((tmp_path / "report" / "report.json").read_text())["scaling"]
    rows = {r["fingerprint_id"]: r for r in series["rows"]}
    assert set(rows) == {fast["fingerprint_id"], slow["fingerprint_id"]}, series["rows"]
    t_fast = rows[fast["fingerprint_id"]]["epoch_time_s_mean"]
    t_slow = rows[slow["fingerprint_id"]]["epoch_time_s_mean"]
    c_fast, c_slow = comm_step[25e6], comm_step[6.25e6]
    print(f"time per epoch: {t_fast:.2f} s at 200mbit, {t_slow:.2f} s at 50mbit "
          f"({t_slow / t_fast:.2f}x); comm a step (median): {1e3 * c_fast:.0f} ms and "
          f"{1e3 * c_slow:.0f} ms ({c_slow / c_fast:.2f}x; the rates are 4x)")
    # a quarter of the rate: each step's comm over twice as long, and the epoch the longer
    assert c_slow > 2 * c_fast, (c_fast, c_slow)
    assert t_slow > t_fast, (t_fast, t_slow)
    links = {k: v["link"] for k, v in series["fingerprints"].items()}
    assert links[slow["fingerprint_id"]]["shaped_Bps"] == 6.25e6, links
