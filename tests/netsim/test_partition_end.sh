#!/usr/bin/env bash
# A worker cut off by a partition and declared dead that outlives the end of
# the job, and then fails (its scheduler went silent), does not fail the job,
# which went on and ended without it: a ddp job of 2 workers on n1 and n2
# (min_workers 1); "cut n2" until the other worker finished alone (the cut
# worker is held by SIGSTOP once declared dead, so that it cannot give up
# before), then "heal n2" and SIGCONT. The job completes (exit 0) with its
# final checkpoint, and tessera-run says why the cut worker's failure does
# not count.
. "$(dirname "$0")/lib.sh"
netsim_init partition_end

ns up --nodes 3 --rate 1gbit
TESSERA_NETSIM=$NAME "$BIN/tessera-run" "$SRC/examples/mlp_fashion_ddp.json" --set steps=2000 \
    --set 'model.hidden=[32]' --set schedule.warmup_steps=5 --set train.log_every=1 \
    --set parallel.min_workers=1 --set parallel.heartbeat_ms=200 --set parallel.heartbeat_timeout_ms=2000 \
    --set parallel.barrier_timeout_ms=20000 --set 'parallel.placement=[0, 1, 2]' \
    --run-dir "$TMP/run" > "$TMP/run.out" 2>&1 &
run=$!
out=$TMP/run.out
wait_for "$out" "] step 20/2000 " 60
worker=$(worker_on "$out" n2)
rank=${worker% *}
pid=${worker#* }
echo "worker $rank (pid $pid) runs on n2; cutting n2"
ns cut n2
wait_for "$out" "[scheduler] dead worker $rank" 30
kill -STOP "$pid"
wait_for "$out" "] shutdown (code 0): job finished" 60
echo "the job finished without worker $rank; healing n2 and resuming it"
kill -CONT "$pid"
ns heal n2
wait $run || { cat "$out" >&2; fail "the job failed because of worker $rank, declared dead before it ended"; }
grep -qE "^\[run\] worker $rank exited with (status|signal) .* after the job's last step.*declared it dead" "$out" ||
    fail "no line on the exit of the worker declared dead: $(grep '^\[run\]' "$out")"
[ -d "$TMP/run/checkpoints/step-2000" ] || fail "no final checkpoint"
grep -q "^\[run\] job mlp-fashion-ddp completed" "$out" || fail "no completion line"
echo "PASS"
