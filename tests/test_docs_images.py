"""scripts/docs_images.py, the recipe of every picture in docs/img: a picture without one
(a new PNG nobody can make again) fails here, as does a recipe whose picture is not there."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "docs_images.py"


def _script():
    spec = importlib.util.spec_from_file_location("docs_images", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_images"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_picture_in_docs_img_has_a_recipe():
    images = _script().IMAGES
    names = [f"{i.name}.png" for i in images]
    assert len(names) == len(set(names))
    on_disk = sorted(p.name for p in (REPO / "docs" / "img").iterdir())
    assert sorted(names) == on_disk, (set(on_disk) - set(names), set(names) - set(on_disk))
    # each recipe names a step the script has, and is said by --list
    work = _script().Work
    assert all(hasattr(work, i.needs) or i.needs == "network" for i in images)


def test_list_and_an_unknown_name():
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(_script().IMAGES)
    bad = subprocess.run([sys.executable, str(SCRIPT), "--only", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--only nope: not a picture" in bad.stderr


def test_the_network_pictures_say_why_they_are_skipped(tmp_path):
    """Without --network the three network pictures are left as they are, with the reason."""
    mod = _script()
    work = mod.Work(tmp_path, tmp_path / "out", tmp_path / "data", network=False)
    said = mod.make(work, list(mod.NETWORK))
    assert set(said) == set(mod.NETWORK)
    assert all(v.startswith("skipped: needs the network lab") for v in said.values()), said
    assert not (tmp_path / "out" / "network_compression.png").exists()
