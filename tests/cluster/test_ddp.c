/* test_ddp.c - strategy "ddp" with real processes: W = 2 and 4 workers at
 * batch b give the per-step losses of one process at batch W*b (MLP and a
 * small GPT with clipping, within 1e-5 relative over 30 steps), under
 * tessera-run and under mpirun, and over a whole epoch (train.epochs, and
 * the validation of train.eval_batches per rank; under mpirun at the
 * world its ranks make), and resumed under mpirun; a worker killed -9 in
 * the middle of training is named, the others redo the step at the new
 * world size and finish with a checkpoint that evaluates; a worker joined
 * mid-run trains in step, one whose job file has another model or
 * strategy is refused; a stopped leader, killed and restarted, takes
 * the others' state; Ctrl-C stops both workers after the same step,
 * saved; a final checkpoint that cannot be written fails the job; a
 * stopped scheduler is given up and named. Run one scenario by name: cluster_test_ddp <name>. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define STEPS 30

/* A job file: model and data of arch ("mlp" or "gpt"), steps, per-worker
 * batch, strategy, workers; extra is spliced into "parallel". */
static const char *job_file(const char *name, const char *arch, int steps, int batch, const char *strategy,
                            int workers, const char *extra) {
    char text[4096], model[512];
    if (strcmp(arch, "gpt") == 0)
        snprintf(model, sizeof model,
                 "\"model\": {\"arch\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"block_size\": 16, "
                 "\"dropout\": 0.0}, \"data\": {\"kind\": \"text\", \"val_fraction\": 0.05}, "
                 "\"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.003, \"clip_norm\": 0.5}");
    else
        snprintf(model, sizeof model,
                 "\"model\": {\"arch\": \"mlp\", \"hidden\": [64]}, \"data\": {\"kind\": \"fashion_mnist\"}, "
                 "\"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.002}");
    snprintf(text, sizeof text,
             "{\"name\": \"%s\", \"seed\": 5, \"steps\": %d, %s,\n"
             " \"schedule\": {\"kind\": \"constant\"},\n"
             " \"train\": {\"batch_size\": %d, \"log_every\": 1, \"eval_every\": 0, \"eval_batches\": 4},\n"
             " \"parallel\": {\"strategy\": \"%s\", \"workers\": %d, \"heartbeat_ms\": 100, "
             "\"heartbeat_timeout_ms\": 1500, \"bucket_mb\": 0.05%s%s}}\n",
             name, steps, model, batch, strategy, workers, extra[0] ? ", " : "", extra);
    char file[128];
    snprintf(file, sizeof file, "%s.json", name);
    return th_write(file, text);
}

/* The losses of a local run of arch at batch. */
static void local_losses(const char *arch, int batch, double *loss) {
    char name[64];
    snprintf(name, sizeof name, "local-%s-%d", arch, batch);
    const char *job = job_file(name, arch, STEPS, batch, "local", 1, "");
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_run_losses(name, argv, dir, loss, STEPS);
}

/* DDP with w workers at per-worker batch b (and extra parallel fields)
 * matches local at w * b. */
static void equivalence(const char *arch, int w, int b, const char *extra) {
    double want[STEPS + 1], got[STEPS + 1];
    local_losses(arch, w * b, want);
    char name[64];
    snprintf(name, sizeof name, "ddp-%s-%d", arch, w);
    const char *job = job_file(name, arch, STEPS, b, "ddp", w, extra);
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_run_losses(name, argv, dir, got, STEPS);
    for (int s = 1; s <= STEPS; s++)
        if (!(fabs(got[s] - want[s]) <= 1e-5 * fabs(want[s])))
            fail_msg("%s, %d workers: step %d loss %.7f, local %.7f", arch, w, s, got[s], want[s]);
    assert_int_equal(th_leftovers(), 0);
}

