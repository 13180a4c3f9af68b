#!/usr/bin/env bash
# The cluster itself: nodes, names, isolation from the host's network, rate
# limits set, cut and heal, two clusters at once, bad input (one reason for
# a cluster that does not exist; rates out of range; numbers with a leading
# zero are decimal), and down removing everything (also what still runs on
# the nodes), idempotently.
. "$(dirname "$0")/lib.sh"
netsim_init basics

host_net() { ip -br link; ip -br addr; ip route; ip -6 route; }
host_net > "$TMP/host.before"

# bad input makes nothing
! ns up --nodes 0 2> "$TMP/err" || fail "up --nodes 0 succeeded"
grep -q -- "--nodes 0: expected 1..250" "$TMP/err" || fail "up --nodes 0: $(cat "$TMP/err")"
! ns up --rate fast 2> "$TMP/err" || fail "up --rate fast succeeded"
grep -q -- "--rate fast: expected" "$TMP/err" || fail "up --rate fast: $(cat "$TMP/err")"
for rate in 0bit 7bit 1001gbit 99999999999gbit; do
    ! ns up --rate $rate 2> "$TMP/err" || fail "up --rate $rate succeeded"
    grep -q -- "--rate $rate: expected a rate of 8bit..1000gbit" "$TMP/err" || fail "up --rate $rate: $(cat "$TMP/err")"
done
! "$NETSIM" --name 'a b' up 2> "$TMP/err" || fail "a cluster name with a space was taken"
! ns exec n0 true 2> "$TMP/err" || fail "exec on a cluster that does not exist succeeded"
grep -q "cluster $NAME does not exist" "$TMP/err" || fail "exec: $(cat "$TMP/err")"
[ "$(wc -l < "$TMP/err")" -eq 1 ] || fail "exec: more than the one reason: $(cat "$TMP/err")"
! ns heal n1 2> "$TMP/err" || fail "heal on a cluster that does not exist succeeded"
[ "$(cat "$TMP/err")" = "tessera-netsim: cluster $NAME does not exist (tessera-netsim --name $NAME up)" ] ||
    fail "heal: $(cat "$TMP/err")"
[ -z "$(ip netns list | grep "^$NAME-" || true)" ] || fail "bad input left namespaces"

# numbers are decimal, also with a leading zero
ns up --nodes 010 --rate 010mbit
[ "$(ns nodes | wc -l)" -eq 10 ] || fail "up --nodes 010 made $(ns nodes | wc -l) nodes"
ns down

ns up --nodes 3 --rate 100mbit
printf 'n0 10.77.0.1\nn1 10.77.0.2\nn2 10.77.0.3\n' | diff - <(ns nodes) || fail "nodes"
! ns up --nodes 2 2> "$TMP/err" || fail "a second up of the same cluster succeeded"
grep -q "cluster $NAME exists" "$TMP/err" || fail "second up: $(cat "$TMP/err")"
! ns exec n3 true 2> "$TMP/err" || fail "exec on n3 of 3 nodes succeeded"
grep -q "n3: cluster $NAME has nodes n0..n2" "$TMP/err" || fail "exec n3: $(cat "$TMP/err")"

for i in 0 1 2; do
    [ "$(ns exec n$i hostname)" = "n$i" ] || fail "n$i: host name $(ns exec n$i hostname)"
    for j in 0 1 2; do
        got=$(ns exec n$i getent hosts n$j | awk '{print $1}' || true)
        [ "$got" = "10.77.0.$((j + 1))" ] || fail "n$i resolves n$j to '$got'"
    done
    [ "$(ns exec $i printenv TESSERA_NETSIM)" = "$NAME" ] || fail "n$i: TESSERA_NETSIM"
    # one route, to its own subnet; nothing else reachable
    routes=$(ns exec n$i ip route show)
    [ "$routes" = "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.$((i + 1)) " ] ||
        [ "$routes" = "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.$((i + 1))" ] ||
        fail "n$i routes: $routes"
    ! ns exec n$i ip route get 1.1.1.1 > /dev/null 2>&1 || fail "n$i has a route to 1.1.1.1"
    ns exec n$i tc qdisc show dev eth0 | grep -q "tbf .*rate 100Mbit" || fail "n$i: no tbf on eth0"
    ip netns exec "$NAME-br" tc qdisc show dev n$i | grep -q "tbf .*rate 100Mbit" ||
        fail "bridge port n$i: no tbf"
done
[ "$(hostname)" != n0 ] || fail "the host's own name changed"

serve_all
ns exec n0 "$BIN/bench_netsim" rr n2 --count 100 > "$TMP/rr" || fail "n0 cannot reach n2"

# cut: n2 unreachable from n0; heal: reachable again
ns cut n2
! timeout 5 "$NETSIM" --name "$NAME" exec n0 "$BIN/bench_netsim" rr n2 --count 100 \
    > /dev/null 2>&1 || fail "n0 reached n2 after cut n2"
ns heal n2
ok=0
for _ in $(seq 50); do
    if ns exec n0 "$BIN/bench_netsim" rr n2 --count 100 > /dev/null 2>&1; then ok=1; break; fi
    sleep 0.2
done
[ $ok -eq 1 ] || fail "n0 cannot reach n2 after heal n2"

# a second cluster (same addresses) does not see the first one
OTHER="$NAME-b"
netsim_track "$OTHER"
"$NETSIM" --name "$OTHER" up --nodes 2
! timeout 5 "$NETSIM" --name "$OTHER" exec n0 "$BIN/bench_netsim" rr 10.77.0.3 --count 10 \
    > /dev/null 2>&1 || fail "cluster $OTHER reached node n2 of $NAME"
"$NETSIM" --name "$OTHER" down
[ -z "$(ip netns list | grep "^$OTHER-" || true)" ] || fail "down $OTHER left namespaces"
ns exec n0 "$BIN/bench_netsim" rr n2 --count 100 > /dev/null || fail "down $OTHER broke $NAME"

# down kills what runs on the nodes and removes every trace; twice is fine
server=$(ip netns pids "$NAME-n1" | head -1)
[ -n "$server" ] || fail "no process on n1"
ns down
ns down
! kill -0 "$server" 2> /dev/null || fail "pid $server on n1 survived down"
[ -z "$(ip netns list | grep "^$NAME-" || true)" ] || fail "down left namespaces"
[ ! -e "/run/tessera-netsim/$NAME" ] || fail "down left /run/tessera-netsim/$NAME"
[ -z "$(ls -d /etc/netns/"$NAME"-* 2> /dev/null || true)" ] || fail "down left /etc/netns/$NAME-*"
host_net | diff "$TMP/host.before" - || fail "the host's network changed"
echo "PASS"
