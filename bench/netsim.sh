#!/usr/bin/env bash
# netsim.sh - the virtual cluster's table in bench/RESULTS.md: for each link
# rate, on 4 nodes made by tessera-netsim (needs root):
#   - one TCP stream n0 -> n1 (median of 3 runs of 3 s),
#   - 4 streams at once, each node to its ring neighbour (the slowest of the
#     4, median of 3 runs),
#   - TCP round trip n0 <-> n1 (median of 20000 1-byte ping-pongs),
#   - Open MPI's MPI_Allreduce of 64 MiB over 2 and over 4 nodes (median of
#     10 rounds; bus bandwidth = 2(N-1)/N * bytes / time),
# each throughput also as a ratio to the set rate, and the allreduce bus
# bandwidth as a ratio to the single stream measured in the same run.
#
# Usage: bench/netsim.sh [RATE...]     (default: 1gbit 10gbit)
# Needs build/bin (bench_netsim, tessera-netsim) from a build with MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/build/bin
NAME=bench$$
RATES=("$@")
[ ${#RATES[@]} -gt 0 ] || RATES=(1gbit 10gbit)
TMP=$(mktemp -d /tmp/tessera-bench-netsim.XXXXXX)
trap '"$BIN/tessera-netsim" --name "$NAME" down; rm -rf "$TMP"' EXIT

ns() { "$BIN/tessera-netsim" --name "$NAME" "$@"; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
calc() { awk "BEGIN {printf \"%.${2:-3}f\", $1}"; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| rate | n0 -> n1 MB/s | 4-node ring, slowest MB/s | TCP RTT us (p99) | allreduce 2 nodes busbw MB/s | allreduce 4 nodes busbw MB/s |"
echo "|---|---|---|---|---|---|"
for rate in "${RATES[@]}"; do
    rate_mbs=$(calc "$(sed -E 's/gbit/*1000/; s/mbit//' <<< "$rate") / 8" 1)
    ns up --nodes 4 --rate "$rate" 2> /dev/null
    for i in 0 1 2 3; do ns exec n$i "$BIN/bench_netsim" serve > "$TMP/serve$i" 2>&1 & done
    until [ "$(cat "$TMP"/serve* | grep -c serving)" -eq 4 ]; do sleep 0.1; done

    for _ in 1 2 3; do
        ns exec n0 "$BIN/bench_netsim" stream n1 | awk '{print $3}'
    done > "$TMP/pair"
    pair=$(median < "$TMP/pair")
    for _ in 1 2 3; do
        streams=()
        for i in 0 1 2 3; do
            ns exec n$i "$BIN/bench_netsim" stream n$(((i + 1) % 4)) > "$TMP/ring$i" &
            streams+=($!)
        done
        wait "${streams[@]}"
        cat "$TMP"/ring? | awk '{print $3}' | sort -g | head -1
    done > "$TMP/ring"
    ring=$(median < "$TMP/ring")
    read -r rtt p99 < <(ns exec n0 "$BIN/bench_netsim" rr n1 | awk '{print $4, $7}')

    busbw=()
    for np in 2 4; do
        ns mpirun -np $np "$BIN/bench_netsim" allreduce > "$TMP/ar$np" 2> "$TMP/ar$np.err" ||
            { cat "$TMP/ar$np.err" >&2; exit 1; }
        cat "$TMP/ar$np" >&2
        busbw+=("$(awk '/busbw/ {for (i = 1; i < NF; i++) if ($i == "busbw") print $(i + 2)}' "$TMP/ar$np")")
    done
    echo "| $rate | $pair ($(calc "$pair / $rate_mbs")x) | $ring ($(calc "$ring / $rate_mbs")x)" \
         "| $rtt ($p99) | ${busbw[0]} ($(calc "${busbw[0]} / $pair")x of the stream)" \
         "| ${busbw[1]} ($(calc "${busbw[1]} / $pair")x of the stream) |"
    ns down
done