static void test_mlp_2(void **state) { (void)state; equivalence("mlp", 2, 32, ""); }
/* the ring without CURVE (parallel.ring_security "none") */
static void test_mlp_4(void **state) { (void)state; equivalence("mlp", 4, 16, "\"ring_security\": \"none\""); }
static void test_gpt_2(void **state) { (void)state; equivalence("gpt", 2, 4, ""); }
static void test_gpt_4(void **state) { (void)state; equivalence("gpt", 4, 2, ""); }

/* bf16 compute: each parameter's gradient, folded into f32 as soon as
 * backward has finished it, goes into its bucket then; W = 2 workers at
 * batch b track one process at batch b with 2 micro-batches (each rank's
 * gradients rounded to bf16 as each micro-batch's): the first steps
 * within 1e-5, the roundings drifting apart to about 1e-4 by step 30. */
static void test_bf16(void **state) {
    (void)state;
    double want[STEPS + 1], got[STEPS + 1];
    th_run_job("local-gpt-bf16-accum", "gpt-bf16", STEPS, 4, 2, "\"strategy\": \"local\"", false, want);
    th_run_job("ddp-gpt-bf16", "gpt-bf16", STEPS, 4, 1,
               "\"strategy\": \"ddp\", \"workers\": 2, \"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 1500, "
               "\"bucket_mb\": 0.05",
               false, got);
    for (int s = 1; s <= STEPS; s++)
        if (!(fabs(got[s] - want[s]) <= (s <= 3 ? 1e-5 : 1e-3) * fabs(want[s])))
            fail_msg("bf16: step %d loss %.7f, local %.7f", s, got[s], want[s]);
    assert_int_equal(th_leftovers(), 0);
}

/* Starts tessera-run --mpi on job under mpirun with np processes (rank 0
 * the scheduler, the others workers), in run folder dir, with a heartbeat
 * timeout long enough for MPI (it progresses only in MPI calls: on a
 * loaded machine a rank may not call one for longer than the other tests'
 * timeout) and up to two more arguments (NULL for none). */
static th_proc start_mpirun(const char *tag, const char *job, const char *dir, const char *np, const char *extra1,
                            const char *extra2) {
    static char bin[4200], set[4300];
    snprintf(bin, sizeof bin, "%s/tessera-run", getenv("TESSERA_BIN_DIR"));
    snprintf(set, sizeof set, "train.run_dir=%s", dir);
    const char *argv[] = {"mpirun", "-np", np, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                          bin, "--mpi", job, "--set", set, "--set", "parallel.heartbeat_timeout_ms=10000",
                          extra1, extra2, NULL};
    return th_start(tag, argv);
}

/* The same under mpirun: 3 processes, the scheduler and 2 workers whose
 * all-reduces go through the MPI backend. */
static void test_mpirun_2(void **state) {
    (void)state;
    th_need_mpirun();
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("mlp", 64, want);
    const char *job = job_file("ddp-mpi", "mlp", STEPS, 32, "ddp", 2, "");
    const char *dir = th_path("ddp-mpi");
    th_proc p = start_mpirun("ddp-mpi", job, dir, "3", NULL, NULL);
    th_wait_mpirun(&p, 120000);
    if (th_losses(dir, got, STEPS) != STEPS) th_dump(&p, "the run did not log every step");
    th_expect_same(got, want, 1, STEPS, "mpirun");
    /* the run folder records the job as the ranks made it, as tessera-run's does */
    char path[4300], text[8192];
    snprintf(path, sizeof path, "%s/job.json", dir);
    FILE *f = fopen(path, "r");
    if (!f) th_dump(&p, "the run folder has no job.json");
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    if (!strstr(text, "\"strategy\": \"ddp\"") || !strstr(text, "\"workers\": 2"))
        fail_msg("%s is not the job of 2 ddp workers:\n%s", path, text);
}

/* --resume under mpirun continues from the run folder's newest checkpoint:
 * a run stopped after step 10 (steps=10) and resumed by a second mpirun
 * says "resumed at step 10" and logs local's losses for steps 11..30. */
