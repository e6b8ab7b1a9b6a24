"""command/lock.py under a crowd: hundreds of real processes take, read, set aside and give back
one folder's lock at once (some die holding it). Exactly one holds it at any moment; every
other is refused in one line or takes over a dead holder's lock; none sees a traceback
(a lock that vanishes between two calls is a holder that has just left; the folder itself
may vanish, removed by another command's validation probe while it is empty)."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from ddp_lab.command import lock
from ddp_lab.command.validate import folder_problem

TAKERS, ROUNDS = 200, 3


def _taker(run_dir: Path, out: Path, seed: int) -> None:
    """One command, ROUNDS times: take the lock (or be refused), hold it for a moment, then
    give it back, or, one time in five, die holding it. Outcomes are appended to `out`, one
    line each (O_APPEND: lines of different processes never mix)."""
    rng = random.Random(seed)
    cfg = SimpleNamespace(run=SimpleNamespace(dir=str(run_dir)))
    fd = os.open(out, os.O_WRONLY | os.O_APPEND)

    def note(kind: str, text: str = "") -> None:
        os.write(fd, f"{kind}\t{os.getpid()}\t{text!r}\n".encode())

    try:
        for _ in range(ROUNDS):
            if rng.random() < 0.3:
                lock.in_use(cfg)  # a validation reading the lock meanwhile
            if rng.random() < 0.3:  # and its probe, which removes the folder while it is empty
                folder_problem("run.dir", str(run_dir), "choose another")
            try:
                lock.acquire(run_dir, "local")
            except lock.FolderInUse as e:
                note("refused", str(e))
                continue
            try:  # the holder's own mark: a second holder cannot make it
                os.close(os.open(run_dir / "HELD", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                note("two holders")
                continue
            time.sleep(rng.random() * 0.003)
            os.unlink(run_dir / "HELD")
            if rng.random() < 0.2:
                note("died holding")
                os._exit(0)
            lock.release(run_dir)
            note("held")
    except BaseException:  # noqa: BLE001 (the test reports it)
        note("traceback", traceback.format_exc())
    os._exit(0)


def test_hundreds_of_takers_one_holder_one_line_refusals(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # as make_run_dir leaves it: empty, so a probe may remove it
    out = tmp_path / "outcomes"
    out.touch()
    from ddp_lab.launch import job_processes  # noqa: F401 (imported before the forks, not in each)

    ctx = multiprocessing.get_context("fork")  # cheap takers, started together
    procs = [ctx.Process(target=_taker, args=(run_dir, out, seed)) for seed in range(TAKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    rows = [ln.split("\t", 2) for ln in out.read_text().splitlines()]
    kinds = [r[0] for r in rows]
    bad = [r for r in rows if r[0] in ("two holders", "traceback")]
    assert not bad, bad[:3]
    refusals = [eval(r[2]) for r in rows if r[0] == "refused"]  # noqa: S307 (our own repr)
    assert all("\n" not in m and m.startswith(f"run.dir={run_dir}") for m in refusals), refusals[:3]
    assert kinds.count("held") + kinds.count("died holding") >= 10 and refusals, kinds
    assert kinds.count("died holding") >= 1  # so some took over a dead holder's lock
    assert not list(run_dir.glob(".LOCK*")), list(run_dir.glob("*"))


def _blocked_on_flock(folder: Path) -> bool:
    """Whether some process waits for a flock on `folder` (a `->` line of /proc/locks on
    its inode)."""
    inode = f":{folder.stat().st_ino} "
    return any("->" in ln and "FLOCK" in ln and inode in ln
               for ln in Path("/proc/locks").read_text().splitlines())


def test_a_second_taker_cannot_slip_between_the_recheck_and_the_unlink(tmp_path, monkeypatch):
    """Deterministic, every run: two takers judge the same dead holder's LOCK. The first is
    paused between its re-check and its unlink (lock._before_unlink); the second must then
    wait on the folder's flock (seen in /proc/locks), not remove the lock itself. Once the
    first goes on, one of them holds the lock and the other is refused. Without the flock the
    second takes the lock while the first is paused, and the first then removes the
    second's lock; without the re-check the second, let in after the first, removes the
    first's: two holders, either way."""
    import socket
    import threading

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = {"host": socket.gethostname(), "pid": 2 ** 22 + 1, "start": 1, "launcher": "local"}
    (run_dir / lock.LOCK).write_text(json.dumps(dead))
    paused, go = threading.Event(), threading.Event()
    first = []

    def pause() -> None:
        if not first:  # the first taker to get here waits; any later one goes on
            first.append(threading.current_thread().name)
            paused.set()
            assert go.wait(60)

    monkeypatch.setattr(lock, "_before_unlink", pause)
    outcome: dict[str, str] = {}

    def take(name: str) -> None:
        try:
            lock.acquire(run_dir, "local")
            outcome[name] = "held"
        except lock.FolderInUse:
            outcome[name] = "refused"
        except BaseException as e:  # noqa: BLE001 (the test reports it)
            outcome[name] = f"{type(e).__name__}: {e}"

    a = threading.Thread(target=take, args=("a",), name="a")
    a.start()
    assert paused.wait(60), "the first taker never reached the unlink"
    b = threading.Thread(target=take, args=("b",), name="b")
    b.start()
    deadline = time.monotonic() + 60
    while b.is_alive() and not _blocked_on_flock(run_dir) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the second waits on the flock, or has finished without it
    b_done_while_a_paused = not b.is_alive()
    go.set()
    a.join(60)
    b.join(60)
    assert not b_done_while_a_paused, f"the second taker got past the flock: {outcome}"
    # after the first's unlink both create anew, outside the flock: either
    # may win that race, and exactly one holds the lock
    assert sorted(outcome.values()) == ["held", "refused"], outcome
    assert json.loads((run_dir / lock.LOCK).read_text())["pid"] == os.getpid()
