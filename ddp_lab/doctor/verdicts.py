"""The doctor's verdicts: the ranks' facts (RUN_DIR/doctor/*.json) against the launcher
settings, one `Check` per question, each "ok|FAIL <name>: <finding> -> <fix>". Pure: dicts in,
checks out; no torch, no process (docs/doctor.md says what each check answers)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from ..world.fingerprint import parse_nccl_info


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    finding: str
    fix: str = ""

    def line(self) -> str:
        head = f"{'ok' if self.ok else 'FAIL'} {self.name}: {self.finding}"
        return f"{head} -> {self.fix}" if not self.ok and self.fix else head

    def as_dict(self) -> dict:
        return {**asdict(self), "line": self.line()}


@dataclass
class Facts:
    """What the doctor's job left: `settings` (the launcher's, from the resolved config),
    `ranks` (every rank's facts file, local rank 0's with `node_facts`), `measures` (rank ->
    what it measured in the group), `status` (the job's summary.json status), `rc`."""
    settings: dict
    ranks: list[dict]
    measures: dict[int, dict]
    status: str = ""
    rc: int = 0

    def nodes(self) -> dict[int, list[dict]]:
        """node rank -> its ranks' facts, by rank."""
        out: dict[int, list[dict]] = {}
        for r in sorted(self.ranks, key=lambda r: r.get("rank", -1)):
            out.setdefault(r.get("node_rank", 0), []).append(r)
        return dict(sorted(out.items()))

    def label(self, node_rank: int) -> str:
        """A node's name as the user knows it (SLURMD_NODENAME or hostname); nodes of one
        machine that share a hostname (a network lab) get their address, else node rank."""
        by_node = self.nodes()
        first = (by_node.get(node_rank) or [{}])[0]
        name = first.get("node", f"node {node_rank}")
        names = [rs[0].get("node") for rs in by_node.values()]
        if names.count(name) == 1:
            return name
        addresses = [rs[0].get("address") for rs in by_node.values()]
        if first.get("address") and addresses.count(first["address"]) == 1:
            # network namespaces of one machine
            return f"{name}@{first['address']}"
        return f"{name}[{node_rank}]"

    def node_facts(self) -> dict[int, dict]:
        """node rank -> the node facts its local rank 0 gathered."""
        return {n: next((r["node_facts"] for r in rs if r.get("node_facts")), {})
                for n, rs in self.nodes().items()}

    def networks(self) -> dict[str, dict]:
        """node label -> its network facts ({} where it reported none)."""
        return {self.label(n): x.get("network") or {} for n, x in self.node_facts().items()}


def disagree(values: Mapping[str, Any]) -> Optional[str]:
    """"node2 has X, node1 Y" when the nodes' values differ (the odd one first), else None."""
    groups: dict[str, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(str(value), []).append(node)
    if len(groups) < 2:
        return None
    # the first node is the reference: the other is odd
    first = next(iter(values), None)
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), first in kv[1]))
    return ", ".join(f"{'/'.join(nodes)} {'has ' if i == 0 else ''}{value}"
                     for i, (value, nodes) in enumerate(ordered))


# Where the ranks run: their count, tasks and GPUs per node, the cores they share.

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
    """The ranks, tasks and GPUs per node against the launcher settings (the mismatch that
    hangs a job or leaves devices idle). A finding shared by several nodes names them all."""
    s = f.settings
    nproc, notes, slots = s["nproc_per_node"], [], s.get("slots") or []
    # (finding with {node}, fix) -> nodes
    problems: dict[tuple[str, str], list[str]] = {}

    def problem(finding: str, fix: str, node: str) -> None:
        problems.setdefault((finding, fix), []).append(node)

    for n, rs in f.nodes().items():
        label = f.label(n)
        sched = rs[0].get("scheduler", {})
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
    """Each node's ranks against the cores they may run on (affinity) and their NUMA nodes."""
    parts, bad = [], []
    for n, rs in f.nodes().items():
        label = f.label(n)
        sets = {r.get("cpus") for r in rs}
        usable = max((r.get("ncpus") or 0) for r in rs)
        numa = sorted({x for r in rs for x in (r.get("numa") or [])})
        parts.append(f"{label}: {len(rs)} rank(s) on cores {'/'.join(sorted(map(str, sets)))}"
                     + (f" (NUMA {','.join(map(str, numa))})" if numa else ""))
        if len(sets) == 1 and len(rs) > 1 and usable and usable * 4 < len(rs):
            bad.append((f"{label} runs {len(rs)} rank(s) on {usable} core(s) "
                        f"({next(iter(sets))})", "ask for more cores (launcher.cpus_per_task) "
                        "or fewer ranks per node"))
    if bad:
        return Check("cores", False, *bad[0])
    return Check("cores", True, "; ".join(parts))