static void test_mpirun_resume(void **state) {
    (void)state;
    th_need_mpirun();
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("mlp", 64, want);
    const char *job = job_file("ddp-mpi-resume", "mlp", STEPS, 32, "ddp", 2, "");
    const char *dir = th_path("ddp-mpi-resume");
    th_proc a = start_mpirun("ddp-mpi-resume-1", job, dir, "3", "--set", "steps=10");
    th_wait_mpirun(&a, 120000);
    th_proc b = start_mpirun("ddp-mpi-resume-2", job, dir, "3", "--resume", NULL);
    th_wait_mpirun(&b, 120000);
    if (th_count(&b, "resumed at step 10") < 1) th_dump(&b, "the job did not resume at step 10");
    if (th_losses(dir, got, STEPS) != STEPS) th_dump(&b, "the run did not log every step");
    th_expect_same(got, want, 11, STEPS, "mpirun --resume");
    assert_int_equal(th_leftovers(), 0);
}

/* Runs job for one epoch (train.epochs=1) with one validation batch
 * (train.eval_batches=1) in run folder name: reads the losses of up to max
 * steps and the final validation line (from "eval val") into val; returns
 * the steps logged. */
static int epoch_run(const char *name, const char *job, double *loss, int max, char *val, size_t cap) {
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, "--set", "train.epochs=1",
                          "--set", "train.eval_batches=1", NULL};
    th_proc p = th_start(name, argv);
    if (th_wait(&p, 240000) != 0) th_dump(&p, "the run did not exit 0");
    char *text = th_output(&p);
    const char *v = strstr(text, "eval val at step");
    snprintf(val, cap, "%.*s", v ? (int)strcspn(v, "\n") : 0, v ? v : "");
    free(text);
    return th_losses(dir, loss, max);
}

/* With train.epochs a cluster job runs the epoch's steps, not "steps":
 * 54000 samples over 2 workers at batch 2000 are 13 steps (the scheduler
 * is told so), those of one process at batch 4000; a validation batch per
 * rank scores what one at batch 4000 does. */
static void test_epochs(void **state) {
    (void)state;
    enum { EPOCH = 13 };
    double want[EPOCH + 2], got[EPOCH + 2];
    char local_val[256], ddp_val[256];
    int local = epoch_run("local-epochs", job_file("local-epochs", "mlp", 3, 4000, "local", 1, ""), want, EPOCH + 1,
                          local_val, sizeof local_val);
    int ddp = epoch_run("ddp-epochs", job_file("ddp-epochs", "mlp", 3, 2000, "ddp", 2, ""), got, EPOCH + 1, ddp_val,
                        sizeof ddp_val);
    if (local != EPOCH || ddp != EPOCH) fail_msg("one epoch: %d steps local, %d with ddp; want %d", local, ddp, EPOCH);
    th_expect_same(got, want, 1, EPOCH, "epochs");
    if (!local_val[0] || strcmp(local_val, ddp_val) != 0)
        fail_msg("validation of one batch per rank:\n  local: %s\n  ddp:   %s", local_val, ddp_val);
    assert_int_equal(th_leftovers(), 0);
}

