"""tests/mutants/: every deliberate break still applies to this checkout and names a test
that exists (scripts/mutants.py runs them; docs/testing.md). Applying is checked with
`git apply --check`, which changes nothing."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO

PATCHES = sorted((REPO / "tests" / "mutants").glob("*.patch"))


def test_there_are_mutants():
    assert len(PATCHES) >= 12, PATCHES


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.stem)
def test_every_mutant_applies_and_names_its_test(patch):
    text = patch.read_text()
    m = re.match(r"# expect: (tests/test_\w+\.py)::(\w+)(\[[^\]]+\])?\n", text)
    assert m, f"{patch.name}: the first line must be '# expect: tests/test_x.py::test_name'"
    file, name = REPO / m.group(1), m.group(2)
    assert file.is_file() and re.search(rf"^def {name}\(", file.read_text(), re.M), m.group(0)
    applied = subprocess.run(["git", "apply", "--check", "-"], cwd=REPO, input=text, text=True,
                             capture_output=True)
    assert applied.returncode == 0, f"{patch.name} no longer applies: {applied.stderr}"


def test_the_script_lists_them():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "mutants.py"), "--list"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(line.split()[0] for line in proc.stdout.splitlines()) == [p.stem for p in PATCHES]
