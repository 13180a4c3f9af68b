#!/usr/bin/env bash
# bench/ps_train.sh - training throughput of strategy "ps" (2 workers + 2
# shards, one thread each) against the local run at the same total batch
# with 2 threads, on the MLP and GPT examples; the PS step split into
# compute, push, pull and wait (medians over the steps after the first 10).
#
# usage: bench/ps_train.sh [STEPS] [REPEATS] [--set K=V ...]
#        (default 200 steps, 3 repeats; the --set options go to every run,
#        e.g. --set parallel.ps_security='"none"')
# Prints one line per model and repeat, then the median ratio per model.
set -euo pipefail
steps=${1:-200}
repeats=${2:-3}
extra=("${@:3}")
cd "$(dirname "$0")/.."
bin=build/bin
tmp=$(mktemp -d /tmp/bench-ps-train-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
common=(--set "steps=$steps" --set train.epochs=0 --set train.eval_every=0 --set train.eval_batches=1
        --set train.checkpoint_every=0 --set train.log_every=1 --set parallel.ps_replicas=1 ${extra[@]+"${extra[@]}"})

# median samples/s of a run folder's steps after the 10th, and the split
rate() {
    /usr/bin/python3 - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
rows = [r for r in rows if r["kind"] == "step" and r["step"] > 10]
med = lambda k: statistics.median(r.get(k, 0) for r in rows)
print("%.1f %.2f %.2f %.2f %.2f" % (med("samples_per_s"), med("step_ms"), med("push_ms"), med("pull_ms"),
                                     med("wait_ms")))
EOF
}

for model in mlp gpt; do
    if [ "$model" = mlp ]; then job=examples/mlp_fashion_ps.json; b=64; else job=examples/gpt_fortunes_ps.json; b=16; fi
    ratios=()
    for r in $(seq 1 "$repeats"); do
        TESSERA_NUM_THREADS=1 "$bin/tessera-run" "$job" --run-dir "$tmp/ps-$model-$r" "${common[@]}" \
            > "$tmp/ps.log" 2>&1 || { tail -20 "$tmp/ps.log"; exit 1; }
        TESSERA_NUM_THREADS=2 "$bin/tessera-run" "$job" --run-dir "$tmp/local-$model-$r" "${common[@]}" \
            --set parallel.strategy=local --set train.batch_size=$((2 * b)) > "$tmp/local.log" 2>&1 ||
            { tail -20 "$tmp/local.log"; exit 1; }
        read -r ps_rate ps_ms push pull wait <<< "$(rate "$tmp/ps-$model-$r")"
        read -r local_rate local_ms _ <<< "$(rate "$tmp/local-$model-$r")"
        # a sync job's leader logs the job's samples/s
        ratio=$(/usr/bin/python3 -c "print('%.2f' % ($ps_rate / $local_rate))")
        ratios+=("$ratio")
        compute=$(/usr/bin/python3 -c "print('%.1f' % ($ps_ms - $push - $pull - $wait))")
        echo "$model run $r: ps $ps_rate samples/s" \
             "(step $ps_ms ms: compute $compute, push $push, pull $pull, wait $wait)," \
             "local $local_rate samples/s (step $local_ms ms): ps/local $ratio"
    done
    echo "$model: median ps/local $(printf '%s\n' "${ratios[@]}" | sort -n | sed -n "$(( (repeats + 1) / 2 ))p")"
done
