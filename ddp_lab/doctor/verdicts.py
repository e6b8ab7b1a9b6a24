"""The doctor's verdicts: the ranks' facts (RUN_DIR/doctor/*.json)
against the launcher settings, one `Check` per question, each "ok|FAIL
<name>: <finding> -> <fix>". Pure: dicts in, checks out; no torch, no
process (docs/doctor.md says what each check answers). The checks:
placement_checks.py, node_checks.py, network_checks.py.
"""

from __future__ import annotations

from typing import Callable, Optional

from .findings import Check, Facts
from .network_checks import (inter_node, interface, intra_node, link, nccl, rendezvous,
                             topology)
from .node_checks import data, software
from .placement_checks import cores, ranks, tasks


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