/* The final checkpoint (step `steps`) of the run in dir evaluates above 75%. */
static void expect_final_accuracy(const char *tag, const char *dir, int steps) {
    char ckpt[4300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-%d", dir, steps);
    const char *eargv[] = {"tessera-run", "--eval", ckpt, NULL};
    th_proc ev = th_start(tag, eargv);
    if (th_wait(&ev, 60000) != 0) th_dump(&ev, "--eval of the final checkpoint failed");
    char *text = th_output(&ev);
    const char *a = strstr(text, "accuracy ");
    double acc = a ? atof(a + 9) : 0;
    free(text);
    if (acc < 75) th_dump(&ev, "the final checkpoint evaluates below 75%");
}

/* Long enough for a worker that comes after the start (it loads its data
 * first; two may start the job on a loaded machine) to join, and for a
 * stopped one to be declared dead, killed and restarted, which takes some
 * 150 steps on an idle machine: 2000 steps (about 8 s). */
enum { FAILURE_STEPS = 2000 };

/* Starts the MLP job `name` of FAILURE_STEPS steps with `workers` ddp
 * workers (extra spliced into "parallel") in the run folder of its name,
 * and returns once every worker joined, whether at the start or after it,
 * and the job took step 20. */
static th_proc start_to_step_20(const char *name, int workers, const char *extra) {
    char at_20[32];
    snprintf(at_20, sizeof at_20, "step 20/%d", FAILURE_STEPS);
    const char *job = job_file(name, "mlp", FAILURE_STEPS, 32, "ddp", workers, extra);
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path(name), NULL};
    th_proc run = th_start(name, argv);
    if (th_wait_count(&run, "joined rank=", workers, 60000) != 0) th_dump(&run, "not every worker joined");
    if (th_wait_for(&run, at_20, 60000) != 0) th_dump(&run, "no step 20");
    return run;
}

/* SIGSTOPs the leader (rank 0) of the 3 workers of run and waits until
 * tessera-run killed it, once declared dead, and its restart joined. */
static void stop_leader_of_3(th_proc *run) {
    pid_t leader = -1, pid;
    for (int i = 0; i < 3; i++)
        if (th_joined_worker(run, i, &pid) == 0) leader = pid;
    assert_true(leader > 0);
    kill(leader, SIGSTOP);
    if (th_wait_for(run, "is stopped: killing it", 20000) != 0) th_dump(run, "the stopped leader was not killed");
    if (th_wait_for(run, "world size 2 -> 3 workers", 30000) != 0) th_dump(run, "the restarted leader did not join");
}

/* kill -9 of one of 4 workers mid-training: the survivors name it, redo the
 * step with 3 and finish; the final checkpoint evaluates. */
static void test_kill_worker(void **state) {
    (void)state;
    th_proc run = start_to_step_20("ddp-kill", 4, "\"min_workers\": 2");
    pid_t victim = -1;
    int rank = th_joined_worker(&run, 2, &victim);
    assert_true(rank >= 0);
    kill(victim, SIGKILL);
    if (th_wait_for(&run, "world size 4 -> 3 workers", 10000) != 0) th_dump(&run, "no new generation of 3");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after losing a worker");
    if (th_count(&run, "dropped") < 1) th_dump(&run, "no survivor named the lost connection");
    expect_final_accuracy("ddp-kill-eval", th_path("ddp-kill"), FAILURE_STEPS);
    assert_int_equal(th_leftovers(), 0);
}

/* SIGSTOP of the leader (rank 0) of 3 workers with a restart to spend:
 * the scheduler declares it dead, tessera-run kills and restarts it, and
 * the restarted process, which gets rank 0 back, takes the state the
 * others trained on. Before, the group took the state of its rank 0, so
 * the fresh process sent every worker back to the first step (the
 * scheduler refused each step it reported again). */
static void test_stop_leader(void **state) {
    (void)state;
    th_proc run = start_to_step_20("ddp-stop-leader", 3, "\"max_restarts\": 1");
    stop_leader_of_3(&run);
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after restarting the leader");
    if (th_count(&run, "goes back") > 0) th_dump(&run, "the restarted leader sent the job back to its first step");
    expect_final_accuracy("ddp-stop-leader-eval", th_path("ddp-stop-leader"), FAILURE_STEPS);
    assert_int_equal(th_leftovers(), 0);
}

/* The lead goes to rank 1 and back twice: the stopped leader is declared
 * dead (rank 1 leads), comes back as rank 0 (it leads and rewrites
 * metrics.jsonl), and is then killed (rank 1 leads again). Before, rank 1
 * kept the file it had opened when it first led, which the restarted
 * leader had replaced, and wrote every later step's line there: the run's
 * metrics.jsonl ended at the step of the second kill. With min_workers 2
 * the survivors go on as two each time and the leader rejoins them; a
 * ring port whose lingering connection to the killed leader dropped once
 * left the three timing out on each other generation after generation
 * (collective test_ring linger_drop). */
