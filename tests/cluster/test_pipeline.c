/* test_pipeline.c - strategy "pipeline" with real processes: P = 2 and 4
 * stages with M micro-batches give, under gpipe and 1f1b, the per-step
 * losses of a local run with M-step gradient accumulation (within 1e-5
 * relative over 30 steps; a small GPT whose embedding and head are tied,
 * with clipping, also with activation checkpointing, and an MLP), and so
 * does interleaved 1F1B (2 chunks per stage; its checkpoint goes on as a
 * local run), and with bf16 compute the local bf16 run's; under 1f1b the
 * stages hold less than half of what gpipe holds; 2 stages x 2 replicas
 * give a local run's at twice the batch;
 * the same over MPI under mpirun, plain and interleaved; the stages'
 * checkpoint loads into a local run and into another stage count, and a
 * local run's into stages, which continue with an uninterrupted local
 * run's losses; a job of train.epochs runs the epoch's steps, however
 * many "steps" says; a resumed stage's timeline holds each step once; a
 * stage killed -9 (plain and interleaved) stops every other stage with an
 * error naming it, and tessera-run restarts the pipeline from its
 * checkpoint and
 * finishes; a stage killed -9 after the last step fails the job, which a
 * resume finishes; Ctrl-C stops every stage after the same step, saved. Run one
 * scenario by name: cluster_test_pipeline test_<name>. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define STEPS 30

/* The "parallel" body of a pipeline of p stages x d replicas, m
 * micro-batches, schedule sched; extra is appended. */
static void pipeline_section(char *out, size_t cap, int p, int d, int m, const char *sched, const char *extra) {
    snprintf(out, cap,
             "\"strategy\": \"pipeline\", \"stages\": %d, \"data_parallel\": %d, \"micro_batches\": %d, "
             "\"schedule\": \"%s\", \"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 1500, \"bucket_mb\": 0.05%s",
             p, d, m, sched, extra);
}

/* The losses of a local run of arch at batch with accum micro-batches. */
static void local_losses(const char *arch, int batch, int accum, double *loss) {
    char name[64];
    snprintf(name, sizeof name, "local-%s-%d-%d", arch, batch, accum);
    th_run_job(name, arch, STEPS, batch, accum, "\"strategy\": \"local\"", false, loss);
}

/* Runs a pipeline job (p stages x d replicas, m micro-batches of batch,
 * schedule sched) as run_job does. */
static void run_pipeline(const char *name, const char *arch, int steps, int batch, int p, int d, int m,
                         const char *sched, bool resume, double *loss) {
    char par[512];
    pipeline_section(par, sizeof par, p, d, m, sched, "");
    th_run_job(name, arch, steps, batch, 1, par, resume, loss);
}

/* p stages with m micro-batches of b, under both schedules, match local
 * with m-step accumulation at batch b. */
static void equivalence(const char *arch, int p, int m, int b) {
    double want[STEPS + 1], got[STEPS + 1];
    local_losses(arch, b, m, want);
    const char *scheds[] = {"gpipe", "1f1b"};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "pipe-%s-%d-%s", arch, p, scheds[k]);
        run_pipeline(name, arch, STEPS, m * b, p, 1, m, scheds[k], false, got);
        th_expect_same(got, want, 1, STEPS, name);
    }
    assert_int_equal(th_leftovers(), 0);
}

static void test_mlp_2(void **state) { (void)state; equivalence("mlp", 2, 4, 8); }
static void test_mlp_4(void **state) { (void)state; equivalence("mlp", 4, 8, 4); }
static void test_gpt_2(void **state) { (void)state; equivalence("gpt", 2, 4, 2); }
/* with dropout: each stage's modules draw the masks of the whole model's */
static void test_gpt_4(void **state) { (void)state; equivalence("gpt-dropout", 4, 4, 2); }
/* activation checkpointing of each stage's blocks changes nothing */
static void test_gpt_checkpointing(void **state) { (void)state; equivalence("gpt-ckpt", 3, 4, 2); }

/* Interleaved: p stages of 2 chunks each (the model cut into 2p pieces by
 * profiling), m micro-batches of b, under both schedules, match local with
 * m-step accumulation at batch b. */
