"""One registry per kind: the config's options and the implementations name the same
things, and an unknown name is one message listing the valid ones."""

import pytest

from ddp_lab.config import SCHEMAS
from ddp_lab.config.errors import UserError
from ddp_lab.config.registry import Registry, UnknownName


def implementations() -> dict:
    from ddp_lab.launch import LAUNCHERS
    from ddp_lab.models import MODELS, OPTIMIZERS
    from ddp_lab.sync import SYNCS

    return {"launcher": LAUNCHERS, "sync": SYNCS, "model": MODELS, "optim": OPTIMIZERS}


@pytest.mark.parametrize("group", ["launcher", "sync", "model", "optim"])
def test_schemas_and_implementations_name_the_same_options(group):
    assert list(implementations()[group]) == list(SCHEMAS[group])


def test_unknown_name_lists_the_choices():
    reg = Registry("sync", {"ddp": 1, "ring": 2})
    with pytest.raises(UnknownName) as e:
        reg.get("rign")
    assert str(e.value) == "unknown sync 'rign': choose one of ddp, ring"
    assert isinstance(e.value, UserError) and isinstance(e.value, LookupError)
    assert "rign" not in reg and "ddp" in reg and reg["ring"] == 2 and len(reg) == 2


def test_list_keys_are_checked_against_the_registry():
    reg = Registry("bench.ops", {"all_reduce": 1, "reduce": 2})
    reg.check(["reduce"])
    with pytest.raises(UnknownName, match="bench.ops: unknown allreduce: choose from all_reduce, reduce"):
        reg.check(["all_reduce", "allreduce"])
    with pytest.raises(UserError, match="bench.ops is empty"):
        reg.check([])


def test_a_name_is_registered_once():
    reg = Registry("model")
    reg.add("mlp", object)
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("mlp", object)


def test_bench_impls_follow_the_collectives_tables():
    from ddp_lab.bench.config import IMPLS
    from ddp_lab.bench.ops import OPS
    from ddp_lab.collectives import COLLECTIVES

    algorithms = {name for table in COLLECTIVES.values() for name in table}
    assert set(IMPLS) == algorithms
    for impl, ops in IMPLS.items():
        assert ops == [op for op, spec in OPS.items() if impl in spec.impls]


def test_each_sync_schema_lives_beside_its_synchroniser():
    """sync/<name>.py runs what config/sync.py's schema for <name> accepts (tree and
    butterfly take allreduce's keys and live in its file: another algorithm on the same
    buckets)."""
    from ddp_lab.sync import SYNCS

    for name, schema in SCHEMAS["sync"].items():
        owner = "allreduce" if name in ("tree", "butterfly") else name
        assert schema.__module__ == "ddp_lab.config.sync", name
        assert schema is SCHEMAS["sync"][owner], name
        assert SYNCS[name].__module__ == f"ddp_lab.sync.{owner}", name
