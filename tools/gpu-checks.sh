#!/usr/bin/env bash
# tools/gpu-checks.sh: the GPU checks of a machine lent for them, in phases that each fit one
# device-tool call (10 minutes). tools/gpu-bundle.sh packs it as .gpubundle/run-gpu-checks.sh
# beside the binaries; with the device tool, carry [".gpubundle"] and run, in three calls:
#
#   bash .gpubundle/run-gpu-checks.sh tests sanitize     # limits: 240 + 330 s
#   bash .gpubundle/run-gpu-checks.sh bench              # limits: 4 x 140 s
#   bash .gpubundle/run-gpu-checks.sh cluster profile    # limits: 360 + 2 x 100 s
#
# Each part of a phase runs under a time limit (timeout), so that a call's parts add up to
# at most 570 s of the device tool's 600; a part past its limit fails (status 124), and what
# the parts before it wrote is already in $OUT. Times seen on the H100 on 2026-11-24: the gpu
# tests 14 s together, memcheck over cuda_backend_test 4 s of tests, racecheck 108 s.
#
# Phases (run in the order given; each one's output goes to $OUT, at most 8 files a call):
#   tests      every gpu-labelled test with PARASYNC_REQUIRE_GPU=1 (a skip is a failure)
#              -> tests.log
#   sanitize   compute-sanitizer memcheck over the gpu unit tests and the GPU cluster test
#              (every process), racecheck over cuda_backend_test (RACECHECK=0: not) -> sanitize.log
#   bench[:MODEL,...]
#              tools/bench-worker for every built-in model (or those named), batches 64 ...
#              8192, GPU columns only (BENCH_CPU=1 adds the CPU ones) -> bench-worker.md
#   cluster    tools/bench-cluster: 2 PS + 4 workers, cnn, cpu beside cuda, CLUSTER_REPEATS
#              (default 3) repeats -> bench-cluster.md
#   variants   parasync-bench-compute for cnn and lenet5 at batches 64, 1024, 8192 with each
#              way of computing a convolution's filter gradient (PARASYNC_CUDA_CONV_WGRAD:
#              auto, patches, cudnn, cudnn-deterministic) -> variants.csv
#   torch-workers
#              tests/worker/python/torch_equivalence_test.py (its cases with the model on the
#              GPU), then the Python CNN example (worker/python/examples/train.py --device
#              cuda) and the C++ worker (--device cuda) as 2 workers of 2 servers, async, Adam
#              1e-3, batch 64, TORCH_EPOCHS (default 10) epochs each -> torch-workers.md
#   profile[:MODEL[:BATCH]]
#              Nsight Compute's per-kernel times, parasync's then PyTorch's, over the 80
#              kernel launches after the first 60 (start-up and warm-up), default cnn at
#              batch 1024 -> profile-MODEL-BATCH.txt
# --no-require-gpu lets the tests skip (to try the plumbing on a machine without a GPU).
# Exit status: 0 when every phase passed, 1 when one failed, 2 for a bad argument.
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/parasync-gpu-checks}
mkdir -p "$out"
require=1
phases=()
for arg in "$@"; do
  case "$arg" in
    tests|sanitize|bench|bench:*|cluster|variants|torch-workers|profile|profile:*)
      phases+=("$arg") ;;
    --no-require-gpu) require=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "run-gpu-checks: unknown phase '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#phases[@]} -gt 0 ]] || phases=(tests)

# The binaries and libraries, unpacked once per call.
here=$(mktemp -d /tmp/parasync-gpu.XXXXXX)
trap 'rm -rf "$here"' EXIT
tar -C "$here" -xJf "$bundle/payload.tar.xz"
# The bundled C++ runtime (Debian 12's) only where the system's is older: a newer one serves
# our binaries too, and the bundled one would shadow it for the machine's own programs
# (apt-get, PyTorch) under LD_LIBRARY_PATH.
newest() { grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$1" 2>/dev/null | sort -uV | tail -n 1; }
system_cxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ { print $NF; exit }')
if [[ -n $system_cxx && -f "$here/deps/libstdc++.so.6" ]]; then
  ours=$(newest "$here/deps/libstdc++.so.6")
  theirs=$(newest "$system_cxx")
  if [[ -n $theirs && $(printf '%s\n%s\n' "$ours" "$theirs" | sort -V | tail -n 1) == "$theirs" ]]; then
    rm -f "$here/deps/libstdc++.so.6" "$here/deps/libgcc_s.so.1"
  fi
fi
export LD_LIBRARY_PATH="$here/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN 9: the one of the machine's PyTorch wheel (nvidia-cudnn), when the system has none.
cudnn=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
if [[ -n "$cudnn" && -d "$cudnn" ]]; then
  echo "run-gpu-checks: cuDNN from $cudnn"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cudnn"
fi
export PARASYNC_BIN_DIR="$here/bin" PARASYNC_DATA_DIR="$bundle/data"
if [[ $require == 1 ]]; then export PARASYNC_REQUIRE_GPU=1; fi
# The PyTorch to compare with: the GPU machine's python3 (bench-worker's fallback).
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then export PYTHON=python3; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "run-gpu-checks: nvidia-smi found no GPU"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)