static void interleaved(const char *arch, int p, int m, int b) {
    double want[STEPS + 1], got[STEPS + 1];
    local_losses(arch, b, m, want);
    const char *scheds[] = {"gpipe", "1f1b"};
    for (int k = 0; k < 2; k++) {
        char name[64], par[512];
        snprintf(name, sizeof name, "pipe-%s-%dx2-%s", arch, p, scheds[k]);
        pipeline_section(par, sizeof par, p, 1, m, scheds[k], ", \"chunks_per_stage\": 2");
        th_run_job(name, arch, STEPS, m * b, 1, par, false, got);
        th_expect_same(got, want, 1, STEPS, name);
    }
    assert_int_equal(th_leftovers(), 0);
}

static void test_interleaved_mlp(void **state) { (void)state; interleaved("mlp", 2, 4, 8); }

/* The GPT (4 units: the embedding and head, tied, on stage 0's first chunk
 * and stage 1's last; with dropout, whose masks follow the whole model's
 * modules although a stage holds units 0 and 2, or 1 and 3); its
 * checkpoint after 20 steps goes on as a local run with the uninterrupted
 * local run's losses. */
static void test_interleaved_gpt(void **state) {
    (void)state;
    interleaved("gpt-dropout", 2, 4, 2);
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("gpt", 2, 4, want);
    char par[512];
    pipeline_section(par, sizeof par, 2, 1, 4, "1f1b", ", \"chunks_per_stage\": 2");
    th_run_job("pipe-il-ck", "gpt", 20, 8, 1, par, false, got);
    th_copy_run(th_path("pipe-il-ck"), th_path("pipe-il-local"));
    th_run_job("pipe-il-local", "gpt", STEPS, 2, 4, "\"strategy\": \"local\"", true, got);
    th_expect_same(got, want, 21, STEPS, "local run resumed from 2 stages of 2 chunks");
    assert_int_equal(th_leftovers(), 0);
}

/* bf16 compute: the micro-batches in flight at once each backward through
 * their own bf16 -> f32 conversions of the weights (one shared by two would
 * be freed by the first backward); the MLP's losses equal the local bf16
 * run's with accumulation, plain and interleaved. */
static void test_bf16(void **state) {
    (void)state;
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("mlp-bf16", 8, 4, want);
    for (int chunks = 1; chunks <= 2; chunks++) {
        char name[64], par[512], extra[64];
        snprintf(name, sizeof name, "pipe-bf16-%d", chunks);
        snprintf(extra, sizeof extra, ", \"chunks_per_stage\": %d", chunks);
        pipeline_section(par, sizeof par, 2, 1, 4, "1f1b", extra);
        th_run_job(name, "mlp-bf16", STEPS, 32, 1, par, false, got);
        th_expect_same(got, want, 1, STEPS, name);
    }
    assert_int_equal(th_leftovers(), 0);
}

/* The median over steps 3 and later of what the micro-batches in flight
 * hold at stage s beyond the first: the most bytes in use after one of its
 * operations beyond what it held after the step's first one (which also
 * takes what a step holds whatever its micro-batches: the batch in f32),
 * from run dir's timeline. */
static double stage_peak(const char *dir, int s) {
    char path[4300], line[1 << 16];
    snprintf(path, sizeof path, "%s/timeline/stage-%d-replica-0.jsonl", dir, s);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double peaks[64];
    int n = 0;
    while (n < 64 && fgets(line, sizeof line, f)) {
        const char *step = strstr(line, "\"step\":");
        if (!step || atoi(step + 7) < 3) continue;
        double first = -1, most = 0;
        /* each op: ["F", micro, start, end, held, chunk] */
        for (const char *op = strstr(line, "[\""); op; op = strstr(op + 1, "[\"")) {
            const char *at = op;
            for (int k = 0; k < 4 && at; k++) at = strchr(at + 1, ',');
            double held = at ? atof(at + 1) : 0;
            if (first < 0) first = most = held;
            if (held > most) most = held;
        }
        peaks[n++] = most - first;
    }
    fclose(f);
    assert_true(n > 0);
    for (int i = 1; i < n; i++) /* insertion sort */
        for (int j = i; j > 0 && peaks[j] < peaks[j - 1]; j--) {
            double t = peaks[j];
            peaks[j] = peaks[j - 1];
            peaks[j - 1] = t;
        }
    return peaks[n / 2];
}

