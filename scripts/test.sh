#!/usr/bin/env bash
# Builds Tessera and runs the whole test suite:
#   1. the Release build and every ctest test (unit + multi-process cluster);
#   2. the kernel tests again under AddressSanitizer + UBSan;
#   3. the wire-protocol fuzzer for a bounded time under ASan.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh

JOBS=${JOBS:-$(nproc)}
export TESSERA_NUM_THREADS=${TESSERA_NUM_THREADS:-2}

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Asan > /dev/null
cmake --build build-asan -j "$JOBS" --target kernel_tests
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -L kernels -j "$JOBS"

if [ -f proto/fuzz/CMakeLists.txt ]; then
  ./proto/fuzz/run.sh "${FUZZ_SECONDS:-60}"
fi
