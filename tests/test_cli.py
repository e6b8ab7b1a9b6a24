"""A -m sweep ends with its table of jobs (ddp_lab/command/cli.py: SweepTable, a Hydra callback):
one row per job, printed last, so the end of the console says which job failed and why.
(The one-line mistakes of the command line are tests/test_mistakes.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import PY, child_env, summary

from ddp_lab.command.cli import sweep_table
from ddp_lab.command.job import Outcome
from ddp_lab.folder.description import sweep_name


def test_the_table_names_each_job_by_what_sets_it_apart():
    table = sweep_table([
        (0, ["model=cnn", "model.hidden=16", "train.epochs=1"], Outcome(0, "ok", Path("/r/a"))),
        (1, ["model=cnn", "model.hidden=8", "train.epochs=1"],
         Outcome(1, "failed: rank 1 ...: dead (no process)", Path("/r/bb"))),
        (2, ["model=cnn", "model.hidden=4", "train.epochs=1"], Outcome(2, "error: port in use")),
    ])
    assert table.splitlines() == [  # no summary.json: no figures, no columns for them
        "sweep of 3 job(s):",
        "      job              run dir  result",
        "  #0  model.hidden=16  /r/a     ok",
        "  #1  model.hidden=8   /r/bb    failed: rank 1 ...: dead (no process)",
        "  #2  model.hidden=4   -        error: port in use",
        "2 of 3 job(s) did not end ok: #1, #2",
    ]


def test_the_table_shows_what_a_sweep_is_run_for(tmp_path):
    """Each job's median epoch time, comm share (in flight, exposed) and test accuracy,
    as its summary.json has them; a job without them (failed early) shows dashes."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps(
        {"epoch_time_s_median": 1.234, "comm_fraction": 0.456, "comm_exposed_fraction": 0.0412,
         "test_accuracy": 0.90671}))
    table = sweep_table([(0, ["sync=ddp"], Outcome(0, "ok", tmp_path / "a")),
                         (1, ["sync=ring"], Outcome(1, "failed: x", tmp_path / "b"))])
    head, ddp, ring = table.splitlines()[1:4]
    assert head.split() == ["job", "epoch", "(median)", "comm", "in", "flight", "exposed", "test",
                            "acc", "run", "dir", "result"]
    assert ddp.split() == ["#0", "sync=ddp", "1.23", "s", "46%", "4%", "0.9067", str(tmp_path / "a"), "ok"]
    assert ring.split() == ["#1", "sync=ring", "-", "-", "-", "-", str(tmp_path / "b"), "failed:", "x"]
    assert head.index("(median)") + len("(median)") == ddp.index("1.23 s") + len("1.23 s")  # right-aligned


def test_a_single_job_shows_all_its_overrides():
    assert sweep_table([(0, ["optim=sgd", "train.lr=0.1"], Outcome(0, "ok", Path("/r")))]).splitlines()[2] == (
        "  #0  optim=sgd train.lr=0.1  /r       ok")
    assert "#0  (no overrides)  /r       ok" in sweep_table([(0, [], Outcome(0, "ok", Path("/r")))])


