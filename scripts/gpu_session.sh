#!/usr/bin/env bash
# The whole GPU session in one script (docs/performance.md, "On a GPU"): what a machine with
# one GPU and no network runs, in about six minutes.
#
#   bash scripts/gpu_session.sh            # on the GPU machine, from a copy of the checkout
#
# 1. the Python packages the machine lacks, from wheels carried beside the checkout
#    (.wheels: hydra-core, omegaconf, PyYAML, antlr4; .wheels-gpu: pytest and
#    pytest-xdist, HTA and its parsers), installed into $OUT/pydeps and put on PYTHONPATH;
# 2. the machine: GPU, driver, CUDA, NCCL, torch (nvidia-smi, torch);
# 3. where the time to the first step goes: python + torch import, CUDA's first context,
#    NCCL's first communicator, MNIST into GPU memory (each timed alone, then a whole run's
#    startup_s from its summary);
# 4. scripts/gpu_check.sh: every CUDA / nccl row (its table);
# 5. the test suite's GPU tests (`-m gpu` and every test that skips without CUDA);
# 6. what the phase timing costs: a rank under cProfile, timing on against off;
# 7. NVTX: the ranges a profiled rank pushes (scripts/nvtx_ranges.py).
# Make the wheel folders on a machine with network (once):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 -d .wheels "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" PyYAML   # hydra 1.3 needs omegaconf 2.3 (2.4 warns at every run)
#   pip wheel --no-deps -w .wheels antlr4-python3-runtime==4.9.3
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d .wheels-gpu \
#     "pytest>=8,<9" pluggy iniconfig execnet pytest-xdist holistictraceanalysis networkx \
#     pydot pyparsing plotly narwhals pandas python-dateutil six tzdata ijson psutil
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON=${PYTHON:-python3}
# WORK holds the runs (MNIST copies, checkpoints); RESULT (the device tool's $OUT, else WORK)
# gets the logs and the runs' small files back
RESULT=${OUT:-}
OUT=${WORK:-/tmp/gpu_session}
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
RESULT=${RESULT:-$OUT}
export PYTHONPATH="$REPO"
if ! command -v nvidia-smi >/dev/null; then
  echo "skipped: no CUDA (no nvidia-smi: this is the GPU machine's script; scripts/gpu_check.sh --rehearse runs its rows on CPU)"
  exit 0
fi
SECTIONS=${SECTIONS:-1 2 3 4 5 6 7 8}  # which of the numbered parts to run (1 and 2 always)
want() { [[ " $SECTIONS " == *" $1 "* ]]; }

echo "== 1. packages"
PYDEPS="$OUT/pydeps"
need=$("$PYTHON" - <<'EOF'
import importlib.util
need = {"hydra": "hydra-core", "omegaconf": "omegaconf", "yaml": "PyYAML", "antlr4": "antlr4-python3-runtime",
      "pytest": "pytest", "xdist": "pytest-xdist", "execnet": "execnet", "pluggy": "pluggy",
      "iniconfig": "iniconfig", "hta": "holistictraceanalysis", "pandas": "pandas",
      "plotly": "plotly", "narwhals": "narwhals", "networkx": "networkx", "pydot": "pydot",
      "pyparsing": "pyparsing", "dateutil": "python-dateutil", "six": "six", "tzdata": "tzdata",
      "ijson": "ijson", "psutil": "psutil"}
print(" ".join(d for m, d in need.items() if importlib.util.find_spec(m) is None))
EOF
)
echo "missing here: ${need:-none}"
if [ -n "$need" ]; then
  # shellcheck disable=SC2086
  "$PYTHON" -m pip install -q --no-deps --no-index --find-links .wheels --find-links .wheels-gpu \
    --target "$PYDEPS" $need >"$OUT/pydeps.log" 2>&1 || { echo "pip failed: $OUT/pydeps.log"; tail -5 "$OUT/pydeps.log"; }
  export PYTHONPATH="$REPO:$PYDEPS"
fi

echo "== 2. the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PYTHON" -c "import torch; print('torch', torch.__version__, '| cuda', torch.version.cuda,
  '| nccl', '.'.join(map(str, torch.cuda.nccl.version())), '|', torch.cuda.get_device_name(0))"
which nsys ncu 2>/dev/null || echo "no nsys/ncu on PATH"
nvidia-smi topo -m 2>/dev/null | head -5

if want 3; then
  echo "== 3. where the time to the first step goes"
  "$PYTHON" - "$OUT" <<'EOF'
import os, subprocess, sys, time
out = sys.argv[1]
def took(code):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0
base = took("pass")
imp = took("import torch")
cuda = took("import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()")
nccl = took("import os, torch, torch.distributed as dist; os.environ.update(MASTER_ADDR='127.0.0.1', "
            "MASTER_PORT='29571'); torch.cuda.set_device(0); dist.init_process_group('nccl', rank=0, "
            "world_size=1, device_id=torch.device('cuda:0')); t = torch.ones(1, device='cuda'); "
            "dist.all_reduce(t); torch.cuda.synchronize(); dist.destroy_process_group()")
ddp = took("import ddp_lab.train, ddp_lab.worker")
print(f"python alone {base:.2f} s | + import torch {imp - base:.2f} s | + CUDA context {cuda - imp:.2f} s"
      f" | + NCCL communicator (world 1) {nccl - cuda:.2f} s | import ddp_lab's rank side {ddp - base:.2f} s")