static void test_leader_back(void **state) {
    (void)state;
    const char *name = "ddp-leader-back";
    th_proc run = start_to_step_20(name, 3, "\"max_restarts\": 2, \"min_workers\": 2");
    stop_leader_of_3(&run);
    pid_t leader;
    if (th_joined_worker(&run, 3, &leader) != 0) th_dump(&run, "the restarted leader did not get rank 0 back");
    int led = th_count(&run, "[worker 0] step ");
    if (th_wait_count(&run, "[worker 0] step ", led + 20, 60000) != 0)
        th_dump(&run, "the restarted leader logged no step");
    kill(leader, SIGKILL);
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after the leader came back and died");
    th_expect_steps_once(th_path(name), FAILURE_STEPS);
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of both workers at once, with restarts to spend: tessera-run
 * starts them again and, with no live worker to take the state from, they
 * go on from the newest checkpoint. Before, they started from fresh
 * parameters at the first step, and the job "completed" having thrown
 * away every step before the kill and rewritten its checkpoints. */
static void test_kill_all_workers(void **state) {
    (void)state;
    const char *name = "ddp-kill-all", *dir = th_path(name);
    const char *job = job_file(name, "mlp", FAILURE_STEPS, 32, "ddp", 2, "\"max_restarts\": 2");
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, "--set", "train.checkpoint_every=400", NULL};
    th_proc run = th_start(name, argv);
    if (th_wait_count(&run, "joined rank=", 2, 60000) != 0) th_dump(&run, "not every worker joined");
    char at[32];
    snprintf(at, sizeof at, "step 900/%d", FAILURE_STEPS);
    if (th_wait_for(&run, at, 60000) != 0) th_dump(&run, "no step 900");
    pid_t pid[2] = {-1, -1};
    for (int i = 0; i < 2; i++) assert_true(th_joined_worker(&run, i, &pid[i]) >= 0);
    kill(pid[0], SIGKILL);
    kill(pid[1], SIGKILL);
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after losing both workers");
    char *text = th_output(&run);
    const char *resumed = strstr(text, "resumed at step ");
    long long step = resumed ? atoll(resumed + 16) : 0;
    free(text);
    if (step < 800) th_dump(&run, "the restarted workers did not go on from the checkpoint of step 800 or later");
    th_expect_steps_once(dir, FAILURE_STEPS);
    expect_final_accuracy("ddp-kill-all-eval", dir, FAILURE_STEPS);
    assert_int_equal(th_leftovers(), 0);
}

/* SIGSTOP of the scheduler mid-training, never continued: the workers
 * give it up once it was silent for the allowance of a stopped one (30 s)
 * and the job fails naming it. Before, the workers said why on stdout only
 * and the job's reason was "worker 1 exited with status 1" alone. */
static void test_stop_scheduler(void **state) {
    (void)state;
    th_proc run = start_to_step_20("ddp-stop-scheduler", 2, "");
    pid_t sched = th_scheduler_pid(&run);
    assert_true(sched > 0);
    kill(sched, SIGSTOP);
    if (th_wait(&run, 90000) != 1) th_dump(&run, "tessera-run did not fail with its scheduler stopped");
    char *text = th_output(&run);
    const char *last = strstr(text, "[run] job ddp-stop-scheduler failed: ");
    bool names_it = last && strstr(last, "scheduler tcp://") && strstr(last, " silent for ");
    free(text);
    if (!names_it) th_dump(&run, "the job's failure does not name the silent scheduler");
    assert_int_equal(th_leftovers(), 0);
}

