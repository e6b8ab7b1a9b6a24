"""The run folder's records: EpochRecord/RunSummary round trips, files written before
versioning (copied from a real 2-rank, 1-epoch run of the trainer as it was before
`schema_version`) still read, the report reads through the types, and only the logging rank
writes (a real 2-rank gloo world drives `Telemetry`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ddp_lab.folder.records import SCHEMA_VERSION, EpochRecord, RunSummary
from helpers import run_world

# `python -m ddp_lab launcher.nproc_per_node=2 train.epochs=1 train.max_steps_per_epoch=5`
# before schema_version existed: metrics.jsonl's line and summary.json, verbatim
OLD_METRICS_LINE = (
    '{"comm": {"algbw_GBps": 0.037689377628093886, "busbw_GBps": 0.037689377628093886, "b'
    'ytes_exact": false, "bytes_recv": 795200, "bytes_sent": 795200, "calls": 5, "fractio'
    'n": 0.40537127945521495, "payload_bytes": 795200, "per_step_s": {"mean": 0.004219756'
    '600105029, "median": 0.0031228059997374658, "p95": 0.006937078000191832}, "time_s": '
    '0.021098783000525145}, "comm_fraction": 0.40537127945521495, "epoch": 1, "epoch_time'
    '_s": 0.05298047500036773, "phase_s": {"backward": {"mean": 0.00718203739997989, "med'
    'ian": 0.003906154999640421, "p95": 0.01872802799971396, "total": 0.03591018699989945'
    '}, "data": {"mean": 0.00037716919996455545, "median": 0.00021148699943296378, "p95":'
    ' 0.001218063999658625, "total": 0.0018858459998227772}, "forward": {"mean": 0.002359'
    '6544000611176, "median": 0.0006668400001217378, "p95": 0.008856637000462797, "total"'
    ': 0.011798272000305587}, "optim": {"mean": 0.0004885218000708847, "median": 0.000472'
    '11499986588024, "p95": 0.0007882270001573488, "total": 0.002442609000354423}, "step"'
    ': {"mean": 0.010409609200178239, "median": 0.008881433001079131, "p95": 0.0199565519'
    '98802752, "total": 0.05204804600089119}, "sync": {"mean": 2.2264001017902045e-06, "m'
    'edian": 2.0440002117538825e-06, "p95": 3.155999365844764e-06, "total": 1.11320005089'
    '51023e-05}}, "samples_per_s": 12079.921895671147, "steps": 5, "stragglers": {"fastes'
    't_rank": 0, "fastest_s": 0.05204804600089119, "measure": "step time", "per_rank_comp'
    'ute_s": [0.030949263000366045, 0.021339968000575027], "per_rank_s": [0.0520480460008'
    '9119, 0.062068969000392826], "slowest_rank": 1, "slowest_s": 0.062068969000392826, "'
    'spread": 1.1925321653637113}, "test_accuracy": 0.5736, "test_loss": 1.85846092529296'
    '87, "timing": true, "train_loss": 2.12803635597229, "world_size": 2}')
OLD_SUMMARY = (
    '{"backend": "gloo", "batch_size": 64, "comm_algbw_GBps": 0.037689377628093886, "comm'
    '_busbw_GBps": 0.037689377628093886, "comm_bytes_exact": false, "comm_bytes_recv": 79'
    '5200, "comm_bytes_sent": 795200, "comm_calls": 5, "comm_fraction": 0.405371279455214'
    '95, "comm_payload_bytes": 795200, "comm_time_s": 0.021098783000525145, "device": "cp'
    'u", "env_source": "torchrun", "epoch_time_s_mean": 0.05298047500036773, "epoch_time_'
    's_median": 0.05298047500036773, "epochs": 1, "epochs_run": 1, "hosts": ["vm"], "laun'
    'cher": "local", "model": "mlp", "node_ranks": [0], "nodes": 1, "nproc_per_node": 2, '
    '"optim": "adam", "pipeline": "tensor", "start_epoch": 0, "status": "completed", "ste'
    'p_time_ms_mean": 10.409609200178238, "steps_run": 5, "sync": "ddp", "test_accuracy":'
    ' 0.5736, "test_loss": 1.8584609252929687, "timing_enabled": true, "torch": "2.14.1+c'
    'u130", "train_loss": 2.12803635597229, "world_size": 2}')


# ----------------------------------------------------------------- the types
def test_old_files_read_as_version_0_with_every_value():
    rec = EpochRecord.from_dict(json.loads(OLD_METRICS_LINE))
    assert rec.schema_version == 0 and rec.extra == {}
    assert (rec.epoch, rec.world_size, rec.steps, rec.timing) == (1, 2, 5, True)
    assert rec.test_accuracy == 0.5736 and rec.stragglers["slowest_rank"] == 1
    assert rec.phase_s["step"]["total"] == pytest.approx(0.05204804600089119)
    # written back: the same object plus the version it was read as
    # (fields added since, all optional, come back at their defaults)
    overlap_keys = {"comm_exposed_s": None, "comm_exposed_fraction": None,
                    "comm_inflight_s": None, "compute_s": None, "overlap": None}
    assert rec.to_dict() == {**json.loads(OLD_METRICS_LINE), "schema_version": 0,
                             "resumed_at_step": None, "straggler": None, "compress": None,
                             "train_accuracy": None, "step_time_s": None, "steps_sampled": None,
                             **overlap_keys}

    s = RunSummary.from_dict(json.loads(OLD_SUMMARY))
    assert s.schema_version == 0 and s.extra == {}
    assert (s.status, s.world_size, s.device, s.hosts) == ("completed", 2, "cpu", ["vm"])
    assert s.to_dict() == {**json.loads(OLD_SUMMARY), "schema_version": 0, "epochs_done": None,
                           "step_in_epoch": None, "stop_reason": None, "job_id": None,
                           "segments": [], "fingerprint": {}, "fingerprint_id": None,
                           "global_batch": None, "scaling": None,
                           "micro_batch": None, "accumulation": None, "study": None,
                           "compiled": None, "compile_s": None, "cuda_graph": None,
                           "ddp_timing": None, "witnesses": None,
                           "entry": None, "records_kept": None,
                           "straggler": None, "injected_delay": None,
                           "comm_bytes_cross_node": None, "compress": None,
                           "memory_param_bytes": None, "memory_grad_bytes": None,
                           "memory_optimizer_state_bytes": None,
                           "memory_optimizer_state_bytes_per_rank": None,
                           "weights_sha256": None, **overlap_keys}


def test_round_trip_keeps_unknown_keys_and_fills_defaults():
    rec = EpochRecord(epoch=3, world_size=4, train_loss=0.5, steps=7,
                      extra={"exposed_comm_s": 0.25})  # a key from a newer writer
    d = json.loads(json.dumps(rec.to_dict()))
    assert d["schema_version"] == SCHEMA_VERSION and d["exposed_comm_s"] == 0.25
    assert EpochRecord.from_dict(d) == rec
    # a failed run's summary: the status and little else; every other field has a default
    failed = RunSummary.from_dict({"status": "failed: boom", "world_size": 2, "queue": "17"})
    assert failed.epoch_time_s_median is None and failed.hosts == [] and failed.extra == {"queue": "17"}
    assert RunSummary.from_dict(failed.to_dict()) == failed
    with pytest.raises(ValueError, match="epoch"):
        EpochRecord.from_dict({"world_size": 2})  # not an epoch record
    with pytest.raises(ValueError, match="JSON object"):
        EpochRecord.from_dict([1, 2])


# ----------------------------------------------------------------- the report reads them
def _run_folder(root: Path, metrics: str, summary: str, device_cfg: str = "auto") -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(
        "launcher:\n  name: local\n  nodes: 1\n  nproc_per_node: 2\nsync:\n  name: ddp\n"
        f"model:\n  name: mlp\ntrain:\n  epochs: 1\n  batch_size: 64\ndist:\n  device: {device_cfg}\n")
    (root / "metrics.jsonl").write_text(metrics)
    if summary:
        (root / "summary.json").write_text(summary)
    return root


def test_report_reads_a_run_written_before_versioning(tmp_path):
    from ddp_lab.report.run import load_run

    run = load_run(_run_folder(tmp_path / "old", OLD_METRICS_LINE + "\n", OLD_SUMMARY))
    assert run.ok and run.status == "completed"
    assert [type(r) for r in run.records] == [EpochRecord]
    assert run.steps_total() == 5 and run.samples_per_s() == pytest.approx(12079.921895671147)
    assert run.phase_ms()["step"] == pytest.approx(10.409609200178239)
    assert run.comm_per_step()["calls"] == 1.0
    assert run.get("epoch_time_s_median") == pytest.approx(0.05298047500036773)
    assert run.device_kind == "cpu"


def test_report_counts_torn_and_foreign_lines(tmp_path):
    from ddp_lab.report.run import load_run

    lines = OLD_METRICS_LINE + "\n" + '{"world_size": 2}\n' + OLD_METRICS_LINE[:40] + "\n"
    run = load_run(_run_folder(tmp_path / "torn", lines, OLD_SUMMARY))
    assert len(run.records) == 1 and run.status == "completed (2 unreadable metrics line(s) ignored)"


@pytest.mark.parametrize("device, cfg_device, kind", [
    ("cpu", "auto", "cpu"), ("CPU", "auto", "cpu"), ("cpu:0", "auto", "cpu"),
    ("NVIDIA H100 80GB HBM3", "auto", "NVIDIA H100 80GB HBM3"),
    (None, "cpu", "cpu"), (None, "auto", "auto")])
def test_device_kind_is_cpu_or_the_gpu_name(tmp_path, device, cfg_device, kind):
    from ddp_lab.report.run import load_run

    summary = json.loads(OLD_SUMMARY)
    summary["device"] = device
    run = load_run(_run_folder(tmp_path / "r", "", json.dumps(summary), cfg_device))
    assert run.device_kind == kind


# ----------------------------------------------------------------- the writers
def test_run_folder_sink_rewrites_metrics_atomically_and_truncates_on_resume(tmp_path):
    from ddp_lab.folder.metrics import RunFolderSink

    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({**json.loads(OLD_METRICS_LINE), "epoch": e}) + "\n" for e in (1, 2, 3)))
    sink = RunFolderSink(tmp_path)
    sink.truncate_after(2, 10)  # resuming from the epoch-2 checkpoint, 10 steps in
    sink.tensorboard("ring_w2_mlp", "config", {"sync": "ring"})
    assert [json.loads(ln)["epoch"] for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    rec = EpochRecord(epoch=3, world_size=2, steps=5, comm={"bytes_sent": 1})
    sink.epoch(rec, {"loss/train": 1.0}, 15)
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["epoch"] for ln in lines] == [1, 2, 3]
    assert EpochRecord.from_dict(json.loads(lines[-1])) == rec
    assert not list(tmp_path.glob(".metrics.jsonl.tmp-*"))  # no temp file left behind


def test_a_torn_metrics_line_costs_its_record_not_the_resume(tmp_path):
    """Issue 20: a stopped run whose metrics.jsonl ends with half a line (damaged outside
    the run) resumes; the torn line is moved aside (kept) and named in the log, once."""
    from ddp_lab.folder.metrics import RunFolderSink

    whole = [json.dumps({**json.loads(OLD_METRICS_LINE), "epoch": e}) for e in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(whole) + "\n" + whole[1][:40])
    sink = RunFolderSink(tmp_path)
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # the rank's log, here
    logging.getLogger("ddp_lab").addHandler(handler)
    try:
        sink.truncate_after(2)
    finally:
        logging.getLogger("ddp_lab").removeHandler(handler)
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["epoch"] for ln in lines] == [1, 2]
    assert said == ["metrics.jsonl: 1 line(s) that are not JSON records (torn?), line 3 first: "
                    "moved to metrics.jsonl.torn"], said
    assert (tmp_path / "metrics.jsonl.torn").read_text() == whole[1][:40] + "\n"  # kept


def _telemetry_cfg(*overrides: str):
    """The trainer's config as the schema types it (Telemetry reads its keys directly)."""
    from helpers import compose

    return compose("launcher=local", "sync=ddp", "model=mlp", "optim=adam",
                   "train.batch_size=2", "train.lr=0.1", "log.progress=lines", *overrides)


