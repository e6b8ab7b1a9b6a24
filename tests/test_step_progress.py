"""Progress without a terminal (issue 28): a run whose output goes into a pipe or a file (a
SLURM .out, `| tee`) prints a line at least every log.progress_every_s seconds of an epoch,
from the logging rank only; on a terminal it keeps its tqdm bar."""

from __future__ import annotations

import logging
import os
import pty
import re
import subprocess
import time

import pytest
from helpers import PY, child_env, describe, run_dir_of

from ddp_lab.rank.records import StepLines, StepProgress

LINE = re.compile(r"^\[rank 0\] step (\d+)/(\d+) of epoch 1/1 \((\d+)%\), ([\d.]+) steps/s, .+ left$")


@pytest.mark.dist
def test_piped_run_prints_progress_lines(tmp_path, shared_data_root):
    """A real 2-rank run, stdout into a pipe: each line timed as it arrives here."""
    every = 0.3
    proc = subprocess.Popen(
        [PY, "-m", "ddp_lab", "train.epochs=1", "launcher.nproc_per_node=2",
         f"log.progress_every_s={every}", "train.checkpoint=false", "timing.trace=false",
         f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}"],
        cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True)
    arrivals = [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    done = subprocess.CompletedProcess(proc.args, 0, "\n".join(ln for _, ln in arrivals), err)
    out, described = done.stdout, describe(done)
    shown = [(t, LINE.match(ln)) for t, ln in arrivals if LINE.match(ln)]
    assert len(shown) >= 2, described  # the epoch takes seconds: several intervals
    steps = [int(m.group(1)) for _, m in shown]
    assert steps == sorted(steps) and all(int(m.group(2)) == 469 for _, m in shown), described
    assert "[rank 1]" not in out  # the logging rank only
    # no longer apart than the interval, plus a step and the pipe's delay on a busy machine
    gaps = [b[0] - a[0] for a, b in zip(shown, shown[1:])]
    assert max(gaps) <= every + 1.0, (gaps, described)
    # ... and in the rank's log, with its timestamps
    log = run_dir_of(done) / "logs" / "rank0.log"
    assert log.read_text().count(" of epoch 1/1 (") == len(shown)


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_step_lines_interval():
    # a handler of our own on ddp_lab's logger (not caplog's on the root: a test before this
    # one in the same process may have set a rank's logging up, and then it does not propagate)
    log, kept = logging.getLogger("ddp_lab"), _Kept()
    level = log.level
    log.addHandler(kept)
    log.setLevel(logging.INFO)
    try:
        for _ in StepLines(range(3, 23), "epoch 2/5", every_s=0.05):
            time.sleep(0.02)
    finally:
        log.removeHandler(kept)
        log.setLevel(level)
    lines = kept.lines
    assert 4 <= len(lines) <= 9, lines  # 20 steps of 20 ms, a line every 50 ms or so
    assert all(re.fullmatch(r"step \d+/23 of epoch 2/5 \(\d+%\), [\d.]+ steps/s, \d+ s left", ln)
               for ln in lines), lines
    assert "step 23/23" not in "".join(lines)  # the epoch's own line follows the last step


def test_bar_only_on_a_terminal():
    # under pytest stdout is captured: no terminal, so lines; a bar only where asked
    assert isinstance(StepProgress("auto", 10, True).wrap(range(5), "e"), StepLines)
    assert type(StepProgress("bar", 10, True).wrap(range(5), "e")).__name__ == "tqdm"
    assert StepProgress("lines", 0, True).wrap(range(5), "e") == range(5)  # lines off
    assert StepProgress("auto", 10, False).wrap(range(5), "e") == range(5)  # not the logging rank
    # on a real terminal (a pseudo-terminal for stdout and stderr) `auto` draws the bar
    code = "from ddp_lab.rank.records import StepProgress; print(StepProgress('auto', 10, True).bar)"
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        os.execve(PY, [PY, "-c", code], child_env())
    seen = b""
    while True:
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # the child has ended and closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.waitpid(pid, 0)
    assert seen.strip() == b"True", seen