/* What the micro-batches in flight hold: under 1f1b each stage holds at
 * most P - s micro-batches (their activations, and a later stage the
 * inputs it received and their gradients), under gpipe all M: with P = 2
 * and M = 8, 1f1b's peak stays under half of gpipe's on both stages. */
static void test_memory(void **state) {
    (void)state;
    const char *scheds[] = {"gpipe", "1f1b"};
    double peak[2][2];
    for (int k = 0; k < 2; k++) {
        char name[64], par[512];
        double loss[STEPS + 1];
        snprintf(name, sizeof name, "pipe-mem-%s", scheds[k]);
        pipeline_section(par, sizeof par, 2, 1, 8, scheds[k], ", \"timeline\": true, \"pipeline_stages\": [4, 3]");
        th_run_job(name, "mlp-wide", 8, 128, 1, par, false, loss);
        for (int st = 0; st < 2; st++) peak[k][st] = stage_peak(th_path(name), st);
    }
    for (int st = 0; st < 2; st++) {
        fprintf(stderr, "stage %d: gpipe %.0f, 1f1b %.0f bytes\n", st, peak[0][st], peak[1][st]);
        if (!(peak[1][st] < 0.5 * peak[0][st]))
            fail_msg("stage %d: 1f1b holds %.0f bytes at most, gpipe %.0f: not under half", st, peak[1][st],
                     peak[0][st]);
    }
    assert_int_equal(th_leftovers(), 0);
}

/* 2 stages x 2 replicas at batch 8 per replica (4 micro-batches) match a
 * local run at batch 16, plain and interleaved. */
static void test_dp_2x2(void **state) {
    (void)state;
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("gpt", 16, 1, want);
    run_pipeline("pipe-dp", "gpt", STEPS, 8, 2, 2, 4, "1f1b", false, got);
    th_expect_same(got, want, 1, STEPS, "2 stages x 2 replicas");
    /* interleaved: each replica's stages loop, the replicas' averages and
     * ports (pipeline, gradients, replicas) side by side */
    char par[512];
    pipeline_section(par, sizeof par, 2, 2, 4, "1f1b", ", \"chunks_per_stage\": 2");
    th_run_job("pipe-dp-il", "gpt", STEPS, 8, 1, par, false, got);
    th_expect_same(got, want, 1, STEPS, "2 stages of 2 chunks x 2 replicas");
    assert_int_equal(th_leftovers(), 0);
}

/* The same under mpirun: the scheduler and 2 stages as MPI processes,
 * activations, gradients and the tied weight's gradient over MPI (the
 * GPT); interleaved (2 chunks per stage: activations then flow both ways
 * between the two stages), the wide MLP, whose 16 KiB activations MPI
 * hands over only to a posted receive. */
static void mpirun_pipeline(const char *name, const char *arch, int b, int chunks) {
    th_need_mpirun();
    double want[STEPS + 1], got[STEPS + 1];
    local_losses(arch, b, 4, want);
    char par[512], extra[64];
    snprintf(extra, sizeof extra, ", \"chunks_per_stage\": %d", chunks);
    pipeline_section(par, sizeof par, 2, 1, 4, "1f1b", extra);
    const char *job = th_job_file(name, arch, STEPS, 4 * b, 1, par);
    const char *dir = th_path(name);
    char bin[4200], set[4300];
    snprintf(bin, sizeof bin, "%s/tessera-run", getenv("TESSERA_BIN_DIR"));
    snprintf(set, sizeof set, "train.run_dir=%s", dir);
    const char *argv[] = {"mpirun", "-np", "3", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                          bin, "--mpi", job, "--set", set, NULL};
    th_proc p = th_start(name, argv);
    th_wait_mpirun(&p, 240000);
    if (th_losses(dir, got, STEPS) != STEPS) th_dump(&p, "the run did not log every step");
    th_expect_same(got, want, 1, STEPS, name);
}

static void test_mpirun_2(void **state) { (void)state; mpirun_pipeline("pipe-mpi", "gpt", 2, 1); }
static void test_mpirun_interleaved(void **state) { (void)state; mpirun_pipeline("pipe-mpi-il", "mlp-wide", 8, 2); }

