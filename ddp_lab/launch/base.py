"""What every launcher shares: the error it raises, what it renders, and the small tools of
rendering (templates, paths, the python to run) and of following a job.
"""

from __future__ import annotations

import itertools
import shlex
import shutil
import socket
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TextIO

from ..config.errors import UserError
from ..config import launchers_dir
from ..world.ports import FIX, port_in_use

TEMPLATES = launchers_dir()  # checkout or installed wheel (ddp_lab/config/__init__.py)


class LaunchError(UserError):
    """A launcher cannot start this configuration: a user error, one line with the fix, exit 2."""


@dataclass
class Rendered:
    command: list[str]  # run on this machine to start the job
    files: dict[str, str] = field(default_factory=dict)  # name -> content, into the run folder
    executable: tuple[str, ...] = ()  # which of `files` get the x bit
    show: str = ""  # what dry_run prints
    warnings: list[str] = field(default_factory=list)  # printed as `warning: ...` to stderr
    # start + follow, given the limit of a job run in the foreground (launch.start); None = run
    # `command`
    starter: Optional[Callable[[Optional[float]], int]] = None
    # after a failed job: the launcher's own reason, when it failed before any rank could say one
    # (torchrun's rendezvous); None = the ranks' records say why
    explain: Optional[Callable[[], Optional[str]]] = None

    def write(self, run_dir: Path) -> None:
        # logs/ must exist before the job starts: sbatch --output does not create folders
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        for name, content in self.files.items():
            path = run_dir / name
            path.write_text(content)
            if name in self.executable:
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def check_port_free(port, key: str = "launcher.master_port", fix: str = FIX) -> None:
    """Refuse, before any process starts, a rendezvous port that is no port or is held here."""
    try:
        number = int(port)
    except (TypeError, ValueError):
        number = 0
    if not 0 < number < 65536:
        raise LaunchError(f"{key}={port} is not a port (1..65535)")
    if port_in_use(number):
        raise LaunchError(f"{key}={port}: port {number} is in use on this machine (another "
                          f"program listens on it): {fix}")


def check_torchrun_job(cfg, nproc: int) -> None:
    """What slurm and runai refuse alike: ranks sharing a GPU, a rendezvous that is neither c10d
    nor static (or a static one with restarts), a wait that is no time."""
    lc = cfg.launcher
    if lc.gpus_per_node and nproc > lc.gpus_per_node and cfg.dist.device != "cpu":
        raise LaunchError(f"launcher.nproc_per_node={nproc} > launcher.gpus_per_node="
                          f"{lc.gpus_per_node}: ranks would share a GPU (NCCL refuses); "
                          "lower nproc_per_node, or set dist.device=cpu")
    if lc.rdzv not in ("c10d", "static"):
        raise LaunchError(f"launcher.rdzv={lc.rdzv}: choose c10d or static")
    if lc.rdzv == "static" and lc.max_restarts:
        raise LaunchError("launcher.max_restarts with launcher.rdzv=static: a static store "
                          "outlives a restart and the new ranks hang on the old addresses; "
                          "use launcher.rdzv=c10d")
    if lc.wait_timeout_s is not None and lc.wait_timeout_s <= 0:
        raise LaunchError(f"launcher.wait_timeout_s={lc.wait_timeout_s}: must be > 0 (or null)")


def is_this_machine(host: str) -> bool:
    return host in {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn(),
                    socket.gethostname().split(".")[0]}


def code_dir() -> Path:
    """The folder holding the `ddp_lab` package that renders: the ranks run the same code."""
    return Path(__file__).resolve().parents[2]


def python_exe(lc) -> str:
    """The ranks' python: launcher.venv's, else launcher.python, else this interpreter."""
    if lc.get("venv"):
        return str(Path(str(lc.venv)).expanduser() / "bin" / "python")
    return lc.python or sys.executable


RUNTIMES = ("apptainer", "singularity")


