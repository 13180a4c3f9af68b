#!/usr/bin/env bash
# bench/serve.sh - tessera-serve under load, and the forward pass it runs
# against ONNX Runtime's on the exported model.
#
# usage: bench/serve.sh [SECONDS] [THREADS]   (default 10 s per point, 2 threads)
#
# 1. Trains the MLP example for 50 steps (a checkpoint to serve) and exports
#    it to ONNX.
# 2. Serves it (TESSERA_NUM_THREADS=THREADS) without batching (--max-batch 1)
#    and with dynamic batching (--max-batch 64 --batch-timeout-ms 2); wrk
#    (2 threads, keep-alive) posts one image per request from 1, 8 and 64
#    connections for SECONDS each: requests/s and p50/p99 latency, and the
#    mean batch the server ran (from /metrics). wrk shares the machine's
#    cores with the server.
# 3. Times Tessera's forward (bench_serve_forward) and ONNX Runtime's
#    (bench/serve_ort.js) on batches of 1, 8 and 64 at 1 and THREADS threads.
set -euo pipefail
secs=${1:-10}
threads=${2:-2}
cd "$(dirname "$0")/.."
bin=${TESSERA_BIN_DIR:-build/bin}
tmp=$(mktemp -d /tmp/bench-serve-XXXXXX)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
$bin/tessera-run examples/mlp_fashion.json --set train.epochs=0 --set steps=50 --set train.eval_every=0 \
  --set train.eval_batches=1 --set schedule.warmup_steps=1 --run-dir "$tmp/run" > "$tmp/train.log"
ck="$tmp/run/checkpoints/step-50"
$bin/tessera-run --export-onnx "$ck" -o "$tmp/mlp.onnx" > /dev/null
head -c 24 /dev/urandom | base64 > "$tmp/token"
/usr/bin/python3 -c "import json, random; random.seed(1); print(json.dumps({'instances': [[round(random.random(), 4) for _ in range(784)]]}))" > "$tmp/body.json"
cat > "$tmp/post.lua" <<LUA
wrk.method = "POST"
wrk.body = io.open("$tmp/body.json"):read("*a")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $(cat "$tmp/token")"
LUA

# wrk's report -> "requests/s p50_ms p99_ms"; fails on any non-2xx answer
wrk_summary() {
  /usr/bin/python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
if "Non-2xx" in text or "Socket errors" in text:
    sys.exit("wrk saw errors:\n" + text)
unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
def pct(p):
    v, u = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)\s*$" % p, text, re.M).groups()
    return float(v) * unit[u]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
print("%.0f %.2f %.2f" % (rps, pct(50), pct(99)))
PY
}

printf "\n%-22s %8s %12s %10s %10s %10s\n" "server" "clients" "requests/s" "p50 ms" "p99 ms" "mean batch"
for mode in "1 0" "64 2"; do
  set -- $mode
  TESSERA_NUM_THREADS=$threads $bin/tessera-serve --model "mlp=$ck" --token-file "$tmp/token" --port 0 \
    --max-batch "$1" --batch-timeout-ms "$2" --max-connections 512 > "$tmp/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do grep -q "listening on" "$tmp/serve.log" && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$tmp/serve.log")
  url="http://127.0.0.1:$port/v1/models/mlp:predict"
  label=$([ "$1" = 1 ] && echo "no batching" || echo "batching (64, 2 ms)")
  for c in 1 8 64; do
    before=$(curl -s -H "Authorization: Bearer $(cat "$tmp/token")" "http://127.0.0.1:$port/metrics" |
             awk '/^tessera_batch_size_(sum|count) / {printf "%s ", $2}')
    wrk -t $([ "$c" = 1 ] && echo 1 || echo 2) -c "$c" -d "${secs}s" --latency -s "$tmp/post.lua" "$url" > "$tmp/wrk.txt"
    after=$(curl -s -H "Authorization: Bearer $(cat "$tmp/token")" "http://127.0.0.1:$port/metrics" |
            awk '/^tessera_batch_size_(sum|count) / {printf "%s ", $2}')
    read -r rps p50 p99 <<< "$(wrk_summary "$tmp/wrk.txt")"
    mean=$(echo "$before $after" | awk '{ printf "%.1f", ($3 - $1) / (($4 - $2) > 0 ? ($4 - $2) : 1) }')
    printf "%-22s %8d %12s %10s %10s %10s\n" "$label" "$c" "$rps" "$p50" "$p99" "$mean"
  done
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
done

printf "\n%-8s %6s %16s %16s %8s\n" "threads" "batch" "Tessera ms" "ORT ms" "ratio"
for t in 1 "$threads"; do
  TESSERA_NUM_THREADS=$t $bin/bench_serve_forward "$ck" 1 8 64 > "$tmp/tessera.txt"
  node bench/serve_ort.js "$tmp/mlp.onnx" "$t" 1 8 64 > "$tmp/ort.txt"
  for b in 1 8 64; do
    ts=$(awk -v b="$b" '$1 == "RESULT" && $3 == b {print $5}' "$tmp/tessera.txt")
    ort=$(awk -v b="$b" '$1 == "RESULT" && $3 == b {print $5}' "$tmp/ort.txt")
    printf "%-8s %6d %16s %16s %8.2f\n" "$t" "$b" "$ts" "$ort" "$(echo "$ts $ort" | awk '{print $1 / $2}')"
  done
done
echo "(ratio: Tessera's time over ONNX Runtime's, same model, same batch, same threads)"