def _console(module: str, args: list[str], cwd: Path, env: dict | None = None):
    """`python -m <module> <args>`, stdout and stderr in one stream, as a terminal shows them."""
    return subprocess.run([PY, "-m", module, *args], cwd=cwd, env=child_env(env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


@pytest.mark.parametrize("module, sweep", [("ddp_lab", "optim=adam,sgd"),
                                           ("ddp_lab.bench", "launcher.nproc_per_node=1,2")])
def test_every_entry_point_ends_a_sweep_with_its_table(tmp_path, module, sweep):
    """Hydra calls the table (conf/config.yaml and conf/bench.yaml register it)."""
    proc = _console(module, ["-m", sweep, "launcher.dry_run=true", f"run.root={tmp_path}"], tmp_path)
    assert proc.returncode == 0, proc.stdout
    key, values = sweep.split("=")
    folders = [ln.removeprefix("run dir: ") for ln in proc.stdout.splitlines()
               if ln.startswith("run dir: ")]
    lines = proc.stdout.splitlines()[-5:]
    assert lines[0] == "sweep of 2 job(s):" and lines[-1] == "all 2 job(s) ok", proc.stdout
    # a training job's run, named by what sets it apart (its description's label, cut to
    # what differs among the sweep's runs); a bench's has no description
    runs = [["ddp"], ["ddp_sgd"]] if module == "ddp_lab" else [[], []]
    assert [row.split() for row in lines[2:4]] == [
        [f"#{i}", f"{key}={v}", *run, folder, "ok", "(dry", "run)"]
        for i, (v, folder, run) in enumerate(zip(values.split(","), folders, runs))], proc.stdout
    # each folder named first by what sets it apart: a training run by its description's
    # label, a bench by what the sweep varies
    names = [Path(f).name.split("_20")[0] for f in folders]
    if module == "ddp_lab":
        assert names == ["ddp_w2_mlp", "ddp_w2_mlp_sgd"], folders
    else:
        assert names == ["bench_local_" + sweep_name([f"{key}={v}"]) for v in values.split(",")], folders


@pytest.mark.dist
@pytest.mark.slow
def test_a_sweep_with_a_failed_job_ends_with_the_failure(tmp_path, shared_data_root):
    """Job #0 (2 ranks) loses rank 1 after epoch 1, job #1 (1 rank) completes: the console's
    last lines are the table naming #0's failure, and the exit status is the failure's."""
    proc = _console("ddp_lab", ["-m", "launcher.nproc_per_node=2,1", "train.epochs=2",
                                "train.max_steps_per_epoch=5", "log.progress=lines",
                                f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}"],
                    tmp_path, env={"DDP_LAB_FAIL_ONCE": "rank=1,epoch=1"})
    assert proc.returncode == 1, proc.stdout
    table = proc.stdout.rstrip().splitlines()[-5:]
    assert table[0] == "sweep of 2 job(s):" and table[-1] == "1 of 2 job(s) did not end ok: #0", proc.stdout
    failed, ok = (row.split() for row in table[2:4])
    folder = [w for w in failed if w.startswith("/")][0]
    result = " ".join(failed[failed.index(folder) + 1:])
    assert failed[:2] == ["#0", "launcher.nproc_per_node=2"], table
    assert result.startswith("failed: rank 1 ") and result.endswith("dead (no process)"), table
    assert summary(Path(folder))["status"] == "failed: " + result.removeprefix("failed: ")
    assert ok[:2] == ["#1", "launcher.nproc_per_node=1"] and ok[-1] == "ok", table
    s = summary(Path(ok[-2]))
    assert s["status"] == "completed" and ok[-3] == f"{s['test_accuracy']:.4f}", table


# ------------------------------------------------------------------ composed once
def _cli_in_process(monkeypatch, argv):
    """Run `cli` in this process with `argv`, counting Hydra's compositions; returns (exit
    code, compositions, what the task saw)."""
    from hydra._internal.hydra import Hydra
    from hydra.core.hydra_config import HydraConfig

    from ddp_lab import config
    from ddp_lab.command.cli import cli

    composed, seen = [], []
    real = Hydra.compose_config

    def counting(self, *a, **kw):
        composed.append(kw.get("run_mode"))
        return real(self, *a, **kw)

    def submit(cfg, t0=None):
        seen.append((cfg.sync.name, HydraConfig.get().overrides.task, str(HydraConfig.get().mode)))
        return Outcome(0, "ok")

    monkeypatch.setattr(Hydra, "compose_config", counting)
    monkeypatch.setattr("sys.argv", ["ddp_lab", *argv])
    config.register_configs()
    with pytest.raises(SystemExit) as ended:
        cli("config", submit, lambda cfg: None, schemas=(config,))
    return ended.value.code, composed, seen


def test_a_plain_run_composes_once_and_is_a_hydra_job(monkeypatch):
    rc, composed, seen = _cli_in_process(monkeypatch, ["sync=ring", "train.epochs=1"])
    assert rc == 0 and len(composed) == 1, composed
    assert seen == [("ring", ["sync=ring", "train.epochs=1"], "RunMode.RUN")]


def test_a_bad_override_on_the_fast_path_is_still_one_line(monkeypatch, capsys):
    rc, _, seen = _cli_in_process(monkeypatch, ["train.epoch=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and not seen and len(err) == 1 and "train.epochs" in err[0], err


def test_hydra_flags_still_take_hydra_main(monkeypatch, capsys):
    rc, composed, seen = _cli_in_process(monkeypatch, ["--cfg", "job", "sync=tree"])
    assert rc == 0 and not seen and "name: tree" in capsys.readouterr().out


def test_a_glob_sweep_runs_its_jobs(monkeypatch, tmp_path):
    """`-m sync=glob(ri*)`: the check of a sweep's jobs parses with a config loader, as
    Hydra's sweeper does (without one it refused every glob: "ConfigLoader is not set")."""
    monkeypatch.chdir(tmp_path)
    rc, _, seen = _cli_in_process(monkeypatch, ["-m", "sync=glob(ri*)", f"run.root={tmp_path}"])
    assert rc == 0 and [s[0] for s in seen] == ["ring"], seen
