/* test_ps.c - parameter-server jobs of real processes on loopback.
 *
 * Equivalence: sync PS with W workers at batch b gives, step by step, the
 * losses of a local run at batch W*b with the same seed (within 1e-5
 * relative), for the MLP and the GPT, W = 2 and 4, S = 1 and 3 shards
 * (and for the MLP: bf16 gradients, and the shards without CURVE; for
 * the GPT: bf16 compute, against the local run's micro-batches), and the
 * MLP with 65 shards.
 * Async and bounded (staleness 2) reach the local run's test accuracy
 * within one point. Elastic and failures: a worker joins, a worker is
 * killed, a shard without a replica is killed (or stopped, and killed by
 * tessera-run once declared dead) and restarted from its checkpoint (the
 * job rolls back and replays), a primary with a backup is
 * killed (nothing is lost: the losses are those of an undisturbed run),
 * and killed again once its restart took the state of the one promoted;
 * each ends with a checkpoint that evaluates to the expected accuracy. A
 * job resumed from its checkpoints goes on as if it never stopped; its
 * workers' checkpoint, which holds no optimizer state, evaluates but does
 * not resume a run of another strategy. Ctrl-C stops every worker after
 * the same step, saved. Under mpirun, a shard whose only server stopped
 * ends the workers once it is declared dead, naming its last server; a
 * stopped primary with a backup is ended once the job completed. A leader
 * that exits between a step due a checkpoint and its save (TESSERA_FAULT)
 * leaves the next leader to log the step and write its checkpoint; when
 * every worker exits there, the restarted leader logs it from the shards.
 * A worker that joins while the others evaluate (TESSERA_FAULT holds one
 * of them) is not waited for in that evaluation; when one of the others
 * then dies, the evaluation is skipped, not summed short or waited for.
 * Run one test by name: cluster_test_ps <name>.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kernels/io/atomic.h"
#include "kernels/io/checkpoint.h"

enum { MAX_STEPS = 1024 };


/* A job file: the MLP on Fashion-MNIST or the small GPT, `steps` steps at
 * batch b per worker; parallel is the "parallel" section's body. */
static const char *job_file(const char *name, bool gpt, int steps, int b, const char *parallel) {
    char text[4096], file[128];
    const char *model = gpt ? "\"model\": {\"arch\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, "
                              "\"block_size\": 16},\n \"data\": {\"kind\": \"text\", \"val_fraction\": 0.05},\n"
                              " \"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.1, "
                              "\"clip_norm\": 1.0},\n \"schedule\": {\"kind\": \"cosine\", \"warmup_steps\": 5},\n"
                            : "\"model\": {\"arch\": \"mlp\", \"hidden\": [64]},\n"
                              " \"data\": {\"kind\": \"fashion_mnist\", \"val_fraction\": 0.1},\n"
                              " \"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.002, \"weight_decay\": 0.01},\n"
                              " \"schedule\": {\"kind\": \"cosine\"},\n";
    snprintf(text, sizeof text,
             "{\"name\": \"%s\", \"seed\": 7, \"steps\": %d,\n %s"
             " \"train\": {\"batch_size\": %d, \"eval_batches\": 4, \"log_every\": 1},\n"
             " \"parallel\": {\"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 1000, "
             "\"barrier_timeout_ms\": 20000%s%s}}\n",
             name, steps, model, b, parallel[0] ? ", " : "", parallel);
    snprintf(file, sizeof file, "%s.json", name);
    return th_write(file, text);
}

/* Starts tessera-run on job in run folder `run` with up to 4 --set options
 * (NULL-terminated varargs). */
static th_proc start_run(const char *tag, const char *job, const char *run, ...) {
    const char *argv[16] = {"tessera-run", job, "--run-dir", run};
    int n = 4;
    va_list ap;
    va_start(ap, run);
    for (const char *s; n < 13 && (s = va_arg(ap, const char *));) {
        argv[n++] = "--set";
        argv[n++] = s;
    }
    va_end(ap);
    argv[n] = NULL;
    return th_start(tag, argv);
}

/* Waits for a run and insists it succeeded. */
static void finish_run(th_proc *p, int timeout_ms) {
    int rc = th_wait(p, timeout_ms);
    if (rc != 0) {
        char why[128];
        snprintf(why, sizeof why, "tessera-run exited with %d", rc);
        th_dump(p, why);
    }
}

/* Each step's loss from run/metrics.jsonl (the last line of a step wins: a
 * replayed step is logged again); returns the last step. */
static int read_losses(const char *run, double *loss) {
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int last = 0;
    memset(loss, 0, MAX_STEPS * sizeof *loss);
    while (fgets(line, sizeof line, f)) {
        int step;
        double l;
        const char *s = strstr(line, "\"step\":"), *k = strstr(line, "\"loss\":");
        if (!strstr(line, "\"kind\":\"step\"") || !s || !k) continue;
        step = atoi(s + 7);
        l = atof(k + 7);
        if (step > 0 && step < MAX_STEPS) loss[step] = l, last = step > last ? step : last;
    }
    fclose(f);
    return last;
}

/* Asserts that runs a and b logged the same losses for steps 1..steps
 * within rel (relative). */
static void same_losses(const char *a, const char *b, int steps, double rel) {
    double la[MAX_STEPS], lb[MAX_STEPS];
    assert_int_equal(read_losses(a, la), steps);
    assert_int_equal(read_losses(b, lb), steps);
    for (int s = 1; s <= steps; s++) {
        double d = la[s] - lb[s];
        if (d < 0) d = -d;
        if (!(la[s] > 0) || d > rel * lb[s])
            fail_msg("step %d: loss %.6f in %s, %.6f in %s (relative difference %.2g > %.0e)", s, la[s], a, lb[s], b,
                     d / lb[s], rel);
    }
}

/* Pid of the ps or worker of rank `rank` ("[run] ps rank R is pid P"). */
static pid_t pid_of(const th_proc *run, const char *role, int rank) {
    char needle[64];
    snprintf(needle, sizeof needle, "[run] %s rank %d is pid ", role, rank);
    char *text = th_output(run);
    const char *s = strstr(text, needle);
    pid_t pid = s ? (pid_t)atoi(s + strlen(needle)) : -1;
    free(text);
    return pid;
}

