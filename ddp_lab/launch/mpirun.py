"""launcher=mpirun: Open MPI starts one rank per slot on a list of hosts (the lab recipe):
`launcher.hosts=[red01:2,orange07:1]` or `launcher.hostfile=hosts`. Renders `hostfile`,
`mpi_rank.sh` (per rank: setup, then `exec python -m <run.entry> RUN_DIR`) and `launch.sh`.

mpirun's stderr goes to the console through `MpirunStderr`: ssh's messages and Open MPI's help
blocks to RUN_DIR/logs/mpirun.log; a daemon failure is kept there only and `close` prints one line
(host, ssh's reason, the fix); other blocks are also shown. torch's per-rank "hostname of the
client socket cannot be retrieved" is explained once; every other line passes through at once.
`reason()` is the run's one-line failure when the daemons did not start.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import threading
from pathlib import Path
from typing import Optional, TextIO

from ..world.env import default_nproc
from ..world.ports import free_port
from .base import (check_container, check_port_free, container_folders, is_this_machine,
    LaunchError, python_check, pythonpath_line, ranks_python, Rendered, setup_block,
    template)
from .local import run_foreground

_HOST = re.compile(r"[A-Za-z0-9_.\-]+")


def parse_hosts(entries, default_slots: int) -> list[tuple[str, int]]:
    """['red01:2', 'orange07'] -> [('red01', 2), ('orange07', default_slots)]."""
    out: list[tuple[str, int]] = []
    for entry in entries:
        name, _, slots = str(entry).strip().partition(":")
        if not _HOST.fullmatch(name):
            raise LaunchError(f"launcher.hosts entry {entry!r}: expected name or name:slots")
        try:
            n = int(slots) if slots else default_slots
        except ValueError:
            raise LaunchError(f"launcher.hosts entry {entry!r}: slots must be an integer") from None
        if n < 1:
            raise LaunchError(f"launcher.hosts entry {entry!r}: slots must be >= 1")
        out.append((name, n))
    names = [n for n, _ in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise LaunchError(f"launcher.hosts lists {', '.join(dupes)} more than once: "
                          "give each host once, with its slot count")
    return out


def read_hostfile(path: str, default_slots: int) -> list[str]:
    """Open MPI hostfile lines (`name`, `name slots=N`, `name max_slots = N`) -> name:slots, as
    Open MPI reads them: a host given only `max_slots` offers that many."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise LaunchError(f"launcher.hostfile={path}: no such file")
    entries = []
    for line in p.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, rest = (line.split(None, 1) + [""])[:2]
        rest = re.sub(r"\s*=\s*", "=", rest)  # the notebook writes `max_slots = 2`
        opts = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        slots, most = opts.get("slots"), opts.get("max_slots")
        if slots and most and slots.isdigit() and most.isdigit() and int(slots) > int(most):
            raise LaunchError(f"launcher.hostfile={path}: {name} has slots={slots} > "
                              f"max_slots={most}; Open MPI refuses it")
        entries.append(f"{name}:{slots or most or default_slots}")
    return entries


def place(hosts: list[tuple[str, int]], np: int) -> list[tuple[str, int]]:
    """Where `np` ranks go with `--map-by slot`: each host's slots filled before the next."""
    placed, left = [], np
    for name, slots in hosts:
        if left <= 0:
            break
        placed.append((name, min(slots, left)))
        left -= slots
    return placed


def same_host(a: str, b: str) -> bool:
    """Whether two names or addresses are one machine, as far as this machine can tell."""
    if a == b or (is_this_machine(a) and is_this_machine(b)):
        return True
    try:
        return socket.gethostbyname(a) == socket.gethostbyname(b)
    except OSError:  # a lab's name this machine cannot resolve: it cannot tell
        return True


MPIRUN_FIX = "install Open MPI (apt-get install openmpi-bin) or set launcher.mpirun=/path/to/mpirun"


def tool(cfg) -> tuple[str, str]:
    """What a real start needs on PATH, and where to get it (launch.check_tool)."""
    return cfg.launcher.mpirun, MPIRUN_FIX


