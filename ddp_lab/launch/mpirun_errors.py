"""mpirun's stderr on its way to the console: Open MPI's failure to
reach a host as one line.

`MpirunStderr` sends ssh's messages and Open MPI's help blocks to
RUN_DIR/logs/mpirun.log; a daemon failure is kept there only and `close`
prints one line (host, ssh's reason, the fix); other blocks are also
shown. torch's per-rank "hostname of the client socket cannot be
retrieved" is explained once; every other line passes through at once.
`reason()` is the run's one-line failure when the daemons did not start.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Optional, TextIO

# Open MPI frames each help message with these
RULE = re.compile(r"^-{20,}$")
DAEMONS_FAILED = "ORTE was unable to reliably start one or more daemons"
# what ssh (and a shell on the far side) says when a daemon cannot
# start; the first group, where there is one, is the host
SSH_LINES = [re.compile(p) for p in (
    r"^ssh: Could not resolve hostname ([^:\s]+): .+",
    r"^ssh: connect to host (\S+) port \d+: .+",
    r"^Connection to (\S+) port \d+ timed out",
    r"^(?:\S+@)?([^@:\s]+): Permission denied \(.+\)",
    r"^ssh: .+",
    r"^Host key verification failed\.",
    r"^Permission denied \(.+\)",
    r"^Connection (?:timed out during banner exchange|closed by .+|reset by .+)",
    r"^kex_exchange_identification: .+",
    r"^Can't open user config file .+",
    # StrictHostKeyChecking=no, every run: noise
    r"^Warning: Permanently added .+",
    r"^(?:bash: )?(?:line \d+: )?orted: command not found",
)]
C10D_NO_NAME = "[c10d] The hostname of the client socket cannot be retrieved"
C10D_NOTE = ("[ddp_lab] torch's [c10d] 'hostname of the client socket cannot be retrieved' "
             "warnings (one per rank, hidden here): no DNS server names the lab's addresses, so "
             "torch logs peers by address instead; harmless (list the hosts in /etc/hosts to "
             "give them names)")
FIX = ("mpirun starts a daemon on every other host over ssh, which must work without a prompt "
       "(passwordless ssh: `ssh {host} true`); ssh options reach it through launcher.extra_args, "
       "e.g. 'launcher.extra_args=[--mca,plm_rsh_args,\"-F SSH_CONFIG\"]' (docs/launchers.md, "
       "mpirun)")


class MpirunStderr:
    """A filter for mpirun's stderr: `feed` each line as it comes,
    `close` at mpirun's end."""

    def __init__(self, log_path: Path, remote_hosts: list[str], out: TextIO = sys.stderr):
        self.log_path, self.remote_hosts, self.out = log_path, remote_hosts, out
        # the help block being read, rules included
        self.block: Optional[list[str]] = None
        # (host or None, ssh's line)
        self.ssh: list[tuple[Optional[str], str]] = []
        self.daemons_failed = False
        self.c10d_told = False
        # feed runs in the reader thread, close in ours
        self.lock = threading.Lock()

    def _log(self, lines: list[str]) -> None:
        with open(self.log_path, "a") as f:
            f.write("".join(ln + "\n" for ln in lines))

    def _show(self, lines: list[str]) -> None:
        self.out.write("".join(ln + "\n" for ln in lines))
        self.out.flush()

    def feed(self, line: str) -> None:
        # ssh ends its lines with \r\n
        line = line.rstrip("\r\n")
        with self.lock:
            if self.block is not None:
                self.block.append(line)
                if RULE.match(line):
                    self._end_block()
            elif RULE.match(line):
                self.block = [line]
            elif C10D_NO_NAME in line:
                self._log([line])
                if not self.c10d_told:
                    self.c10d_told = True
                    self._show([C10D_NOTE])
            elif ssh := next(filter(None, (p.match(line) for p in SSH_LINES)), None):
                self._log([line])
                self.ssh.append((ssh.group(1) if ssh.re.groups else None, line))
            else:
                self._show([line])

    def _end_block(self) -> None:
        block, self.block = self.block or [], None
        self._log(block)
        if any(DAEMONS_FAILED in ln for ln in block):
            # said in one line by `close`
            self.daemons_failed = True
        else:
            # another of Open MPI's messages: shown as it was
            self._show(block)

    def reason(self) -> Optional[str]:
        """`mpirun could not start its daemon on HOST over ssh (ssh's
        words)`, or None when the daemons started (the ranks' own
        records say why a run failed)."""
        if not self.daemons_failed:
            return None
        named = list(dict.fromkeys(h for h, _ in self.ssh if h))
        if named:
            where = " and ".join(named)
        elif len(self.remote_hosts) == 1:
            where = self.remote_hosts[0]
        else:  # ssh did not say which: one of them
            where = "one of " + ", ".join(self.remote_hosts)
        said = "; ".join(dict.fromkeys(ln for _, ln in self.ssh if not ln.startswith("Warning:")))
        return f"mpirun could not start its daemon on {where} over ssh" + (f" ({said})" if said else "")

    def close(self) -> None:
        """mpirun has ended: flush an unfinished block; a daemon failure
        becomes its one line."""
        with self.lock:
            if self.block is not None:
                self._end_block()
            why = self.reason()
            # the fix's `ssh HOST true`: the host ssh named, else the
            # only remote one
            if why:
                host = next((h for h, _ in self.ssh if h),
                            self.remote_hosts[0] if len(self.remote_hosts) == 1 else "HOST")
                self._show([f"[ddp_lab] {why}: {FIX.format(host=host)}; Open MPI's message: "
                            f"{self.log_path}"])
