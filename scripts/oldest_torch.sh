#!/usr/bin/env bash
# The oldest torch ddp_lab declares (pyproject.toml's floor: torch 2.2, as NVIDIA's NGC
# containers from 24.01 on carry it), from the registry, in a venv of its own, and the part
# of the suite that runs on it: every synchroniser to its end, a resume, the report, stop 0
# bit for bit, and the end of a run whose ranks torchrun forked.
#   bash scripts/oldest_torch.sh          # .ci/run's last step
# Knobs (env): PYTHON (default python3), VENV (default .venv-oldest-torch), KEEP_VENV
# (default 1; 0 removes the venv at the end, as .ci/run does to free its ~5 GB), INSTALL_ONLY
# (default 0; 1 installs torch, torchvision and ddp_lab's other requirements, the download,
# and stops: .ci/run runs it while setup.sh makes the main venv; ddp_lab itself, an editable
# build in this folder, is installed by the second call, so two builds never share the folder).
# The registry's linux wheels of torch 2.2 bring NVIDIA's CUDA 12 libraries (~2.5 GB;
# `import torch` loads them even on a CPU): one install, then reused while the venv stays.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-oldest-torch}
KEEP_VENV=${KEEP_VENV:-1}
INSTALL_ONLY=${INSTALL_ONLY:-0}
# torch==X.Y.* and torchvision==X.Y.* of pyproject.toml's floors (the newest patch release)
read -r -a PINS < <("$PYTHON" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for d in deps:
    m = re.fullmatch(r"(torch|torchvision)>=(\d+)\.(\d+)\S*", d.replace(" ", ""))
    if m:
        print(f"{m[1]}=={m[2]}.{m[3]}.*", end=" ")
print()
PY
)
[ "${#PINS[@]}" -eq 2 ] || { echo "pyproject.toml: no torch>=X.Y / torchvision>=X.Y floor" >&2; exit 1; }
if [ "$KEEP_VENV" = 0 ]; then
    trap 'rm -rf "$VENV"' EXIT
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# numpy < 2: torch < 2.3 was built against numpy 1 (tensor.numpy() fails under numpy 2)
PROJECT=(-e '.[test]')
if [ "$INSTALL_ONLY" = 1 ]; then
    # ddp_lab's other requirements and its test extra come with the download, so the second
    # call only builds ddp_lab itself (about a minute less on .ci/run's path)
    read -r -a PROJECT < <("$PYTHON" - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = [*project["dependencies"], *project["optional-dependencies"]["test"]]
print(" ".join(d.replace(" ", "") for d in deps if not re.match(r"(torch|torchvision)\b", d)))
PY
)
fi
time "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "${PINS[@]}" "numpy<2" "${PROJECT[@]}"
[ "$INSTALL_ONLY" = 1 ] && exit 0
"$VENV/bin/python" -c "import torch, torchvision; print('oldest torch:', torch.__version__, 'torchvision', torchvision.__version__)"
# of tests/test_one_file.py, what the oldest torch changes: stop 0 told --no-fused (no fused
# Adam on CPU before 2.4) and still the framework's weights bit for bit, on 2 ranks; its 3- and
# 7-rank run is about the ring's order and the shards' padding, the same on every torch
time "$VENV/bin/python" -m pytest -n 2 -v -p no:cacheprovider tests/oldest_torch.py \
    tests/test_one_file.py -k "not test_one_file_matches_the_ring_at_3_and_7_ranks" \
    tests/test_launch_local.py::test_forked_ranks_end_when_torchrun_polls_seldom
