#!/usr/bin/env bash
# bench/fsdp.sh - strategy "fsdp" against "ddp" on a GPT of about 100 M
# parameters (14 blocks of 768, block_size 64, bytes): per-rank memory,
# step time and bytes sent, in one run, for W = 1, 2, 4 workers under DDP,
# FSDP grad_op and FSDP full, on loopback (or on whatever the command runs
# under, e.g. tessera-netsim's links).
#
# Per configuration: the leader's (rank 0's) allocator peak and resident
# peak of a step (max over the measured steps), its median step time
# (steps after the first), and the payload it sent per step (median; the
# ring counts every chunk) beside the collectives' theory: DDP and grad_op
# 2 N (W-1)/W values, full 3 N (W-1)/W less the backward gathers of the
# first and last units (kept gathered from forward to backward). The memory
# bound of the issue for full: 1.25 x (16 N / W + two gathered units +
# activations), activations taken from the W = 1 DDP run (its peak less
# 16 N).
#
# usage: bench/fsdp.sh [STEPS] [LAYERS] [--set KEY=VALUE ...]
#   (default 4 steps, 14 layers; the --set options go to every job, e.g.
#   --set parallel.ring_security=none)
set -euo pipefail
steps=${1:-4}
layers=${2:-14}
shift $(( $# < 2 ? $# : 2 ))
cd "$(dirname "$0")/.."
bin=${TESSERA_BIN:-build/bin}
tmp=$(mktemp -d /tmp/bench-fsdp-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/job.json" <<EOF
{"name": "bench-fsdp", "seed": 1, "steps": $steps,
 "model": {"arch": "gpt", "n_layer": $layers, "n_head": 12, "n_embd": 768, "block_size": 64, "dropout": 0.0},
 "data": {"kind": "text", "val_fraction": 0.01},
 "optimizer": {"kind": "adamw", "lr": 0.0003, "clip_norm": 1.0},
 "schedule": {"kind": "constant"},
 "train": {"batch_size": 2, "log_every": 1, "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0},
 "parallel": {"strategy": "ddp", "workers": 1, "heartbeat_ms": 500, "heartbeat_timeout_ms": 60000,
              "barrier_timeout_ms": 600000}}
EOF
for w in 1 2 4; do
    for s in ddp grad_op full; do
        set=(--set "parallel.workers=$w")
        if [ "$s" = ddp ]; then set+=(--set parallel.strategy=ddp)
        else set+=(--set parallel.strategy=fsdp --set "parallel.fsdp_mode=$s"); fi
        run="$tmp/$s-$w"
        TESSERA_NUM_THREADS=$(( w == 1 ? 2 : 1 )) "$bin/tessera-run" "$tmp/job.json" --force --run-dir "$run" \
            "${set[@]}" "$@" > "$run.log" 2>&1 || { tail -30 "$run.log"; exit 1; }
        rm -rf "$run/checkpoints" # 1.2 GB each
    done
done
/usr/bin/python3 - "$tmp" "$layers" <<'EOF'
import json, statistics, sys
tmp, layers = sys.argv[1], int(sys.argv[2])
C, V, T = 768, 256, 64
block = 12 * C * C + 13 * C          # one block's parameters
N = layers * block + V * C + T * C + 2 * C
kept = V * C + T * C + 2 * C         # embedding + head (ln_f): not gathered again in backward
def row(s, w):
    steps = [json.loads(l) for l in open("%s/%s-%d/metrics.jsonl" % (tmp, s, w))]
    steps = [r for r in steps if r.get("kind") == "step"]
    timed = [r["step_ms"] for r in steps[1:]] or [steps[0]["step_ms"]]
    return (max(r["peak_bytes"] for r in steps) / 2**20, max(r["rss_peak_bytes"] for r in steps) / 2**20,
            statistics.median(timed), statistics.median(r["sent_bytes"] for r in steps) / 2**20)
MiB = 2**20
print("GPT %d blocks x %d: N = %d parameters (16 N = %.0f MiB); one unit (block) %.1f MiB" %
      (layers, C, N, 16 * N / MiB, 4 * block / MiB))
res = {(s, w): row(s, w) for w in (1, 2, 4) for s in ("ddp", "grad_op", "full")}
act = res[("ddp", 1)][0] - 16 * N / MiB
print("activations and workspace (W = 1 DDP peak - 16 N): %.0f MiB" % act)
print("%-8s %2s %12s %12s %12s %10s %9s %12s %12s" % ("strategy", "W", "alloc peak", "RSS peak", "full bound",
      "step ms", "vs DDP", "sent MiB", "theory MiB"))
for w in (1, 2, 4):
    for s in ("ddp", "grad_op", "full"):
        peak, rss, ms, sent = res[(s, w)]
        if s == "full":
            theory = (3 * N - kept) * (w - 1) / w * 4 / MiB
            bound = "%.0f" % (1.25 * (16 * N / w / MiB + 2 * 4 * block / MiB + act))
        else:
            theory, bound = 2 * N * (w - 1) / w * 4 / MiB, "-"
        print("%-8s %2d %12.0f %12.0f %12s %10.0f %9.2f %12.1f %12.1f" % (s, w, peak, rss, bound, ms,
              ms / res[("ddp", w)][2], sent, theory))
EOF
