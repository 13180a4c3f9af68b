#!/usr/bin/env bash
# Builds the wire decoder fuzzer with clang (libFuzzer + ASan + UBSan) into
# build-fuzz/ and runs it for SECONDS seconds (default 60) on a copy of the
# seed corpus proto/fuzz/corpus. Exits non-zero on any crash, leak, sanitizer
# report or round-trip mismatch; the failing input is left in
# build-fuzz/artifacts/.
set -euo pipefail
run_seconds=${1:-60}
cd "$(dirname "$0")/../.."

cmake -S proto/fuzz -B build-fuzz -DCMAKE_C_COMPILER=clang > /dev/null
cmake --build build-fuzz -j "${JOBS:-2}" > /dev/null

rm -rf build-fuzz/corpus build-fuzz/artifacts
mkdir -p build-fuzz/corpus build-fuzz/artifacts
cp proto/fuzz/corpus/* build-fuzz/corpus/

echo "fuzz_decode: ${run_seconds}s on $(ls build-fuzz/corpus | wc -l) seeds"
status=0
./build-fuzz/fuzz_decode -max_total_time="$run_seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -dict=proto/fuzz/wire.dict -print_final_stats=1 \
  -artifact_prefix=build-fuzz/artifacts/ build-fuzz/corpus > build-fuzz/fuzz.log 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  tail -n 60 build-fuzz/fuzz.log >&2
  echo "fuzz_decode: FAILED (exit $status); log build-fuzz/fuzz.log, inputs in build-fuzz/artifacts/" >&2
  exit "$status"
fi
grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' build-fuzz/fuzz.log || true
echo "fuzz_decode: no crashes"
