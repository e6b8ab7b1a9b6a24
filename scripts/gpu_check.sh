#!/usr/bin/env bash
# Every CUDA / nccl path of ddp_lab on one GPU, in a few minutes, as a short table.
#
#   bash scripts/gpu_check.sh              # run; without CUDA: one line "skipped: no CUDA", exit 0
#   bash scripts/gpu_check.sh --dry        # print the commands it would run, run nothing
#   bash scripts/gpu_check.sh --rehearse   # the same checks on CPU with gloo and few steps
#                                          # (tests the script itself where no GPU is)
#
# Checks: the default MLP trained with nccl on 1 rank (figure: median s/epoch over full
# epochs; goal <= 0.3 s on one H100), the same run with timing.enabled=false (what the
# CUDA-event phase timing costs, side by side: goal <= 3%), the same run with
# train.cuda_graph=true (the step one CUDA graph: epoch time and test accuracy against
# eager; goal <= 0.3 s, within 0.3 points), the same step's floor (a tight loop, no
# ddp_lab), CUDA-event phase timing, an nccl group of several
# ranks on one device (NCCL may refuse it, "Duplicate GPU detected": then the row says
# refused), every synchroniser with nccl, torch's library twins (sync=torch_zero, sync=fsdp2,
# sync=ddp sync.hook=...), the collective benchmark with nccl, a run with
# PyTorch's flight recorder on (dumps go into that run's folder), and a run with
# timing.profile=true (its traces, HTA, the witness table's rows, its cost against row 1).
# Exit 1 if a check failed.
#
# Knobs (env): PYTHON (default: the checkout's .venv/bin/python, else python3 from PATH),
# OUT (default outputs/gpu_check/<date>_<time>), EPOCHS (3: full epochs of the speed row),
# STEPS (200: steps per epoch of the other rows), RANKS (2: ranks on the one device),
# WHEELS (default <repo>/.wheels): for a machine without network, wheels of the packages it
# lacks (torch is expected there); every wheel in it is installed (--no-deps) into
# $OUT/pydeps. Made on a machine with network, for the GPU machine's Python (3.12 here):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 -d .wheels "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" PyYAML   # hydra 1.3 needs omegaconf 2.3 (2.4 warns at every run)
#   pip wheel --no-deps -w .wheels antlr4-python3-runtime==4.9.3     # no wheel on PyPI
# (and tensorboard, matplotlib, tqdm with their dependencies if the machine lacks them)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE=run
case "${1:-}" in
  --dry) MODE=dry ;;
  --rehearse) MODE=rehearse ;;
  "") ;;
  *) echo "usage: $0 [--dry | --rehearse]" >&2; exit 2 ;;