/* ---- equivalence ---- */

/* For W in {2, 4} and S in {1, 3}: sync PS at batch b against local at W*b. */
static void equivalence(bool gpt, int b) {
    const char *name = gpt ? "eq-gpt" : "eq-mlp";
    const char *job = job_file(name, gpt, 30, b, "\"strategy\": \"ps\"");
    for (int W = 2; W <= 4; W += 2) {
        char local[64], batch[64], run[64];
        snprintf(local, sizeof local, "%s-local-%d", name, W);
        snprintf(batch, sizeof batch, "train.batch_size=%d", W * b);
        th_proc l = start_run(local, job, th_path(local), "parallel.strategy=\"local\"", batch, NULL);
        finish_run(&l, 120000);
        for (int S = 1; S <= 3; S += 2) {
            char workers[64], servers[64];
            snprintf(run, sizeof run, "%s-w%d-s%d", name, W, S);
            snprintf(workers, sizeof workers, "parallel.workers=%d", W);
            snprintf(servers, sizeof servers, "parallel.servers=%d", S);
            th_proc p = start_run(run, job, th_path(run), workers, servers, NULL);
            finish_run(&p, 120000);
            same_losses(th_path(run), th_path(local), 30, 1e-5);
        }
    }
    assert_int_equal(th_leftovers(), 0);
}

static void test_equivalence_mlp(void **state) {
    (void)state;
    equivalence(false, 16);
    /* bf16 gradients on the wire: the losses stay within a percent */
    const char *job = th_path("eq-mlp.json");
    th_proc p = start_run("eq-mlp-bf16", job, th_path("eq-mlp-bf16"), "parallel.wire_dtype=\"bf16\"",
                          "parallel.workers=2", "parallel.servers=1", NULL);
    finish_run(&p, 120000);
    same_losses(th_path("eq-mlp-bf16"), th_path("eq-mlp-local-2"), 30, 1e-2);
    /* without CURVE (parallel.ps_security "none"), each shard with a
     * backup: the plain links to shards and backups carry the same bits */
    th_proc n = start_run("eq-mlp-plain", job, th_path("eq-mlp-plain"), "parallel.ps_security=\"none\"",
                          "parallel.workers=2", "parallel.servers=2", "parallel.ps_replicas=2", NULL);
    finish_run(&n, 120000);
    th_expect_output(&n, "parallel.ps_security \"none\"", 0);
    th_expect_output(&n, "[run] chart: ", 0); /* the workers' metrics, drawn */
    same_losses(th_path("eq-mlp-plain"), th_path("eq-mlp-local-2"), 30, 1e-5);
}

static void test_equivalence_gpt(void **state) {
    (void)state;
    equivalence(true, 4);
    /* bf16 compute: each parameter's gradient is pushed once backward has
     * finished it and folded it into f32; 2 workers at batch 4 track one
     * process at batch 4 with 2 micro-batches (each rank's gradients
     * rounded to bf16 as each micro-batch's; the roundings drift apart,
     * 1e-5 in the first steps, 1e-2 by step 22) */
    const char *job = th_path("eq-gpt.json");
    th_proc l = start_run("eq-gpt-bf16-local", job, th_path("eq-gpt-bf16-local"), "parallel.strategy=\"local\"",
                          "train.precision=\"bf16\"", "train.accum_steps=2", NULL);
    finish_run(&l, 120000);
    th_proc p = start_run("eq-gpt-bf16", job, th_path("eq-gpt-bf16"), "train.precision=\"bf16\"",
                          "parallel.workers=2", "parallel.servers=2", NULL);
    finish_run(&p, 120000);
    same_losses(th_path("eq-gpt-bf16"), th_path("eq-gpt-bf16-local"), 30, 2e-2);
}

/* 65 shards (more than the 64 sockets a worker once polled: the answers
 * of shard 64 were never read and the job hung) give the losses of the
 * local run at batch 2b. */
static void test_many_shards(void **state) {
    (void)state;
    const char *job = job_file("many", false, 10, 16, "\"strategy\": \"ps\", \"workers\": 2, \"servers\": 65");
    th_proc l = start_run("many-local", job, th_path("many-local"), "parallel.strategy=\"local\"",
                          "train.batch_size=32", NULL);
    finish_run(&l, 120000);
    th_proc p = start_run("many", job, th_path("many"), NULL);
    finish_run(&p, 120000);
    same_losses(th_path("many"), th_path("many-local"), 10, 1e-5);
    assert_int_equal(th_leftovers(), 0);
}

/* ---- async and bounded ---- */

/* Runs long enough (2.8 epochs) that the accuracies have levelled off: at
 * 800 steps async once ended 1.2 points short of the local run, from
 * nothing but the order in which its pushes arrived. */
static void test_async_bounded(void **state) {
    (void)state;
    enum { STEPS = 2400 };
    const char *job = job_file("acc", false, STEPS, 32, "\"strategy\": \"ps\", \"workers\": 2, \"servers\": 2");
    th_proc l = start_run("acc-local", job, th_path("acc-local"), "parallel.strategy=\"local\"",
                          "train.batch_size=64", NULL);
    finish_run(&l, 120000);
    double local = th_eval_accuracy(th_path("acc-local"), STEPS);
    const char *modes[] = {"parallel.consistency=\"async\"", "parallel.consistency=\"bounded\""};
    for (int i = 0; i < 2; i++) {
        const char *run = th_path(i ? "acc-bounded" : "acc-async");
        th_proc p = start_run(i ? "acc-bounded" : "acc-async", job, run, modes[i], "parallel.staleness=2", NULL);
        finish_run(&p, 180000);
        double acc = th_eval_accuracy(run, STEPS);
        print_message("%s: test accuracy %.2f%%, local %.2f%%\n", modes[i], acc, local);
        if (acc < local - 1 || acc > local + 1)
            fail_msg("%s: test accuracy %.2f%%, the local run's %.2f%% (more than 1 point apart)", modes[i], acc,
                     local);
    }
    assert_int_equal(th_leftovers(), 0);
}

