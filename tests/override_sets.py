"""Random override sets for `python -m ddp_lab`: valid keys and options mixed with wrong
types, config groups given numbers, null, lists or mappings, unknown options and keys, and
malformed override syntax. A seed makes the same sets again (tests/test_override_fuzz.py
runs them in-process as dry runs; scripts/override_fuzz.py runs real ones)."""

from __future__ import annotations

import random

# (key, values): a valid value and values of the wrong type or range
KEYS = [
    ("train.epochs", ["1", "2", "0", "-3", "many", "1.5", "[1]", "null"]),
    ("train.batch_size", ["16", "64", "0", "x", "null"]),
    ("train.lr", ["0.01", "1e-3", "0", "-1", "fast", "[0.1]"]),
    ("train.seed", ["0", "7", "seed", "1.5"]),
    ("train.global_batch", ["0", "64", "63", "-64"]),
    ("train.micro_batch", ["0", "8", "12", "x"]),
    ("train.resume", ["auto", "false", "later", "3"]),
    ("train.stop_signal", ["SIGUSR2", "SIGKILL", "USR2", "''"]),
    ("sync.bucket_mb", ["25", "-1", "x"]),
    ("sync.root", ["0", "1", "5", "-1", "root"]),
    ("sync.compress", ["none", "fp16", "zip", "3"]),
    ("model.hidden", ["32", "[64,32]", "[64,0]", "-1", "wide"]),
    ("launcher.nproc_per_node", ["1", "2", "3", "0", "1000", "two", "[2]"]),
    ("launcher.nodes", ["1", "2", "0", "[1"]),
    ("launcher.hosts", ["[localhost:2]", "nohost:2", "[]"]),
    ("log.progress", ["auto", "bar", "lines", "dots", "1"]),
    ("log.ranks", ["0", "all", "1"]),
    ("dist.backend", ["auto", "gloo", "nccl", "mpi", "7"]),
    ("dist.device", ["auto", "cpu", "cuda", "tpu"]),
    ("dist.timeout_s", ["60", "0", "-5", "soon"]),
    ("timing.trace_steps", ["0", "3", "-1", "x"]),
    ("timing.tb_every", ["0", "10", "-2"]),
    ("optim.momentum", ["0.9", "x"]),
    ("optim.fused", ["false", "maybe"]),
    ("data.num_workers", ["0", "-1", "two"]),
    ("data.pipeline", ["tensor", "dataloader", "pipe"]),
    ("data.mirrors", ["[embedded]", "[]", "embedded"]),
    ("debug.slow_rank", ["-1", "0", "9", "x"]),
    ("run.entry", ["ddp_lab.worker", "ddp_lab.nowhere", "3"]),
    ("train.epoch", ["3"]),  # misspelt
    ("sync.nosuchkey", ["1"]),
]

# every config group of conf/ and what it might be given
GROUPS = {
    "sync": ["ddp", "naive", "allreduce", "reduce_broadcast", "ring", "tree", "butterfly",
             "hierarchical", "zero1"],
    "model": ["mlp", "mlp_wide", "cnn", "resnet18"],
    "optim": ["adam", "sgd"],
    "launcher": ["local", "mpirun", "slurm", "runai"],
    "cluster": ["alps", "entropy", "rcp"],
    "study": ["scaling"],
    "data": ["mnist"],
}
NOT_AN_OPTION = ["3", "7", "-1", "0.5", "true", "null", "[1,2]", "[a,b]", "[]", "{a:1}",
                 "''", "rign", "MLP", "ddp ring", "${oops}"]

JUNK = ["=", "==", "train.epochs", "train.epochs=[", "launcher.nodes=[1", "a=b=c", "{",
        "}", "+foo=1", "~train", "train..epochs=1", "++train.epochs=2",
        "train.epochs=${oops}", "ø=1", "'", "sync=", "=ddp", ".=1", "+sync.foo=1",
        "~sync", "model.hidden=[64,", "train.lr=1e", "sync=ddp,ring", "train.epochs=range(1,3)",
        "hydra.job.name=x", "launcher.nproc_per_node=2 2", "train.epochs=\\", "x" * 300 + "=1"]


def override_set(rng: random.Random) -> list[str]:
    """One command line's overrides: 1 to 5 of them, each a key with a random value, a
    group with an option or something that is none, or junk."""
    words = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.45:
            key, values = rng.choice(KEYS)
            words.append(f"{key}={rng.choice(values)}")
        elif kind < 0.85:
            group, options = rng.choice(list(GROUPS.items()))
            value = rng.choice(options) if rng.random() < 0.5 else rng.choice(NOT_AN_OPTION)
            words.append(f"{group}={value}")
        else:
            words.append(rng.choice(JUNK))
    return words


def override_sets(seed: int, n: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [override_set(rng) for _ in range(n)]
