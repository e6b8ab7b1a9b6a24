"""The doctor's checks of the network: the interface, the link, the
rendezvous, the all-reduces within and across nodes, NCCL's transport
and the GPU-NIC affinity."""

from __future__ import annotations

from typing import Mapping, Optional

from .findings import Check, Facts, disagree

# an inter-node all-reduce below this share of the link's reported rate
# fails: NCCL on sockets instead of InfiniBand measures about 5 of 25
# GB/s (20%); a tbf-shaped node among unshaped ones, or a 1 Gbit/s port
# in a 10 Gbit/s network, far less
MIN_LINK_SHARE = 0.25
# gloo on CPUs copies and sums every byte on cores shared with the
# ranks: its all-reduce reaches a fraction of a fast link's rate even
# when the link is fine (docs/doctor.md)
MIN_LINK_SHARE_CPU = 0.05


def interface(f: Facts) -> Check:
    found = []
    for n, x in f.node_facts().items():
        net = x.get("network") or {}
        names = net.get("interfaces") or []
        for key, c in (net.get("chosen") or {}).items():
            if not c["resolved"]:
                other = net.get("default") or next((i for i in names if i != "lo"), None)
                return Check("interface", False, f"{key}={c['spec']} does not exist on "
                             f"{f.label(n)} (it has {', '.join(names)})",
                             f"set {key}={other or '<an interface>'} or unset it (then the "
                             "interface of the hostname's address is used)")
            found.append(f"{f.label(n)} {key}={','.join(c['resolved'])}")
        if not net.get("chosen") and net.get("link"):
            found.append(f"{f.label(n)} {net['link']['iface']}")
    return Check("interface", True, "; ".join(found) or "no interface reported")


def _rate(lk: Optional[Mapping]) -> Optional[float]:
    """A link's rate in bytes/s: its tbf's where shaped, else its speed;
    None unknown."""
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
    links = {f.label(n): (x.get("network") or {}).get("link") for n, x in f.node_facts().items()}
    known = {k: v for k, v in links.items() if v}
    if not known:
        if any(c["spec"] and not c["resolved"] for x in f.node_facts().values()
               for c in ((x.get("network") or {}).get("chosen") or {}).values()):
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
    if len(known) < len(links):
        blind = [k for k in links if k not in known]
        return Check("link", True, f"{_words(next(iter(known.values())))} "
                     f"(not known on {', '.join(blind)})")
    return Check("link", True, f"{_words(next(iter(known.values())))} on every node")


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
    if len(joined) < want and skipped:
        return Check("rendezvous", False, f"{len(joined)} of {want} rank(s) joined the process "
                     f"group at {where}: rank(s) {', '.join(map(str, skipped[:8]))} did not try "
                     "(their interface does not exist: the interface check)",
                     "fix the interface first")
    if len(joined) < want:
        why = f.status.removeprefix("failed: ") if f.status.startswith("failed") else \
            f"exit status {f.rc}"
        return Check("rendezvous", False, f"{len(joined)} of {want} rank(s) joined the process "
                     f"group at {where}: {why}", "the line above names the rank, host and "
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
    links = {f.label(n): (x.get("network") or {}).get("link") for n, x in f.node_facts().items()}
    rates = {k: _rate(v) for k, v in links.items() if _rate(v)}
    got = row["busbw_Bps"]
    head = (f"busbw {got / 1e6:.4g} MB/s at {row['bytes'] / 1e6:.3g} MB over {row['ranks']} "
            f"node(s) ({row['backend']})")
    if not rates:
        return Check("inter-node all-reduce", True, head + "; no link rate to compare with")
    best = max(rates, key=rates.get)
    shaped = [k for k, v in links.items() if v and v.get("shaped_Bps")]
    if len(rates) < len(links) and shaped or len(set(rates.values())) > 1:
        # one node's link is slower than another's (or shaped where
        # another is not): every ring and tree runs at the slowest
        # link's pace
        slow = min(rates, key=rates.get)
        return Check("inter-node all-reduce", False,
                     f"inter-node all-reduce at {got / 1e6:.4g} MB/s, held to {slow}'s link "
                     f"({_words(links[slow])}; "
                     + ", ".join(f"{k} {_words(v)}" for k, v in links.items() if k != slow)
                     + ")", f"every node on links of one rate: ask for other nodes than {slow}")
    share = got / rates[best]
    floor = MIN_LINK_SHARE_CPU if row["backend"] == "gloo" else MIN_LINK_SHARE
    finding = f"{head}: {share:.0%} of the link's rate ({_words(links[best])} on {best})"
    if share < floor:
        slow = min(rates, key=rates.get)
        fix = (f"{slow}'s link is slower than {best}'s: ask for other nodes" if rates[slow] < rates[best]
               else "check the transport below (NCCL on sockets?) and the switch ports; "
               "python -m ddp_lab.bench measures every size")
        return Check("inter-node all-reduce", False,
                     f"inter-node all-reduce at {share:.0%} of the link's rate ({got / 1e6:.4g} "
                     f"MB/s; {_words(links[best])} on {best}, below {floor:.0%})", fix)
    return Check("inter-node all-reduce", True, finding)


def nccl(f: Facts) -> Optional[Check]:
    rows = [m["nccl"] for m in f.measures.values() if m.get("nccl")]
    if not rows:
        return None
    kinds = sorted({k for r in rows for k in (r.get("connections") or {})})
    label = "+".join(kinds) or f"none (network {rows[0].get('network')})"
    gdr = any(r.get("gdrdma") for r in rows)
    socket = [r for r in rows if "NET/Socket" in (r.get("connections") or {})]
    rdma = {n for n, x in f.node_facts().items()
            if (x.get("network") or {}).get("rdma_devices")}
    if socket and rdma:
        ifs = sorted({i for r in socket for i in r.get("socket_ifaces") or []})
        return Check("nccl transport", False, f"NCCL on NET/Socket {','.join(ifs) or ''}: "
                     "InfiniBand/RoCE/Slingshot not used though the nodes have "
                     f"{', '.join(sorted({d for n in rdma for d in f.node_facts()[n]['network']['rdma_devices']}))}",
                     "unset NCCL_IB_DISABLE / NCCL_NET=Socket; on IB/RoCE set NCCL_IB_HCA and "
                     "NCCL_IB_GID_INDEX (python -m ddp_lab.nccl_env prints them), on Slingshot "
                     "load the aws-ofi-nccl plugin (the site's container or module)")
    return Check("nccl transport", True, label + (" with GPUDirect RDMA" if gdr else ""))


def topology(f: Facts) -> Optional[Check]:
    from .parsers import nearest_nic, parse_topo

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
