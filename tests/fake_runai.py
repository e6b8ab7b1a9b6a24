"""A stand-in for the RunAI CLI: `runai submit-dist pytorch ... --command -- CMD...`.

It checks every flag against the documented flags of `runai submit-dist pytorch`
(run-ai/docs, docs/Researcher/cli-reference/runai-submit-dist-pytorch.md, CLI v2.10+),
then does what RunAI's PyTorchJob does: starts `--workers` + 1 pods (here: background
processes on this machine) with WORLD_SIZE = pods, RANK = pod index, MASTER_ADDR and
MASTER_PORT of the master pod, and the `-e` variables, each in its own session (a pod's
script is its PID 1), and returns at once; FAKE_RUNAI_RECORD gets the call and the pods' pids.

Used as an executable named `runai` on PATH by tests/test_launch_runai.py, and imported
for DOCUMENTED_* by the render tests.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

# flags that take a value (short aliases included), as the reference documents them
DOCUMENTED_VALUE_FLAGS = {
    "--clean-pod-policy", "--max-replicas", "--min-replicas", "--workers",
    "--job-name-prefix", "--name", "--template",
    "--add-capability", "-a", "--annotation", "-e", "--environment", "-i", "--image",
    "--image-pull-policy", "-l", "--label", "--preferred-pod-topology-key",
    "--required-pod-topology-key", "--working-dir",
    "--cpu", "--cpu-limit", "--extended-resource", "-g", "--gpu", "--gpu-memory", "--memory",
    "--memory-limit", "--mig-profile", "--backoff-limit",
    "--git-sync", "--nfs-server", "--pvc", "--pvc-exists", "--pvc-new", "--s3", "-v", "--volume",
    "--address", "--port", "-s", "--service-type",
    "--node-pools", "--node-type", "--toleration", "--loglevel", "-p", "--project",
}
# flags that take none
DOCUMENTED_BOOL_FLAGS = {
    "--attach", "--command", "--create-home-dir", "--stdin", "-t", "--tty", "--large-shm",
    "--mount-propagation", "--host-ipc", "--host-network", "--allow-privilege-escalation",
    "--run-as-user", "-h", "--help",
}


def quiet_port(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range: unlike one the OS picks (bind to 0),
    no outgoing connection (gloo opens many, other tests run beside) is handed it between
    this check and torchrun's listen, which fails with EADDRINUSE then."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(20000, max(low, 20001))
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def parse(argv: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """`submit-dist pytorch FLAGS -- CMD` -> ([(flag, value)], CMD); ValueError if a flag is
    not documented or lacks its value."""
    if argv[:2] != ["submit-dist", "pytorch"]:
        raise ValueError(f"expected 'submit-dist pytorch', got {argv[:2]}")
    flags: list[tuple[str, str | None]] = []
    i = 2
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return flags, argv[i + 1:]
        name, eq, inline = a.partition("=")
        if name in DOCUMENTED_BOOL_FLAGS and not eq:
            flags.append((name, None))
            i += 1
        elif name in DOCUMENTED_VALUE_FLAGS:
            if eq:
                flags.append((name, inline))
                i += 1
            else:
                if i + 1 >= len(argv) or argv[i + 1] == "--":
                    raise ValueError(f"{name} needs a value")
                flags.append((name, argv[i + 1]))
                i += 2
        else:
            raise ValueError(f"{a}: not a documented flag of runai submit-dist pytorch")
    return flags, []


def main(argv: list[str]) -> int:
    try:
        flags, command = parse(argv)
    except ValueError as e:
        print(f"runai (fake): {e}", file=sys.stderr)
        return 2
    record = os.environ.get("FAKE_RUNAI_RECORD")
    values = {}
    for k, v in flags:
        values.setdefault(k, []).append(v)
    workers = int(values.get("--workers", ["0"])[0])
    env = dict(os.environ)
    for kv in values.get("-e", []) + values.get("--environment", []):
        k, _, v = kv.partition("=")
        env[k] = v
    port = quiet_port()
    env.update(WORLD_SIZE=str(workers + 1), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    pods = []
    for rank in range(workers + 1):  # the master pod is RANK 0, then the workers
        pod = subprocess.Popen(command, env=dict(env, RANK=str(rank)), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        pods.append(pod.pid)  # each its own process group, as a pod is its own container
    if record:  # the pods' pids: a test plays Kubernetes (SIGTERM to a pod's PID 1)
        tmp = record + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"argv": argv, "flags": flags, "command": command, "pods": pods}, f)
        os.replace(tmp, record)
    print(f"The job '{values.get('--name', ['?'])[0]}' has been submitted successfully")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