rc=0
fail() { echo "run-gpu-checks: FAILED: $*"; rc=1; }
# gtest's verdict lines of a log, to stdout.
verdict() { grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\] .* ran|ERROR SUMMARY|RACECHECK SUMMARY|GPU cluster|Segmentation|Aborted' "$1" | head -40; }

phase_tests() {
  local log="$out/tests.log"
  : >"$log"
  local t limit
  for t in backend_factory_test:30 cuda_backend_test:60 gpu_integration_test:150; do
    limit=${t#*:} t=${t%:*}
    echo "=== $t" | tee -a "$log"
    timeout "$limit" "$here/bin/$t" >>"$log" 2>&1 || fail "$t (exit status $?; 124: over $limit s)"
  done
  verdict "$log"
}

# sanitize_one LOG TIMEOUT TOOL ARGS...: one compute-sanitizer run; failure on any error.
sanitize_one() {
  local log=$1 limit=$2 tool=$3; shift 3
  local what="--tool $tool ${*//$here\/bin\//}"
  echo "=== compute-sanitizer $what" | tee -a "$log"
  local part
  part=$(mktemp)
  timeout "$limit" "$sanitizer" --tool "$tool" --error-exitcode 3 "$@" >"$part" 2>&1
  local status=$?
  cat "$part" >>"$log"
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$part" | head -5
  rm -f "$part"
  [[ $status == 0 ]] || fail "compute-sanitizer $what (exit status $status; 124: over $limit s)"
}

phase_sanitize() {
  local log="$out/sanitize.log"
  : >"$log"
  if [[ -z $sanitizer ]]; then fail "sanitize: compute-sanitizer not found"; return; fi
  sanitize_one "$log" 30 memcheck "$here/bin/backend_factory_test"
  # Less the test that provokes an allocation failure on purpose (an API error to the tool).
  local provoked=--gtest_filter=-CudaBackendTest.ABatchLargerThanTheGpuIsTheAllocationErrorNamed
  sanitize_one "$log" 60 memcheck --leak-check full "$here/bin/cuda_backend_test" "$provoked"
  # The workers of a real cluster (mlp, 5 epochs): every process the launcher starts.
  sanitize_one "$log" 90 memcheck --target-processes all "$here/bin/gpu_integration_test" \
    --gtest_filter='GpuClusterTest.*'
  # RACECHECK=0 leaves racecheck out (108 s on an H100; it checks shared-memory hazards).
  # Racecheck less the filter-gradient test too: it runs the other tests' kernels six ways
  # (150 s were not enough with it on 2026-11-27), and Im2colKernel has no shared memory.
  if [[ ${RACECHECK:-1} != 0 ]]; then
    sanitize_one "$log" 150 racecheck "$here/bin/cuda_backend_test" \
      "$provoked:CudaBackendTest.EveryWayOfTheFilterGradientMatchesTheCpuBackend"
  fi
}

phase_bench() {
  local file="$out/bench-worker.md" models=(mlp cnn lenet5 ctr)
  if [[ -n ${1:-} ]]; then IFS=, read -r -a models <<<"$1"; fi
  : >"$file"
  : >"$out/bench-worker.err"
  local cpu=(--no-cpu)
  if [[ ${BENCH_CPU:-0} == 1 ]]; then cpu=(--cpu-threads "1,16"); fi
  for m in "${models[@]}"; do
    echo "=== bench-worker --model $m" | tee -a "$file"
    (cd "$here" && BUILD_DIR="$here" timeout 140 tools/bench-worker --model "$m" \
        --batches 64,128,256,512,1024,2048,4096,8192 --seconds 0.3 --repeats 5 "${cpu[@]}") \
      >>"$file" 2>>"$out/bench-worker.err" || fail "bench-worker --model $m"
    echo >>"$file"
  done
  cat "$file"
}

phase_cluster() {
  local file="$out/bench-cluster.md"
  (cd "$here" && BUILD_DIR="$here" timeout 360 tools/bench-cluster --model cnn --ps 2 \
      --workers 4 --devices cpu,cuda --repeats "${CLUSTER_REPEATS:-3}" --compute-threads 3 --dataset "$bundle/data" \
      --json "$out/bench-cluster.json") >"$file" 2>"$out/bench-cluster.err" ||
    fail "bench-cluster"
  cat "$file"
}

phase_variants() {
  local file="$out/variants.csv" m v
  echo "wgrad,device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat" >"$file"
  for m in cnn lenet5; do
    for v in auto patches cudnn cudnn-deterministic; do
      PARASYNC_CUDA_CONV_WGRAD=$v timeout 60 "$here/bin/parasync-bench-compute" --device cuda \
          --model "$m" --batches 64,1024,8192 --seconds 0.2 --repeats 3 2>>"$out/variants.err" |
        awk -v w="$m/$v" -F, 'NR > 1 { print w "," $0 }' >>"$file" || fail "variants $m $v"
    done
  done
  cat "$file"
}

# One cluster of 2 servers and 2 GPU workers on the Fashion-MNIST CNN; a line of its results
# (from summary.json and the chief's eval.jsonl).
torch_cluster() {
  local name=$1 dir=$2; shift 2
  local epochs=${TORCH_EPOCHS:-10}
  timeout 240 "$here/bin/parasync-launch" --bin-dir "$here/bin" --ps 2 --workers 2 \
      --mode async --epochs "$epochs" --optimizer adam --lr 0.001 --batch-size 64 \
      --dataset "$bundle/data" --log-dir "$dir" "$@" >"$dir.log" 2>&1 ||
    { fail "torch-workers: $name (exit status $?)"; tail -n 20 "$dir.log"; return; }
  python3 - "$name" "$dir" <<'PY'
import json, os, statistics, sys
name, d = sys.argv[1:3]
rows = [json.loads(l) for l in open(os.path.join(d, "eval.jsonl")) if l.strip()]
summary = json.load(open(os.path.join(d, "summary.json")))
rates = [r["global_examples_per_sec"] for r in rows if r["epoch"] >= 1]
accuracy = " ".join(f"{r['test_accuracy']:.4f}" for r in rows if r["epoch"] >= 1)
print(f"| {name} | {accuracy} | {statistics.median(rates):,.0f} | {summary['wall_seconds']:.1f} |")
PY
}

phase_torch_workers() {
  local file="$out/torch-workers.md" repo tmp
  repo=$(cd "$bundle/.." && pwd)
  tmp=$(mktemp -d)
  {
    echo "=== torch_equivalence_test.py (its cases with the model on the GPU too)"
    timeout 150 python3 "$repo/tests/worker/python/torch_equivalence_test.py" "$here/bin" \
      "$here/python" "$repo" 2>&1 | tail -n 15 || fail "torch_equivalence"
    echo
    echo "| workers (2, async, on the GPU) | test accuracy after each epoch | median examples/s (all workers, per epoch) | wall s |"
    echo "|---|---|---|---|"
    torch_cluster "Python (train.py --device cuda)" "$tmp/python" --worker-command \
      "python3 $repo/worker/python/examples/train.py --model cnn --device cuda"
    torch_cluster "C++ (parasync-worker --device cuda)" "$tmp/cpp" --model cnn \
      --worker-arg=--device=cuda
  } >"$file" 2>&1
  cat "$file"
  rm -rf "$tmp"
}

# profile MODEL BATCH: per-kernel GPU times of a few steps, parasync's then PyTorch's.
phase_profile() {
  local model=$1 batch=$2 file="$out/profile-$1-$2.txt"
  if [[ -z $ncu ]]; then fail "profile: ncu not found"; return; fi
  local describe
  describe=$("$here/bin/parasync-bench-compute" --model "$model" --describe) ||
    { fail "profile: no description of $model"; return; }
  local common=(--batches "$batch" --seconds 0.01 --repeats 1)
  {
    echo "=== parasync-bench-compute --device cuda --model $model --batches $batch"
    timeout 100 "$ncu" --clock-control none --launch-skip 60 --launch-count 80 \
      --print-summary per-kernel --metrics gpu__time_duration.sum \
      "$here/bin/parasync-bench-compute" --device cuda --model "$model" "${common[@]}"
    echo "=== PyTorch eager (torch_model.py --device cuda), the same model and batch"
    timeout 100 "$ncu" --clock-control none --launch-skip 60 --launch-count 80 \
      --print-summary per-kernel --metrics gpu__time_duration.sum \
      "${PYTHON:-/usr/bin/python3}" "$here/tools/benchmarks/torch_model.py" --device cuda \
      --describe "$describe" "${common[@]}"
  } >"$file" 2>&1 || fail "profile $model $batch"
  grep -E '^===|gpu__time_duration.sum|^  [A-Za-z_].*\(' "$file" | head -80
}

for p in "${phases[@]}"; do
  echo "=== phase $p ($(date -u +%H:%M:%SZ))"
  case "$p" in
    tests) phase_tests ;;
    sanitize) phase_sanitize ;;
    bench) phase_bench ;;
    bench:*) phase_bench "${p#bench:}" ;;
    cluster) phase_cluster ;;
    variants) phase_variants ;;
    torch-workers) phase_torch_workers ;;
    profile*) IFS=: read -r _ model batch <<<"$p"; phase_profile "${model:-cnn}" "${batch:-1024}" ;;
  esac
done
echo "run-gpu-checks: $( [[ $rc == 0 ]] && echo "all phases passed" || echo "a phase failed" ) ($(date -u +%H:%M:%SZ))"
exit $rc
