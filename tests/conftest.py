from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data_root(tmp_path_factory) -> Path:
    """One extracted MNIST for the whole session (runs re-verify it, fetch nothing)."""
    from ddp_lab.data import fetch_mnist

    root = tmp_path_factory.mktemp("mnist-shared")
    fetch_mnist(root, ["embedded"])
    return root
