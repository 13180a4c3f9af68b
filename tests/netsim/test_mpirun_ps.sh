#!/usr/bin/env bash
# A parameter-server job under mpirun across 3 nodes with parallel.bind
# 0.0.0.0: 1 scheduler, 2 shards and 1 worker (4 ranks, round robin over
# the nodes, so the worker's shards are on other nodes). Each shard names
# itself by its node's host name, as the scheduler does; the worker pulls
# and pushes over the nodes' links and the job completes.
. "$(dirname "$0")/lib.sh"
need_mpi
netsim_init mpirun_ps

ns up --nodes 3 --rate 1gbit
rc=0
timeout 120 "$NETSIM" --name "$NAME" mpirun -np 4 "$BIN/tessera-run" --mpi "$SRC/examples/mlp_fashion_ps.json" \
    --set parallel.bind=0.0.0.0 --set train.epochs=0 --set steps=20 --set schedule.warmup_steps=0 --set train.log_every=10 \
    --run-dir "$TMP/run" > "$TMP/mpirun.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$TMP/mpirun.out" >&2; fail "mpirun exited with status $rc"; }
for shard in 0 1; do
    grep -qE "ps rank $shard admitted \(address 'tcp://n[0-2]:[0-9]+'" "$TMP/mpirun.out" ||
        fail "shard $shard did not name itself by its node's host name"
done
grep -q "step 20/20 " "$TMP/mpirun.out" || fail "the worker did not reach step 20"
echo "PASS"