def _telemetry_rank(rank: int, world: int, root: str) -> dict:
    """Drive Telemetry on a real rank as the loop does: start, one epoch, finish."""
    import torch

    from ddp_lab.world.distributed import DistContext
    from ddp_lab.world.env import DistEnv
    from ddp_lab.rank.records import MeasuredEpoch
    from ddp_lab.rank.records import Telemetry
    from ddp_lab.timing import PHASES, CommStats, StepTimes

    cfg = _telemetry_cfg("train.epochs=1", "timing.trace=false", "timing.trace_steps=2",
                         "timing.tb_every=1")
    env = DistEnv(rank, rank, world, world, 0, 1, "127.0.0.1", 1, "test")
    ctx = DistContext(env=env, backend="gloo", device=torch.device("cpu"))
    run_dir = Path(root) / f"rank{rank}"  # each rank its own folder: who writes shows
    tel = Telemetry(cfg, ctx, run_dir, steps_per_epoch=2, bytes_exact=True)
    tel.start(0)
    d = 0.001 * (rank + 1)  # rank 1's phases take twice as long: the straggler
    steps = [StepTimes([(p, (5 * i + k) * d, (5 * i + k + 1) * d) for k, p in enumerate(PHASES)])
             for i in range(2)]
    comm = CommStats(calls=2, bytes_sent=800, bytes_recv=800, payload_bytes=800, seconds=d)
    rec = tel.epoch(MeasuredEpoch(1, steps, comm, busy_s=10 * d, wall_s=0.1,
                                  loss_sum=2.0 * (rank + 1), samples=4, test=(0.5, 0.9)))
    summary = tel.finish()
    return {"sink": type(tel.sink).__name__, "record": rec.to_dict(), "summary": summary.to_dict()}