/* A 4-stage run stopped after step 20 (its checkpoint) continues as a
 * local run and as a 2-stage pipeline with an uninterrupted local run's
 * losses for steps 21..30, and the local run's checkpoint of step 20 as 2
 * interleaved stages; the 4-stage checkpoint exports to ONNX as its
 * consolidated copy does. */
static void test_checkpoint_cuts(void **state) {
    (void)state;
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("gpt", 2, 4, want);
    run_pipeline("pipe-ck4", "gpt", 20, 8, 4, 1, 4, "1f1b", false, got);
    th_expect_same(got, want, 1, 20, "4 stages, first 20 steps");

    const char *dir4 = th_path("pipe-ck4");
    th_copy_run(dir4, th_path("pipe-ck-local"));
    th_run_job("pipe-ck-local", "gpt", STEPS, 2, 4, "\"strategy\": \"local\"", true, got);
    th_expect_same(got, want, 21, STEPS, "local run resumed from 4 stages");

    th_copy_run(dir4, th_path("pipe-ck2"));
    run_pipeline("pipe-ck2", "gpt", STEPS, 8, 2, 1, 4, "gpipe", true, got);
    th_expect_same(got, want, 21, STEPS, "2 stages resumed from 4 stages");

    /* the other way: the local run's checkpoint of step 20 continues as 2
     * interleaved stages, each taking its pieces from the whole model */
    const char *from_local = th_path("pipe-ck-from-local");
    th_copy_run(th_path("local-gpt-2-4"), from_local);
    char cmd[4400], par[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/checkpoints/step-30'", from_local);
    assert_int_equal(system(cmd), 0);
    pipeline_section(par, sizeof par, 2, 1, 4, "1f1b", ", \"chunks_per_stage\": 2");
    th_run_job("pipe-ck-from-local", "gpt", STEPS, 8, 1, par, true, got);
    th_expect_same(got, want, 21, STEPS, "2 interleaved stages resumed from a local run");

    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-20", dir4);
    th_expect_export_whole("pipe-ck-export", ckpt);
    assert_int_equal(th_leftovers(), 0);
}

/* Runs argv (a tool given a checkpoint; tag names its output) and fails
 * unless it exits non-zero saying each of the NULL-terminated says. */
static void expect_refused(const char *tag, const char *const *argv, const char *const *says) {
    th_proc p = th_start(tag, argv);
    if (th_wait(&p, 60000) <= 0) th_dump(&p, "the command did not fail");
    for (int i = 0; says[i]; i++)
        if (th_count(&p, says[i]) < 1) th_dump(&p, says[i]);
}

/* Runs the MLP job `name` as `stages` stages in its run folder to step
 * `steps` (a checkpoint every 10, 2 kept), resuming from its checkpoints
 * when resume. */
static void run_stages(const char *name, int stages, int steps, bool resume) {
    char par[512];
    double loss[41];
    pipeline_section(par, sizeof par, stages, 1, 4, "1f1b", "");
    const char *job = th_job_file(name, "mlp", steps, 32, 1, par);
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, "--set", "train.keep_checkpoints=2",
                          resume ? "--resume" : NULL, NULL};
    th_run_losses(name, argv, dir, loss, steps);
}

/* Fails unless the folder <dir>/<rel> exists (there) or not. */
static void expect_folder(const char *dir, const char *rel, bool there) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    if ((access(path, F_OK) == 0) != there) fail_msg("%s %s", path, there ? "is missing" : "was not removed");
}

/* One stage's part of a 4-stage checkpoint given to every tool that takes
 * a checkpoint is refused naming the index to give instead (before, it
 * failed on a parameter of another stage: "no tensor named ..."); an index
 * copied without its stage parts names the part missing and where it
 * belongs. Resumed as 2 stages keeping 2 checkpoints, the folders of
 * stages 2 and 3 keep the parts of the 4-stage index still kept (step 20,
 * which loads) and lose the others, and go with that index (before, they
 * stayed for good). */