/* The final checkpoint cannot be written (the run folder's "checkpoints"
 * is a file, as a full disk would make it fail): tessera-run exits 1
 * naming the folder. Before, a worker that failed after the scheduler
 * had ended the job went unnoticed and the job "completed" with exit 0,
 * without its checkpoint. */
static void test_final_checkpoint_fails(void **state) {
    (void)state;
    const char *job = th_job_file("ddp-final-ckpt", "mlp", 5, 16, 1, "\"strategy\": \"ddp\", \"workers\": 2");
    const char *dir = th_path("ddp-final-ckpt");
    assert_int_equal(mkdir(dir, 0755), 0);
    th_write("ddp-final-ckpt/checkpoints", "not a folder\n");
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_proc run = th_start("ddp-final-ckpt", argv);
    if (th_wait(&run, 120000) != 1) th_dump(&run, "tessera-run did not exit 1 when the final checkpoint failed");
    if (th_count(&run, "[run] job ddp-final-ckpt failed: worker") < 1 || th_count(&run, "cannot create folder") < 1)
        th_dump(&run, "tessera-run did not name the worker and the checkpoint it could not write");
    assert_int_equal(th_leftovers(), 0);
}

/* The parallel section of the fault tests. */
#define FAULT_PARALLEL "\"strategy\": \"ddp\", \"workers\": 4"

/* The leader exits once the group took step 15, before logging it: the
 * next leader, which took it too, logs it. Before, the step's line was
 * missing from metrics.jsonl. */
static void test_leader_exit(void **state) {
    (void)state;
    th_fault_logs_every_step("ddp-leader-exit", 30, FAULT_PARALLEL, "leader_exit@15", 15,
                             "ddp: TESSERA_FAULT: rank 0 exits after step 15");
    assert_int_equal(th_leftovers(), 0);
}

/* The leader exits once the group took its last step, before it logs it,
 * saves or evaluates: the survivors' evaluation fails, they regroup and
 * the next leader logs step 30 before the evaluations and writes the
 * final checkpoint. Before, metrics.jsonl ended at step 29, without the
 * evaluations, and the run had no checkpoint of step 30. */
static void test_leader_exit_last(void **state) {
    (void)state;
    th_fault_logs_every_step("ddp-leader-exit-last", 30, FAULT_PARALLEL, "leader_exit@30", 30,
                             "ddp: TESSERA_FAULT: rank 0 exits after step 30");
    th_expect_end_written(th_path("ddp-leader-exit-last"), 30);
    assert_int_equal(th_leftovers(), 0);
}

/* Rank 0's sums of step 15 fail while ranks 1 and 2 take the step and rank
 * 3 exits: rank 0, the leader, takes the state of step 15 from rank 1 in
 * the regroup, with the step's loss to log. Before, its line was missing. */
