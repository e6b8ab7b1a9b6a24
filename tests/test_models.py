"""The models: mlp widths from config, mlp_wide (~10M parameters), ResNet-18 on 1x28x28."""

import pytest
import torch

from ddp_lab.config import widths
from ddp_lab.models import MLP, build_model
from tests.helpers import compose, run_cli


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_mlp_default_is_the_notebook_network():
    m = build_model(compose().model)
    assert n_params(m) == 784 * 50 + 50 + 50 * 10 + 10
    assert [n for n, _ in m.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def test_mlp_takes_its_widths_from_config():
    m = build_model(compose("model.hidden=[64,32]").model)
    assert [tuple(p.shape) for n, p in m.named_parameters() if n.endswith("weight")] == \
        [(64, 784), (32, 64), (10, 32)]
    assert m(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_mlp_wide_has_about_ten_million_parameters():
    m = build_model(compose("model=mlp_wide").model)
    assert 9.5e6 < n_params(m) < 10.5e6


def test_resnet18_takes_digits():
    m = build_model(compose("model=resnet18").model)
    assert 11e6 < n_params(m) < 11.5e6
    assert m.conv1.in_channels == 1 and m.conv1.stride == (1, 1)
    assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize("bad", [0, [], [8, 0], [True]])
def test_bad_widths_are_refused(bad):
    with pytest.raises(ValueError, match="model.hidden"):
        widths(bad)


def test_bad_widths_exit_2_with_one_line(tmp_path):
    r = run_cli("model.hidden=[16,-1]", f"run.root={tmp_path}", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: model.hidden=[16, -1]: give a width >= 1 or a list of them, e.g. model.hidden=[2048,2048]"]
    assert not list(tmp_path.iterdir())