# Every node has the same software and the same data.

VERSIONS = ("python", "torch", "cuda", "nccl", "ddp_lab")


def software(f: Facts) -> Check:
    nf = f.node_facts()
    for key in VERSIONS:
        values = {f.label(n): (x.get("software") or {}).get(key) for n, x in nf.items() if x}
        odd = disagree(values)
        if odd:
            return Check("software", False, f"{key} differs: {odd}",
                         f"install the same {key} on every node, or point launcher.venv "
                         "(or launcher.image) at one every node sees")
    first = next((x.get("software") for x in nf.values() if x.get("software")), {})
    return Check("software", True, "the same on every node: " + ", ".join(
        f"{k} {first.get(k)}" for k in VERSIONS if first.get(k)))


def data(f: Facts) -> Check:
    nf = {n: x.get("data") for n, x in f.node_facts().items() if x.get("data")}
    if not nf:
        return Check("data", False, "no node reported its data", "read the doctor folder's logs/")
    first = next(iter(nf.values()))
    root, files, expected = first["root"], first["files"], first["expected"]
    missing = {f.label(n): sorted(k for k, v in d["files"].items() if v is None)
               for n, d in nf.items()}
    lacking = [n for n, m in missing.items() if m]
    local = f.settings.get("node_local")
    if len(lacking) == len(missing):
        how = ("each node's local rank 0 fetches it" if local else "global rank 0 fetches it")
        return Check("data", True, f"not under {root} on any node yet: at the start {how} "
                     "from data.mirrors")
    if lacking:
        n = lacking[0]
        fix = ("copy it there first (data.node_local=true: else that node's local rank 0 "
               "fetches its own copy from data.mirrors at the start)" if local else
               "data.root is shared (data.node_local=false) but that node does not see it: "
               "mount the shared folder there, or set data.node_local=true")
        return Check("data", False, f"data missing on {n} under {root} "
                     f"({len(missing[n])} of {len(files)} files)", fix)
    for name in sorted(files):
        got = {f.label(n): d["files"][name] for n, d in nf.items()}
        wrong = {k: v for k, v in got.items() if expected.get(name) and v != expected[name]}
        if wrong:
            md5, on = next(iter(wrong.values())), f" on {', '.join(wrong)}" if len(nf) > 1 else ""
            return Check("data", False, f"{name} under {root} has MD5 {md5}{on}, not "
                         f"{expected[name]}", "remove it: ddp_lab fetches and verifies it again")
        odd = disagree(got)
        if odd:
            return Check("data", False, f"{name} differs between nodes: {odd}",
                         "remove the odd copy (ddp_lab fetches and verifies it again)")
    return Check("data", True, f"{len(files)} files under {root}, the same MD5s on {len(nf)} "
                 "node(s)")


# The network: the interface, the link, the rendezvous, the all-reduces within and across
# nodes, NCCL's transport and the GPU-NIC affinity.

# an inter-node all-reduce below this share of the link's reported rate fails: NCCL on sockets
# instead of InfiniBand measures about 5 of 25 GB/s (20%); a tbf-shaped node among unshaped
# ones, or a 1 Gbit/s port in a 10 Gbit/s network, far less
MIN_LINK_SHARE = 0.25
# gloo on CPUs copies and sums every byte on cores shared with the ranks: its all-reduce
# reaches a fraction of a fast link's rate even when the link is fine (docs/doctor.md)
MIN_LINK_SHARE_CPU = 0.05


def interface(f: Facts) -> Check:
    found = []
    for node, net in f.networks().items():
        names = net.get("interfaces") or []
        for key, c in (net.get("chosen") or {}).items():
            if not c["resolved"]:
                other = net.get("default") or next((i for i in names if i != "lo"), None)
                return Check("interface", False, f"{key}={c['spec']} does not exist on "
                             f"{node} (it has {', '.join(names)})",
                             f"set {key}={other or '<an interface>'} or unset it (then the "
                             "interface of the hostname's address is used)")
            found.append(f"{node} {key}={','.join(c['resolved'])}")
        if not net.get("chosen") and net.get("link"):
            found.append(f"{node} {net['link']['iface']}")
    return Check("interface", True, "; ".join(found) or "no interface reported")