esac
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
OUT=${OUT:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
EPOCHS=${EPOCHS:-3}
STEPS=${STEPS:-200}
RANKS=${RANKS:-2}
BENCH_MAX=16777216
SPEED_STEPS=0   # the speed and floor rows run full epochs (0: no cap)
WHEELS=${WHEELS:-$REPO/.wheels}
BACKEND=nccl
DEVICE=cuda
if [ "$MODE" = rehearse ]; then
  BACKEND=gloo DEVICE=cpu EPOCHS=1 STEPS=20 BENCH_MAX=65536 SPEED_STEPS=20
fi
DIST=("dist.backend=$BACKEND" "dist.device=$DEVICE")
DATA="data.root=$OUT/data"

if [ "$MODE" = run ]; then
  if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "skipped: no CUDA (torch.cuda.is_available() is false for $PYTHON)"
    exit 0
  fi
fi

if [ "$MODE" != dry ]; then
  mkdir -p "$OUT/logs"
  OUT="$(cd "$OUT" && pwd)"
  DATA="data.root=$OUT/data"
  # a plain checkout (the GPU machine's copy) has no install: run this checkout's ddp_lab
  if ! "$PYTHON" -c "import ddp_lab" 2>/dev/null; then
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  fi
  missing() {
    "$PYTHON" - <<'EOF'
import importlib.util
need = {"hydra": "hydra-core", "omegaconf": "omegaconf", "torchvision": "torchvision",
        "tensorboard": "tensorboard", "matplotlib": "matplotlib", "tqdm": "tqdm"}
print(" ".join(d for m, d in need.items() if importlib.util.find_spec(m) is None))
EOF
  }
  lacking=$(missing)
  if [ -n "$lacking" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-deps --no-index --target "$OUT/pydeps" "$WHEELS"/*.whl \
      >"$OUT/logs/pydeps.log" 2>&1 || { echo "cannot install the wheels of $WHEELS: see $OUT/logs/pydeps.log"; exit 1; }
    export PYTHONPATH="$OUT/pydeps${PYTHONPATH:+:$PYTHONPATH}"
    lacking=$(missing)
  fi
  if [ -n "$lacking" ]; then
    echo "missing Python packages: $lacking (no network? put their wheels in $WHEELS: see $0's header)"; exit 1
  fi
fi

ROWS=()    # "check|result|figure"
FAILED=0

# run NAME CMD...: its output goes to $OUT/logs/NAME.log; returns the command's status
run() {
  local name=$1; shift
  if [ "$MODE" = dry ]; then printf '%q ' "$@"; echo; return 0; fi
  echo "== $name" >&2
  timeout 300 "$@" >"$OUT/logs/$name.log" 2>&1
}

row() { ROWS+=("$1|$2|$3"); [ "$2" = failed ] && FAILED=1; return 0; }

# figure DIR WHAT: one number from a run folder's files (see the python below)
figure() {
  "$PYTHON" - "$@" <<'EOF'
import json, sys
from pathlib import Path
d, what = Path(sys.argv[1]), sys.argv[2]
if what == "epoch":
    s = json.loads((d / "summary.json").read_text())
    print(f"{s['epoch_time_s_median']:.3f} s/epoch, acc {s['test_accuracy']:.4f} ({s['backend']} on {s['device']})")
elif what == "phases":
    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ph = recs[-1]["phase_s"]
    assert all(ph[p]["mean"] > 0 for p in ("forward", "backward", "sync", "optim")), ph
    print(", ".join(f"{p} {1e3 * ph[p]['mean']:.3f}" for p in ("forward", "backward", "sync", "optim")) + " ms/step")
elif what == "bench":
    bench = json.loads((d / "bench.json").read_text())
    rows = bench["rows"]
    if not rows:  # one GPU: a world of 1 has nothing to all-reduce (NCCL refuses 2 on 1 device)
        print(f"n/a: world of {bench['meta']['world_size']}, nothing to all-reduce")
        sys.exit(0)
    bad = [r for r in rows if not r.get("correct", True)]
    assert not bad, bad
    best = {}
    for r in rows:
        if r["impl"] not in best or r["busbw_GBps"] > best[r["impl"]]["busbw_GBps"]:
            best[r["impl"]] = r
    print("peak busbw " + ", ".join(f"{k} {v['busbw_GBps']:.2f}" for k, v in best.items()) + " GB/s")
elif what == "versus":  # versus REF LABEL: this run's epoch time and accuracy against REF's
    s = json.loads((d / "summary.json").read_text())
    r = json.loads((Path(sys.argv[3]) / "summary.json").read_text())
    t, rt = s["epoch_time_s_median"], r["epoch_time_s_median"]
    print(f"{t:.3f} s/epoch vs {rt:.3f} {sys.argv[4]} ({100 * (t - rt) / rt:+.1f}%), "
          f"acc {s['test_accuracy']:.4f} ({100 * (s['test_accuracy'] - r['test_accuracy']):+.2f} points)")
elif what == "refused":  # the one line a refused command printed (exit 2)
    lines = [x for x in (d / "log").read_text().splitlines() if x.strip()]
    assert len(lines) == 1 and "train.cuda_graph=true" in lines[0], lines
    print(lines[0][:120])
elif what == "witness":  # timing.profile: the traces, HTA's reading, the witness table's rows
    from ddp_lab.report.run import load_run
    from ddp_lab.report.truth_table import hta_overlap, witness_rows
    traces = sorted((d / "profile").glob("rank*.pt.trace.json"))
    assert traces, "no profile/rank*.pt.trace.json"
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    missing = {f"ddp_lab:{p}" for p in ("data", "forward", "backward", "sync", "optim")} - names
    assert not missing, missing
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    nccl = sum(1 for e in events if e.get("cat") == "kernel" and str(e.get("name", "")).startswith("nccl"))
    import os
    saved = os.dup(1)
    os.dup2(2, 1)  # HTA logs its parsing to stdout: to the log, not into the row
    try:
        try:
            from hta.trace_analysis import TraceAnalysis
            hta = f"HTA parsed {len(TraceAnalysis(trace_dir=str(d / 'profile')).t.traces)} rank(s)"
        except ImportError:
            hta = "HTA not installed"
        overlap = hta_overlap(d / "profile")
        rows = "; ".join(f"{r['figure']} {r['ratio']:.2f}" for r in witness_rows(load_run(d), str)
                         if r["ratio"] is not None)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
    print(f"{len(traces)} trace(s), {kernels} kernels ({nccl} nccl), {hta}, HTA overlap "
          + (f"{overlap:.2f}" if overlap is not None else "n/a") + (f"; {rows}" if rows else ""))
elif what == "dumps":
    print(f"{len(list(d.glob('nccl_trace_rank_*')))} dump file(s) (dumps come on a timeout)")
EOF
}

train() {  # train NAME RUN_DIR OVERRIDES...: the trainer, into RUN_DIR
  local name=$1 dir=$2; shift 2
  run "$name" "$PYTHON" -m ddp_lab "${DIST[@]}" "$DATA" "run.dir=$dir" log.progress=lines "$@"
}

# 1. speed of the default MLP on one GPU, CUDA-event phase timing
if train nccl_1rank "$OUT/nccl_1rank" launcher.nproc_per_node=1 "train.epochs=$EPOCHS" "train.max_steps_per_epoch=$SPEED_STEPS"; then
  [ "$MODE" = dry ] || { row "$BACKEND, 1 rank, default MLP" ok "$(figure "$OUT/nccl_1rank" epoch)"
    if f=$(figure "$OUT/nccl_1rank" phases 2>>"$OUT/logs/nccl_1rank.log"); then
      row "phase timing ($DEVICE)" ok "$f"; else row "phase timing ($DEVICE)" failed "see logs/nccl_1rank.log"; fi; }
else
  row "$BACKEND, 1 rank, default MLP" failed "see logs/nccl_1rank.log"
fi

# 1b. the same run with timing off: what the phase timing costs (CUDA events from a pool,
# one per phase boundary, read once per epoch), side by side with row 1
if train timing_off "$OUT/timing_off" launcher.nproc_per_node=1 "train.epochs=$EPOCHS" \
     "train.max_steps_per_epoch=$SPEED_STEPS" timing.enabled=false; then
  [ "$MODE" = dry ] || row "timing on vs off (row 1 vs this)" ok \
    "$(figure "$OUT/nccl_1rank" versus "$OUT/timing_off" "timing off")"
else row "timing on vs off (row 1 vs this)" failed "see logs/timing_off.log"; fi

# 1c. the step as one CUDA graph (train.cuda_graph=true), against row 1's eager run. On
# CPU (--rehearse) it is refused before any process starts: the row shows that one line
train cuda_graph "$OUT/cuda_graph" launcher.nproc_per_node=1 "train.epochs=$EPOCHS" \
  "train.max_steps_per_epoch=$SPEED_STEPS" train.cuda_graph=true
rc=$?
if [ "$MODE" != dry ]; then
  if [ $rc -eq 0 ]; then row "train.cuda_graph=true vs eager" ok \
    "$(figure "$OUT/cuda_graph" versus "$OUT/nccl_1rank" eager)"
  elif [ "$DEVICE" = cpu ] && [ $rc -eq 2 ] && mkdir -p "$OUT/cuda_graph_refused" &&
       cp "$OUT/logs/cuda_graph.log" "$OUT/cuda_graph_refused/log" &&
       f=$(figure "$OUT/cuda_graph_refused" refused 2>>"$OUT/logs/cuda_graph.log"); then
    row "train.cuda_graph=true" "needs CUDA" "$f"
  else row "train.cuda_graph=true vs eager" failed "see logs/cuda_graph.log"; fi
fi

# 1d. the floor: the same model, batch and fused Adam in a tight loop over preloaded tensors
# (the epoch benchmark's tight loop, ddp_lab/bench/loops.py: no ddp_lab in the step), on
# the same device
if [ "$MODE" = dry ]; then echo "floor_epochs(data, $EPOCHS, device=$DEVICE)  # ddp_lab/bench/loops.py"
elif f=$("$PYTHON" - "$OUT/data" "$EPOCHS" "$DEVICE" "$SPEED_STEPS" 2>>"$OUT/logs/floor.log" <<'EOF'
import statistics, sys
from ddp_lab.bench.loops import floor_epochs  # the ddp_lab the rows above run
root, epochs, device, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
times = floor_epochs(root, epochs, steps, device=device)
print(f"{statistics.median(times):.3f} s/epoch (tight loop, no ddp_lab)")
EOF
); then row "floor, 1 $DEVICE, same step" ok "$f"
else row "floor, 1 $DEVICE, same step" failed "see logs/floor.log"; fi

# 2. several ranks on one device: NCCL decides (ddp_lab gives each local rank its own GPU)
SHARED="$OUT/shared_device.py"
[ "$MODE" = dry ] || cat >"$SHARED" <<'EOF'
"""torchrun --standalone --nproc_per_node=N shared_device.py BACKEND DEVICE: all on device 0."""
import sys
import torch
import torch.distributed as dist

backend, device = sys.argv[1], sys.argv[2]
dist.init_process_group(backend)
t = torch.ones(1024, device="cuda:0" if device == "cuda" else "cpu")
dist.all_reduce(t)  # NCCL checks the devices of the communicator here
assert t[0].item() == dist.get_world_size(), t[0].item()
dist.destroy_process_group()
EOF
# NCCL names the refusal ("Duplicate GPU detected") only at NCCL_DEBUG=WARN
run nccl_shared_device env NCCL_DEBUG=WARN OMP_NUM_THREADS=1 "$PYTHON" -m torch.distributed.run \
  --standalone "--nproc_per_node=$RANKS" "$SHARED" "$BACKEND" "$DEVICE"
rc=$?
if [ "$MODE" != dry ]; then
  if [ $rc -eq 0 ]; then row "$BACKEND, $RANKS ranks on one device" ok "all_reduce correct"
  elif grep -q "Duplicate GPU" "$OUT/logs/nccl_shared_device.log"; then
    row "$BACKEND, $RANKS ranks on one device" refused "NCCL: Duplicate GPU detected"
  else row "$BACKEND, $RANKS ranks on one device" failed "see logs/nccl_shared_device.log"; fi
fi

# 3. every synchroniser on the GPU (one rank per visible GPU)
for s in ddp naive allreduce reduce_broadcast ring tree butterfly zero1; do
  if train "sync_$s" "$OUT/sync_$s" "sync=$s" train.epochs=1 "train.max_steps_per_epoch=$STEPS"; then
    [ "$MODE" = dry ] || row "sync=$s" ok "$(figure "$OUT/sync_$s" epoch)"
  else row "sync=$s" failed "see logs/sync_$s.log"; fi
done

# 3b. torch's library twins (docs/twins.md), each as a row: ZeroRedundancyOptimizer over DDP,
# FSDP2 both ways, and DDP with each comm hook (ddp_lab's collectives and torch's). One rank
# per visible GPU: on one GPU they run the bare model, as sync=ddp's world of one does
TWINS=("sync=torch_zero" "sync=fsdp2" "sync=fsdp2 sync.reshard_after_forward=false"
       "sync=ddp sync.hook=ring" "sync=ddp sync.hook=ring_prepost" "sync=ddp sync.hook=reduce_broadcast"
       "sync=ddp sync.hook=fp16" "sync=ddp sync.hook=powersgd")
for t in "${TWINS[@]}"; do
  name="twin_$(echo "$t" | tr ' =.' '___')"
  # shellcheck disable=SC2086  # the words of $t are overrides
  if train "$name" "$OUT/$name" $t train.epochs=1 "train.max_steps_per_epoch=$STEPS"; then
    [ "$MODE" = dry ] || row "$t" ok "$(figure "$OUT/$name" epoch)"
  else row "$t" failed "see logs/$name.log"; fi
done

# 4. the collective benchmark
if run bench "$PYTHON" -m ddp_lab.bench "${DIST[@]}" "run.dir=$OUT/bench" log.progress=lines \
     "bench.impl=[torch,ring,butterfly,tree,naive]" "bench.max_elements=$BENCH_MAX" bench.points=4; then
  [ "$MODE" = dry ] || { f=$(figure "$OUT/bench" bench)
    case $f in n/a:*) row "bench all_reduce" n/a "${f#n/a: }" ;; *) row "bench all_reduce" ok "$f" ;; esac; }
else row "bench all_reduce" failed "see logs/bench.log"; fi

# 5. PyTorch's flight recorder, its dumps into the run folder
FR=(env TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
    "TORCH_FR_DUMP_TEMP_FILE=$OUT/flight_recorder/nccl_trace_rank_")
if run flight_recorder "${FR[@]}" "$PYTHON" -m ddp_lab "${DIST[@]}" "$DATA" "run.dir=$OUT/flight_recorder" \
     log.progress=lines train.epochs=1 "train.max_steps_per_epoch=$STEPS"; then
  [ "$MODE" = dry ] || row "flight recorder env" ok "$(figure "$OUT/flight_recorder" dumps)"
else row "flight recorder env" failed "see logs/flight_recorder.log"; fi

# 6. timing.profile: torch.profiler's traces (CUDA kernels, ddp_lab's phases as ranges),
# read by HTA where it is installed, the witness table's rows (ddp_lab/report/truth_table.py:
# comm per step against the NCCL kernels, exposed comm against HTA's overlap, DDP's own
# timing; with one GPU, one rank: no collective, so no comm rows), and what it costs,
# side by side with row 1
NGPU=$("$PYTHON" -c "import torch; print(max(1, torch.cuda.device_count()))" 2>/dev/null || echo 1)
[ "$DEVICE" = cpu ] && NGPU=2
if train profile "$OUT/profile" sync=ddp "launcher.nproc_per_node=$NGPU" "train.epochs=$EPOCHS" \
     "train.max_steps_per_epoch=$SPEED_STEPS" timing.profile=true; then
  [ "$MODE" = dry ] || { if f=$(figure "$OUT/profile" witness 2>>"$OUT/logs/profile.log"); then
      row "timing.profile, $NGPU rank(s)" ok "$f"; else row "timing.profile, $NGPU rank(s)" failed "see logs/profile.log"; fi
    [ "$NGPU" = 1 ] && row "timing.profile on vs off (this vs row 1)" ok \
      "$(figure "$OUT/profile" versus "$OUT/nccl_1rank" "profile off")"; }
else row "timing.profile, $NGPU rank(s)" failed "see logs/profile.log"; fi

[ "$MODE" = dry ] && exit 0
echo
echo "ddp_lab GPU check ($BACKEND on $DEVICE), logs and run folders in $OUT"
"$PYTHON" -c "import torch; print('torch', torch.__version__, '| cuda', torch.version.cuda, '|',
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU', '| nccl',
  '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-')"
printf '%-34s %-10s %s\n' check result figure
for r in "${ROWS[@]}"; do IFS='|' read -r c res f <<<"$r"; printf '%-34s %-10s %s\n' "$c" "$res" "$f"; done
exit $FAILED