EOF
fi

if want 4; then
  echo "== 4. scripts/gpu_check.sh"
  OUT="$OUT/check" WHEELS="$REPO/.wheels" timeout 420 bash scripts/gpu_check.sh
  echo "gpu_check exit $?"
  for d in "$OUT"/check/nccl_1rank "$OUT"/check/cuda_graph; do
    [ -f "$d/summary.json" ] && "$PYTHON" -c "import json,sys; s=json.load(open(sys.argv[1]));
  print(sys.argv[1].rsplit('/',1)[-1], 'startup_s', [g.get('startup_s') for g in s.get('segments', [])],
        'epochs', s.get('epochs_done'), 'median', s.get('epoch_time_s_median'))" "$d/summary.json"
  done
fi

if want 5; then
  echo "== 5. the suite's GPU tests"
  timeout 150 "$PYTHON" -m pytest -p no:cacheprovider -n 0 -q -rs -W ignore --continue-on-collection-errors -m gpu tests 2>&1 |
    grep -E "passed|failed|FAILED|ERROR|Error|error|SKIP" | tail -15
  timeout 150 "$PYTHON" -m pytest -p no:cacheprovider -n 0 -q -rs -W ignore tests/test_cuda_graph.py \
    tests/test_timing.py tests/test_timing_pool.py 2>&1 | grep -E "passed|failed|FAILED|ERROR|Error|SKIP" | tail -15
fi

if want 6; then
  echo "== 6. what the phase timing costs, profiled: one rank's full epoch under cProfile, timing on and off"
  for t in on off; do
    d="$OUT/cost_$t"; rm -rf "$d"
    en=true; [ $t = off ] && en=false
    "$PYTHON" -m ddp_lab launcher.dry_run=true "run.dir=$d" dist.backend=nccl dist.device=cuda \
      "data.root=$OUT/check/data" launcher.nproc_per_node=1 train.epochs=1 "timing.enabled=$en" >/dev/null 2>&1
    (cd "$d" && MASTER_PORT=2961${#t} timeout 120 "$PYTHON" "$REPO/scripts/profile_rank.py" "$d" \
       "$OUT/cost_$t.prof" >"$OUT/cost_$t.log" 2>&1) || echo "cost_$t failed: $(tail -3 "$OUT/cost_$t.log")"
    grep "epoch 1/" "$OUT/cost_$t.log"
  done
  "$PYTHON" "$REPO/scripts/profile_diff.py" "$OUT/cost_on.prof" "$OUT/cost_off.prof"
fi

if want 7; then
  echo "== 7. NVTX ranges of a profiled rank (no nsys here: range_push counted in process)"
  d="$OUT/nvtx_run"; rm -rf "$d"
  "$PYTHON" -m ddp_lab launcher.dry_run=true "run.dir=$d" dist.backend=nccl dist.device=cuda \
    "data.root=$OUT/check/data" launcher.nproc_per_node=1 train.epochs=1 train.max_steps_per_epoch=50 \
    timing.profile=true >/dev/null 2>&1
  (cd "$d" && timeout 120 "$PYTHON" "$REPO/scripts/nvtx_ranges.py" "$d" 2>"$OUT/nvtx.log" | grep -v "^\[rank")
fi

if want 8; then
  echo "== 8. the library twins against DDP on nccl (one rank: the same weights, optimiser state per rank)"
  for s in ddp zero1 torch_zero fsdp2 "ddp sync.hook=ring" "ddp sync.hook=fp16"; do
    name=twin_${s// /_}; name=${name//[.=]/-}
    # shellcheck disable=SC2086
    timeout 120 "$PYTHON" -m ddp_lab dist.backend=nccl dist.device=cuda "data.root=$OUT/check/data" \
      "run.dir=$OUT/$name" launcher.nproc_per_node=1 train.epochs=1 train.max_steps_per_epoch=200 \
      model=mlp_wide log.progress=lines sync=$s >"$OUT/$name.log" 2>&1 || echo "$name failed: $(tail -2 "$OUT/$name.log")"
  done
  "$PYTHON" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
import torch
out = Path(sys.argv[1])
ref = None
for d in sorted(out.glob("twin_*")):
  if not (d / "summary.json").is_file():
      continue
  s = json.loads((d / "summary.json").read_text())
  w = d / "model.pt"
  diff = "-"
  if w.is_file():
      sd = torch.load(w, map_location="cpu")
      if d.name == "twin_ddp":
          ref = sd
      if ref is not None:
          diff = f"{max((sd[k].float() - ref[k].float()).abs().max().item() for k in ref):.2e}"
  state = s.get('memory_optimizer_state_bytes_per_rank') or s.get('memory_optimizer_state_bytes')
  print(f"{d.name:<22} {s.get('status')!s:<10} {s.get('epoch_time_s_median', 0):.3f} s/epoch  "
        f"acc {s.get('test_accuracy', 0):.4f}  max|w - ddp| {diff}  optimiser state {state}")
PYEOF
fi

if [ "$RESULT" != "$OUT" ]; then
  (cd "$OUT" && find . \( -name '*.log' -o -name summary.json -o -name metrics.jsonl \
     -o -name config.yaml -o -name 'rank0*.pt.trace.json' \) -size -20M -print0 |
   xargs -0 -I{} cp --parents {} "$RESULT"/) 2>/dev/null
fi
