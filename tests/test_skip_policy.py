"""The skip policy of tests/conftest.py, run on small test files by a real pytest: a skip is
a failure unless its reason is one of EXPECTED_SKIPS word for word, whether the skip comes
from a test, a skipif mark, or the module's collection (`pytest.skip(...,
allow_module_level=True)`, `pytest.importorskip`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO

CASES = {  # (the test file's text, whether pytest passes it)
    "module-skip-expected": ('import pytest\npytest.skip("needs CUDA", allow_module_level=True)\n'
                             "def test_x():\n    pass\n", True),
    "module-skip-unexpected": ('import pytest\npytest.skip("mpirun is not installed", '
                               "allow_module_level=True)\ndef test_x():\n    pass\n", False),
    "module-importorskip": ('import pytest\npytest.importorskip("ddp_lab_no_such_module")\n'
                            "def test_x():\n    pass\n", False),
    "skip-reason-prefix-only": ('import pytest\ndef test_x():\n    pytest.skip("needs CUDA 13 '
                                'and a miracle")\n', False),
    "skip-reason-exact": ('import pytest\ndef test_x():\n    pytest.skip("needs CUDA")\n', True),
    "skipif-unexpected": ('import pytest\n@pytest.mark.skipif(True, reason="no sbatch")\n'
                          "def test_x():\n    pass\n", False),
}


def run_pytest(tmp_path, files: dict[str, str], allow: bool = False) -> subprocess.CompletedProcess:
    """One real pytest over `files` (name: text) with the suite's conftest as a plugin."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the repo's (no xdist, no addopts)
    for name, text in files.items():
        (tmp_path / f"test_{name.replace('-', '_')}.py").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "DDP_LAB_ALLOW_SKIPS"}
    if allow:
        env["DDP_LAB_ALLOW_SKIPS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO),
                                         os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p",
                           "no:cacheprovider", "--continue-on-collection-errors", "-q", "-rA",
                           *(f"test_{n.replace('-', '_')}.py" for n in files)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def outcome(stdout: str, name: str) -> str:
    """SKIPPED, FAILED or ERROR: what pytest's -rA summary says of test file `name`."""
    file = f"test_{name.replace('-', '_')}.py"
    found = {ln.split()[0] for ln in stdout.splitlines()
             if ln.split()[:1] and ln.split()[0] in ("SKIPPED", "FAILED", "ERROR", "PASSED")
             and file in ln}
    assert len(found) == 1, (name, found, stdout)
    return found.pop()


def test_a_skip_passes_only_for_an_expected_reason(tmp_path):
    proc = run_pytest(tmp_path, {name: text for name, (text, _) in CASES.items()})
    said = f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    # an unexpected skip fails its test (FAILED), its setup (a skipif: ERROR) or its
    # module's collection (ERROR)
    got = {name: outcome(proc.stdout, name) == "SKIPPED" for name in CASES}
    assert got == {name: passes for name, (_, passes) in CASES.items()}, said
    assert proc.stdout.count("skipped for a reason this suite does not expect") >= 4, said
    assert proc.returncode != 0, said


def test_allow_skips_lets_an_unexpected_module_skip_pass(tmp_path):
    proc = run_pytest(tmp_path, {"module-importorskip": CASES["module-importorskip"][0]}, allow=True)
    assert proc.returncode in (0, 5) and "1 skipped" in proc.stdout, proc.stdout + proc.stderr