@pytest.mark.dist
def test_only_the_logging_rank_writes(tmp_path):
    results = run_world(_telemetry_rank, 2, str(tmp_path))
    assert [r["sink"] for r in results] == ["RunFolderSink", "NullSink"]
    assert not (tmp_path / "rank1").exists()  # rank 1 wrote nothing at all
    written = tmp_path / "rank0"
    assert {p.name for p in written.iterdir()} == {"metrics.jsonl", "summary.json", "tb"}
    (tb_run,) = (written / "tb").iterdir()  # one TensorBoard run, named by the description
    assert tb_run.name.startswith("ddp_w2_mlp") and list(tb_run.glob("events.out.tfevents.*"))
    (line,) = (written / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line) == results[0]["record"]
    assert json.loads((written / "summary.json").read_text()) == results[0]["summary"]
    for r in results:  # the collective parts agree on every rank
        rec = EpochRecord.from_dict(r["record"])
        assert rec.schema_version == SCHEMA_VERSION and rec.train_loss == pytest.approx(0.75)
        assert rec.stragglers["slowest_rank"] == 1
        assert rec.stragglers["per_rank_s"] == pytest.approx([0.01, 0.02])
        s = RunSummary.from_dict(r["summary"])
        assert (s.status, s.epochs_run, s.steps_run, s.world_size) == ("completed", 1, 2, 2)
        assert s.comm_bytes_sent == 800 and s.test_accuracy == 0.9


