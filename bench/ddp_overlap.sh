#!/usr/bin/env bash
# bench/ddp_overlap.sh - how much of DDP's all-reduce the backward pass hides.
#
# The small GPT (examples/gpt_fortunes.json) with 2 workers of one thread
# each, on the virtual cluster (root; launch/tessera-netsim) with links of
# RATE, three ways (medians of step_ms and wait_ms over the steps after the
# 10th):
#   compute   two local runs at the per-worker batch, side by side (the same
#             two cores busy, no communication)
#   overlap   DDP with buckets of BUCKET_MB, each all-reduced as soon as
#             backward has finished it
#   serial    DDP with one bucket for the whole model: its all-reduce starts
#             when backward has ended (nothing overlapped)
# exposed = step(overlap) - step(compute); the all-reduce not overlapped =
# step(serial) - step(compute); the target is exposed <= 25% of it.
#
# usage: sudo bench/ddp_overlap.sh [RATE] [STEPS] [BATCH] [BUCKET_MB] [--set KEY=VALUE ...]
#        (default 1gbit, 120 steps, batch 16 per worker, 0.25 MiB buckets;
#        the --set options go to the DDP runs, e.g.
#        --set parallel.ring_security=none)
set -euo pipefail
rate=${1:-1gbit}
steps=${2:-120}
batch=${3:-16}
bucket=${4:-0.25}
shift $(( $# < 4 ? $# : 4 ))
cd "$(dirname "$0")/.."
bin=build/bin
job=examples/gpt_fortunes.json
tmp=$(mktemp -d /tmp/bench-ddp-overlap-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
common=(--set "steps=$steps" --set train.eval_every=0 --set train.checkpoint_every=0 --set train.log_every=1
        --set "train.batch_size=$batch" --set schedule.warmup_steps=10)
extra=("$@")
export TESSERA_NUM_THREADS=1

# median step_ms and wait_ms of a run folder's steps after the 10th
medians() {
    /usr/bin/python3 - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
rows = [r for r in rows if r["kind"] == "step" and r["step"] > 10]
print("%.2f %.2f" % (statistics.median(r["step_ms"] for r in rows), statistics.median(r["wait_ms"] for r in rows)))
EOF
}

run_ddp() { # name bucket_mb
    "$bin/tessera-netsim" run --nodes 3 --rate "$rate" -- "$bin/tessera-run" "$job" --run-dir "$tmp/$1" \
        "${common[@]}" --set parallel.strategy=ddp --set parallel.workers=2 --set "parallel.bucket_mb=$2" \
        "${extra[@]}" > "$tmp/$1.log" 2>&1 || { tail -20 "$tmp/$1.log"; exit 1; }
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 0 1; do
    "$bin/tessera-run" "$job" --run-dir "$tmp/compute$i" "${common[@]}" > "$tmp/compute$i.log" 2>&1 &
done
wait
read -r c0 _ <<< "$(medians "$tmp/compute0")"
read -r c1 _ <<< "$(medians "$tmp/compute1")"
run_ddp overlap "$bucket"
run_ddp serial 4096
read -r so wo <<< "$(medians "$tmp/overlap")"
read -r ss ws <<< "$(medians "$tmp/serial")"
/usr/bin/python3 - "$c0" "$c1" "$so" "$wo" "$ss" "$ws" "$rate" "$bucket" <<'EOF'
import sys
c0, c1, so, wo, ss, ws = map(float, sys.argv[1:7])
compute = (c0 + c1) / 2
exposed, serial = so - compute, ss - compute
print("links %s, 2 workers, small GPT; median ms per step:" % sys.argv[7])
print("  compute only        %8.2f  (two local runs side by side: %.2f, %.2f)" % (compute, c0, c1))
print("  DDP, %s MiB buckets %8.2f  (waiting after backward %.2f)" % (sys.argv[8], so, wo))
print("  DDP, one bucket     %8.2f  (waiting after backward %.2f)" % (ss, ws))
print("all-reduce not overlapped: %.2f ms; exposed with buckets: %.2f ms = %.0f%% of it (target <= 25%%)"
      % (serial, exposed, 100 * exposed / serial if serial > 0 else float("nan")))
print("by the waits alone: %.2f / %.2f ms = %.0f%%" % (wo, ws, 100 * wo / ws if ws > 0 else float("nan")))
EOF
