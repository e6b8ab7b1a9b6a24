#!/usr/bin/env python3
"""A stand-in for `apptainer` (and `singularity`) on PATH: no real Apptainer runs in
ddp_lab's tests (it is not in this machine's package archive). It checks a command line
against Apptainer's documented CLI for `exec` (apptainer.org/docs/user/main/cli/apptainer_exec.html:
`apptainer [global options] exec [exec options...] <container> <command> [args...]`), notes
it in $FAKE_APPTAINER_LOG (one JSON line: the options, the image, the command), then runs
the command on this machine: what the image's python would run, minus the container.

What it refuses, with exit status 255 and one line on stderr as Apptainer does: a
subcommand other than exec, an option `exec` does not have, a --bind entry that is not
`src[:dest[:ro|rw]]` with an absolute `src` that exists, an image that is neither a SIF
file (its magic), a sandbox folder nor a URI of a kind Apptainer pulls, a missing command.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# `apptainer exec` options (apptainer 1.3 `apptainer exec --help`): those taking a value ...
VALUED = {"-B": "bind", "--bind": "bind", "--mount": "mount", "--env": "env",
          "--env-file": "env-file", "--pwd": "pwd", "-H": "home", "--home": "home",
          "-o": "overlay", "--overlay": "overlay", "-W": "workdir", "--workdir": "workdir",
          "--security": "security", "--network": "network", "--apply-cgroups": "cgroups"}
# ... and flags
FLAGS = {"--nv", "--nvccli", "--rocm", "-e", "--cleanenv", "-C", "--containall", "-c",
         "--contain", "--no-home", "--writable-tmpfs", "-w", "--writable", "-f", "--fakeroot",
         "-i", "--ipc", "-p", "--pid", "-u", "--userns", "--no-mount", "--no-init"}
# what Apptainer can run or pull (apptainer.org/docs/user/main/cli/apptainer_exec.html)
SCHEMES = ("docker://", "docker-archive:", "docker-daemon:", "oras://", "library://",
           "shub://", "oci:", "oci-archive:", "http://", "https://")
SIF_MAGIC = b"SIF_MAGIC"  # at byte 32 of every SIF file, after its launch line


def fail(message: str) -> None:
    print(f"FATAL:   {message}", file=sys.stderr)
    sys.exit(255)


def check_bind(spec: str) -> None:
    for entry in spec.split(","):
        parts = entry.split(":")
        if not 1 <= len(parts) <= 3 or not parts[0]:
            fail(f"bind entry {entry!r}: expected src[:dest[:opts]]")
        if not parts[0].startswith("/") or not Path(parts[0]).exists():
            fail(f"mount source {parts[0]} doesn't exist")
        if len(parts) == 3 and parts[2] not in ("ro", "rw"):
            fail(f"bind entry {entry!r}: options are ro or rw")


def check_image(image: str) -> None:
    if image.startswith(SCHEMES):
        return
    path = Path(image)
    if path.is_dir():
        return  # a sandbox
    if not path.is_file():
        fail(f"could not open image {image}: failed to retrieve path for {image}: no such file")
    with path.open("rb") as f:
        if f.read(64)[32:32 + len(SIF_MAGIC)] != SIF_MAGIC:
            fail(f"could not open image {image}: image format not recognized")


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "exec":
        fail(f"this stand-in knows `exec` only, not {argv[:1]}")
    args, options = argv[1:], []
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        name, _, value = opt.partition("=")
        if name in FLAGS and not value:
            options.append(name)
        elif name in VALUED:
            if not value:
                if not args:
                    fail(f"flag needs an argument: {name}")
                value = args.pop(0)
            if VALUED[name] == "bind":
                check_bind(value)
            options.append(f"{name}={value}")
        else:
            fail(f"unknown flag: {opt}")
    if len(args) < 2:
        fail("exec needs an image and a command")
    image, command = args[0], args[1:]
    check_image(image)
    log = os.environ.get("FAKE_APPTAINER_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"runtime": os.environ.get("FAKE_APPTAINER_NAME", "apptainer"),
                                "options": options,
                                "image": image, "command": command}) + "\n")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