/* ---- elastic and failures ---- */

/* A sync MLP job of 240 steps whose checkpoint evaluates above 70%. */
static const char *elastic_job(const char *name, int steps, const char *parallel) {
    char p[512];
    snprintf(p, sizeof p, "\"strategy\": \"ps\", \"servers\": 2%s%s", parallel[0] ? ", " : "", parallel);
    return job_file(name, false, steps, 32, p);
}

static void expect_accuracy(const char *run, int step) {
    double acc = th_eval_accuracy(run, step);
    if (acc < 70) fail_msg("%s: checkpoint of step %d evaluates to %.2f%%, expected above 70%%", run, step, acc);
}

/* A worker started by hand joins the running job: it pulls the current
 * parameters, the quorum grows to 3 and the job finishes with it. */
static void test_join(void **state) {
    (void)state;
    const char *job = elastic_job("join", 3000, "\"workers\": 2, \"max_workers\": 3");
    const char *run = th_path("run-join");
    th_proc p = start_run("join", job, run, NULL);
    th_expect_output(&p, "step 20/3000", 30000);
    th_proc joiner = th_start_joiner("joiner", job, run, NULL);
    th_expect_output(&joiner, "joined rank=", 20000);
    th_expect_output(&p, "world size 2 -> 3 workers", 20000);
    th_expect_output(&p, ": 3 workers", 0); /* the shards' quorum */
    finish_run(&p, 120000);
    if (th_wait(&joiner, 20000) != 0) th_dump(&joiner, "the joined worker did not exit 0");
    th_expect_output(&joiner, "shutdown (code 0)", 0);
    expect_accuracy(run, 3000);
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of a worker (the leader): declared dead, the quorum shrinks, the
 * step in flight is computed again by the others, the next worker leads
 * (log, metrics, checkpoints) and the job finishes; and of a worker of a
 * bounded-staleness job. */
/* Waits until the leader (worker 2) took a step with all three workers:
 * all three were in before the first step (the scheduler's generation "at
 * step -1" holds 3 workers), or the leader said "world size 2 -> 3" when
 * the third came later. Only then is a kill a change from 3 to 2 that it
 * sees. A worker killed before the others stepped with it (under bounded
 * staleness they wait for its first push) leaves them at 2. */
static void wait_three_seen(const th_proc *p) {
    if (th_count(p, "at step -1: 2 servers, 3 workers") == 0 &&
        th_wait_for(p, "world size 2 -> 3 workers", 30000) != 0)
        th_dump(p, "the leader never stepped with the third worker");
}

static void test_kill_worker(void **state) {
    (void)state;
    /* long enough for the third worker, which may join after the start
     * (it loads its data first), to join a loaded machine's run */
    enum { STEPS = 1000 };
    char at_40[32], at_end[48];
    snprintf(at_40, sizeof at_40, "step 40/%d", STEPS);
    snprintf(at_end, sizeof at_end, "[worker 3] step %d/%d", STEPS, STEPS);
    const char *job = elastic_job("killw", STEPS, "\"workers\": 3, \"min_workers\": 2");
    const char *run = th_path("run-killw");
    th_proc p = start_run("killw", job, run, NULL);
    if (th_wait_count(&p, "] joined rank=", 5, 30000) != 0) th_dump(&p, "not 2 ps and 3 workers joined");
    th_expect_output(&p, at_40, 30000);
    wait_three_seen(&p);
    pid_t victim = pid_of(&p, "worker", 2); /* the leader */
    assert_true(victim > 0);
    kill(victim, SIGKILL);
    th_expect_output(&p, "world size 3 -> 2 workers", 20000);
    finish_run(&p, 120000);
    char *text = th_output(&p);
    const char *line = strstr(text, "world size 3 -> 2 workers");
    while (line > text && line[-1] != '\n') line--;
    bool by_3 = !strncmp(line, "[worker 3] ", 11); /* the new leader says it */
    free(text);
    if (!by_3) th_dump(&p, "the new leader (worker 3) did not report the new world size");
    th_expect_output(&p, "worker 2 exited with signal 9 (SIGKILL", 0);
    th_expect_output(&p, "), restart budget 0 used up; the job goes on with 2 workers", 0);
    th_expect_output(&p, at_end, 0);
    double loss[MAX_STEPS];
    assert_int_equal(read_losses(run, loss), STEPS); /* the metrics go on to the end */
    expect_accuracy(run, STEPS);
    /* bounded staleness: the workers are never all at one step, yet the
     * death is announced and the others stop waiting for the dead one */
    const char *bounded = th_path("run-killw-bounded");
    th_proc b = start_run("killw-bounded", job, bounded, "parallel.consistency=\"bounded\"", NULL);
    /* the workers do not wait for each other: the leader may pass step 40
     * before the third worker has joined */
    if (th_wait_count(&b, "] joined rank=", 5, 30000) != 0) th_dump(&b, "not 2 ps and 3 workers joined");
    th_expect_output(&b, at_40, 30000);
    wait_three_seen(&b);
    victim = pid_of(&b, "worker", 4);
    assert_true(victim > 0);
    kill(victim, SIGKILL);
    th_expect_output(&b, "world size 3 -> 2 workers", 20000);
    finish_run(&b, 120000);
    expect_accuracy(bounded, STEPS);
    assert_int_equal(th_leftovers(), 0);
}

/* Shard 1 (no replica) lost to signal sig after step 60: tessera-run
 * restarts it from its checkpoint, the workers take every shard back to
 * that step and replay the steps since, each logged once in
 * metrics.jsonl; the losses end up those of an undisturbed run. A stopped
 * shard (SIGSTOP) is killed once the scheduler declares it dead. */
static void lose_shard(const char *name, int sig) {
    const char *job = elastic_job(name, 240, "\"workers\": 2, \"max_restarts\": 1");
    char run[64], quiet_run[64];
    snprintf(run, sizeof run, "run-%s", name);
    snprintf(quiet_run, sizeof quiet_run, "run-%s-quiet", name);
    th_proc p = start_run(name, job, th_path(run), "train.checkpoint_every=25", NULL);
    th_expect_output(&p, "step 60/240", 30000);
    pid_t victim = pid_of(&p, "ps", 1);
    assert_true(victim > 0);
    kill(victim, sig);
    if (sig == SIGSTOP) th_expect_output(&p, "[run] the scheduler declared ps 1 dead and its process ", 10000);
    th_expect_output(&p, "[run] ps 1 exited with signal 9", 10000); /* a kill -9 says more: "(SIGKILL, ...)" */
    th_expect_output(&p, "; restarting it (restart 1 of 1)", 0);
    th_expect_output(&p, "shard 1: restored to step ", 20000);
    th_expect_output(&p, "and replays ", 20000);
    finish_run(&p, 120000);
    th_proc quiet = start_run(quiet_run, job, th_path(quiet_run), "train.checkpoint_every=25", NULL);
    finish_run(&quiet, 120000);
    same_losses(th_path(run), th_path(quiet_run), 240, 0);
    th_expect_steps_once(th_path(run), 240);
    expect_accuracy(th_path(run), 240);
    assert_int_equal(th_leftovers(), 0);
}

/* The parallel section of the fault tests. */
#define FAULT_PARALLEL "\"strategy\": \"ps\", \"workers\": 4, \"servers\": 1"

/* The leader exits once the job took step 10, before it logs or saves it
 * (train.checkpoint_every 10): the next leader logs the step and writes
 * the run's checkpoint of it. Before, checkpoints/step-10 was missing
 * (only the shards had theirs): --eval of that step was lost. */
static void test_leader_exit(void **state) {
    (void)state;
    th_fault_logs_every_step("ps-leader-exit", 20, FAULT_PARALLEL, "leader_exit@10", 10,
                             "ps: TESSERA_FAULT: rank 0 exits after step 10");
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-10", th_path("ps-leader-exit"));
    ts_checkpoint *ck = ts_checkpoint_open(ckpt);
    if (!ck) fail_msg("no whole-model checkpoint of step 10: %s", ts_last_error());
    assert_int_equal(ck->step, 10);
    ts_checkpoint_close(ck);
    assert_int_equal(th_leftovers(), 0);
}

/* The leader exits once the job took its last step, before it logs it,
 * saves or evaluates: the others' evaluation fails (shard 0 gives up its
 * reduction), they evaluate again at 3 and the new leader logs step 20
 * first and writes the final checkpoint. Before, metrics.jsonl ended at
 * step 19 and the run had no checkpoint of step 20. */
static void test_leader_exit_last(void **state) {
    (void)state;
    th_fault_logs_every_step("ps-leader-exit-last", 20, FAULT_PARALLEL, "leader_exit@20", 20,
                             "evaluation at step 20 abandoned: shard 0 asked to evaluate again");
    th_expect_end_written(th_path("ps-leader-exit-last"), 20);
    assert_int_equal(th_leftovers(), 0);
}

/* Async: the leader exits once it wrote the run's end, before it says so
 * (TESSERA_FAULT leader_exit@end); the others, done, wait for its word
 * before they report their last step, and the one that takes the lead
 * writes the end again: its step 20, its checkpoint and the evaluations,
 * which it scores alone. Before, the job could end before the leader was
 * declared dead, with the end of a leader that died within the heartbeat
 * timeout of it unwritten. */
static void test_leader_exit_end_async(void **state) {
    (void)state;
    const char *name = "ps-leader-exit-end-async";
    const char *job = th_job_file(name, "mlp", 20, 16, 1,
                                  FAULT_PARALLEL ", \"consistency\": \"async\", \"min_workers\": 2, "
                                  "\"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 5000");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path(name), NULL};
    setenv("TESSERA_FAULT", "leader_exit@end", 1);
    th_proc run = th_start(name, argv);
    unsetenv("TESSERA_FAULT");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after the fault");
    if (th_count(&run, "ps: TESSERA_FAULT: rank 0 exits after step 20") != 1 ||
        th_count(&run, "took the lead after the last step from a leader that left") != 1)
        th_dump(&run, "no worker took the lead after the leader wrote the end and left");
    th_expect_end_written(th_path(name), 20);
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of a worker as the evaluation of step 20 starts: shard 0 gives
 * up the reduction of the evaluation's sums and the survivors evaluate
 * again at 3. Before, the shard summed the survivors' parts alone and the
 * leader logged a validation of 13504 samples of 18000 as the whole. */
static void test_kill_in_eval(void **state) {
    (void)state;
    th_kill_in_eval("ps-kill-in-eval", "ps", ", \"servers\": 1");
    assert_int_equal(th_leftovers(), 0);
}

/* Runs a job of 2 workers (up to 3) of the consistency given whose rank 1
 * holds at step 20 (TESSERA_FAULT fault) until a third worker, started
 * by hand, joined; checks that the job and the joiner finish and
 * that every evaluation logged scored the whole set. Returns the run. */
static th_proc join_in_eval_run(const char *name, const char *fault, const char *consistency) {
    char text[2048], file[128], joiner[128];
    snprintf(text, sizeof text,
             "{\"name\": \"%s\", \"seed\": 5, \"steps\": 40,\n"
             " \"model\": {\"arch\": \"mlp\", \"hidden\": [128]},\n"
             " \"data\": {\"kind\": \"fashion_mnist\", \"val_fraction\": 0.3},\n"
             " \"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.001}, \"schedule\": {\"kind\": \"constant\"},\n"
             " \"train\": {\"batch_size\": 32, \"log_every\": 1, \"eval_every\": 20, \"eval_batches\": 0},\n"
             " \"parallel\": {\"strategy\": \"ps\", \"servers\": 1, \"workers\": 2, \"max_workers\": 3, "
             "\"min_workers\": 2, \"max_restarts\": 2, \"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 3000, "
             "\"consistency\": \"%s\"}}\n",
             name, consistency);
    snprintf(file, sizeof file, "%s.json", name);
    snprintf(joiner, sizeof joiner, "%s-joiner", name);
    const char *job = th_write(file, text), *dir = th_path(name);
    setenv("TESSERA_FAULT", fault, 1);
    th_proc run = start_run(name, job, dir, NULL);
    unsetenv("TESSERA_FAULT");
    if (th_wait_for(&run, "until a worker joins", 120000) != 0) th_dump(&run, "rank 1 held nothing");
    th_proc j = th_start_joiner(joiner, job, dir, NULL);
    th_expect_output(&j, "joined rank=", 30000);
    finish_run(&run, 240000);
    if (th_wait(&j, 30000) != 0) th_dump(&j, "the joined worker did not exit 0");
    if (th_count(&run, "eval val at step") != th_count(&run, "% (18000 samples)") ||
        th_count(&run, "eval test at step 40") != 1 || th_count(&run, "% (10000 samples)") != 1)
        th_dump(&run, "an evaluation logged did not score the whole set");
    return run;
}

/* A worker joins while the others evaluate step 20: it trains from step
 * 21 and does not evaluate step 20, so shard 0 sums the parts of the two
 * that trained it. Before, the shard counted the joiner in and waited for
 * its part, which never came, until the workers gave up on the shard. */
static void test_join_in_eval(void **state) {
    (void)state;
    th_proc run = join_in_eval_run("ps-join-in-eval", "eval_hold@20", "sync");
    if (th_count(&run, "eval val at step 20") != 1) th_dump(&run, "step 20's evaluation was not logged once");
    assert_int_equal(th_leftovers(), 0);
}

/* ... and rank 1 then dies: the new group counts the joiner, which does
 * not evaluate step 20, so the evaluation cannot be done again; shard 0
 * says so and the others go on without it (and not wait for a part that
 * never comes, nor log the survivors' part as the whole). */
static void test_join_exit_in_eval(void **state) {
    (void)state;
    th_proc run = join_in_eval_run("ps-join-exit-in-eval", "eval_exit@20", "sync");
    if (th_count(&run, "evaluation at step 20 skipped") < 1 || th_count(&run, "eval val at step 20") != 0)
        th_dump(&run, "the evaluation of step 20 was not skipped");
    assert_int_equal(th_leftovers(), 0);
}

/* Async: a worker joins after rank 1 took step 20 and before it takes the
 * group for its evaluation (TESSERA_FAULT end_hold@20). Rank 1's group
 * counts the joiner, which does not evaluate step 20: shard 0 skips the
 * evaluation for every worker in it. Before, it answered rank 1 alone;
 * rank 0 waited for rank 1's part until it gave up on the shard (30 s),
 * and the job went on only by restarting it. */
static void test_join_in_eval_async(void **state) {
    (void)state;
    th_proc run = join_in_eval_run("ps-join-in-eval-async", "end_hold@20", "async");
    if (th_count(&run, "evaluation at step 20 skipped") != 2 || th_count(&run, "eval val at step 20") != 0)
        th_dump(&run, "the evaluation of step 20 was not skipped by both workers");
    if (th_count(&run, "did not answer the reduction") + th_count(&run, "restarting it") > 0)
        th_dump(&run, "a worker waited for a part of a skipped evaluation");
    assert_int_equal(th_leftovers(), 0);
}

/* Runs the MLP job `name` for `steps` steps with 4 workers, `extra` added
 * to its parallel section, every one of them exiting once it took step 10
 * (TESSERA_FAULT workers_exit@10): checks that the restarted workers
 * finish the job, that the new leader logs step 10 once as the shards
 * described it, and that no line train.log_every asks for is missing.
 * Returns the job file. */
static const char *workers_exit_run(const char *name, int steps, const char *extra) {
    char parallel[512], line[64];
    snprintf(parallel, sizeof parallel,
             FAULT_PARALLEL ", \"max_restarts\": 8, \"min_workers\": 2, \"heartbeat_ms\": 100, "
             "\"heartbeat_timeout_ms\": 5000%s", extra);
    const char *job = th_job_file(name, "mlp", steps, 16, 1, parallel);
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path(name), NULL};
    setenv("TESSERA_FAULT", "workers_exit@10", 1);
    th_proc run = th_start(name, argv);
    unsetenv("TESSERA_FAULT");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after the fault");
    if (th_count(&run, "exits after step 10") != 4) th_dump(&run, "not every worker exited at step 10");
    if (th_count(&run, "has no line") != 0) th_dump(&run, "a step was left without its line");
    snprintf(line, sizeof line, "step 10/%d | loss ", steps);
    char *text = th_output(&run), *at = strstr(text, line), *eol = at ? strchr(at, '\n') : NULL;
    if (eol) *eol = '\0';
    /* (async: a worker back under a lower rank leads on, and logs the step
     * it adopted the same way; so the line of step 10 is looked at alone) */
    bool adopted = at && strstr(at, "| taken under a leader that left before logging it");
    free(text);
    if (th_count(&run, line) != 1 || !adopted)
        th_dump(&run, "the new leader did not log step 10 once, as the shards described it");
    return job;
}