def _rate(lk: Optional[Mapping]) -> Optional[float]:
    """A link's rate in bytes/s: its tbf's where shaped, else its speed; None unknown."""
    if not lk:
        return None
    if lk.get("shaped_Bps"):
        return float(lk["shaped_Bps"])
    return lk["speed_mbit"] * 1e6 / 8 if lk.get("speed_mbit") else None


def _words(lk: Optional[Mapping]) -> str:
    if not lk:
        return "unknown"
    rate = (f"shaped to {lk['shaped_Bps'] / 1e6:.4g} MB/s (tbf)" if lk.get("shaped_Bps") else
            f"{lk['speed_mbit']} Mbit/s" if lk.get("speed_mbit") else "speed unknown")
    return f"{lk.get('iface')} {rate}, MTU {lk.get('mtu')}"


def link(f: Facts) -> Check:
    links = {k: net.get("link") for k, net in f.networks().items()}
    known = {k: v for k, v in links.items() if v}
    if not known:
        if any(c["spec"] and not c["resolved"] for net in f.networks().values()
               for c in (net.get("chosen") or {}).values()):
            return Check("link", False, "not read: the interface named does not exist "
                         "(the interface check)", "fix the interface first")
        return Check("link", True, "no node could say its link (no `ip` there)")
    for what in (_rate, lambda lk: lk.get("mtu")):
        odd = disagree({k: what(v) for k, v in known.items()})
        if odd:
            slow = min(known, key=lambda k: _rate(known[k]) or float("inf"))
            return Check("link", False, "the nodes' links differ: " + "; ".join(
                f"{k} {_words(v)}" for k, v in sorted(known.items(), key=lambda kv: kv[0] != slow)),
                f"every node on the same network: ask for other nodes than {slow}, or fix "
                "its link (tc qdisc, the switch port, the MTU)")
    blind = [k for k in links if k not in known]
    where = f"(not known on {', '.join(blind)})" if blind else "on every node"
    return Check("link", True, f"{_words(next(iter(known.values())))} {where}")


def rendezvous(f: Facts) -> Check:
    r0 = next((r for r in f.ranks if r.get("rank") == 0), f.ranks[0] if f.ranks else {})
    where = f"{r0.get('master_addr')}:{r0.get('master_port')}"
    unreached = [r for r in f.ranks if r.get("master", {}).get("answers") is False]
    if unreached:
        r = unreached[0]
        return Check("rendezvous", False, f"{f.label(r.get('node_rank', 0))} cannot reach "
                     f"{where} ({r['master'].get('why')})",
                     "set launcher.master_addr to rank 0's node's address the others reach")
    joined = sorted(f.measures)
    want = f.settings["world_size"]
    skipped = sorted(r["rank"] for r in f.ranks if r.get("skipped_group"))
    if len(joined) < want:
        head = f"{len(joined)} of {want} rank(s) joined the process group at {where}: "
        if skipped:
            return Check("rendezvous", False, f"{head}rank(s) {', '.join(map(str, skipped[:8]))} "
                         "did not try (their interface does not exist: the interface check)",
                         "fix the interface first")
        why = f.status.removeprefix("failed: ") if f.status.startswith("failed") else \
            f"exit status {f.rc}"
        return Check("rendezvous", False, head + why, "the line above names the rank, host and "
                     "port; the doctor folder's logs/ hold the rest")
    return Check("rendezvous", True, f"every rank reached {where} and joined the process group")


def _level(f: Facts, key: str) -> list[dict]:
    return [m[key] for m in f.measures.values() if m.get(key)]


def intra_node(f: Facts) -> Optional[Check]:
    rows = _level(f, "intra")
    if not rows:
        return None
    worst = min(rows, key=lambda r: r["busbw_Bps"])
    return Check("intra-node all-reduce", True, f"busbw {worst['busbw_Bps'] / 1e9:.3g} GB/s at "
                 f"{worst['bytes'] / 1e6:.3g} MB over {worst['ranks']} rank(s) "
                 f"({worst['backend']}; the slowest node)")


