"""`python -m ddp_lab.check`, on real forked gloo ranks: the notebook's own seven
solutions (read from ../shared/seeds/ as the test runs, never copied), students' broken
files (tests/students/), ddp_lab's own collectives, bad input, and `sync=custom` trained
against DDP's weights and through a real run's consumers.

What each verdict is checked against is the case the test planted (the rank that raises,
the line it raises on, the pair that both send first), never what the check computed.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from helpers import REPO, describe, run_cli, run_dir_of, run_world

SEEDS = REPO.parent / "shared" / "seeds" / "004_28afbf3ed4f504c3.txt"
STUDENTS = REPO / "tests" / "students"
pytestmark = pytest.mark.dist


def notebook_solutions(path: Path) -> Path:
    """The sheet's code blocks that define its solutions, as a student pastes them into
    one file: the sheet's `from test import ...` and `if __name__` blocks left out."""
    text = SEEDS.read_text()
    out = ["import torch", "from torch import distributed as dist",
           "from torch.distributed import ReduceOp", ""]
    for block in re.findall(r"```python3?\n(.*?)```", text, re.S):
        if not re.search(r"^def (broadcast|reduce|allreduce)_", block, re.M):
            continue
        skip = False
        for line in block.splitlines():
            if line.startswith("from test import"):
                continue
            if line.startswith("if __name__"):
                skip = True
                continue
            if skip and (line.startswith(" ") or not line.strip()):
                continue
            skip = False
            out.append(line)
    path.write_text("\n".join(out) + "\n")
    return path


def _line_of(path: Path, needle: str, after: str) -> int:
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln)
    return next(i + 1 for i, ln in enumerate(lines) if i > start and needle in ln)


def _check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run_cli(*args, f"run.root={tmp_path / 'out'}", cwd=tmp_path, module="ddp_lab.check")
    run_dir = run_dir_of(proc)
    return proc, {f["name"]: f for f in json.loads((run_dir / "check.json").read_text())["functions"]}


@pytest.mark.slow
def test_the_notebooks_seven_solutions(tmp_path):
    nb = notebook_solutions(tmp_path / "notebook.py")
    proc, got = _check(tmp_path, str(nb))
    assert proc.returncode == 1, describe(proc)
    assert set(got) == {"broadcast_naive", "broadcast_tree", "broadcast_ring", "reduce_naive",
                        "reduce_tree", "allreduce_naive", "allreduce_butterfly"}
    assert got["broadcast_naive"]["verdict"] == "pass"
    assert got["broadcast_ring"]["verdict"] == "pass"
    assert got["broadcast_naive"]["worlds_passed"] == [1, 2, 3, 4, 5, 6, 7]
    tree = got["broadcast_tree"]
    assert tree["verdict"] == "wrong" and tree["first_failure"]["world_size"] == 3, tree
    for name in ("reduce_naive", "allreduce_naive"):
        f = got[name]
        assert f["verdict"] != "pass", f
        assert ("not written" in f["detail"] and "rebinds" in f["detail"]) or \
            "barrier" in f["detail"], f
        assert f["first_failure"]["op"] in ("MAX", "MIN") or "barrier" in f["detail"], f
    crash = got["reduce_tree"]
    line = _line_of(nb, "dist.recv(buff", "def reduce_tree")
    assert crash["verdict"] == "crash", crash
    assert f"notebook.py:{line}" in crash["detail"] and "float" in crash["detail"], crash
    assert crash["ranks"][0]["where"] in (f"notebook.py:{line}",
                                          f"notebook.py:{_line_of(nb, 'dist.send(', 'def reduce_tree')}")
    hang = got["allreduce_butterfly"]
    send = _line_of(nb, "dist.send(tensor.clone(), partner_rank)", "def allreduce_butterfly")
    assert hang["verdict"] == "hang" and hang["first_failure"]["world_size"] == 2, hang
    assert sorted((r["rank"], r["op"], r["peer"], r["where"]) for r in hang["ranks"]) == [
        (0, "send", 1, f"notebook.py:{send}"), (1, "send", 0, f"notebook.py:{send}")]
    assert "rank 0 sends to 1 and rank 1 sends to 0" in hang["detail"]
    # a screen: the table and one line per failure, the run dir last
    assert len(proc.stdout.split("\n\n", 1)[1].splitlines()) <= 25, proc.stdout
    # every rank ended, whatever the verdict
    assert not _leftover_ranks(tmp_path), _leftover_ranks(tmp_path)


