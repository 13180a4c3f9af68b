#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU check, in one go, on a machine with an NVIDIA
# GPU (sm_90: H100/H200): configures and builds with CUDA (build-gpu/),
# runs the GPU tests (every op forward and backward against the CPU
# backend, a 1-rank NCCL communicator, GPT jobs on the GPU against the
# same jobs on the CPU: local and a parameter-server job with one GPU
# worker), then the GPU benchmark (GPT-2 124M shape, bf16), and prints a
# summary. About 5 minutes on 16 cores; each part has its own time limit.
#
# Usage: tests/gpu/run.sh [build-dir]     (env JOBS: parallel build jobs)
set -u
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}
JOBS=${JOBS:-$(nproc)}
declare -a SUMMARY
note() { SUMMARY+=("$1"); echo "== $1"; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no CUDA device: skipped"
  exit 0
fi
nvidia-smi -L

start=$(date +%s)
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTESSERA_WITH_CUDA=ON >"$BUILD.configure.log" 2>&1 &&
   timeout 900 cmake --build "$BUILD" -j"$JOBS" --target tessera-run tessera-worker tessera-ps tessera-scheduler \
     gpu_test_ops gpu_test_nccl gpu_test_jobs bench_gpu_gpt >"$BUILD.build.log" 2>&1; then
  note "build: ok ($(( $(date +%s) - start )) s)"
else
  note "build: FAILED (see $BUILD.configure.log, $BUILD.build.log)"
  tail -30 "$BUILD.build.log" 2>/dev/null || tail -30 "$BUILD.configure.log"
  printf '%s\n' "${SUMMARY[@]}"
  exit 1
fi

status=0
for t in test_ops test_nccl test_jobs; do
  t0=$(date +%s)
  TESSERA_BIN_DIR="$PWD/$BUILD/bin" timeout 240 "$BUILD/bin/gpu_$t" 2>&1 | tee "$BUILD/gpu_$t.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && r=passed || { r="FAILED (exit $rc)"; status=1; }
  note "gpu_$t: $r ($(( $(date +%s) - t0 )) s; $(grep -c '^FAIL' "$BUILD/gpu_$t.log") failing checks)"
done

t0=$(date +%s)
timeout 180 "$BUILD/bin/bench_gpu_gpt" --batch 8 --steps 10 --warmup 3 2>&1 | tee "$BUILD/bench_gpu_gpt.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || status=1
note "bench_gpu_gpt: exit $rc ($(( $(date +%s) - t0 )) s): $(grep 'tokens/s' "$BUILD/bench_gpu_gpt.log" | tail -1)"

echo
echo "==== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(( $(date +%s) - start )) s)"
printf '%s\n' "${SUMMARY[@]}"
exit $status