static void test_checkpoint_folders(void **state) {
    (void)state;
    const char *dir = th_path("pipe-folders");
    run_stages("pipe-folders", 4, 20, false);
    char part[4400], index[4400], onnx[4300], out[4300], model[4500];
    snprintf(part, sizeof part, "%s/checkpoints/stages/stage-1/step-20", dir);
    snprintf(index, sizeof index, "give its index %s/checkpoints/step-20 instead", dir);
    snprintf(onnx, sizeof onnx, "%s.onnx", th_path("pipe-part"));
    snprintf(out, sizeof out, "%s", th_path("pipe-part-whole"));
    snprintf(model, sizeof model, "mlp=%s", part);
    const char *says[] = {"is stage 1's part of a pipeline checkpoint", index, NULL};
    const char *eval[] = {"tessera-run", "--eval", part, NULL};
    const char *cons[] = {"tessera-run", "--consolidate", part, "--out", out, NULL};
    const char *gen[] = {"tessera-run", "--generate", part, "--prompt", "a", NULL};
    const char *exp[] = {"tessera-run", "--export-onnx", part, "-o", onnx, NULL};
    const char *serve[] = {"tessera-serve", "--model", model, "--token-file", th_write("token", "part-token-1234\n"),
                           "--port", "0", NULL};
    expect_refused("pipe-part-eval", eval, says);
    expect_refused("pipe-part-consolidate", cons, says);
    expect_refused("pipe-part-generate", gen, says);
    expect_refused("pipe-part-export", exp, says);
    expect_refused("pipe-part-serve", serve, says);

    char lone[4300], cmd[9000];
    snprintf(lone, sizeof lone, "%s", th_path("pipe-lone-index"));
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp -r '%s/checkpoints/step-20' '%s/'", lone, dir, lone);
    assert_int_equal(system(cmd), 0);
    snprintf(part, sizeof part, "%s/step-20", lone);
    const char *lone_eval[] = {"tessera-run", "--eval", part, NULL};
    const char *lone_says[] = {"its part stages/stage-0/step-20 is missing",
                               "copy the run's checkpoints/stages/ folder beside the index", NULL};
    expect_refused("pipe-lone-eval", lone_eval, lone_says);

    run_stages("pipe-folders", 2, 30, true);
    expect_folder(dir, "checkpoints/stages/stage-2/step-10", false);
    expect_folder(dir, "checkpoints/stages/stage-3/step-10", false);
    expect_folder(dir, "checkpoints/stages/stage-2/step-20", true);
    expect_folder(dir, "checkpoints/stages/stage-3/step-20", true);
    snprintf(part, sizeof part, "%s/checkpoints/step-20", dir);
    const char *kept[] = {"tessera-run", "--eval", part, NULL};
    free(th_run_tool("pipe-kept-eval", kept));

    run_stages("pipe-folders", 2, 40, true);
    expect_folder(dir, "checkpoints/step-20", false);
    expect_folder(dir, "checkpoints/stages/stage-2", false);
    expect_folder(dir, "checkpoints/stages/stage-3", false);
    expect_folder(dir, "checkpoints/stages/stage-1/step-40", true);
    assert_int_equal(th_leftovers(), 0);
}

/* A job of train.epochs: one epoch of 1 % of Fashion-MNIST's training
 * images (600, 18 batches of 32) whose "steps" (10) says less. The job
 * runs the epoch's 18 steps (the scheduler is told them, not "steps"),
 * with the losses of a local run with 4-step accumulation; its banner
 * counts the whole model's parameters. */
static void test_epochs(void **state) {
    (void)state;
    enum { EPOCH = 18 };
    double want[EPOCH + 1], got[EPOCH + 1];
    const char *runs[] = {"pipe-ep-local", "pipe-ep"};
    for (int k = 0; k < 2; k++) {
        char text[2048], file[64], par[512];
        pipeline_section(par, sizeof par, 2, 1, 4, "1f1b", "");
        snprintf(text, sizeof text,
                 "{\"name\": \"%s\", \"seed\": 5, \"steps\": 10,\n"
                 " \"model\": {\"arch\": \"mlp\", \"hidden\": [64, 48, 32]},\n"
                 " \"data\": {\"kind\": \"fashion_mnist\", \"val_fraction\": 0.99},\n"
                 " \"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.002}, \"schedule\": {\"kind\": \"cosine\"},\n"
                 " \"train\": {\"batch_size\": %d, \"accum_steps\": %d, \"epochs\": 1, \"log_every\": 1, "
                 "\"eval_batches\": 2},\n"
                 " \"parallel\": {%s}}\n",
                 runs[k], k ? 32 : 8, k ? 1 : 4, k ? par : "\"strategy\": \"local\"");
        snprintf(file, sizeof file, "%s.json", runs[k]);
        const char *argv[] = {"tessera-run", th_write(file, text), "--run-dir", th_path(runs[k]), NULL};
        th_run_losses(runs[k], argv, th_path(runs[k]), k ? got : want, EPOCH);
    }
    th_expect_same(got, want, 1, EPOCH, "2 stages, one epoch");
    /* the leader (stage 0) names the whole model's parameters, and its own */
    th_proc run = {.status = 0};
    snprintf(run.out, sizeof run.out, "%s", th_path("pipe-ep.out"));
    th_expect_output(&run, "MLP with 55258 parameters (0.21 MiB, 50240 of them here)", 0);
    assert_int_equal(th_leftovers(), 0);
}

