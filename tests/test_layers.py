"""The layers hold: no import runs back up (docs/architecture.md, *The layout*).

pyproject.toml's [tool.importlinter] names the layers, top first; import-linter reads every
import of ddp_lab/ (at module level or inside a function) and fails on one that runs from a
layer to one above it, from the lesson (sync/, collectives/, timing/, models, data,
step) into the machinery, or from the submitting side (command/, launch/) into rank/."""

from pathlib import Path

from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parent.parent


def test_no_import_runs_back_up_a_layer(capsys, tmp_path):
    rc = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_logo=True,
                      cache_dir=str(tmp_path))
    out = capsys.readouterr().out
    assert rc == 0, out[out.find("Broken contracts"):] or out
