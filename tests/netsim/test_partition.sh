#!/usr/bin/env bash
# A network partition, not a killed process: the stand-in job on 4 nodes
# (scheduler and ps on n0, one worker on each node), then "cut n3". The
# scheduler declares n3's worker dead within the heartbeat timeout and the
# job goes on with 3 workers; the cut worker's barrier fails, tessera-run
# restarts it on n3, where it cannot join until "heal n3" lets it rejoin with
# its rank; the job completes with 4 workers.
. "$(dirname "$0")/lib.sh"
netsim_init partition

TIMEOUT_MS=2000 # examples/standin.json: heartbeat 200 ms, timeout 2000 ms
ns up --nodes 4 --rate 1gbit
TESSERA_NETSIM=$NAME "$BIN/tessera-run" "$SRC/examples/standin.json" --set steps=280 \
    --set 'parallel.placement=[0, 0, 0, 0, 1, 2, 3]' --run-dir "$TMP/run" > "$TMP/run.out" 2>&1 &
run=$!
out=$TMP/run.out
wait_for "$out" "] step 20 world 4 " 60
worker=$(worker_on "$out" n3)
rank=${worker% *}
echo "worker $rank runs on n3; cutting n3"

t0=$(now_ms)
ns cut n3
wait_re "$out" "worker rank $rank .*declared dead" $((TIMEOUT_MS / 1000 + 10))
dt=$(($(now_ms) - t0))
echo "declared dead $dt ms after the cut"
# the silence is counted from its last heartbeat, at most one interval
# before the cut; 1000 ms of slack for a busy machine
((dt <= TIMEOUT_MS + 1000)) || fail "declared dead $dt ms after the cut (timeout $TIMEOUT_MS ms)"

# the job goes on without it (steps of a world of 3 may also precede the
# fourth worker's arrival: look only after the change)
wait_for "$out" "world size 4 -> 3 workers" 10
since=$(grep -n "world size 4 -> 3 workers" "$out" | head -1 | cut -d: -f1)
timeout 30 bash -c "until tail -n +$since '$out' | grep -qE '\] step [0-9]+ world 3 '; do sleep 0.1; done" ||
    fail "no step in a world of 3 after the change"
step=$(tail -n +"$since" "$out" | grep -o "] step [0-9]* world 3 " | tail -1 | awk '{print $3}')
wait_for "$out" "] step $((step + 20)) world 3 " 30

# the cut worker fails, is restarted on n3, and cannot join while cut
wait_re "$out" "^\[run\] worker $rank exited with (status|signal)" 30
wait_for "$out" "[run] worker $rank: restarted as pid" 10
sleep 2
[ "$(grep -c "^\[worker $rank\] joined rank=$rank " "$out")" -eq 1 ] ||
    fail "worker $rank joined again while n3 was cut"

ns heal n3
if ! timeout 30 bash -c "until [ \$(grep -c '^\[worker $rank\] joined rank=$rank ' '$out') -ge 2 ]; do sleep 0.1; done"; then
    cat "$out" >&2
    fail "the restarted worker $rank did not rejoin after heal"
fi
grep -qE "worker rank $rank admitted .*its previous rank" "$out" ||
    fail "worker $rank did not get its previous rank back"
wait $run || { cat "$out" >&2; fail "the job failed"; }
[ "$(grep -c "] step 280 world " "$out")" -eq 4 ] || fail "not 4 workers at step 280"
grep -q "^\[worker $rank\] step 280 world 4 " "$out" || fail "worker $rank did not finish in a world of 4"
grep -q "^\[run\] job standin completed" "$out" || fail "no completion line"
echo "PASS"