def container_binds(cfg) -> list[str]:
    """What launcher.image's --bind names besides the run folder: data.root, the rendering
    checkout, launcher.venv, launcher.bind (each made first: `container_folders`)."""
    lc = cfg.launcher
    binds = [str(cfg.data.root)] if "data" in cfg else []
    if code_dir().name not in ("site-packages", "dist-packages"):
        binds.append(str(code_dir()))
    if lc.get("venv"):
        binds.append(str(Path(str(lc.venv)).expanduser()))
    binds += [str(b) for b in lc.get("bind") or []]
    return list(dict.fromkeys(binds))


def ranks_python(cfg, run_dir: str) -> str:
    """The shell words that run the ranks' python on a node: `python_exe`, or with launcher.image
    the image's python under `<runtime> exec [--nv] --bind ...`. `run_dir`: the run folder as a
    shell word (a quoted path, or $RUN_DIR)."""
    lc = cfg.launcher
    if not lc.get("image"):
        return shlex.quote(python_exe(lc))
    py = python_exe(lc) if lc.get("venv") else (lc.python or "python")
    nv = "--nv " if cfg.dist.device != "cpu" else ""
    binds = ",".join([run_dir, *(shlex.quote(b) for b in container_binds(cfg))])
    return (f"{shlex.quote(lc.runtime)} exec {nv}--bind {binds} {shlex.quote(str(lc.image))} "
            f"{shlex.quote(py)}")


def container_folders(cfg, run_dir: str) -> str:
    """The script line that makes what launcher.image binds; '' without an image."""
    if not cfg.launcher.get("image"):
        return ""
    sources = [shlex.quote(b.split(":")[0]) for b in container_binds(cfg)]
    return (f"mkdir -p {' '.join([run_dir, *sources])}  # launcher.image binds them "
            "(Apptainer refuses a missing source)\n")


def check_container(cfg) -> None:
    """launcher.image and launcher.runtime, before anything is written: the runtime is one of
    RUNTIMES, and for a real submission on PATH, with a local image that exists."""
    lc = cfg.launcher
    if lc.runtime not in RUNTIMES:
        raise LaunchError(f"launcher.runtime={lc.runtime}: choose apptainer or singularity")
    local = lc.get("image") and "://" not in str(lc.image)
    if local:
        lc.image = str(Path(str(lc.image)).expanduser().resolve())  # one path for every node
    if not lc.get("image") or lc.dry_run:
        return
    if local and not Path(lc.image).exists():
        raise LaunchError(f"launcher.image={lc.image}: no such image (a .sif file every "
                          "node sees, or a docker:// reference)")
    require_tool(lc.runtime, "launcher.image needs it on every node; install Apptainer, or "
                             "set launcher.runtime=singularity where that is the site's")


def pythonpath_line() -> str:
    """Put the ddp_lab that renders on the ranks' path if it is a source checkout, never an
    installed one (site-packages, with this machine's torch, would shadow a container's)."""
    where = code_dir()
    if where.name in ("site-packages", "dist-packages"):
        return "# ddp_lab is installed, not a checkout: the ranks' python brings its own"
    return (f"export PYTHONPATH={shlex.quote(str(where))}${{PYTHONPATH:+:$PYTHONPATH}}"
            "  # the ddp_lab that rendered this script")


def setup_block(lines) -> str:
    lines = [str(x) for x in (lines or [])]
    if not lines:
        return "# (no setup lines; add some with launcher.setup=['module load ...', ...])"
    return "# launcher.setup\n" + "\n".join(lines)


# what every rank imports first; a container image with torch alone lacks the rest
NEEDED = ("torch", "torchvision", "hydra", "omegaconf", "ddp_lab")
_CHECK = ("import importlib.util as u, sys\n"
          "def has(m):\n"
          "    try:\n"
          "        return u.find_spec(m) is not None\n"
          "    except Exception:\n"
          "        return False\n"
          "miss = [m for m in {need} if not has(m)]\n"
          "miss and print(\"%s cannot import %s: install them for that python, or point "
          "launcher.python or launcher.venv at one that can (docs/launchers.md, Containers)\" "
          "% (sys.executable, \", \".join(miss)))")