def resolve(cfg) -> None:
    lc = cfg.launcher
    check_container(cfg)
    if lc.max_restarts:
        raise LaunchError("launcher=mpirun cannot restart ranks (launcher.max_restarts needs "
                          "torchrun: use launcher=local or slurm)")
    default_slots = lc.nproc_per_node if lc.nproc_per_node is not None else default_nproc()
    if lc.hosts is not None and lc.hostfile:
        raise LaunchError("give launcher.hosts or launcher.hostfile, not both")
    where = f"launcher.hostfile={lc.hostfile}" if lc.hostfile else "launcher.hosts"
    if lc.hostfile:
        entries = read_hostfile(lc.hostfile, default_slots)
    else:
        entries = [f"localhost:{default_slots}"] if lc.hosts is None else list(lc.hosts)
    if not entries:
        raise LaunchError(f"{where} lists no host: give at least one, e.g. "
                          "launcher.hosts=[localhost:2] or [red01:2,orange07:1]")
    hosts = parse_hosts(entries, default_slots)
    if lc.nodes not in (1, len(hosts)):
        raise LaunchError(f"launcher.nodes={lc.nodes} but {where} gives {len(hosts)} host(s): "
                          "the hosts decide; drop launcher.nodes")
    total = sum(s for _, s in hosts)
    np = total if lc.np is None else lc.np
    if not 1 <= np <= total:
        raise LaunchError(f"launcher.np={lc.np}: {where} offers {total} slot(s); choose 1 to "
                          f"{total}, or give the hosts more slots")
    others = {n for n, _ in hosts[1:]}
    hosts = place(hosts, np)
    if lc.master_addr and (lc.master_addr in others or not same_host(lc.master_addr, hosts[0][0])):
        raise LaunchError(f"launcher.master_addr={lc.master_addr} is not {hosts[0][0]}, the "
                          "host of rank 0, which serves the rendezvous: drop master_addr, or "
                          f"list {lc.master_addr} first")
    master = lc.master_addr or hosts[0][0]
    if master == "localhost":
        master = "127.0.0.1"
    if len(hosts) > 1 and master in ("127.0.0.1", "::1"):
        raise LaunchError(f"the first host is {hosts[0][0]}, which the other hosts cannot reach: "
                          "set launcher.master_addr to this machine's name or address")
    if lc.master_port is not None and is_this_machine(master):
        check_port_free(lc.master_port)
    lc.hosts, lc.np, lc.hostfile = [f"{n}:{s}" for n, s in hosts], np, None
    lc.nodes, lc.nproc_per_node, lc.master_addr = len(hosts), max(s for _, s in hosts), master
    if lc.allow_run_as_root is None:
        lc.allow_run_as_root = os.geteuid() == 0
    if lc.oversubscribe is None:
        cores = os.cpu_count() or 1
        lc.oversubscribe = any(is_this_machine(n) and s > cores for n, s in hosts)


