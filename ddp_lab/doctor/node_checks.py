"""The doctor's checks that every node has the same software and the
same data."""

from __future__ import annotations

from .findings import Check, Facts, disagree

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
    root = next(iter(nf.values()))["root"]
    missing = {f.label(n): sorted(k for k, v in d["files"].items() if v is None)
               for n, d in nf.items()}
    have = [n for n, m in missing.items() if not m]
    lacking = [n for n, m in missing.items() if m]
    local = f.settings.get("node_local")
    if lacking and not have:
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
                     f"({len(missing[n])} of {len(next(iter(nf.values()))['files'])} files)", fix)
    expected = next(iter(nf.values()))["expected"]
    for name in sorted(next(iter(nf.values()))["files"]):
        got = {f.label(n): d["files"][name] for n, d in nf.items()}
        wrong = {k: v for k, v in got.items() if expected.get(name) and v != expected[name]}
        if wrong:
            node, md5 = next(iter(wrong.items()))
            on = f" on {', '.join(wrong)}" if len(nf) > 1 else ""
            return Check("data", False, f"{name} under {root} has MD5 {md5}{on}, not "
                         f"{expected[name]}", "remove it: ddp_lab fetches and verifies it again")
        odd = disagree(got)
        if odd:
            return Check("data", False, f"{name} differs between nodes: {odd}",
                         "remove the odd copy (ddp_lab fetches and verifies it again)")
    return Check("data", True, f"{len(next(iter(nf.values()))['files'])} files under {root}, "
                 f"the same MD5s on {len(nf)} node(s)")
