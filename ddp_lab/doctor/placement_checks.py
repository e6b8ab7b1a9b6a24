"""The doctor's checks of where the ranks run: their count, tasks and
GPUs per node, and the cores they share (docs/doctor.md)."""

from __future__ import annotations

from .findings import Check, Facts


def ranks(f: Facts) -> Check:
    want = f.settings["world_size"]
    got = sorted({r["rank"] for r in f.ranks if "rank" in r})
    seen = sorted({r.get("world_size") for r in f.ranks if "world_size" in r})
    unplaced = [r for r in f.ranks if "rank" not in r]
    if unplaced:
        return Check("ranks", False, f"{len(unplaced)} process(es) could not place themselves: "
                     f"{unplaced[0].get('error')}", "see docs/launchers.md, 'What every "
                     "launcher shares'")
    if seen and seen != [want]:
        return Check("ranks", False, f"the ranks see a world of {'/'.join(map(str, seen))}, "
                     f"the launcher settings give {want}",
                     "make launcher.nodes x launcher.nproc_per_node match the allocation")
    missing = sorted(set(range(want)) - set(got))
    if missing:
        return Check("ranks", False, f"{len(got)} of {want} rank(s) started (none from rank(s) "
                     f"{', '.join(map(str, missing[:8]))})",
                     "read the doctor folder's logs/: a node that did not start its ranks")
    return Check("ranks", True, f"{want} rank(s) on {len(f.nodes())} node(s), "
                 f"{', '.join(f'{f.label(n)}: {len(rs)}' for n, rs in f.nodes().items())}")


def tasks(f: Facts) -> Check:
    """The ranks, tasks and GPUs per node against the launcher settings
    (the mismatch that hangs a job or leaves devices idle). A finding
    shared by several nodes names them all."""
    s = f.settings
    nproc, notes = s["nproc_per_node"], []
    # (finding with {node}, fix) -> nodes
    problems: dict[tuple[str, str], list[str]] = {}

    def problem(finding: str, fix: str, node: str) -> None:
        problems.setdefault((finding, fix), []).append(node)

    for n, rs in f.nodes().items():
        label = f.label(n)
        sched = rs[0].get("scheduler", {})
        slots = s.get("slots") or []
        if s["launcher"] == "mpirun" and n < len(slots):
            if len(rs) != slots[n]:
                problem(f"{{node}} runs {len(rs)} rank(s), launcher.hosts gives it {slots[n]} "
                        "slot(s)", "check the hostfile's slots and launcher.np", label)
        elif len(rs) != nproc:
            problem(f"{{node}} runs {len(rs)} rank(s), launcher.nproc_per_node={nproc}",
                    "set launcher.nproc_per_node to the ranks each node should run", label)
        local = {r.get("local_world_size") for r in rs}
        if local != {len(rs)}:
            problem(f"the ranks of {{node}} think {'/'.join(map(str, sorted(local)))} rank(s) "
                    f"share the node, {len(rs)} run there", "collectives that group by node "
                    "hang or mix nodes: ask the scheduler for as many tasks per node as ranks",
                    label)
        if s["launcher"] == "slurm":
            want_tasks = nproc if s.get("per_task") else 1
            given = sched.get("SLURM_NTASKS_PER_NODE")
            if given is not None and str(given) != str(want_tasks):
                mode = ("launcher.per_task=true: one task per rank" if s.get("per_task")
                        else "one torchrun per node")
                problem(f"SLURM gives {given} task(s) per node on {{node}}, "
                        f"launcher.nproc_per_node={nproc} ({mode} wants {want_tasks})",
                        "drop the --ntasks-per-node of launcher.sbatch_extra / your salloc: "
                        "ddp_lab asks for what the settings need", label)
            gpus = sched.get("SLURM_GPUS_ON_NODE")
            if gpus is not None and s.get("device") != "cpu" and int(gpus) not in (0, nproc):
                problem(f"SLURM gives {gpus} GPU(s) on {{node}}, launcher.nproc_per_node={nproc}",
                        f"set launcher.nproc_per_node={gpus} (one rank per GPU) or "
                        f"launcher.gpus_per_node={nproc}", label)
        cuda = [r.get("gpus", {}).get("count", 0) for r in rs]
        if s.get("device") == "cuda" and min(cuda, default=0) < len(rs):
            problem(f"{{node}} shows {min(cuda)} GPU(s) to {len(rs)} rank(s)",
                    "one GPU per rank: lower launcher.nproc_per_node or ask for more GPUs "
                    "(launcher.gpus_per_node)", label)
        if sched.get("SLURM_NTASKS_PER_NODE") is not None:
            notes.append(f"{label} {sched['SLURM_NTASKS_PER_NODE']} task(s)")
    if problems:
        (finding, fix), nodes = next(iter(problems.items()))
        more = f" (and {len(problems) - 1} more finding(s))" if len(problems) > 1 else ""
        return Check("tasks", False, finding.format(node=", ".join(nodes)) + more, fix)
    mode = ("one task per rank" if s.get("per_task") else
            "one torchrun per node" if s["launcher"] in ("slurm", "local") else s["launcher"])
    return Check("tasks", True, f"{nproc} rank(s) per node as launcher.nproc_per_node says "
                 f"({mode}{'; SLURM: ' + ', '.join(notes) if notes else ''})")


def cores(f: Facts) -> Check:
    """Each node's ranks against the cores they may run on (affinity)
    and their NUMA nodes."""
    parts, bad = [], []
    for n, rs in f.nodes().items():
        label = f.label(n)
        sets = {r.get("cpus") for r in rs}
        usable = max((r.get("ncpus") or 0) for r in rs)
        numa = sorted({x for r in rs for x in (r.get("numa") or [])})
        where = f"{label}: {len(rs)} rank(s) on cores {'/'.join(sorted(map(str, sets)))}" + \
            (f" (NUMA {','.join(map(str, numa))})" if numa else "")
        parts.append(where)
        if len(sets) == 1 and len(rs) > 1 and usable and usable * 4 < len(rs):
            bad.append((f"{label} runs {len(rs)} rank(s) on {usable} core(s) "
                        f"({next(iter(sets))})", "ask for more cores (launcher.cpus_per_task) "
                        "or fewer ranks per node"))
    if bad:
        return Check("cores", False, *bad[0])
    return Check("cores", True, "; ".join(parts))
