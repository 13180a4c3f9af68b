#!/usr/bin/env bash
# mpirun across 4 nodes (started from n0, ranks on the others through
# "tessera-netsim rsh"): the stand-in job of examples/standin.json (1
# scheduler, 2 ps, 4 workers = 7 ranks) runs to completion over the nodes'
# links, and each rank reports the node it ran on and that node's address;
# with the scheduler bound to 127.0.0.1 the job stops at once, saying why.
. "$(dirname "$0")/lib.sh"
need_mpi
netsim_init mpirun

ns up --nodes 4 --rate 1gbit
# every rank prints "rank R on HOST ADDRESSES" (the addresses of its node's
# interfaces), then becomes tessera-run --mpi; the scheduler binds every
# interface of n0 and names itself by host name (tcp://n0:PORT)
report='echo "rank $OMPI_COMM_WORLD_RANK on $(hostname) $(hostname -I)"; exec "$0" "$@"'
# a run that outlives 120 s leaves, before it is killed, the state of each
# of its processes (what each thread waits in) beside its output
"$NETSIM" --name "$NAME" mpirun -np 7 sh -c "$report" "$BIN/tessera-run" \
    --mpi "$SRC/examples/standin.json" --set parallel.bind=0.0.0.0 > "$TMP/mpirun.out" 2>&1 &
run=$!
for _ in $(seq 1200); do kill -0 $run 2> /dev/null || break; sleep 0.1; done
if kill -0 $run 2> /dev/null; then
    for p in $(pgrep -f "tessera|mpirun|orted" || true); do
        echo "pid $p: $(tr '\0' ' ' < /proc/$p/cmdline 2> /dev/null | cut -c1-120)"
        for t in /proc/$p/task/*; do echo "  thread ${t##*/}: $(cat $t/wchan 2> /dev/null) $(cut -d' ' -f3 $t/stat 2> /dev/null)"; done
    done > "$TMP/processes.txt" 2>&1
    cat "$TMP/mpirun.out" "$TMP/processes.txt" >&2
    fail "mpirun did not exit within 120 s (the processes' states: processes.txt)"
fi
rc=0
wait $run || rc=$?
[ $rc -eq 0 ] || { cat "$TMP/mpirun.out" >&2; fail "mpirun exited with status $rc"; }

nodes_seen=""
for r in 0 1 2 3 4 5 6; do
    line=$(grep "^rank $r on " "$TMP/mpirun.out") || fail "rank $r did not report"
    read -r _ _ _ host addr rest <<< "$line"
    [[ $host =~ ^n([0-3])$ ]] || fail "rank $r ran on host '$host', not a node"
    [ "$addr" = "10.77.0.$((BASH_REMATCH[1] + 1))" ] && [ -z "$rest" ] ||
        fail "rank $r on $host reports addresses '$addr $rest'"
    echo "rank $r on $host ($addr)"
    nodes_seen+=" $host"
done
[ "$(tr ' ' '\n' <<< "$nodes_seen" | sort -u | grep -c .)" -eq 4 ] ||
    fail "the ranks ran on$nodes_seen, not on all 4 nodes"
grep -q "^listening tcp://n0:" "$TMP/mpirun.out" || fail "the scheduler is not on n0"
[ "$(grep -c "step 50 world 4 " "$TMP/mpirun.out")" -eq 4 ] ||
    { cat "$TMP/mpirun.out" >&2; fail "not 4 workers at step 50"; }
[ "$(grep -c "shutdown (code 0)" "$TMP/mpirun.out")" -eq 6 ] ||
    { cat "$TMP/mpirun.out" >&2; fail "not 2 ps + 4 workers shut down with code 0"; }

# without parallel.bind the scheduler binds 127.0.0.1 of n0, which the ranks
# of the other nodes cannot reach: every rank stops at once with status 2
rc=0
timeout 20 "$NETSIM" --name "$NAME" mpirun -np 4 "$BIN/tessera-run" --mpi "$SRC/examples/standin.json" \
    > "$TMP/loopback.out" 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat "$TMP/loopback.out" >&2; fail "mpirun with the scheduler on 127.0.0.1 exited $rc, not 2"; }
grep -q "the scheduler on host n0 binds 127.0.0.1 (parallel.bind), which the 3 ranks on other hosts cannot reach" \
    "$TMP/loopback.out" || { cat "$TMP/loopback.out" >&2; fail "no reason given for the unreachable scheduler"; }
echo "PASS"