def inter_node(f: Facts) -> Optional[Check]:
    rows = _level(f, "cross")
    if not rows:
        return None
    row = rows[0]
    links = {k: net.get("link") for k, net in f.networks().items()}
    rates = {k: _rate(v) for k, v in links.items() if _rate(v)}
    got = row["busbw_Bps"]
    head = (f"busbw {got / 1e6:.4g} MB/s at {row['bytes'] / 1e6:.3g} MB over {row['ranks']} "
            f"node(s) ({row['backend']})")
    if not rates:
        return Check("inter-node all-reduce", True, head + "; no link rate to compare with")
    best, slow = max(rates, key=rates.get), min(rates, key=rates.get)
    shaped = [k for k, v in links.items() if v and v.get("shaped_Bps")]
    if len(rates) < len(links) and shaped or len(set(rates.values())) > 1:
        # one node's link is slower than another's (or shaped where another is not): every
        # ring and tree runs at the slowest link's pace
        return Check("inter-node all-reduce", False,
                     f"inter-node all-reduce at {got / 1e6:.4g} MB/s, held to {slow}'s link "
                     f"({_words(links[slow])}; "
                     + ", ".join(f"{k} {_words(v)}" for k, v in links.items() if k != slow)
                     + ")", f"every node on links of one rate: ask for other nodes than {slow}")
    share = got / rates[best]
    floor = MIN_LINK_SHARE_CPU if row["backend"] == "gloo" else MIN_LINK_SHARE
    finding = f"{head}: {share:.0%} of the link's rate ({_words(links[best])} on {best})"
    if share < floor:
        # every known link has one rate here (a slower one returned above)
        return Check("inter-node all-reduce", False,
                     f"inter-node all-reduce at {share:.0%} of the link's rate ({got / 1e6:.4g} "
                     f"MB/s; {_words(links[best])} on {best}, below {floor:.0%})",
                     "check the transport below (NCCL on sockets?) and the switch ports; "
                     "python -m ddp_lab.bench measures every size")
    return Check("inter-node all-reduce", True, finding)


def nccl(f: Facts) -> Optional[Check]:
    rows = _level(f, "nccl")
    if not rows:
        return None
    kinds = sorted({k for r in rows for k in (r.get("connections") or {})})
    label = "+".join(kinds) or f"none (network {rows[0].get('network')})"
    gdr = any(r.get("gdrdma") for r in rows)
    socket = [r for r in rows if "NET/Socket" in (r.get("connections") or {})]
    rdma = sorted({d for net in f.networks().values() for d in net.get("rdma_devices") or []})
    if socket and rdma:
        ifs = sorted({i for r in socket for i in r.get("socket_ifaces") or []})
        return Check("nccl transport", False, f"NCCL on NET/Socket {','.join(ifs) or ''}: "
                     f"InfiniBand/RoCE/Slingshot not used though the nodes have {', '.join(rdma)}",
                     "unset NCCL_IB_DISABLE / NCCL_NET=Socket; on IB/RoCE set NCCL_IB_HCA and "
                     "NCCL_IB_GID_INDEX (python -m ddp_lab.nccl_env prints them), on Slingshot "
                     "load the aws-ofi-nccl plugin (the site's container or module)")
    return Check("nccl transport", True, label + (" with GPUDirect RDMA" if gdr else ""))


def topology(f: Facts) -> Optional[Check]:
    found, far = [], []
    for n, x in f.node_facts().items():
        topo = parse_topo(x.get("topo") or "")
        if not topo or not topo["nics"]:
            continue
        for gpu, (nic, path) in nearest_nic(topo).items():
            found.append(f"{f.label(n)} {gpu}-{nic} {path}")
            if path in ("SYS", "NODE"):
                far.append(f"{f.label(n)} {gpu}'s nearest NIC {nic} is {path}")
    if not found:
        return None
    if far:
        return Check("gpu-nic affinity", False, "; ".join(far[:3]),
                     "bind each rank to the GPU and NIC of one PCIe switch (srun "
                     "--gpu-bind=closest, NCCL_IB_HCA per local rank)")
    return Check("gpu-nic affinity", True, "; ".join(found[:4]))


# ------------------------------------------------------------------ NVIDIA's tools' output
# "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC", "... via NET/IB/0/GDRDMA", "... via
# NET/Socket/0", "... via SHM/direct/direct"
_CHANNEL = re.compile(r"NCCL INFO Channel \S+ ?: .*\bvia (\S+)")
# "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>" (the interfaces NCCL's sockets use)
_SOCKET_IFS = re.compile(r"NCCL INFO NET/Socket ?: Using (.+)$")
_IF_NAME = re.compile(r"\[\d+\]([A-Za-z0-9_.\-]+):")