def test_equal_weight_digests_are_the_same_weights_bit_for_bit():
    """folder/weights.py's digest, on the CNN (odd sizes): a copy has the same digest; one
    last-bit change, -0.0 for 0.0, another dtype, shape or name does not."""
    import torch

    from ddp_lab.folder.weights import digest
    from ddp_lab.models import CNN

    torch.manual_seed(0)
    state = CNN().state_dict()
    copy = {k: v.clone() for k, v in state.items()}
    assert digest(copy) == digest(state)
    changed = []
    one_ulp = {k: v.clone() for k, v in state.items()}
    w = one_ulp["fc1.weight"].view(-1)
    w[12345] = torch.nextafter(w[12345], torch.tensor(float("inf")))
    changed.append(one_ulp)
    zero = {k: v.clone() for k, v in state.items()}
    zero["fc2.bias"][3] = 0.0
    neg = {k: v.clone() for k, v in zero.items()}
    neg["fc2.bias"][3] = -0.0
    assert torch.equal(zero["fc2.bias"], neg["fc2.bias"]) and digest(zero) != digest(neg)
    changed.append({**state, "fc2.bias": state["fc2.bias"].double()})
    changed.append({**state, "fc2.bias": state["fc2.bias"].view(2, 5)})
    changed.append({("fc3.bias" if k == "fc2.bias" else k): v for k, v in state.items()})
    assert all(digest(c) != digest(state) for c in changed)
