#!/usr/bin/env bash
# tessera-run places a local cluster on the nodes of TESSERA_NETSIM's
# cluster: round robin (scheduler n0, ps n1 n2, workers n3 n0 n1 n2 for the
# stand-in job on 4 nodes) or by parallel.placement; each process really
# runs in its node's namespace, the scheduler binds its node's address, and
# the job completes. Placement errors name the field.
. "$(dirname "$0")/lib.sh"
netsim_init placement

ns up --nodes 4 --rate 1gbit
export TESSERA_NETSIM=$NAME
job=$SRC/examples/standin.json

# Checks every "[run] ROLE ... is pid P on nK" line of $1: P runs in nK.
check_nodes() {
    local out=$1 n=0 pid node line
    while read -r line; do
        [[ $line =~ is\ pid\ ([0-9]+)\ on\ n([0-9]+)$ ]] || continue
        pid=${BASH_REMATCH[1]}
        node=${BASH_REMATCH[2]}
        got=$(ip netns identify "$pid" 2>&1 || true)
        [ "$got" = "$NAME-n$node" ] || fail "$line: pid $pid is in namespace '$got'"
        n=$((n + 1))
    done < <(grep '^\[run\] .* is pid ' "$out")
    [ $n -eq 7 ] || fail "$n placed processes seen in $out, expected 7"
}

# round robin
"$BIN/tessera-run" "$job" --set steps=40 --run-dir "$TMP/rr" > "$TMP/rr.out" 2>&1 &
run=$!
# the job starts with 3 workers (min_workers) when the fourth is still
# loading its data on a loaded machine; it joins at a later step
wait_for "$TMP/rr.out" " world 4 loss " 60
grep -q "^\[run\] on virtual cluster $NAME (4 nodes): scheduler n0, ps n1 n2, workers n3 n0 n1 n2$" \
    "$TMP/rr.out" || fail "round-robin placement: $(grep 'on virtual cluster' "$TMP/rr.out")"
grep -q "^\[run\] scheduler at tcp://10.77.0.1:" "$TMP/rr.out" || fail "scheduler not at n0's address"
check_nodes "$TMP/rr.out"
wait $run || { cat "$TMP/rr.out" >&2; fail "round-robin job failed"; }
[ "$(grep -c "] step 40 world " "$TMP/rr.out")" -eq 4 ] || fail "not 4 workers at step 40"

# a placement list, cycled: [3, 2] puts the scheduler on n3, ps on n2 n3,
# workers on n2 n3 n2 n3
"$BIN/tessera-run" "$job" --set steps=40 --set 'parallel.placement=[3, 2]' \
    --run-dir "$TMP/list" > "$TMP/list.out" 2>&1 &
run=$!
wait_for "$TMP/list.out" " world 4 loss " 60
grep -q "scheduler n3, ps n2 n3, workers n2 n3 n2 n3$" "$TMP/list.out" ||
    fail "placement [3, 2]: $(grep 'on virtual cluster' "$TMP/list.out")"
grep -q "^\[run\] scheduler at tcp://10.77.0.4:" "$TMP/list.out" || fail "scheduler not at n3's address"
check_nodes "$TMP/list.out"
wait $run || { cat "$TMP/list.out" >&2; fail "placement-list job failed"; }

# errors
! "$BIN/tessera-run" "$job" --set 'parallel.placement=[0, 4]' --run-dir "$TMP/bad" \
    > "$TMP/bad.out" 2>&1 || fail "node 4 of 4 nodes was accepted"
grep -q "parallel.placement\[1\]: node 4, but virtual cluster $NAME has nodes 0..3" "$TMP/bad.out" ||
    fail "bad node: $(cat "$TMP/bad.out")"
! TESSERA_NETSIM= "$BIN/tessera-run" "$job" --set 'parallel.placement=[0]' \
    --run-dir "$TMP/none" > "$TMP/none.out" 2>&1 || fail "placement without a cluster was accepted"
grep -q "parallel.placement: needs a virtual cluster" "$TMP/none.out" ||
    fail "placement without a cluster: $(cat "$TMP/none.out")"
! TESSERA_NETSIM=nosuch-$$ "$BIN/tessera-run" "$job" --run-dir "$TMP/gone" \
    > "$TMP/gone.out" 2>&1 || fail "a cluster that does not exist was accepted"
grep -q "virtual cluster nosuch-$$ (TESSERA_NETSIM): cannot read" "$TMP/gone.out" ||
    fail "missing cluster: $(cat "$TMP/gone.out")"
echo "PASS"