/* Pid of the worker of rank r ("[run] worker rank R is pid P"), the last
 * one started; -1 when none. */
static pid_t worker_pid(const th_proc *p, int r) {
    char *text = th_output(p), needle[64];
    snprintf(needle, sizeof needle, "[run] worker rank %d is pid ", r);
    pid_t pid = -1;
    for (const char *s = text; (s = strstr(s, needle)); s += strlen(needle)) pid = atoi(s + strlen(needle));
    free(text);
    return pid;
}

/* Whether worker `stage` (its rank) stopped with an error of its stage
 * naming stage 1 (rank 1 of its communicator in a collective) and the
 * micro-batch (or the step it came after, between steps). */
static int names_stage_1(const th_proc *p, int stage) {
    char *text = th_output(p), head[64], mine[64];
    snprintf(head, sizeof head, "[worker %d] tessera-worker: ", stage);
    snprintf(mine, sizeof mine, "pipeline stage %d of 3", stage);
    int found = 0;
    for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n"))
        found = strncmp(line, head, strlen(head)) == 0 && strstr(line, mine) &&
                (strstr(line, "micro-batch") || strstr(line, "after step")) &&
                (strstr(line, "from stage 1:") || strstr(line, "to stage 1:") || strstr(line, "rank 1 ("));
    free(text);
    return found;
}

/* Fails unless stage s's timeline in run dir holds steps 1..steps once
 * each, in order (a restarted stage drops the lines of the steps it runs
 * again). */
static void expect_timeline_steps(const char *dir, int s, int steps) {
    char path[4300], line[1 << 16];
    snprintf(path, sizeof path, "%s/timeline/stage-%d-replica-0.jsonl", dir, s);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "\"step\":");
        int step = at ? atoi(at + 7) : -1;
        if (step != ++n) fail_msg("%s: line %d is of step %d", path, n, step);
    }
    fclose(f);
    if (n != steps) fail_msg("%s: %d steps, not %d", path, n, steps);
}

/* A 2-stage run of 20 steps with a timeline, resumed from its checkpoint
 * of step 10 (the one of step 20 removed), ends with each step once in
 * every stage's timeline, as in its metrics. */
