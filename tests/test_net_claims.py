"""The network benchmark's pure parts (`python -m ddp_lab.bench.suite network`,
ddp_lab/bench/specs/network.py), with no lab and no cluster: the predictions'
arithmetic, the claims and their targets, the tables, the plots from saved rounds, and a
user's mistake (one line naming the option, exit 2). The measurement itself needs a lab and
a SLURM cluster for minutes; what it exercises is tested where it lives (test_netlab*.py,
test_hierarchical*.py, test_compress.py, test_overlap.py, test_stragglers.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from helpers import REPO

from ddp_lab.bench.specs import network as nc  # its claims: pure, no lab

MB = 1e6


def test_rates_are_tc_rates_in_bytes():
    assert nc.rate_bytes("200mbit") == 25e6
    assert nc.rate_bytes("25mbps") == 25e6
    assert nc.rate_bytes("1gbit") == 125e6
    for bad in ("fast", "200mb", "0mbit", "none"):
        with pytest.raises(ValueError, match="not a tc rate"):
            nc.rate_bytes(bad)


def test_hierarchy_saving_is_half_a_buffer_at_the_link_rate():
    # flat ring of 4: 1.5 buffers over each link between nodes; the leaders' ring: 1
    assert nc.hierarchy_saving_s(10 * MB, 25e6) == pytest.approx(0.5 * 10 * MB / 25e6)


def figures(step, inflight, exposed=None, sent=11 * MB, payload=7 * MB, cross=None):
    return {"step_ms": step, "inflight_ms": inflight, "compute_ms": step - inflight,
            "exposed_ms": inflight if exposed is None else exposed, "sent_bytes": sent,
            "payload_bytes": payload, "cross_bytes": cross}


MEDIANS = {
    "ring": figures(700, 550),
    "hierarchical": figures(560, 420, sent=18 * MB, payload=10 * MB, cross=10 * MB),
    "ddp": figures(650, 500),
    "ddp fp16": figures(450, 270, sent=5.5 * MB),
    "ddp bf16": figures(460, 330, sent=5.5 * MB),
    "allreduce": figures(740, 580),
    "allreduce+overlap": figures(700, 560, exposed=510),
}


def test_claims_against_their_predictions_and_targets():
    found = {c.name: c for c in nc.claims(MEDIANS, 25e6, {"ddp": None,
                                                          "hierarchical": {"rank": 3}})}
    hier = found["hierarchical saves over ring (time/step)"]
    assert (hier.measured, hier.predicted, hier.ok) == (140, pytest.approx(200), False)
    fp16 = found["ddp fp16 / none: comm time/step (pred.: bytes)"]
    assert (fp16.measured, fp16.predicted, fp16.ok) == (0.54, 0.5, True)
    assert not found["ddp bf16 / none: comm time/step (pred.: bytes)"].ok  # 0.66: 32% off
    assert "ddp powersgd / none: comm time/step (pred.: bytes)" not in found  # not run
    share = found["allreduce+overlap: exposed / in-flight comm"]
    assert share.measured == pytest.approx(510 / 560) and share.ok
    step = found["allreduce+overlap: time/step (pred.: blocking - hidden comm)"]
    assert (step.measured, step.predicted, step.ok) == (700, 740 - 50, True)
    assert not found["slow node2 link, ddp: the straggler named"].ok
    assert found["slow node2 link, hierarchical: the straggler named"].ok


def test_a_slow_link_shows_in_the_comm_time():
    # hierarchical: 10 MB over the link a step; at 12.5 MB/s instead of 25: +400 ms
    slow = {"hierarchical": figures(1000, 830), "ddp": figures(1200, 900)}
    found = {c.name: c for c in nc.claims(MEDIANS, 25e6, {}, slow, 12.5e6)}
    hier = found["slow node2 link, hierarchical: comm/step grows by (pred.: link bytes at "
                 "the slower rate)"]
    assert (hier.measured, hier.predicted, hier.ok) == (410, pytest.approx(400), True)
    ddp = found["slow node2 link, ddp: comm/step grows by (pred.: link bytes at the slower rate)"]
    assert (ddp.measured, ddp.predicted, ddp.ok) == (400, pytest.approx(440), True)


def test_the_claims_table_says_what_was_met():
    table = nc.claims_table(nc.claims(MEDIANS, 25e6, {"ddp": None}))
    lines = table.splitlines()
    assert lines[0] == "| claim | measured | predicted | target | met |"
    assert "| hierarchical saves over ring (time/step) | 140.0 ms | 200.0 ms | within 20% | NO |" in lines
    assert "| slow node2 link, ddp: the straggler named | none | rank 2 or 3 | node2's ranks | NO |" in lines
    assert "| ddp fp16 / none: comm time/step (pred.: bytes) | 0.540 | 0.500 | within 20% | yes |" in lines


def rounds_of(phase, link, label, values, waits=None):
    return [{"phase": phase, "link": link, "round": r, "label": label,
             "figures": figures(v, v - 100), "waits": waits or [[0.1] * 20] * 4}
            for r, v in enumerate(values, 1)]


def test_medians_spread_and_the_straggler_from_rounds():
    rows = [*rounds_of("main", "200mbit", "ring", [700, 650, 720]),
            *rounds_of("main", "1gbit", "ring", [100])]
    med, spread = nc.summarise(rows, "main", "200mbit")
    assert med["ring"]["step_ms"] == 700 and spread["ring"] == (650, 720)
    assert "| ring | 700 (650-720) | 100 | 600 | 600 | 11.00 | - |" in nc.phase_table(med, spread)
    # rank 2 arrives last at every step: it waits 5 ms less than the others
    late = [[0.105] * 12, [0.105] * 12, [0.100] * 12, [0.105] * 12]
    named = nc.straggler_named(rounds_of("straggler", "200mbit", "ddp", [900, 910], late))
    assert named["ddp"]["rank"] == 2 and named["ddp"]["late_ms"] == pytest.approx(5)


def test_plots_from_saved_rounds(tmp_path):
    args = argparse.Namespace(link="200mbit", steps=16, powersgd_rank=32)
    rows = []
    for label in [*nc.SWEEP, "allreduce+overlap", *nc.COMPRESSED]:
        rows += rounds_of("main", "200mbit", label, [700, 650, 720])
    for link in ("1gbit", "100mbit"):
        for label in nc.SWEEP:
            rows += rounds_of("sweep", link, label, [400])
    nc.draw(args, rows, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "network_compression.png", "network_epoch_vs_link.png", "network_exposed_inflight.png"]


@pytest.mark.parametrize("argv, option", [
    (["--link", "2x"], "--link"),
    (["--rates", "1gbit,fast"], "--rates"),
    (["--slow-link", "slow"], "--slow-link"),
    (["--rounds", "0"], "--rounds"),
    (["--sweep-rounds", "-1"], "--sweep-rounds"),
    (["--bucket-mb", "0"], "--bucket-mb"),
    (["--hidden", "a,b"], "--hidden"),
    (["--lab", "nosuchlab"], "--lab"),
    (["--from", "/nowhere.json"], "--from"),
    (["--data-root", "/nowhere"], "--data-root"),
    (["--steps"], "--steps"),
])
def test_bad_arguments_one_line_exit_2(argv, option):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}  # no SLURM_CONF
    proc = subprocess.run([sys.executable, "-m", "ddp_lab.bench.suite", "network", *argv],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and option in proc.stderr, proc.stderr
