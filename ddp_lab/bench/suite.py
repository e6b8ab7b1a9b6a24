"""The training benchmarks, one runner: `python -m ddp_lab.bench.suite NAME [options]`
(docs/benchmarks.md).

    python -m ddp_lab.bench.suite                         # the benchmarks, one line each
    python -m ddp_lab.bench.suite NAME --help             # its own options too

Each benchmark is a `Benchmark` of a module of ddp_lab/bench/specs/ (its `BENCHMARKS`): its `Spec`
(what it compares), `add_args` and `run(args)` (its figures). The runner gives every one the same
options (`--rounds`, `--out`, `--data-root`), ending (the ratios as a table) and JSON file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# name -> the module of ddp_lab.bench.specs that holds it, in the order `python -m
# ddp_lab.bench.suite` lists
NAMES = {"epoch": "epoch", "syncs": "syncs", "overlap": "syncs", "compress": "syncs",
         "hierarchical": "syncs", "stop": "machinery", "start": "machinery",
         "tensorboard": "machinery", "timing": "machinery", "truth": "truth",
         "network": "network"}


@dataclass(frozen=True)
class Spec:
    """What a benchmark runs side by side (`compares`), its rounds (`rounds`: the default of
    `--rounds`; None: it has no rounds) and the ratios it prints (`ratios`, in words). The options
    several share, where given: `--world` (ranks), `--steps` (per epoch) and `--only` (labels of
    `configs`, default `only`: all), whose choice the benchmark reads as `args.configs`."""
    compares: str
    ratios: str
    rounds: Optional[int] = None
    data: bool = True  # reads MNIST: takes --data-root
    world: Optional[int] = None
    steps: Optional[int] = None
    configs: Optional[Mapping[str, Any]] = None
    only: str = ""


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its description (the first paragraph is its line in the listing), spec,
    options, run and optional check of the parsed options."""
    doc: str
    spec: Spec
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict]
    check: Optional[Callable[[argparse.Namespace], None]] = None


class UsageError(ValueError):
    """A bad option found after parsing: one line naming it and the fix, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """A user's mistake: one line naming the option, exit 2 (no usage block)."""

    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def load(name: str) -> Benchmark:
    """Benchmark `name`, from its module of ddp_lab.bench.specs."""
    return importlib.import_module(f"ddp_lab.bench.specs.{NAMES[name]}").BENCHMARKS[name]


def parse(name: str, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Benchmark `name`'s command line (the runner's options, then its own) parsed, `--only`'s
    labels (comma-separated; empty: all) resolved to `args.configs` in `configs`' order, then
    checked by its `check(args)` where it has one. A label it lacks: UsageError."""
    bench = load(name)
    spec = bench.spec
    ap = OneLineParser(prog=f"python -m ddp_lab.bench.suite {name}",
                       description=bench.doc.split("\n\n")[0],
                       epilog=f"side by side: {spec.compares}. ratios: {spec.ratios}.")
    if spec.rounds is not None:
        ap.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=spec.rounds,
                        help=f"measured rounds, the order rotated each round (default {spec.rounds})")
    if spec.data:
        ap.add_argument("--data-root", default=str(REPO / "data"), help="MNIST folder")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    if spec.world is not None:
        ap.add_argument("--world", type=int, default=spec.world, help=f"ranks (default {spec.world})")
    if spec.steps is not None:
        ap.add_argument("--steps", type=int, default=spec.steps, help="steps per epoch (0: the "
                        "whole shard)" if not spec.steps else f"steps per epoch (default {spec.steps})")
    if spec.configs is not None:
        ap.add_argument("--only", default=spec.only, help="configurations, comma-separated "
                        f"(default: {spec.only or 'all'}; of {', '.join(spec.configs)})")
    bench.add_args(ap)
    args = ap.parse_args(argv)
    if spec.configs is not None:
        keep = [c.strip() for c in args.only.split(",") if c.strip()] or list(spec.configs)
        unknown = set(keep) - set(spec.configs)
        if unknown:
            raise UsageError(f"--only: unknown configuration(s) {sorted(unknown)}: "
                             f"choose from {list(spec.configs)}")
        args.configs = {label: c for label, c in spec.configs.items() if label in keep}
    if bench.check is not None:
        bench.check(args)
    return args


def run(name: str, argv: Optional[Sequence[str]] = None) -> int:
    """Parse, measure, print the ratios, write the JSON: benchmark `name`'s whole command."""
    try:
        args = parse(name, argv)
        result = load(name).run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result.get("ratios"):
        print(f"\n{name}: the ratios, measured side by side in one run\n")
        print(table(["ratio", "measured"], [(k, f"{v:.3f}") for k, v in result["ratios"].items()
                                            if v is not None]))
    if args.out:
        # the benchmark, its options and its figures (ratios among them)
        doc = {"bench": name, "args": {k: (str(v) if isinstance(v, Path) else v)
                                       for k, v in vars(args).items()}, **result}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