def nccl_transport(lines: Iterable[str]) -> dict[str, Any]:
    """The transport NCCL chose, from its INFO lines (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS
    INIT,NET): fingerprint.parse_nccl_info's `network`, `net_devices` and `connections`, and
    `gdrdma` (a NET channel with GPUDirect RDMA) and `socket_ifaces` (NET/Socket's)."""
    lines = list(lines)
    out = parse_nccl_info(lines)
    gdr, ifaces = False, []
    for line in lines:
        m = _CHANNEL.search(line)
        if m and m.group(1).startswith("NET/") and "GDRDMA" in m.group(1):
            gdr = True
        m = _SOCKET_IFS.search(line.rstrip())
        if m:
            ifaces += [n for n in _IF_NAME.findall(m.group(1)) if n not in ifaces]
    return {**out, "gdrdma": gdr, "socket_ifaces": ifaces}


# `nvidia-smi topo -m`'s legend, nearest first
TOPO_KINDS = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS")


def _rank(kind: str) -> int:
    if kind.startswith("NV"):
        return 1
    return TOPO_KINDS.index(kind) if kind in TOPO_KINDS else len(TOPO_KINDS)


def parse_topo(text: str) -> Optional[dict[str, Any]]:
    """`nvidia-smi topo -m` read (None when the text holds no matrix). The header row (tab
    separated: columns of two words kept whole) names the columns: GPU0.. NIC0.., then CPU
    Affinity, NUMA Affinity, GPU NUMA ID; each row starts with its device name."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    head_i = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\b", ln)), None)
    if head_i is None:
        return None
    header = [h.strip() for h in re.split(r"\t+|\s{2,}", lines[head_i].strip()) if h.strip()]
    devices = [h for h in header if re.fullmatch(r"(GPU|NIC|mlx\w+)\d*\w*", h)]
    extra = header[len(devices):]
    matrix: dict[str, dict[str, str]] = {}
    cpu_aff, numa_aff = {}, {}
    for ln in lines[head_i + 1:]:
        if not ln.strip():
            break
        cells = [c for c in re.split(r"\t+|\s+", ln.strip()) if c]
        name = cells[0]
        if name not in devices:
            break
        matrix[name] = dict(zip(devices, cells[1:1 + len(devices)]))
        if name.startswith("GPU"):
            for key, value in zip(extra, cells[1 + len(devices):]):
                if key.lower().startswith("cpu"):
                    cpu_aff[name] = value
                elif key.lower().startswith("numa"):
                    numa_aff[name] = value
    nic_names = dict(re.findall(r"^\s*(NIC\d+)\s*:\s*(\S+)", text, re.M))
    return {"gpus": [d for d in devices if d.startswith("GPU")],
            "nics": [d for d in devices if not d.startswith("GPU")],
            "matrix": matrix, "cpu_affinity": cpu_aff, "numa_affinity": numa_aff,
            "nic_names": nic_names}


def nearest_nic(topo: dict[str, Any]) -> dict[str, tuple[Optional[str], Optional[str]]]:
    """Each GPU's nearest NIC and the path to it: {"GPU0": ("mlx5_0", "PIX")}; (None, None)
    for a GPU of a node without a NIC in the matrix."""
    out = {}
    for gpu in topo["gpus"]:
        row = topo["matrix"].get(gpu, {})
        best = min(topo["nics"], key=lambda n: _rank(row.get(n, "SYS")), default=None)
        out[gpu] = ((topo["nic_names"].get(best, best), row.get(best)) if best else (None, None))
    return out


CHECKS: tuple[Callable[[Facts], Optional[Check]], ...] = (
    ranks, tasks, cores, software, data, interface, link, rendezvous, intra_node, inter_node,
    nccl, topology)


def verdicts(f: Facts) -> list[Check]:
    """Every check that has something to judge, in CHECKS' order."""
    out = []
    for check in CHECKS:
        try:
            c = check(f)
        except (KeyError, TypeError, ValueError) as e:
            # a node that reported half
            c = Check(check.__name__.replace("_", "-"), False, f"could not judge: {e!r}",
                      "read the doctor folder's doctor/*.json and logs/")
        if c is not None:
            out.append(c)
    return out
