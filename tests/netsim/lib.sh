# lib.sh - shared by the netsim tests (sourced): skip without the rights,
# a cluster name of this test's own, cleanup on any exit, small assertions.
#
# A test sources this, calls netsim_init TAG, and uses ns (tessera-netsim
# on its cluster). Whatever happens, the EXIT trap kills the background
# processes the test started and takes its clusters down.
set -euo pipefail

BIN=${TESSERA_BIN_DIR:?TESSERA_BIN_DIR is not set}
SRC=${TESSERA_SOURCE_DIR:?TESSERA_SOURCE_DIR is not set}
NETSIM=$BIN/tessera-netsim
CLUSTERS=()
TMP=

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

skip() {
    echo "SKIP: $*"
    exit 77
}

# Skips (exit 77) unless mpirun is installed and tessera-run was built with MPI.
need_mpi() {
    command -v mpirun > /dev/null || skip "mpirun not found (Debian's openmpi-bin)"
    local env_text
    env_text=$("$BIN/tessera-run" --env 2>&1 || true)
    grep -q "MPI on" <<< "$env_text" || skip "tessera-run built without MPI"
}

# Skips (exit 77) unless this process may make network namespaces.
netsim_require() {
    [ "$(id -u)" -eq 0 ] || skip "needs root with CAP_NET_ADMIN (tessera-netsim makes network namespaces)"
    local eff
    eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
    (( (16#$eff >> 12) & 1 )) || skip "needs CAP_NET_ADMIN (tessera-netsim makes network namespaces)"
    command -v ip > /dev/null && command -v tc > /dev/null ||
        skip "needs iproute2 (ip, tc)"
    unshare --net --uts true 2> /dev/null ||
        skip "cannot make network namespaces here (unshare --net failed)"
}

cleanup() {
    local rc=$?
    trap - EXIT
    local pids
    pids=$(jobs -p)
    {
        [ -z "$pids" ] || kill -9 $pids || true
        wait || true
    } 2> /dev/null
    for c in "${CLUSTERS[@]}"; do "$NETSIM" --name "$c" down || true; done
    if [ $rc -eq 0 ] || [ $rc -eq 77 ]; then
        [ -z "$TMP" ] || rm -rf "$TMP"
    elif [ -n "$TMP" ]; then
        echo "output kept in $TMP" >&2
    fi
    exit $rc
}

# Takes down the clusters of netsim tests that no longer run ("t<pid>-..."
# of a dead pid: a test killed before its cleanup could run).
sweep_dead_tests() {
    local c
    for c in $("$NETSIM" list); do
        [[ $c =~ ^t([0-9]+)- ]] || continue
        kill -0 "${BASH_REMATCH[1]}" 2> /dev/null || "$NETSIM" --name "$c" down || true
    done
}

# Checks the rights, names this test's cluster NAME (unique per process)
# and a temporary folder TMP, and installs the cleanup.
netsim_init() {
    netsim_require
    sweep_dead_tests
    NAME="t$$-$1"
    CLUSTERS+=("$NAME")
    TMP=$(mktemp -d "/tmp/tessera-netsim-$1.XXXXXX")
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    # a command that fails outside a check still says where
    set -E
    trap 'echo "FAIL: ${BASH_SOURCE[0]##*/} line $LINENO: $BASH_COMMAND (status $?)" >&2' ERR
}

# tessera-netsim on this test's cluster.
ns() { "$NETSIM" --name "$NAME" "$@"; }

# Also takes cluster $1 down at exit.
netsim_track() { CLUSTERS+=("$1"); }

# Waits up to $4 seconds until grep $1 (-F: a fixed string, -E: an extended
# regular expression) finds $3 in file $2; fails otherwise, showing the file.
wait_grep() {
    local how=$1 file=$2 pattern=$3 deadline=$((SECONDS + $4))
    until grep -q "$how" -- "$pattern" "$file" 2> /dev/null; do
        if ((SECONDS >= deadline)); then
            echo "---- $file ----" >&2
            cat "$file" >&2 || true
            fail "no \"$pattern\" in $file within $4 s"
        fi
        sleep 0.1
    done
}

# Waits up to $3 seconds until file $1 contains the string $2.
wait_for() { wait_grep -F "$@"; }

# Waits up to $3 seconds until a line of file $1 matches the regex $2.
wait_re() { wait_grep -E "$@"; }

# Prints "RANK PID" of the worker that tessera-run's output $1 places on
# node $2 ("[run] worker rank 3 is pid 812 on n2"); fails when none is.
worker_on() {
    local line
    line=$(grep "^\[run\] worker rank [0-9]* is pid [0-9]* on $2\$" "$1") ||
        fail "no worker on $2: $(grep '^\[run\]' "$1")"
    awk '{print $4, $7}' <<< "$line"
}

# Starts bench_netsim's server on every node of this test's cluster.
serve_all() {
    local n i
    n=$(ns nodes | wc -l)
    for ((i = 0; i < n; i++)); do
        ns exec "n$i" "$BIN/bench_netsim" serve > "$TMP/serve-n$i.out" 2>&1 &
    done
    for ((i = 0; i < n; i++)); do wait_for "$TMP/serve-n$i.out" "serving on port" 10; done
}

# Milliseconds on a monotonic-enough clock (for elapsed times).
now_ms() { date +%s%3N; }