def rounds(configs: Sequence[T], repeats: int) -> Iterator[tuple[int, T]]:
    """(round, configuration) for rounds 1 to `repeats`: every configuration once a round, the
    order rotated by one each round, so that slow drift on a shared machine hits every
    configuration alike."""
    configs = list(configs)
    for r in range(repeats):
        k = r % len(configs)
        for c in configs[k:] + configs[:k]:
            yield r + 1, c


def side_by_side(configs: Sequence[T], repeats: int, one: Callable[[T, int], Any],
                 line: Optional[Callable[[int, T, Any], str]] = None) -> dict[T, list]:
    """configuration -> what `one(configuration, round)` returned in each of the `rounds`; after
    each, `line(round, configuration, it)` printed where given."""
    got: dict[T, list] = {c: [] for c in configs}
    for r, c in rounds(configs, repeats):
        got[c].append(one(c, r))
        if line is not None:
            print(line(r, c, got[c][-1]), flush=True)
    return got


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A Markdown table: `head`'s columns, then one line per row of cells; `align` a letter a
    column, l (left) or r (right); default: the first left, the others right."""
    from ..report.tables import md_row  # the report's row, so both print one table form

    align = align or "l" + "r" * (len(head) - 1)
    return "\n".join(map(md_row, [head, ["---" if a == "l" else "---:" for a in align], *rows]))


def with_bucket(overrides: Sequence[str], mb: float) -> list[str]:
    """A configuration's `overrides` with buckets of `mb` MB (DDP's own key where it is sync=ddp)."""
    return [*overrides, f"sync.bucket_cap_mb={mb}" if "sync=ddp" in overrides else f"sync.bucket_mb={mb}"]


def medians(runs: Mapping[str, Sequence]) -> dict[str, Any]:
    """label -> the median over its rounds: of numbers, or key by key of dicts of numbers (None
    where a round has None: a figure the configuration does not record)."""
    def median(v: Sequence) -> Any:
        if isinstance(v[0], Mapping):
            return {k: median([m[k] for m in v]) for k in v[0]}
        return None if None in v else statistics.median(v)

    return {label: median(v) for label, v in runs.items()}


def ratios(values: Mapping[str, float], pairs: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    """name -> values[a] / values[b] for each (name, a, b) of `pairs` where both were run."""
    return {name: values[a] / values[b] for name, a, b in pairs if a in values and b in values}


def trained(overrides: Sequence[str], cwd: Path, env: Optional[dict] = None,
            on_line: Optional[Callable[[Optional[str]], None]] = None,
            entry: str = "ddp_lab") -> dict:
    """One real run (`python -m ddp_lab`, or `entry`: this checkout's, `overrides` last) started in
    `cwd`, `env` added to its environment: its summary.json, and its folder as "run_dir". `on_line`
    sees each line of its output as it comes, then None when it has ended (in any case). Exits with
    the run's last output if it failed."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **(env or {})}
    cmd = [sys.executable, "-m", entry, "log.progress=lines", *overrides]
    on_line = on_line or (lambda line: None)
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    out: list[str] = []
    try:
        for line in p.stdout:
            out.append(line)
            on_line(line)
        p.wait()
    finally:
        on_line(None)
        if p.poll() is None:
            p.kill()
            p.wait()
    stdout = "".join(out)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{stdout[-6000:]}")
    run_dir = Path(cwd, next(line.split("run dir: ", 1)[1].strip()
                             for line in stdout.splitlines() if line.startswith("run dir: ")))
    return {**json.loads((run_dir / "summary.json").read_text()), "run_dir": str(run_dir)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("python -m ddp_lab.bench.suite NAME [--rounds N] [--out FILE] [options]; NAME:")
        for name in NAMES:
            print(f"  {name:13s}{load(name).doc.splitlines()[0]}")
        return 0
    if argv[0] not in NAMES:
        print(f"error: no benchmark {argv[0]!r}; choose from {', '.join(NAMES)}", file=sys.stderr)
        return 2
    # so every `finally` ends what it started
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return run(argv[0], argv[1:])


def _exit_on_sigterm(signum, frame) -> None:
    """SIGTERM as an exception: the benchmark's processes (a run, a loop in a child, the CPU hog)
    are ended on the way out (`subprocess.run` kills its child; the specs' `finally`)."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    # the module the specs import, not this __main__ copy
    from ddp_lab.bench import suite

    sys.exit(suite.main())