def _leftover_ranks(tmp_path: Path) -> list[str]:
    """This test's check processes still there: a command line naming its folder (the run
    root), not another session's check on the same machine."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines()
            if "ddp_lab" in ln and str(tmp_path) in ln and "ps -eo" not in ln]


def test_broken_files_get_their_verdict_with_rank_and_line(tmp_path):
    files = ["deadlock", "off_by_one", "forgot_root", "raises_on_one", "not_written", "ring_ok",
             "extra_barrier"]
    proc, got = _check(tmp_path, *(str(STUDENTS / f"{f}.py") for f in files),
                       "check.worlds=[1,2,3,4]")
    assert proc.returncode == 1, describe(proc)
    dead = got["all_reduce_sendfirst"]
    line = _line_of(STUDENTS / "deadlock.py", "dist.send(acc", "def all_reduce_sendfirst")
    assert dead["verdict"] == "hang", dead
    assert {(r["rank"], r["op"], r["where"]) for r in dead["ranks"]} == {
        (0, "send", f"deadlock.py:{line}"), (1, "send", f"deadlock.py:{line}")}
    chunks = got["all_reduce_ring_chunks"]
    assert chunks["verdict"] in ("wrong", "crash") and chunks["first_failure"]["world_size"] == 3
    assert chunks["worlds_passed"] == [1, 2], chunks
    root = got["broadcast_from_zero"]
    assert root["verdict"] == "wrong" and root["first_failure"]["root"] != 0, root
    raised = got["reduce_last_raises"]
    line = _line_of(STUDENTS / "raises_on_one.py", "raise ValueError", "def reduce_last")
    assert raised["verdict"] == "crash", raised
    assert raised["ranks"][0]["rank"] == raised["first_failure"]["world_size"] - 1
    assert raised["ranks"][0]["where"] == f"raises_on_one.py:{line}", raised
    unwritten = got["all_reduce_returns"]
    assert unwritten["verdict"] == "wrong"
    assert "not written, but the returned value is right" in unwritten["detail"], unwritten
    extra = got["reduce_extra_barrier"]
    line = _line_of(STUDENTS / "extra_barrier.py", "dist.barrier()", "def reduce_extra")
    assert extra["verdict"] == "hang" and extra["first_failure"]["world_size"] == 2, extra
    root = extra["first_failure"]["root"]
    assert f"rank {root} called barrier once, rank {1 - root} never" in extra["detail"], extra
    assert {(r["rank"], r["op"], r["where"]) for r in extra["ranks"]} == {
        (root, "barrier", f"extra_barrier.py:{line}"), (1 - root, "returned", None)}
    ok = got["all_reduce_ring"]
    # SUM only, and right everywhere: no false alarm
    assert ok["verdict"] == "unsupported" and ok["first_failure"] is None, ok
    assert ok["worlds_passed"] == [1, 2, 3, 4] and "SUM" not in ok["unsupported"], ok
    assert len(ok["bytes"]["sent"]) == ok["bytes"]["world_size"] == 4
    # the ring moves 2(n-1)/n of the tensor: each element travels 2(n-1) hops in all
    assert sum(ok["bytes"]["sent"]) == 2 * (4 - 1) * 3001 * 4, ok["bytes"]
    assert sum(ok["bytes"]["recv"]) == sum(ok["bytes"]["sent"])
    assert not _leftover_ranks(tmp_path)


@pytest.mark.slow  # every collective at four worlds, a minute; the check in the fast tier: test_broken_files_...
def test_ddp_labs_own_collectives_pass():
    import ddp_lab.collectives as C
    from ddp_lab.check import check
    from ddp_lab.config.student import collective_of

    fns = [getattr(C, n) for n in C.__all__ if callable(getattr(C, n))
           and collective_of(n) and not n.startswith("torch_")]
    assert len(fns) >= 10, [f.__name__ for f in fns]
    results = check(*fns, worlds=(1, 2, 3, 5), quiet=True)
    bad = [f"{r.name}: {r.verdict}: {r.detail}" for r in results if r.verdict != "pass"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("args, says", [
    (["missing.py"], "missing.py: no such file"),
    (["bad.py"], "bad.py:2: syntax error"),
    (["empty.py"], "no collective found"),
    (["empty.py:nope"], "defines no function 'nope'"),
    (["empty.py:helper"], "says no collective"),
    (["empty.py:helper=allreduce"], "unknown collective"),
    (["imports.py"], "imports.py:1: importing it raised ModuleNotFoundError: No module named"),
    (["empty.py", "check.worlds=[0]"], "check.worlds"),
    (["empty.py", "check.nope=1"], "nope"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "bad.py").write_text("def f():\n    return (\n")
    (tmp_path / "empty.py").write_text("def helper(t):\n    return t\n")
    (tmp_path / "imports.py").write_text("from harness_of_the_sheet import test_naive\n"
                                         "def broadcast_x(t, src):\n    pass\n")
    proc = run_cli(*args, cwd=tmp_path, module="ddp_lab.check")
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "outputs").exists()


def test_templates_are_stubs_the_check_reads(tmp_path):
    for name in ("notebook", "assignment"):
        proc = run_cli("--template", name, cwd=tmp_path, module="ddp_lab.check")
        assert proc.returncode == 0, describe(proc)
        (tmp_path / f"{name}.py").write_text(proc.stdout)
    proc, got = _check(tmp_path, str(tmp_path / "notebook.py"), str(tmp_path / "assignment.py"),
                       "check.worlds=[2]")
    assert {"broadcast_tree", "reduce_tree", "allreduce_butterfly", "all_reduce_ring",
            "all_gather_ring", "reduce_scatter_ring"} <= set(got)
    assert {f["verdict"] for f in got.values()} == {"unsupported"}, got


# ------------------------------------------------------------------ sync=custom
def _custom_vs_ddp(rank: int, world: int, spec: str) -> dict:
    import torch.nn.functional as F

    from ddp_lab.sync import SYNCS
    from test_sync import STEPS, global_batches, initial_model, sync_cfg

    torch.set_num_threads(1)
    xs, ys = global_batches(world)
    out = {}
    for name, extra in (("ddp", {}), ("custom", {"all_reduce": spec})):
        model = initial_model()
        syncer = SYNCS[name](sync_cfg(name, **extra), model, torch.device("cpu"), world)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for k in range(STEPS):
            x = xs[k, rank * 8:(rank + 1) * 8]
            loss = F.cross_entropy(syncer.wrapped(x), ys[k, rank * 8:(rank + 1) * 8])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            syncer.sync()
            syncer.step(opt)
        comm = syncer.collect_comm()
        out[name] = {"params": [p.detach().numpy().copy() for p in model.parameters()],
                     "sent": comm.bytes_sent, "recv": comm.bytes_recv}
        syncer.close()
    return out


def test_custom_ring_trains_to_ddps_weights_on_3_ranks():
    spec = f"{STUDENTS / 'ring_ok.py'}:all_reduce_ring"
    results = run_world(_custom_vs_ddp, 3, spec)
    for r in results:
        for a, b in zip(r["custom"]["params"], r["ddp"]["params"]):
            assert abs(a - b).max() <= 1e-5
    # bytes from the student's own calls: every element travels 2(n-1) hops over the ring
    n_params = sum(p.size for p in results[0]["ddp"]["params"])
    from test_sync import STEPS
    assert sum(r["custom"]["sent"] for r in results) == 2 * 2 * n_params * 4 * STEPS
    assert sum(r["custom"]["recv"] for r in results) == sum(r["custom"]["sent"] for r in results)


@pytest.mark.slow
def test_sync_custom_run_named_by_its_function_everywhere(tmp_path):
    """A real run: refused before start with a function that hangs; trained with a right
    one, then status, the report and TensorBoard name it by the function."""
    proc = run_cli("sync=custom", f"sync.all_reduce={STUDENTS / 'deadlock.py'}:all_reduce_sendfirst",
                   "launcher.nproc_per_node=2", f"run.root={tmp_path / 'out'}", cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert "does not pass its check at world 2: hang" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "out").exists()
    proc = run_cli("sync=custom", f"sync.all_reduce={STUDENTS / 'ring_ok.py'}:all_reduce_ring",
                   "launcher.nproc_per_node=3", "train.epochs=1", "train.max_steps_per_epoch=5",
                   f"run.root={tmp_path / 'out'}", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert run_dir.name.startswith("custom-all_reduce_ring_w3_mlp_"), run_dir
    summ = json.loads((run_dir / "summary.json").read_text())
    assert summ["sync"] == "custom" and summ["comm_bytes_sent"] > 0, summ
    status = run_cli(str(run_dir), cwd=tmp_path, module="ddp_lab.status")
    assert status.returncode == 0 and "all_reduce_ring" in status.stdout, describe(status)
    report = run_cli(str(tmp_path / "out"), cwd=tmp_path, module="ddp_lab.report")
    assert report.returncode == 0 and "all_reduce=ring_ok.py:all_reduce_ring" in report.stdout, \
        describe(report)
    tb = [p.name for p in (run_dir / "tb").iterdir() if p.is_dir()]
    assert any("all_reduce_ring" in n for n in tb) or "all_reduce_ring" in run_dir.name, tb


@pytest.mark.slow
def test_a_hang_in_training_names_rank_peer_and_line(tmp_path):
    """A function that passes its check but hangs on a whole model's bucket: the console
    names the waiting rank, its call, its peer and the line of the student's file, and
    the run ends (torch's timeout) with no rank left."""
    path = STUDENTS / "hangs_in_training.py"
    proc = run_cli("sync=custom", f"sync.all_reduce={path}:all_reduce_big_hangs",
                   "launcher.nproc_per_node=2", "train.epochs=1", "train.max_steps_per_epoch=3",
                   "dist.timeout_s=40", f"run.root={tmp_path / 'out'}", cwd=tmp_path, timeout=240)
    assert proc.returncode != 0, describe(proc)
    console = proc.stdout + proc.stderr
    line = _line_of(path, "dist.recv(buf, 1)", "def all_reduce_big_hangs")
    waits = [ln for ln in console.splitlines() if "has waited 20 s" in ln]
    assert any("rank 0 has waited" in ln and "in recv from rank 1" in ln and
               f"hangs_in_training.py:{line}" in ln for ln in waits), console[-4000:]
    # at dist.timeout_s the call raises with the same words: the run ends failed
    assert f"waited 40 s in recv from rank 1 (39760 elements) at {path}:{line}" in console, \
        console[-4000:]
    assert not _leftover_ranks(tmp_path)
