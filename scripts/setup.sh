#!/usr/bin/env bash
# Set ddp_lab up on a fresh machine: a virtual environment in .venv with the package
# (editable) and its test tools.
#
#   bash scripts/setup.sh            # Python side only: enough for `python -m ddp_lab`
#   bash scripts/setup.sh --system   # also the Debian packages the launcher tests run
#                                    # (slurmctld/slurmd/munge, openmpi-bin; needs root)
#
# Knobs (env): PYTHON (default python3), VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

if [ "${1:-}" = "--system" ]; then
    bash scripts/install_system_deps.sh
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# torch is not pinned: torch and torchvision resolve together from the registry
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
"$VENV/bin/python" -c "import torch, torchvision, hydra, tensorboard; \
print(f'ddp_lab ready: torch {torch.__version__}, torchvision {torchvision.__version__}, \
cuda {torch.cuda.is_available()}')"