static void test_sums_split(void **state) {
    (void)state;
    th_fault_logs_every_step("ddp-sums-split", 30, FAULT_PARALLEL, "sums_split@15", 15,
                             "ddp: TESSERA_FAULT: rank 0 drops its sums of step 15");
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of a worker while the others evaluate: they redo the evaluation
 * at 3 workers and finish. */
static void test_kill_in_eval(void **state) {
    (void)state;
    th_kill_in_eval("ddp-eval-kill", "ddp", "");
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run: both workers stop after the same step and save
 * it; resumed, the job logs the losses of a run never stopped. */
static void test_interrupt(void **state) {
    (void)state;
    th_interrupt_resume("ddp-interrupt", 600, 16, "\"strategy\": \"ddp\", \"workers\": 2", 30);
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run while its workers are still starting: the
 * scheduler ends the job at once, and tessera-run says that nothing was
 * saved, and that the run folder holds no checkpoint, rather than that the
 * workers stopped and saved a checkpoint. */
static void test_interrupt_rendezvous(void **state) {
    (void)state;
    const char *job = th_job_file("ddp-interrupt-rdv", "mlp", 600, 16, 1, "\"strategy\": \"ddp\", \"workers\": 2");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("ddp-interrupt-rdv"), NULL};
    th_proc run = th_start("ddp-interrupt-rdv", argv);
    if (th_wait_for(&run, "[run] scheduler at ", 60000) != 0) th_dump(&run, "the scheduler did not start");
    kill(run.pid, SIGINT);
    if (th_wait(&run, 60000) != 128 + SIGINT) th_dump(&run, "tessera-run did not exit 128 + SIGINT");
    if (th_count(&run, "] step 1/600 ") != 0) th_dump(&run, "the workers joined before the signal: no rendezvous to interrupt");
    if (th_count(&run, "saved a checkpoint (") != 0) th_dump(&run, "tessera-run claims a checkpoint no worker saved");
    th_expect_output(&run, "its workers saved nothing now", 0);
    th_expect_output(&run, "holds no checkpoint", 0);
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run while a killed worker restarts (loading its data,
 * not yet joined again): the others stop and save, and the restarted
 * worker gives up its join (the stopping job refuses it with a SHUTDOWN)
 * or tessera-run stops it at once, rather than waiting out its drain (the
 * barrier timeout, 30 s) for a process that has nothing to finish. */
static void test_interrupt_restart(void **state) {
    (void)state;
    const char *job = job_file("ddp-interrupt-restart", "mlp", 4000, 32, "ddp", 3,
                               "\"min_workers\": 2, \"max_restarts\": 1");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("ddp-interrupt-restart"), NULL};
    th_proc run = th_start("ddp-interrupt-restart", argv);
    if (th_wait_count(&run, "joined rank=", 3, 60000) != 0) th_dump(&run, "not 3 workers joined");
    if (th_wait_for(&run, "step 20/4000", 60000) != 0) th_dump(&run, "no step 20");
    pid_t victim = -1;
    assert_true(th_joined_worker(&run, 2, &victim) >= 0);
    kill(victim, SIGKILL);
    if (th_wait_for(&run, ": restarted as pid ", 20000) != 0) th_dump(&run, "the killed worker was not restarted");
    double t0 = th_now_ms();
    kill(run.pid, SIGINT);
    if (th_wait(&run, 60000) != 128 + SIGINT) th_dump(&run, "tessera-run did not exit 128 + SIGINT");
    if (th_count(&run, "its workers stopped and saved a checkpoint") != 1) th_dump(&run, "the workers did not stop");
    if (th_count(&run, "joined rank=") != 3) th_dump(&run, "the restarted worker joined before the signal");
    /* the restarted worker gave up its join into the stopping job, or was
     * stopped when the job ended */
    if (th_count(&run, "no worker joins it") + th_count(&run, "never joined the job, which has ended") < 1)
        th_dump(&run, "the restarted worker neither gave up nor was stopped");
    if (th_now_ms() - t0 > 20000) th_dump(&run, "tessera-run waited out the drain for the restarted worker");
    assert_int_equal(th_leftovers(), 0);
}

/* A worker joined mid-run receives the state and trains in step. */
static void test_join(void **state) {
    (void)state;
    const char *job = job_file("ddp-join", "gpt", 2000, 4, "ddp", 2, "\"max_workers\": 3");
    const char *dir = th_path("ddp-join");
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_proc run = th_start("ddp-join", argv);
    if (th_wait_for(&run, "step 10/2000", 60000) != 0) th_dump(&run, "no step 10");
    th_proc joiner = th_start_joiner("ddp-joiner", job, dir, NULL);
    if (th_wait_for(&run, "world size 2 -> 3 workers", 20000) != 0) th_dump(&run, "no generation of 3");
    if (th_wait(&joiner, 240000) != 0) th_dump(&joiner, "the joined worker did not exit 0");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 with a joined worker");
    if (th_count(&run, "all workers completed 2000 steps") < 1) th_dump(&run, "not every worker completed the steps");
    assert_int_equal(th_leftovers(), 0);
}

/* Starts tessera-run --join against the job of run_dir with job file job
 * and overrides sets; waits up to 30 s for it to exit, and fails unless it
 * exited non-zero saying the scheduler refused its job. */
static void expect_join_refused(const char *tag, const char *run_dir, const char *job, const char *set1,
                                const char *set2) {
    const char *more[] = {"--set", set1, "--set", set2, "--run-dir", th_path(tag), NULL};
    th_proc joiner = th_start_joiner(tag, job, run_dir, more);
    int rc = th_wait(&joiner, 30000);
    if (rc <= 0) th_dump(&joiner, "a worker of another job did not give up its join");
    if (th_count(&joiner, "model, optimizer or schedule differ") != 1) th_dump(&joiner, "the refusal does not say why");
}

/* A worker whose job file has another model or another strategy is
 * refused at its join: the job never changes its world for it, and logs
 * every step once. */
static void test_join_other_job(void **state) {
    (void)state;
    const char *job = job_file("ddp-join-other", "mlp", 4000, 16, "ddp", 2, "\"max_workers\": 3");
    const char *dir = th_path("ddp-join-other");
    /* the refused joiners load their data beside the run: under that load
     * a 1.5 s heartbeat timeout declared both of its workers dead */
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, "--set", "parallel.heartbeat_timeout_ms=5000", NULL};
    th_proc run = th_start("ddp-join-other", argv);
    if (th_wait_for(&run, "step 10/4000", 60000) != 0) th_dump(&run, "no step 10");
    expect_join_refused("other-model", dir, job, "model.hidden=[32]", "steps=4000");
    expect_join_refused("other-strategy", dir, job, "parallel.strategy=ps", "parallel.servers=1");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0");
    if (th_count(&run, "world size 2 -> 3") != 0) th_dump(&run, "a worker of another job joined");
    th_expect_steps_once(dir, 4000);
    assert_int_equal(th_leftovers(), 0);
}

/* Under mpirun a job of train.epochs ends after the epoch's steps at the
 * world its ranks make: one epoch of 54000 images over 3 worker ranks (the
 * job file says 2) at batch 1000 is 18 steps, not 27. */
static void test_epochs_mpirun(void **state) {
    (void)state;
    th_need_mpirun();
    const char *job = job_file("ddp-epochs-mpi", "mlp", 0, 1000, "ddp", 2, "");
    const char *dir = th_path("ddp-epochs-mpi");
    th_proc m = start_mpirun("ddp-epochs-mpi", job, dir, "4", "--set", "train.epochs=1");
    th_wait_mpirun(&m, 60000);
    double loss[64];
    assert_int_equal(th_losses(dir, loss, 63), 18);
    assert_int_equal(th_leftovers(), 0);
}

int main(int argc, char **argv) {
    th_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_2),    cmocka_unit_test(test_mlp_4),       cmocka_unit_test(test_gpt_2),
        cmocka_unit_test(test_epochs),   cmocka_unit_test(test_epochs_mpirun),
        cmocka_unit_test(test_gpt_4),    cmocka_unit_test(test_mpirun_2),    cmocka_unit_test(test_mpirun_resume),
        cmocka_unit_test(test_kill_worker), cmocka_unit_test(test_stop_leader),
        cmocka_unit_test(test_kill_in_eval), cmocka_unit_test(test_leader_exit), cmocka_unit_test(test_leader_exit_last), cmocka_unit_test(test_sums_split),
        cmocka_unit_test(test_final_checkpoint_fails), cmocka_unit_test(test_stop_scheduler),
        cmocka_unit_test(test_kill_all_workers), cmocka_unit_test(test_leader_back),
        cmocka_unit_test(test_interrupt), cmocka_unit_test(test_interrupt_rendezvous),
        cmocka_unit_test(test_interrupt_restart),
        cmocka_unit_test(test_join),     cmocka_unit_test(test_join_other_job), cmocka_unit_test(test_bf16),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    th_finish(failed);
    return failed;
}