/* Every worker exits once the job took step 10, before any logs it; the
 * restarted workers adopt the shards' step 10, whose loss, learning rate
 * and norm the shards' pull answers carry, and the new leader logs it:
 * every line is that of an undisturbed run. Before, metrics.jsonl went
 * from step 9 to 11. */
static void test_workers_exit(void **state) {
    (void)state;
    const char *job = workers_exit_run("ps-workers-exit", 20, "");
    /* up to step 10 every line is that of an undisturbed run (later steps
     * are computed by the workers restarted so far) */
    const char *quiet_argv[] = {"tessera-run", job, "--run-dir", th_path("ps-workers-quiet"), NULL};
    th_proc quiet = th_start("ps-workers-quiet", quiet_argv);
    finish_run(&quiet, 240000);
    double loss[MAX_STEPS], want[MAX_STEPS];
    assert_int_equal(read_losses(th_path("ps-workers-exit"), loss), 20);
    assert_int_equal(read_losses(th_path("ps-workers-quiet"), want), 20);
    for (int s = 1; s <= 20; s++)
        if (!(loss[s] > 0) || (s <= 10 && loss[s] != want[s]))
            fail_msg("step %d: loss %.6f, an undisturbed run's %.6f", s, loss[s], want[s]);
    assert_int_equal(th_leftovers(), 0);
}

