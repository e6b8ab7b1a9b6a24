"""The report's terminal screen (ddp_lab/report/summary.py) stays one screen, at most 40
lines, whatever the folder holds: a thing that applies to many series is said once, a
model miss says what it means and what to try, and what does not fit is counted and left
to report.md. Folders written without training (report_data.py)."""

from __future__ import annotations

from report_data import FP, SYNCS, runbook_folder, train_run  # tests/ is on sys.path

from ddp_lab.report.build import build_report
from ddp_lab.report.run import find_runs


def _screen(folder, out) -> list[str]:
    return build_report(find_runs([folder]), out, make_plots=False)["summary"].splitlines()


def test_runbook_outputs_fit_one_screen(tmp_path):
    """21 trainings and 2 benches (the runbook's outputs/): the sweeps' tables, one line for
    the 16 series that have no held-out check, the model miss explained."""
    out = runbook_folder(tmp_path)
    screen = _screen(out, tmp_path / "rep")
    text = "\n".join(screen)
    assert len(screen) <= 40, text
    assert screen[0] == f"21 training run(s), 2 bench run(s), 0 skipped, under {out}"
    assert screen[-1] == f"Full report: {tmp_path / 'rep' / 'report.md'}"
    # the two sweeps (7 syncs each) are on screen whole, with their one header
    assert sum(ln.startswith("  sync ") for ln in screen) == 1
    for s in SYNCS:
        assert sum(ln.split()[:1] == [s] for ln in screen) >= 2, (s, text)
    assert "more point(s) of 3 more workload(s) in report.md" in text
    # said once, with how many, and what to do about it
    assert text.count("no held-out check") == 1, text
    assert "no forecast for 16 series" in text and "second world size" in text
    model = " ".join(text[text.index("- comm model:"):].split())  # unwrapped
    assert "the alpha-beta prediction" in model and "so forecasts built on it miss" in model
    assert "Try a bench on the runs' own allocation" in model
    assert max(len(ln) for ln in screen if str(tmp_path) not in ln) <= 100


def test_any_folder_fits_one_screen(tmp_path):
    """Thirty workloads, two allocations with different fingerprints, eight failed runs:
    still 40 lines, the rest counted."""
    other = {**FP, "cpu": "Other CPU"}
    for b in range(30):
        for n in (1, 2):
            train_run(tmp_path / "o", f"b{b}_w{n}", sync=SYNCS[b % 7], world=n, batch=16 + b,
                      steps=20, fid="bbbbbbbbbb" if n == 2 else "aaaaaaaaaa",
                      fp=other if n == 2 else FP)
    for k in range(8):
        train_run(tmp_path / "o", f"failed_{k}", status="failed: killed")
    screen = _screen(tmp_path / "o", tmp_path / "rep")
    text = "\n".join(screen)
    assert len(screen) <= 40, text
    assert "in report.md" in text and "... and 5 more skipped folder(s)" in text
    # thirty rows compared across fingerprints: one note, with the count
    flat = " ".join(text.split())  # unwrapped
    assert flat.count("cpu: Test CPU vs Other CPU") == 1 and "⚠ 30 row(s)" in flat, text