def render(cfg, run_dir: Path) -> Rendered:
    lc = cfg.launcher
    hosts = parse_hosts(lc.hosts, 1)
    np_total = sum(s for _, s in hosts)
    port = lc.master_port if lc.master_port is not None else free_port()
    flags = [*(["--allow-run-as-root"] if lc.allow_run_as_root else []),
             *(["--oversubscribe"] if lc.oversubscribe else [])]
    extra = "".join(f" {shlex.quote(str(a))}" for a in lc.extra_args)
    q_run = shlex.quote(str(run_dir))
    launch_sh = template("mpirun.sh").format(
        run_dir=q_run, master_addr=shlex.quote(lc.master_addr), master_port=port,
        mpirun=shlex.quote(lc.mpirun), flags="".join(f"{f} " for f in flags), np=np_total,
        extra=extra, hosts_summary=", ".join(f"{n}:{s}" for n, s in hosts))
    py = ranks_python(cfg, q_run)  # launcher.image: under `<runtime> exec ... <image>`
    rank_sh = template("mpi_rank.sh").format(
        setup=setup_block(lc.setup), pythonpath=pythonpath_line(),
        container=container_folders(cfg, q_run), python_check=python_check(py),
        slots=" ".join(str(s) for _, s in hosts), python=py,
        run_dir=q_run, entry=shlex.quote(cfg.run.entry))
    hostfile = "".join(f"{n} slots={s}\n" for n, s in hosts)
    files = {"launch.sh": launch_sh, "mpi_rank.sh": rank_sh, "hostfile": hostfile}
    # the hostfile is not shown: launch.sh's comment lists its hosts on one line
    show = "\n".join(f"# ---- {name}\n{text.rstrip()}" for name, text in
                     (("launch.sh", launch_sh), ("mpi_rank.sh", rank_sh)))

    # mpirun's stderr passes through a filter: a host it cannot reach over ssh is one line (the
    # host, ssh's reason, the fix), Open MPI's block in logs/mpirun.log
    errors = MpirunStderr(run_dir / "logs" / "mpirun.log",
                          [n for n, _ in hosts if not is_this_machine(n)])

    def starter(limit_s: Optional[float] = None) -> int:
        try:
            return run_foreground(["bash", str(run_dir / "launch.sh")], run_dir,
                                  cfg.dist.timeout_s + 60, stderr_lines=errors.feed,
                                  limit_s=limit_s)
        finally:
            errors.close()

    return Rendered(command=["bash", str(run_dir / "launch.sh")], files=files,
                    executable=("launch.sh", "mpi_rank.sh"), show=show, starter=starter,
                    explain=errors.reason)


RULE = re.compile(r"^-{20,}$")  # Open MPI frames each help message with these
DAEMONS_FAILED = "ORTE was unable to reliably start one or more daemons"
# what ssh (and a shell on the far side) says when a daemon cannot start; the first group, where
# there is one, is the host
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
# Open MPI's rsh starter sets the ssh child's process group after the fork; a child that has
# exec'd (or ended) by then refuses it (EACCES): a race of Open MPI's, harmless, logs only
PLM_SETPGID = re.compile(r"^\[[^\]]*\] plm:rsh: Warning: setpgid\(\d+,\d+\) failed in parent")
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
    """A filter for mpirun's stderr: `feed` each line as it comes, `close` at mpirun's end."""

    def __init__(self, log_path: Path, remote_hosts: list[str], out: TextIO = sys.stderr):
        self.log_path, self.remote_hosts, self.out = log_path, remote_hosts, out
        self.block: Optional[list[str]] = None  # the help block being read, rules included
        self.ssh: list[tuple[Optional[str], str]] = []  # (host or None, ssh's line)
        self.daemons_failed = False
        self.c10d_told = False
        self.lock = threading.Lock()  # feed runs in the reader thread, close in ours

    def _log(self, lines: list[str]) -> None:
        with open(self.log_path, "a") as f:
            f.writelines(ln + "\n" for ln in lines)

    def _show(self, lines: list[str]) -> None:
        self.out.write("".join(ln + "\n" for ln in lines))
        self.out.flush()

    def feed(self, line: str) -> None:
        line = line.rstrip("\r\n")  # ssh ends its lines with \r\n
        with self.lock:
            if self.block is not None:
                self.block.append(line)
                if RULE.match(line):
                    self._end_block()
            elif RULE.match(line):
                self.block = [line]
            elif PLM_SETPGID.match(line):
                self._log([line])
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
            self.daemons_failed = True  # said in one line by `close`
        else:
            self._show(block)  # another of Open MPI's messages: shown as it was

    def reason(self) -> Optional[str]:
        """`mpirun could not start its daemon on HOST over ssh (ssh's words)`, or None when the
        daemons started (the ranks' own records say why a run failed)."""
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
        """mpirun has ended: flush an unfinished block; a daemon failure becomes its one line."""
        with self.lock:
            if self.block is not None:
                self._end_block()
            why = self.reason()
            if why:  # the fix's `ssh HOST true`: the host ssh named, else the only remote one
                host = next((h for h, _ in self.ssh if h),
                            self.remote_hosts[0] if len(self.remote_hosts) == 1 else "HOST")
                self._show([f"[ddp_lab] {why}: {FIX.format(host=host)}; Open MPI's message: "
                            f"{self.log_path}"])