/* The same in async mode: the shards' step is the one every live worker
 * finished, and their pull answers carry the loss, learning rate and norm
 * of the commit that finished it; the new leader logs it, and every later
 * step has its line, also those the restarted workers took while the old
 * leader was not yet declared dead. (The run is long enough for that to
 * happen before its end.) */
static void test_workers_exit_async(void **state) {
    (void)state;
    enum { STEPS = 200 };
    workers_exit_run("ps-workers-exit-async", STEPS, ", \"consistency\": \"async\"");
    double loss[MAX_STEPS];
    assert_int_equal(read_losses(th_path("ps-workers-exit-async"), loss), STEPS);
    for (int s = 1; s <= STEPS; s++)
        if (!(loss[s] > 0)) fail_msg("step %d has no loss in metrics.jsonl", s);
    assert_int_equal(th_leftovers(), 0);
}

static void test_kill_shard(void **state) {
    (void)state;
    lose_shard("kills", SIGKILL);
}

static void test_stop_shard(void **state) {
    (void)state;
    lose_shard("stops", SIGSTOP);
}

/* kill -9 of a primary with ps_replicas 2: its backup is promoted, the
 * workers send it what was unanswered, no step is lost and every loss is
 * that of an undisturbed run. */
static void test_kill_primary(void **state) {
    (void)state;
    const char *job = elastic_job("killp", 240, "\"workers\": 2, \"ps_replicas\": 2");
    const char *run = th_path("run-killp");
    th_proc p = start_run("killp", job, run, NULL);
    th_expect_output(&p, "step 60/240", 30000);
    pid_t victim = pid_of(&p, "ps", 0); /* shard 0's primary; rank 2 is its backup */
    assert_true(victim > 0);
    kill(victim, SIGKILL);
    th_expect_output(&p, "shard 0: promoted to primary at step ", 20000);
    finish_run(&p, 120000);
    th_expect_output(&p, "its shard goes on with its replica", 0);
    if (th_count(&p, "replays") != 0) th_dump(&p, "a step was replayed: something was lost");
    th_proc quiet = start_run("killp-quiet", job, th_path("run-quiet-p"), "parallel.ps_replicas=1", NULL);
    finish_run(&quiet, 120000);
    same_losses(run, th_path("run-quiet-p"), 240, 0);
    expect_accuracy(run, 240);
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of a primary, its restart taking the promoted backup's state,
 * then kill -9 of that backup: the restarted process, which received the
 * whole shard and every update after it, takes over. Nothing is lost
 * either time (no replay) and every loss is that of an undisturbed run. */
static void test_kill_primary_twice(void **state) {
    (void)state;
    const char *job = elastic_job("killp2", 600, "\"workers\": 2, \"ps_replicas\": 2, \"max_restarts\": 1");
    const char *run = th_path("run-killp2");
    th_proc p = start_run("killp2", job, run, NULL);
    th_expect_output(&p, "step 60/600", 30000);
    pid_t first = pid_of(&p, "ps", 0), second = pid_of(&p, "ps", 2); /* shard 0's primary and backup */
    assert_true(first > 0 && second > 0);
    kill(first, SIGKILL);
    th_expect_output(&p, "shard 0: promoted to primary at step ", 20000);
    th_expect_output(&p, "[run] ps 0 exited with signal 9 (SIGKILL", 10000);
    th_expect_output(&p, "); restarting it (restart 1 of 1)", 0);
    th_expect_output(&p, "shard 0: rank 0 took the state of step ", 30000);
    if (th_count(&p, "step 600/600")) th_dump(&p, "the job ended before the restarted rank 0 took the state");
    kill(second, SIGKILL);
    finish_run(&p, 120000);
    if (th_count(&p, "shard 0: promoted to primary at step ") != 2) th_dump(&p, "rank 0 was not promoted");
    if (th_count(&p, "replays") != 0) th_dump(&p, "a step was replayed: something was lost");
    th_proc quiet = start_run("killp2-quiet", job, th_path("run-quiet-p2"), "parallel.ps_replicas=1",
                              "parallel.max_restarts=0", NULL);
    finish_run(&quiet, 120000);
    same_losses(run, th_path("run-quiet-p2"), 600, 0);
    expect_accuracy(run, 600);
    assert_int_equal(th_leftovers(), 0);
}

/* A sync job stopped at step 40 and resumed with --resume goes on from the
 * shards' checkpoints (parameters, optimizer state, data position, step)
 * with the losses of a run that never stopped; with one shard's checkpoints
 * lost, from step 0 with those losses again. */
static void test_resume(void **state) {
    (void)state;
    const char *job = job_file("resume", false, 80, 32, "\"strategy\": \"ps\", \"workers\": 2, \"servers\": 2");
    const char *run = th_path("run-resume");
    th_proc first = start_run("resume-1", job, run, "steps=40", "schedule.kind=\"constant\"", NULL);
    finish_run(&first, 120000);
    /* the shards keep the optimizer state: another strategy does not resume
     * the workers' checkpoint as if it held it, which evaluates */
    const char *copy = th_path("run-resume-local"), *lost = th_path("run-resume-lost");
    th_copy_run(run, copy);
    th_copy_run(run, lost);
    const char *largv[] = {"tessera-run", job, "--run-dir", copy, "--resume", "--set", "parallel.strategy=\"local\"",
                           NULL};
    th_proc local = th_start("resume-local", largv);
    if (th_wait(&local, 60000) == 0) th_dump(&local, "a local run resumed the ps job's checkpoint");
    th_expect_output(&local, "step-40 holds no optimizer state", 0);
    char ckpt[4300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-40", run);
    const char *eargv[] = {"tessera-run", "--eval", ckpt, NULL};
    free(th_run_tool("resume-eval", eargv));
    const char *argv[] = {"tessera-run", job, "--run-dir", run, "--resume", "--set", "schedule.kind=\"constant\"",
                          NULL};
    th_proc second = th_start("resume-2", argv);
    finish_run(&second, 120000);
    th_expect_output(&second, "restored to step 40 from", 0);
    th_expect_output(&second, "resumed at step 40", 0);
    th_proc whole = start_run("resume-whole", job, th_path("run-whole"), "schedule.kind=\"constant\"", NULL);
    finish_run(&whole, 120000);
    same_losses(run, th_path("run-whole"), 80, 0);
    /* a shard whose checkpoints are gone starts from the seed, and the job
     * from step 0 with it, without a worker failing on its way there */
    char shard[4300];
    snprintf(shard, sizeof shard, "%s/ps/shard-1", lost);
    assert_int_equal(ts_io_remove_tree(shard), TS_OK);
    const char *bargv[] = {"tessera-run", job, "--run-dir", lost, "--resume", "--set", "schedule.kind=\"constant\"",
                           "--set", "parallel.max_restarts=0", NULL};
    th_proc back = th_start("resume-lost", bargv);
    finish_run(&back, 120000);
    th_expect_output(&back, "shard 0: rolled back from step 40 to its checkpoint of step 0", 0);
    same_losses(lost, th_path("run-whole"), 80, 0);
    /* nor does a ps job take a local run's folder for its own: no shard
     * has a checkpoint of it */
    const char *lrun = th_path("run-resume-from-local");
    th_proc l = start_run("resume-local-first", job, lrun, "steps=10", "parallel.strategy=\"local\"",
                          "schedule.kind=\"constant\"", NULL);
    finish_run(&l, 60000);
    const char *pargv[] = {"tessera-run", job, "--run-dir", lrun, "--resume", NULL};
    th_proc ps = th_start("resume-ps-from-local", pargv);
    if (th_wait(&ps, 60000) == 0) th_dump(&ps, "a ps job resumed a local run's folder");
    th_expect_output(&ps, "was written by a \"local\" job", 0);
    assert_int_equal(th_leftovers(), 0);
}

/* A sync job resumed with another parallel.servers reshards its
 * checkpoints: 20 steps at 3 shards, 20 more at 2 (fewer), 20 more at 4
 * (more); the losses are those of a run that never stopped. */
static void test_resume_reshard(void **state) {
    (void)state;
    const char *job = job_file("reshard", false, 60, 32, "\"strategy\": \"ps\", \"workers\": 2, \"servers\": 2");
    const char *run = th_path("run-reshard");
    const char *constant = "schedule.kind=\"constant\"";
    th_proc first = start_run("reshard-1", job, run, "steps=20", "parallel.servers=3", constant, NULL);
    finish_run(&first, 120000);
    const char *fewer[] = {"tessera-run", job, "--run-dir", run, "--resume", "--set", "steps=40",
                           "--set", "parallel.servers=2", "--set", constant, NULL};
    th_proc second = th_start("reshard-2", fewer);
    finish_run(&second, 120000);
    th_expect_output(&second, "rebuilt from the checkpoints of 3 shards of step 20", 0);
    const char *more[] = {"tessera-run", job, "--run-dir", run, "--resume", "--set", "parallel.servers=4",
                          "--set", constant, NULL};
    th_proc third = th_start("reshard-3", more);
    finish_run(&third, 120000);
    th_expect_output(&third, "shard 3 of 4: keys", 0);
    th_expect_output(&third, "rebuilt from the checkpoints of 2 shards of step 40", 0);
    th_proc whole = start_run("reshard-whole", job, th_path("run-reshard-whole"), constant, NULL);
    finish_run(&whole, 120000);
    same_losses(run, th_path("run-reshard-whole"), 60, 0);
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run: the sync workers vote the stop into a step's
 * commit, so every one of them stops after it, and the shards and the
 * leader save it; resumed, the job logs the losses of a run never
 * stopped. */
static void test_interrupt(void **state) {
    (void)state;
    th_interrupt_resume("ps-interrupt", 600, 16,
                        "\"strategy\": \"ps\", \"workers\": 2, \"servers\": 2, \"consistency\": \"sync\"", 30);
    assert_int_equal(th_leftovers(), 0);
}

/* mpirun of tessera-run --mpi on np ranks (the scheduler, the ps, the
 * workers) running job in the run folder th_path(run); each output line
 * begins with its MPI rank ("[1,2]<stdout>:" for rank 2). */
static th_proc start_mpirun(const char *tag, const char *job, const char *run, const char *np) {
    char run_bin[4200], set_dir[4300];
    snprintf(run_bin, sizeof run_bin, "%s/tessera-run", getenv("TESSERA_BIN_DIR"));
    snprintf(set_dir, sizeof set_dir, "train.run_dir=%s", th_path(run));
    const char *argv[] = {"mpirun", "-np", np, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                          "--tag-output", "-x", "TESSERA_NUM_THREADS=1", run_bin, "--mpi", job, "--set", set_dir, NULL};
    return th_start(tag, argv);
}

/* Under mpirun (1 scheduler, 1 ps, 2 workers, each an MPI process): the
 * same sync job, ending with a checkpoint that evaluates. */
static void test_mpirun(void **state) {
    (void)state;
    th_need_mpirun();
    const char *job = job_file("mpi-ps", false, 240, 32, "\"strategy\": \"ps\", \"servers\": 1, \"workers\": 2");
    th_proc p = start_mpirun("mpi-ps", job, "run-mpi", "4");
    th_wait_mpirun(&p, 120000);
    assert_int_equal(th_count(&p, "shutdown (code 0)"), 3); /* ps + 2 workers */
    expect_accuracy(th_path("run-mpi"), 240);
    assert_int_equal(th_leftovers(), 0);
}

/* Under mpirun nothing restarts a ps: once the scheduler declares the
 * only server of shard 0 dead (stopped by SIGSTOP), the workers end
 * without waiting out their patience (20 s here), naming the shard, since
 * which generation it has had no live server and its last one. */
static void test_mpirun_stop_shard(void **state) {
    (void)state;
    th_need_mpirun();
    const char *job = job_file("mpi-ps-stop", false, 100000, 8, "\"strategy\": \"ps\", \"servers\": 1, \"workers\": 2");
    th_proc p = start_mpirun("mpi-ps-stop", job, "run-mpi-stop", "4");
    if (th_wait_for(&p, "step 20/100000", 60000) != 0) th_dump(&p, "the job did not reach step 20");
    pid_t ps = th_child(p.pid, NULL, 1); /* mpirun's children are its ranks: MPI rank 1 is the ps */
    if (ps <= 0) th_dump(&p, "mpirun has fewer than 2 ranks");
    kill(ps, SIGSTOP);
    if (th_mpirun_status(&p, 60000) <= 0) th_dump(&p, "mpirun did not end non-zero after its only ps stopped");
    if (th_count(&p, "shard 0 has had no live server since generation ") == 0 ||
        th_count(&p, "(its last, ps rank 0 at tcp://127.0.0.1:") == 0 ||
        th_count(&p, "nothing restarts a server under mpirun") == 0)
        th_dump(&p, "no worker said that shard 0 has no live server left, and which was its last");
    th_leftovers(); /* mpirun may exit before it reaped every rank */
}

/* The MPI rank whose ps said it is shard 0's primary, or -1. */
static int mpi_primary(const th_proc *p) {
    char *text = th_output(p);
    int rank = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "]<stdout>:shard 0: generation ") && strstr(line, " is primary "))
            sscanf(line, "[%*d,%d]", &rank);
    free(text);
    return rank;
}

/* Under mpirun, shard 0 with a backup (MPI ranks 1 and 2): its primary,
 * stopped by SIGSTOP, is declared dead, the backup takes over and the job
 * completes; the stopped rank, which would hold mpirun for ever, is ended
 * by the scheduler's rank (MPI_Abort, status 0) naming it, and the final
 * checkpoint evaluates. */
static void test_mpirun_stop_primary(void **state) {
    (void)state;
    th_need_mpirun();
    const char *job = job_file("mpi-ps-stopp", false, 240, 32,
                               "\"strategy\": \"ps\", \"servers\": 1, \"workers\": 2, \"ps_replicas\": 2");
    th_proc p = start_mpirun("mpi-ps-stopp", job, "run-mpi-stopp", "5");
    if (th_wait_for(&p, "step 60/240", 60000) != 0) th_dump(&p, "the job did not reach step 60");
    int primary = mpi_primary(&p);
    if (primary != 1 && primary != 2) th_dump(&p, "neither MPI rank 1 nor 2 said it is shard 0's primary");
    pid_t victim = th_child(p.pid, NULL, primary); /* mpirun's children are its ranks */
    if (victim <= 0) th_dump(&p, "mpirun has too few ranks");
    kill(victim, SIGSTOP);
    if (th_mpirun_status(&p, 60000) != 0) th_dump(&p, "mpirun did not exit 0 after the job completed");
    char needle[200];
    snprintf(needle, sizeof needle, "the job completed, but MPI rank %d (ps), which the scheduler declared dead, "
             "did not end", primary);
    if (th_count(&p, needle) != 1) th_dump(&p, "the scheduler's rank did not name the stopped rank it ended");
    th_expect_output(&p, "shard 0: promoted to primary at step ", 0);
    expect_accuracy(th_path("run-mpi-stopp"), 240);
    th_leftovers(); /* mpirun may exit before it reaped every rank */
}

/* Ctrl-C of mpirun, which passes SIGTERM to every rank and relays their
 * output no more: the scheduler's rank stops the job at a step the workers
 * agree on, and the workers and the shard save it. Before, each worker
 * stopped by itself at its own step and its exit ended the MPI job before
 * anything was saved (and with a line logged every step, a rank blocked
 * on its unrelayed output until mpirun killed it). */
static void test_mpirun_interrupt(void **state) {
    (void)state;
    th_need_mpirun();
    const char *job = job_file("mpi-ps-int", false, 100000, 8, "\"strategy\": \"ps\", \"servers\": 1, \"workers\": 2");
    th_proc p = start_mpirun("mpi-ps-int", job, "run-mpi-int", "4");
    if (th_wait_for(&p, "step 40/100000", 60000) != 0) th_dump(&p, "the job did not reach step 40");
    kill(p.pid, SIGINT);
    th_mpirun_status(&p, 60000);
    char root[4400], dir[4400];
    int64_t step;
    snprintf(root, sizeof root, "%s/checkpoints", th_path("run-mpi-int"));
    assert_int_equal(ts_checkpoint_latest(root, dir, sizeof dir, &step), TS_OK);
    if (step < 40) th_dump(&p, "the workers saved no checkpoint of the step they stopped at");
    snprintf(dir, sizeof dir, "%s/ps/shard-0/step-%lld/state.json", th_path("run-mpi-int"), (long long)step);
    if (access(dir, F_OK) != 0) th_dump(&p, "the shard's checkpoint of the stop step is missing");
    th_leftovers(); /* mpirun may exit before it reaped every rank */
}

int main(int argc, char **argv) {
    th_init();
    setenv("TESSERA_NUM_THREADS", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equivalence_mlp), cmocka_unit_test(test_equivalence_gpt),
        cmocka_unit_test(test_many_shards),
        cmocka_unit_test(test_async_bounded),   cmocka_unit_test(test_join),
        cmocka_unit_test(test_kill_worker),     cmocka_unit_test(test_leader_exit), cmocka_unit_test(test_kill_in_eval), cmocka_unit_test(test_join_in_eval),
        cmocka_unit_test(test_join_exit_in_eval), cmocka_unit_test(test_join_in_eval_async), cmocka_unit_test(test_leader_exit_last), cmocka_unit_test(test_leader_exit_end_async),
        cmocka_unit_test(test_workers_exit),    cmocka_unit_test(test_workers_exit_async),
        cmocka_unit_test(test_kill_shard),      cmocka_unit_test(test_stop_shard),
        cmocka_unit_test(test_kill_primary),    cmocka_unit_test(test_kill_primary_twice),
        cmocka_unit_test(test_resume), cmocka_unit_test(test_resume_reshard),
        cmocka_unit_test(test_interrupt),
        cmocka_unit_test(test_mpirun),          cmocka_unit_test(test_mpirun_stop_shard),
        cmocka_unit_test(test_mpirun_stop_primary),
        cmocka_unit_test(test_mpirun_interrupt),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    th_finish(failed);
    return failed;
}
