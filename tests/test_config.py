"""Every config group composes against the schema; mistakes fail at composition."""

import pytest
from helpers import compose
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from ddp_lab.config import CONF_DIR, SCHEMAS, load_run_config, register_configs

register_configs()


def test_defaults_reproduce_the_notebook():
    cfg = compose()
    assert cfg.launcher.name == "local" and cfg.sync.name == "ddp"
    assert cfg.model.name == "mlp" and cfg.model.hidden == 50
    assert cfg.optim.name == "adam" and cfg.train.lr == pytest.approx(1e-3)
    assert cfg.train.batch_size == 64 and cfg.train.epochs == 5
    assert cfg.data.mirrors == ["embedded"]


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in SCHEMAS.items() for o in opts])
def test_every_group_option_composes(group, option):
    cfg = compose(f"{group}={option}")
    assert cfg[group].name == option
    # every YAML we ship is typed by its schema
    assert OmegaConf.get_type(cfg[group]) is SCHEMAS[group][option]


def test_every_yaml_in_conf_is_a_registered_option():
    for group in SCHEMAS:
        shipped = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
        assert shipped == set(SCHEMAS[group]), group


def test_misspelt_key_fails_at_composition():
    with pytest.raises(ConfigCompositionException) as e:
        compose("train.epoch=3")
    assert "Key 'epoch' not in 'TrainConfig'" in str(e.value.__cause__)


def test_wrong_type_fails_at_composition():
    with pytest.raises(ConfigCompositionException) as e:
        compose("train.epochs=many")
    assert isinstance(e.value.__cause__, ValidationError)


def test_option_specific_key_is_checked():
    compose("optim=sgd", "optim.momentum=0.9")
    with pytest.raises(ConfigCompositionException):
        compose("optim=adam", "optim.momentum=0.9")  # Adam has no momentum


def test_unknown_option_lists_valid_ones():
    with pytest.raises(MissingConfigException) as e:
        compose("model=resnet")
    assert "mlp" in str(e.value) and "cnn" in str(e.value)


def test_run_config_round_trip(tmp_path):
    cfg = compose("model=cnn", "optim=sgd", "train.epochs=2")
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    back = load_run_config(tmp_path)
    assert back.model.channels1 == 16 and back.optim.momentum == 0.0 and back.train.epochs == 2
    assert OmegaConf.get_type(back.model).__name__ == "CNNConfig"
