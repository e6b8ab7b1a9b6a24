#!/usr/bin/env bash
# Install the Debian packages the cluster/MPI tests need (SLURM, munge, OpenMPI; iproute2's
# ip and tc for scripts/netlab.sh, the network lab the session's SLURM cluster runs in).
# Idempotent: does nothing (no apt-get update) when every package is already installed.
# Usage: scripts/install_system_deps.sh        (needs root, or sudo available)
set -euo pipefail
# (so a pipe into grep reads to the end, `grep ... >/dev/null`: `grep -q` exits at the first
# match, and a writer still writing dies of SIGPIPE, which pipefail reports as the pipe's status)

PKGS=(slurmctld slurmd slurm-client munge openmpi-bin)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep '^install ok installed$' >/dev/null; then
        missing+=("$p")
    fi
done
# ip and tc: present on most machines by other means too; the package only if one is missing
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    missing+=(iproute2)
fi

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install_system_deps: all installed (${PKGS[*]}, ip and tc)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install_system_deps: need root to install: ${missing[*]}" >&2; exit 1
    fi
fi

echo "install_system_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# timeouts so a stuck mirror cannot hang CI forever
$SUDO timeout 300 apt-get update -q
$SUDO timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install_system_deps: done"