def python_check(py: str, fail: str = "exit 3") -> str:
    """Script lines that end the job in one line if the ranks' python cannot import their code."""
    code = _CHECK.format(need="(" + ", ".join(f'"{m}"' for m in NEEDED) + ")")  # no ' for bash
    return ("# the ranks' python must import what they run: else one line naming what is missing\n"
            f"MISSING=$({py} -c '{code}' 2>&1) || MISSING=\"{py} did not run: $MISSING\"\n"
            'if [ -n "$MISSING" ]; then\n'
            '  echo "[ddp_lab] $MISSING" >&2\n'
            f"  {fail}\n"
            "fi")


def store_line(max_restarts: int) -> str:
    """The script lines that pick the workers' store: torchrun's, or a fresh one per restart."""
    if max_restarts <= 0:
        return "# no restarts: the workers share torchrun's store on the rendezvous port"
    return ("# a fresh store per restart attempt (pytorch/pytorch#135712); its port is picked\n"
            "# by torchrun and bound by rank 0 a few seconds later\n"
            "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def sourced_note(path: Path, text: str, by: str) -> str:
    """What a dry run prints of a helper script that `by` sources (slurm_stop.sh, pod_stop.sh): its
    path, length and the functions its header lists."""
    lines = text.splitlines()
    block = itertools.takewhile(lambda ln: ln.startswith("#"), lines[1:])  # after the shebang
    header = [ln for ln in block if ln.startswith("#   ") and ln[4:5].strip()]
    return (f"# ---- {path}: sourced by {by}, {len(lines)} lines not shown "
            f"(cat it to read it); it defines:\n" + "\n".join(header))


def require_tool(tool: str, where: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise LaunchError(f"{tool} not found on PATH: {where} (launcher.dry_run=true renders "
                          "and prints what would run, without it)")
    return path


def follow_if_waited(wait: Optional[bool], look: str, follow: Callable[[], int]) -> int:
    """A submitted job: `follow()` it where launcher.wait says so (null: when a person is watching,
    stdin a tty), else say how to `look` at it and return 0."""
    if wait is None:
        try:
            wait = sys.stdin is not None and sys.stdin.isatty()
        except ValueError:  # stdin closed
            wait = False
    if wait:
        return follow()
    print(f"not following it (launcher.wait=false): {look}", flush=True)
    return 0


class Tail:
    """Print what a growing log file gains, whole lines only (the job may be mid-line)."""

    def __init__(self, path: Path, out: TextIO):
        self.path, self.out, self.pos = path, out, 0

    def poll(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read()
        except OSError:
            return
        if not final:
            chunk = chunk[: chunk.rfind(b"\n") + 1]
        if chunk:
            self.pos += len(chunk)
            self.out.write(chunk.decode(errors="replace"))
            self.out.flush()


def tail_text(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def diagnose(logs: list[Path], lines: int = 15) -> str:
    """What a failed job's logs say: every rank's one-line `failed: ...` reason (the worker writes
    one), then the last lines of the first log that has any (the launcher's view)."""
    reasons: list[str] = []
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        reasons += [ln.strip() for ln in text.splitlines()
                    if "] failed: " in ln and ln.strip() not in reasons]
    tail_of = next((p for p in logs if tail_text(p)), None)
    parts = []
    if reasons:
        parts.append("the ranks said:\n  " + "\n  ".join(reasons[:8]))
    if tail_of is not None:
        parts.append(f"last lines of {tail_of}:\n{tail_text(tail_of, lines)}")
    return "\n".join(parts) or "no log output (see the run folder's logs/)"