static void test_timeline_resume(void **state) {
    (void)state;
    double loss[21];
    char par[512], cmd[9000];
    pipeline_section(par, sizeof par, 2, 1, 2, "1f1b", ", \"timeline\": true");
    th_run_job("pipe-tl", "mlp", 20, 16, 1, par, false, loss);
    const char *dir = th_path("pipe-tl");
    snprintf(cmd, sizeof cmd, "rm -rf '%s/checkpoints/step-20' '%s'/checkpoints/stages/stage-*/step-20", dir, dir);
    assert_int_equal(system(cmd), 0);
    th_run_job("pipe-tl", "mlp", 20, 16, 1, par, true, loss);
    for (int s = 0; s < 2; s++) expect_timeline_steps(dir, s, 20);
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run: the 2 stages x 2 replicas stop after the same
 * step and save their parts of it; resumed, the job logs the losses of a
 * run never stopped. */
static void test_interrupt(void **state) {
    (void)state;
    char par[512];
    pipeline_section(par, sizeof par, 2, 2, 2, "1f1b", "");
    th_interrupt_resume("pipeline-interrupt", 600, 16, par, 30);
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of stage 1 of 3 mid-training (chunks per stage; with 2 the
 * pipeline loops, stage 2 handing on to stage 0): stages 0 and 2 stop with
 * errors naming it, tessera-run restarts all three from the last
 * checkpoint, and the job finishes with an uninterrupted local run's
 * losses, and every stage's timeline holds each step once. */
static void kill_stage(const char *name, int chunks) {
    enum { KSTEPS = 60 };
    int m = chunks > 1 ? 6 : 4; /* interleaving: a multiple of the 3 stages */
    double want[KSTEPS + 1], got[KSTEPS + 1];
    char local[64], extra[128], par[512];
    snprintf(local, sizeof local, "%s-local", name);
    th_run_job(local, "mlp", KSTEPS, 8, m, "\"strategy\": \"local\"", false, want);

    snprintf(extra, sizeof extra, ", \"max_restarts\": 1, \"timeline\": true, \"chunks_per_stage\": %d", chunks);
    pipeline_section(par, sizeof par, 3, 1, m, "1f1b", extra);
    const char *job = th_job_file(name, "mlp", KSTEPS, 8 * m, 1, par);
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_proc run = th_start(name, argv);
    if (th_wait_for(&run, "step 25/60", 90000) != 0) th_dump(&run, "no step 25");
    pid_t victim = worker_pid(&run, 1);
    assert_true(victim > 0);
    double killed = th_now_ms();
    kill(victim, SIGKILL);
    /* both others name stage 1 (a send or receive with it failed) */
    for (int s = 0; s < 3; s += 2)
        while (!names_stage_1(&run, s))
            if (th_now_ms() - killed > 15000) th_dump(&run, "a stage did not stop naming stage 1");
            else usleep(20000);
    if (th_wait_for(&run, "restarting every stage from the last checkpoint", 20000) != 0)
        th_dump(&run, "tessera-run did not restart the pipeline");
    double stopped = th_now_ms() - killed;
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not finish the job after the restart");
    fprintf(stderr, "the pipeline was restarting %.0f ms after the kill\n", stopped);
    if (th_losses(dir, got, KSTEPS) != KSTEPS) th_dump(&run, "the restarted job did not log every step");
    th_expect_same(got, want, 1, KSTEPS, "3 stages with a restart");
    for (int s = 0; s < 3; s++) expect_timeline_steps(dir, s, KSTEPS);
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run as the 3 stages join again after one was killed:
 * they are stopped at once. Forwarded to the scheduler alone, the
 * signal let the stages that had joined again wait the barrier timeout
 * (30 s) for the ones the stopping job refused. */
static void test_interrupt_restart(void **state) {
    (void)state;
    char par[512];
    pipeline_section(par, sizeof par, 3, 1, 4, "1f1b", ", \"max_restarts\": 1");
    const char *job = th_job_file("pipe-interrupt-restart", "mlp", 4000, 32, 1, par);
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("pipe-interrupt-restart"), NULL};
    th_proc run = th_start("pipe-interrupt-restart", argv);
    if (th_wait_for(&run, "step 25/4000", 90000) != 0) th_dump(&run, "no step 25");
    pid_t victim = worker_pid(&run, 1);
    assert_true(victim > 0);
    kill(victim, SIGKILL);
    /* the first stage in again (the others are a few ms behind) */
    if (th_wait_count(&run, "joined rank=", 4, 30000) != 0) th_dump(&run, "no stage joined again");
    double t0 = th_now_ms();
    kill(run.pid, SIGINT);
    if (th_wait(&run, 60000) != 128 + SIGINT) th_dump(&run, "tessera-run did not exit 128 + SIGINT");
    if (th_now_ms() - t0 > 10000) th_dump(&run, "the stages took more than 10 s to stop");
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run right after stage 1 of 3 was killed -9 (before
 * tessera-run restarted the pipeline): no stage can take a step to stop
 * at, and tessera-run exits 128 + SIGINT naming the run folder's newest
 * checkpoint and how to go on from it (before: "nothing was saved", with
 * no word of the checkpoints of steps 10 and 20). */
static void test_interrupt_after_kill(void **state) {
    (void)state;
    char par[512];
    pipeline_section(par, sizeof par, 3, 1, 4, "1f1b", ", \"max_restarts\": 1");
    const char *job = th_job_file("pipe-interrupt-kill", "mlp", 4000, 32, 1, par);
    const char *dir = th_path("pipe-interrupt-kill");
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_proc run = th_start("pipe-interrupt-kill", argv);
    if (th_wait_for(&run, "step 25/4000", 90000) != 0) th_dump(&run, "no step 25");
    pid_t victim = worker_pid(&run, 1);
    assert_true(victim > 0);
    kill(victim, SIGKILL);
    kill(run.pid, SIGINT);
    if (th_wait(&run, 60000) != 128 + SIGINT) th_dump(&run, "tessera-run did not exit 128 + SIGINT");
    char *text = th_output(&run), hint[4400];
    const char *at = strstr(text, "the newest checkpoint, of step ");
    int step = at ? atoi(at + strlen("the newest checkpoint, of step ")) : -1;
    free(text);
    if (step < 20) th_dump(&run, "tessera-run did not name the newest checkpoint");
    snprintf(hint, sizeof hint, "%s/checkpoints/step-%d: go on from it with --resume --run-dir %s", dir, step, dir);
    if (th_count(&run, hint) != 1) th_dump(&run, "tessera-run did not say how to go on from the checkpoint");
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of stage 1 after the job's last step, in its final evaluation
 * (of the whole validation set, which takes a while): the job is not over
 * until the final evaluation and checkpoint are, so the stages restart
 * from the last checkpoint and the job completes with them. Before, the
 * scheduler ended the job at the last step, and a stage killed then left
 * it without its final checkpoint and evaluation. */
static void test_kill_after_last_step(void **state) {
    (void)state;
    char par[512];
    pipeline_section(par, sizeof par, 2, 1, 4, "1f1b", ", \"max_restarts\": 1");
    const char *job = th_job_file("pipe-kill-end", "mlp-wide", 12, 32, 1, par);
    const char *dir = th_path("pipe-kill-end");
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, "--set", "train.eval_batches=0",
                          "--set", "data.val_fraction=0.5", NULL};
    th_proc run = th_start("pipe-kill-end", argv);
    if (th_wait_for(&run, "step 12/12 |", 90000) != 0) th_dump(&run, "no step 12");
    pid_t victim = worker_pid(&run, 1);
    assert_true(victim > 0);
    kill(victim, SIGKILL);
    if (th_wait(&run, 120000) != 0) th_dump(&run, "the job did not complete after losing a stage at its end");
    if (th_count(&run, "worker 1 exited with signal 9 (SIGKILL") != 1 || th_count(&run, "restarting every stage") != 1)
        th_dump(&run, "the stages were not restarted");
    if (th_count(&run, "eval test at step 12") != 1) th_dump(&run, "the job did not evaluate once at its end");
    char ckpt[4300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-12", dir);
    assert_int_equal(access(ckpt, F_OK), 0);
    th_expect_steps_once(dir, 12);
    assert_int_equal(th_leftovers(), 0);
}

static void test_kill_stage(void **state) { (void)state; kill_stage("pipe-kill", 1); }
static void test_kill_stage_interleaved(void **state) { (void)state; kill_stage("pipe-kill-il", 2); }

int main(int argc, char **argv) {
    th_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_2),  cmocka_unit_test(test_mlp_4),           cmocka_unit_test(test_gpt_2),
        cmocka_unit_test(test_gpt_4),  cmocka_unit_test(test_gpt_checkpointing), cmocka_unit_test(test_dp_2x2),
        cmocka_unit_test(test_interleaved_mlp), cmocka_unit_test(test_interleaved_gpt), cmocka_unit_test(test_bf16), cmocka_unit_test(test_memory),
        cmocka_unit_test(test_checkpoint_cuts), cmocka_unit_test(test_mpirun_2), cmocka_unit_test(test_mpirun_interleaved),
        cmocka_unit_test(test_kill_stage), cmocka_unit_test(test_kill_stage_interleaved), cmocka_unit_test(test_epochs),
        cmocka_unit_test(test_timeline_resume),
        cmocka_unit_test(test_interrupt), cmocka_unit_test(test_interrupt_restart),
        cmocka_unit_test(test_kill_after_last_step), cmocka_unit_test(test_checkpoint_folders),
        cmocka_unit_test(test_interrupt_after_kill),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    th_finish(failed);
    return failed;
}
