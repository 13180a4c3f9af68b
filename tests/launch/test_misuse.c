/* test_misuse.c - what a careless user does to tessera-run, against the real
 * binary: checkpoint files that are not regular files, a resumed run's
 * metrics, a model too big for the machine (also in a cluster, and with
 * --force), a metrics.jsonl, job.json or chart data on a full disk, a
 * cluster.log that cannot be made or written, messages that must name the file or
 * field. Every run
 * goes through timeout(1), so a hang fails the test instead of stalling it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../test_util.h"

/* A hung tessera-run is stopped after this long (timeout(1) exits 124). */
#define HANG_S 120

static char base[256];

/* The small MLP job's flags: steps steps of batch 64, a checkpoint at the
 * end, no evaluation during the run. */
#define MLP_JOB "examples/mlp_fashion.json --set train.epochs=0 --set train.batch_size=64 " \
                "--set train.checkpoint_every=1000 --set train.eval_every=0 --set train.eval_batches=2 " \
                "--set schedule.warmup_steps=1"

/* Runs "[prefix] timeout HANG_S BIN/prog ARGS" in sh with its output in
 * base/<tag>.log; returns the exit status and the log's text in log[cap]. */
static int vrun(const char *prefix, const char *prog, const char *tag, char *log, size_t cap, const char *fmt,
                va_list ap) {
    char args[2048], path[400], cmd[4096];
    vsnprintf(args, sizeof args, fmt, ap);
    snprintf(path, sizeof path, "%s/%s.log", base, tag);
    const char *bin = getenv("TESSERA_BIN_DIR");
    snprintf(cmd, sizeof cmd, "%s timeout %d %s/%s %s > %s 2>&1", prefix, HANG_S, bin ? bin : "build/bin", prog,
             args, path);
    int status = system(cmd);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    tu_read_back(f, log, cap);
    return code;
}

/* tessera-run ARGS (printf-style), output in base/<tag>.log and log[cap]. */
static int run(const char *tag, char *log, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int run(const char *tag, char *log, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int code = vrun("", "tessera-run", tag, log, cap, fmt, ap);
    va_end(ap);
    return code;
}

/* prog ARGS after the shell prefix (e.g. "ulimit -v N;"). */
static int run_prog(const char *prefix, const char *prog, const char *tag, char *log, size_t cap, const char *fmt,
                    ...) __attribute__((format(printf, 6, 7)));
static int run_prog(const char *prefix, const char *prog, const char *tag, char *log, size_t cap, const char *fmt,
                    ...) {
    va_list ap;
    va_start(ap, fmt);
    int code = vrun(prefix, prog, tag, log, cap, fmt, ap);
    va_end(ap);
    return code;
}

/* Resumes the run in dir of job for `steps` steps, with extra flags. */
static int resume_with(const char *tag, char *log, size_t cap, const char *job, const char *dir, int steps,
                       const char *extra) {
    return run(tag, log, cap, "%s --run-dir %s --resume --set steps=%d %s", job, dir, steps, extra);
}

/* Fails unless log contains needle, printing the log. */
static void expect_text(const char *log, const char *needle) {
    if (!strstr(log, needle)) fail_msg("expected \"%s\" in:\n%s", needle, log);
}

/* Writes text to path (a new file). */
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* Fails unless the file path holds exactly text. */
static void expect_file(const char *path, const char *text) {
    char got[256];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    tu_read_back(f, got, sizeof got);
    assert_string_equal(got, text);
}

/* Makes the folder base/name as dir[300] and names dir/file in path[400]. */
static void case_dir(const char *name, const char *file, char *dir, char *path) {
    snprintf(dir, 300, "%s/%s", base, name);
    snprintf(path, 400, "%s/%s", dir, file);
    assert_int_equal(mkdir(dir, 0777), 0);
}

/* case_dir, with dir/file a link to /dev/full (every write of it fails
 * with ENOSPC, as on a full disk). */
static void full_file_case(const char *name, const char *file, char *dir, char *path) {
    case_dir(name, file, dir, path);
    assert_int_equal(symlink("/dev/full", path), 0);
}

/* A checkpoint whose optim.safetensors is a symlink to /dev/zero, or whose
 * model.safetensors is a FIFO: --eval and --resume refuse it naming the
 * file, instead of reading forever (or waiting for a writer). */
static void test_checkpoint_file_not_regular(void **state) {
    (void)state;
    char log[16384], dir[300], ck[400], part[500];
    snprintf(dir, sizeof dir, "%s/ck", base);
    assert_int_equal(run("ck-train", log, sizeof log, MLP_JOB " --set steps=4 --run-dir %s", dir), 0);
    snprintf(ck, sizeof ck, "%s/checkpoints/step-4", dir);

    snprintf(part, sizeof part, "%s/optim.safetensors", ck);
    assert_int_equal(unlink(part), 0);
    assert_int_equal(symlink("/dev/zero", part), 0);
    assert_int_equal(run("ck-eval", log, sizeof log, "--eval %s", ck), 1);
    expect_text(log, "optim.safetensors is not a regular file (a character device)");
    assert_int_equal(run("ck-resume", log, sizeof log, MLP_JOB " --set steps=8 --run-dir %s --resume", dir), 1);
    expect_text(log, "optim.safetensors is not a regular file (a character device)");

    snprintf(part, sizeof part, "%s/model.safetensors", ck);
    assert_int_equal(unlink(part), 0);
    assert_int_equal(mkfifo(part, 0600), 0);
    assert_int_equal(run("ck-fifo", log, sizeof log, "--eval %s", ck), 1);
    expect_text(log, "model.safetensors is not a regular file (a FIFO)");
}

/* Lines of kind in run_dir/metrics.jsonl per step (count[0..max]). */
static void count_lines(const char *run_dir, const char *kind, int *count, int max) {
    char path[512], line[1024], want[64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    snprintf(want, sizeof want, "{\"kind\":\"%s\"", kind);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step\":");
        int step = p ? atoi(p + 7) : -1;
        if (strncmp(line, want, strlen(want)) == 0 && step >= 0 && step <= max) count[step]++;
    }
    fclose(f);
}

/* A run stopped after step 20 whose last checkpoint is step 16 (the final
 * one never written) and then resumed: metrics.jsonl holds every step once,
 * the steps 17..20 of the stopped run are cut back. A --resume that finds
 * no checkpoint says it starts afresh. */
static void test_resume_keeps_each_step_once(void **state) {
    (void)state;
    char log[16384], dir[300], ck[400];
    snprintf(dir, sizeof dir, "%s/metrics", base);
    const char *job = MLP_JOB " --set steps=20 --set train.checkpoint_every=8 --set train.log_every=1";
    assert_int_equal(run("metrics-first", log, sizeof log, "%s --run-dir %s", job, dir), 0);
    snprintf(ck, sizeof ck, "%s/checkpoints/step-20", dir);
    assert_int_equal(ts_io_remove_tree(ck), TS_OK);
    assert_int_equal(run("metrics-resumed", log, sizeof log, "%s --run-dir %s --resume", job, dir), 0);
    expect_text(log, "resumed at step 16");
    int steps[21] = {0}, evals[21] = {0};
    count_lines(dir, "step", steps, 20);
    count_lines(dir, "eval", evals, 20);
    for (int s = 1; s <= 20; s++)
        if (steps[s] != 1) fail_msg("metrics.jsonl has %d lines for step %d", steps[s], s);
    assert_int_equal(evals[20], 2); /* the final validation and test evaluations */

    /* another optimizer's state does not carry over: refused, naming both;
     * Adam's moments serve AdamW */
    assert_int_equal(resume_with("metrics-sgd", log, sizeof log, job, dir, 24, "--set optimizer.kind=sgd"), 1);
    snprintf(ck, sizeof ck, "optimizer.kind: sgd, but checkpoint %s/checkpoints/step-20 was trained with adamw", dir);
    expect_text(log, ck);
    assert_int_equal(resume_with("metrics-adam", log, sizeof log, job, dir, 24, "--set optimizer.kind=adam"), 0);
    expect_text(log, "resumed at step 20");

    /* mid-epoch, another order of the samples would repeat some and skip
     * others: refused, naming the field and both values; another batch
     * size takes the rest of the epoch as it is */
    assert_int_equal(resume_with("metrics-seed", log, sizeof log, job, dir, 26, "--set seed=7 --set "
                                 "optimizer.kind=adam"), 1);
    char want[700];
    snprintf(want, sizeof want, "seed: 7, but checkpoint %s/checkpoints/step-24 was trained with 1 and stopped "
             "inside epoch 0 (1536 samples of it used, in that order)", dir);
    expect_text(log, want);
    assert_int_equal(resume_with("metrics-split", log, sizeof log, job, dir, 26, "--set data.val_fraction=0.2 --set "
                                 "optimizer.kind=adam"), 1);
    expect_text(log, "data.val_fraction: 0.2, but checkpoint");
    assert_int_equal(resume_with("metrics-batch", log, sizeof log, job, dir, 26, "--set train.batch_size=32 --set "
                                 "optimizer.kind=adam"), 0);
    expect_text(log, "resumed at step 24");

    /* --resume in a folder without checkpoints trains from the start, and says so */
    snprintf(dir, sizeof dir, "%s/metrics-none", base);
    assert_int_equal(run("metrics-none", log, sizeof log, MLP_JOB " --set steps=2 --run-dir %s --resume", dir), 0);
    snprintf(ck, sizeof ck, "--resume: no checkpoint in %s/checkpoints: training from the start", dir);
    expect_text(log, ck);
}

/* train.epochs whose epoch is shorter than one step of train.accum_steps
 * batches: refused naming the fields, by a local run and by a cluster
 * (which would otherwise run a job of no set length, never ending). */
static void test_epoch_shorter_than_a_step(void **state) {
    (void)state;
    char log[16384], dir[300];
    snprintf(dir, sizeof dir, "%s/short-epoch", base);
    const char *job = MLP_JOB " --set train.epochs=1 --set train.batch_size=20000 --set train.accum_steps=3";
    const char *want = "train.epochs 1: an epoch of 54000 samples gives 1 batches of train.batch_size 20000 per "
                       "worker, fewer than one step of train.accum_steps 3 batches";
    assert_int_equal(run("short-epoch-ps", log, sizeof log, "%s --set parallel.strategy=ps --set parallel.workers=2 "
                         "--set parallel.servers=1 --run-dir %s", job, dir), 2);
    expect_text(log, want);
    assert_int_equal(run("short-epoch-local", log, sizeof log, "%s --run-dir %s", job, dir), 1);
    expect_text(log, "an epoch of 54000 samples gives 2 batches");
}

/* data.val_fraction 0 trains on every sample: no validation evaluations,
 * said once; a text job (which has no test set) runs too, and an MLP still
 * takes its test evaluation. */
static void test_no_validation_part(void **state) {
    (void)state;
    char log[16384], dir[300];
    snprintf(dir, sizeof dir, "%s/no-val-gpt", base);
    assert_int_equal(run("no-val-gpt", log, sizeof log, "examples/gpt_fortunes.json --set data.val_fraction=0 "
                         "--set steps=4 --set schedule.warmup_steps=1 --set train.eval_every=2 --set model.n_layer=1 "
                         "--run-dir %s", dir), 0);
    expect_text(log, "no validation part (data.val_fraction 0): no validation evaluations");
    if (strstr(log, "eval val")) fail_msg("a validation evaluation ran without validation data:\n%s", log);
    snprintf(dir, sizeof dir, "%s/no-val-mlp", base);
    assert_int_equal(run("no-val-mlp", log, sizeof log, MLP_JOB " --set data.val_fraction=0 --set steps=4 "
                         "--set train.eval_every=2 --run-dir %s", dir), 0);
    expect_text(log, "eval test at step 4");
    if (strstr(log, "eval val")) fail_msg("a validation evaluation ran without validation data:\n%s", log);
}

/* A CNN of 3.8e9 parameters is refused before it is built, with the
 * estimate and the memory available, by tessera-run and tessera-worker;
 * --force tries anyway (under a 4 GB address-space limit here, so the
 * allocation fails instead of the OOM killer ending the machine's jobs). */
static void test_model_too_big(void **state) {
    (void)state;
    char log[16384], dir[300];
    snprintf(dir, sizeof dir, "%s/big", base);
    const char *huge = "examples/cnn_fashion.json --set model.ch1=4096 --set model.ch2=4096 --set model.kernel=15";
    /* at batch 2^20 its activations alone exceed any machine's memory */
    assert_int_equal(run("big", log, sizeof log, "%s --set train.batch_size=1048576 --run-dir %s", huge, dir), 1);
    expect_text(log, "model: cnn of 3.78e+09 parameters needs about ");
    expect_text(log, "(parameters 14.07 GiB, gradients 14.07 GiB, optimizer state 28.15 GiB, activations ");
    expect_text(log, "GiB at train.batch_size 1048576, data set 262.3 MiB) but ");
    expect_text(log, " are available (");
    expect_text(log, "or pass --force to try anyway");
    assert_int_equal(run_prog("", "tessera-worker", "big-worker", log, sizeof log,
                              "%s --set train.batch_size=1048576 --run-dir %s", huge, dir), 1);
    expect_text(log, "model: cnn of 3.78e+09 parameters needs about ");
    assert_int_equal(run_prog("ulimit -v 4000000;", "tessera-run", "big-force", log, sizeof log,
                              "%s --run-dir %s --force", huge, dir), 1);
    assert_null(strstr(log, "needs about"));
    expect_text(log, "out of memory");
    /* a cluster's --force reaches its workers */
    assert_int_equal(run_prog("ulimit -v 4000000;", "tessera-run", "big-force-ddp", log, sizeof log,
                              "%s --set parallel.strategy=ddp --run-dir %s-ddp --force", huge, dir), 1);
    assert_null(strstr(log, "needs about"));
    expect_text(log, "out of memory");
}

/* A full disk under metrics.jsonl (here the file is /dev/full) fails the
 * run at its first line, naming the file, instead of training on with the
 * steps' record lost without a word (and a half line left in it). */
static void test_metrics_disk_full(void **state) {
    (void)state;
    static char log[16384];
    char dir[300], path[400];
    full_file_case("full", "metrics.jsonl", dir, path);
    assert_int_equal(run("full", log, sizeof log, "%s --set steps=20 --run-dir %s", MLP_JOB, dir), 1);
    expect_text(log, "metrics: cannot write ");
    expect_text(log, "/full/metrics.jsonl: No space left on device");
}

/* Messages that name the file or the field (issue 11, item 8). */
static void test_messages_name_the_thing(void **state) {
    (void)state;
    char log[16384], path[400];
    assert_int_equal(run("msg-missing", log, sizeof log, "%s/no-such-job.json", base), 2);
    snprintf(path, sizeof path, "job file %s/no-such-job.json: cannot open: No such file", base);
    expect_text(log, path);

    assert_int_equal(run("msg-folder", log, sizeof log, "%s", base), 2);
    snprintf(path, sizeof path, "job file %s is not a regular file (a folder)", base);
    expect_text(log, path);

    assert_int_equal(run("msg-lr", log, sizeof log, MLP_JOB " --set optimizer.lr=1e999"), 2);
    expect_text(log, "optimizer.lr: 1e999 out of range");
    assert_int_equal(run("msg-steps", log, sizeof log, MLP_JOB " --set steps=1e20"), 2);
    expect_text(log, "steps: 1e+20 out of range [0, 9223372036854775807]");
    assert_int_equal(run("msg-steps-int", log, sizeof log, MLP_JOB " --set steps=100000000000000000000"), 2);
    expect_text(log, "steps: 1e+20 out of range [0, 9223372036854775807]");

    char run_dir[300];
    snprintf(run_dir, sizeof run_dir, "%s/msg-run", base);
    assert_int_equal(run("msg-val", log, sizeof log, MLP_JOB " --set steps=4 --set data.val_fraction=0.99999 "
                         "--run-dir %s", run_dir), 1);
    expect_text(log, "data.val_fraction 0.99999");

    snprintf(path, sizeof path, "%s/short.txt", base);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("a corpus shorter than a block\n", f);
    fclose(f);
    assert_int_equal(run("msg-short", log, sizeof log, "examples/gpt_fortunes.json --set data.path=%s "
                         "--set model.block_size=64 --run-dir %s", path, run_dir), 1);
    char want[500];
    snprintf(want, sizeof want, "data.path %s,", path);
    expect_text(log, want);
    expect_text(log, "model.block_size 64");

    /* a --run-dir that is a file: refused naming it, by the local run and
     * by a cluster, whose message says it once (no "tessera-run: " twice) */
    assert_int_equal(run("msg-run-file-local", log, sizeof log, MLP_JOB " --set steps=2 --run-dir %s", path), 1);
    snprintf(want, sizeof want, "run folder %s: exists and is not a folder", path);
    expect_text(log, want);
    assert_int_equal(run("msg-run-file-ddp", log, sizeof log, MLP_JOB " --set steps=2 --set parallel.strategy=ddp "
                         "--run-dir %s", path), 1);
    expect_text(log, want);
    if (strstr(log, "tessera-run: tessera-run")) fail_msg("doubled prefix in:\n%s", log);

    /* a run folder another process holds (its .lock) is refused naming the
     * process, by a local run, tessera-worker and a cluster; free again, it runs */
    snprintf(run_dir, sizeof run_dir, "%s/msg-busy", base);
    assert_int_equal(mkdir(run_dir, 0755), 0);
    snprintf(path, sizeof path, "%s/.lock", run_dir);
    int lock = open(path, O_RDWR | O_CREAT, 0644);
    assert_true(lock >= 0);
    assert_int_equal(flock(lock, LOCK_EX), 0);
    assert_int_equal(write(lock, "4242\n", 5), 5);
    snprintf(want, sizeof want, "run folder %s is in use by process 4242", run_dir);
    assert_int_equal(run("msg-busy-local", log, sizeof log, MLP_JOB " --set steps=2 --run-dir %s", run_dir), 1);
    expect_text(log, want);
    assert_int_equal(run_prog("", "tessera-worker", "msg-busy-worker", log, sizeof log, MLP_JOB " --set steps=2 "
                              "--run-dir %s", run_dir), 1);
    expect_text(log, want);
    assert_int_equal(run("msg-busy-ddp", log, sizeof log, MLP_JOB " --set steps=2 --set parallel.strategy=ddp "
                         "--run-dir %s", run_dir), 1);
    expect_text(log, want);
    close(lock);
    assert_int_equal(run("msg-busy-free", log, sizeof log, MLP_JOB " --set steps=2 --run-dir %s", run_dir), 0);
}

/* "device" names a device kind; a job on a GPU where there is none (or in
 * a build without CUDA) stops with the reason, not a crash. */
static void test_device_messages(void **state) {
    (void)state;
    static char log[16384];
    assert_int_equal(run("dev-name", log, sizeof log, MLP_JOB " --set device=gpu"), 2);
    expect_text(log, "device: \"gpu\" is not one of: cpu, cuda");
    int code = run("dev-cuda", log, sizeof log, MLP_JOB " --set steps=2 --set device=cuda --run-dir %s/dev", base);
    if (code == 0) {
        print_message("a CUDA device is present: tests/gpu covers device jobs\n");
        return;
    }
    assert_int_equal(code, 1);
    expect_text(log, "model: moving");
    assert_true(strstr(log, "cuda:0: no CUDA device") || strstr(log, "no kernels for device cuda:0 in this build"));
}

/* --generate's numbers are checked as the command line is read: a
 * negative, partial or out-of-range count, temperature, top-k or seed
 * exits 2 naming the flag and the value. */
static void test_generate_numbers(void **state) {
    (void)state;
    static char log[16384];
    const char *bad[][2] = {{"--tokens", "-10"},     {"--tokens", "10x"}, {"--tokens", "99999999999"},
                            {"--top-k", "-1"},       {"--top-k", ""},     {"--temperature", "hot"},
                            {"--temperature", "0"},  {"--temperature", "inf"}, {"--seed", "-1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(run("gen-number", log, sizeof log, "--generate %s/none --prompt x %s='%s'", base, bad[i][0],
                             bad[i][1]), 2);
        char want[64];
        snprintf(want, sizeof want, "%s: \"%s\"", bad[i][0], bad[i][1]);
        expect_text(log, want);
    }
}

/* --consolidate of a checkpoint named with a trailing slash writes beside
 * it (checkpoints/consolidated) as without the slash, not into the working
 * folder. */
static void test_consolidate_trailing_slash(void **state) {
    (void)state;
    static char log[16384];
    char dir[300], path[500], prefix[300];
    snprintf(dir, sizeof dir, "%s/cons", base);
    assert_int_equal(run("cons-train", log, sizeof log, MLP_JOB " --set steps=4 --run-dir %s", dir), 0);
    snprintf(prefix, sizeof prefix, "cd %s &&", base);
    assert_int_equal(run_prog(prefix, "tessera-run", "cons", log, sizeof log, "--consolidate cons/checkpoints/step-4/"), 0);
    snprintf(path, sizeof path, "%s/checkpoints/consolidated/step-4/state.json", dir);
    if (access(path, F_OK) != 0) fail_msg("no %s:\n%s", path, log);
    snprintf(path, sizeof path, "%s/consolidated", base);
    assert_int_not_equal(access(path, F_OK), 0);
}

/* Entries of folder dir other than . and .. */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* --plot of a folder without metrics.jsonl, of one whose metrics.jsonl
 * holds nothing to draw, or is not a regular file (a link to /dev/zero:
 * once read for ever), exits 1 and leaves the folder as it was: no data
 * files behind, an earlier metrics.png untouched. */
static void test_plot_leaves_nothing(void **state) {
    (void)state;
    static char log[16384];
    char dir[300], path[400], png[400];
    snprintf(dir, sizeof dir, "%s/plot", base);
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(run("plot-none", log, sizeof log, "--plot %s", dir), 1);
    expect_text(log, "metrics.jsonl");
    assert_int_equal(count_entries(dir), 0);

    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    write_text(path, "not a metrics line\n");
    snprintf(png, sizeof png, "%s/metrics.png", dir);
    write_text(png, "the earlier chart");
    assert_int_equal(run("plot-no-steps", log, sizeof log, "--plot %s", dir), 1);
    expect_text(log, "metrics.jsonl");
    assert_int_equal(count_entries(dir), 2);
    expect_file(png, "the earlier chart");

    assert_int_equal(remove(path), 0);
    assert_int_equal(symlink("/dev/zero", path), 0);
    assert_int_equal(run("plot-dev-zero", log, sizeof log, "--plot %s", dir), 1);
    expect_text(log, "is not a regular file");
    assert_int_equal(count_entries(dir), 2);
}

/* A small job of the local cluster: one ps, one stand-in worker, 3 steps. */
#define STANDIN_JOB "examples/standin.json --set steps=3 --set parallel.workers=1 --set parallel.servers=1 " \
                    "--set parallel.min_workers=1 --set parallel.max_workers=1 --set standin.step_ms=0"
/* A disk as good as full: files are cut at 512 bytes (EFBIG, not a signal). */
#define DISK_FULL "trap '' XFSZ; ulimit -f 1;"

/* A cluster's job.json that cannot be written whole (a full disk) fails
 * the start naming the file and the reason; a job.json the folder held
 * stays whole and no temp file is left beside it. */
static void test_job_file_disk_full(void **state) {
    (void)state;
    static char log[16384];
    char dir[300], path[400];
    case_dir("job-full", "job.json", dir, path);
    write_text(path, "{\"name\": \"earlier\"}\n");
    assert_int_equal(run_prog(DISK_FULL, "tessera-run", "job-full", log, sizeof log, "%s --run-dir %s", STANDIN_JOB,
                              dir), 1);
    expect_text(log, "/job-full/job.json: File too large");
    expect_file(path, "{\"name\": \"earlier\"}\n");
    assert_int_equal(count_entries(dir), 2); /* job.json and .lock */
}

/* A cluster.log that cannot be made (a folder is in its place) is said,
 * naming it; the job trains on. */
static void test_cluster_log_unwritable(void **state) {
    (void)state;
    static char log[16384];
    char dir[300], path[400];
    case_dir("log-dir", "cluster.log", dir, path);
    assert_int_equal(mkdir(path, 0777), 0);
    assert_int_equal(run("log-dir", log, sizeof log, "%s --run-dir %s", STANDIN_JOB, dir), 0);
    expect_text(log, "[run] cannot write ");
    expect_text(log, "/log-dir/cluster.log: Is a directory");
}

/* A cluster.log whose writes fail once the job runs (a full disk: it is
 * /dev/full) is said once, naming it and the reason; the job trains on. */
static void test_cluster_log_write_fails(void **state) {
    (void)state;
    static char log[16384];
    char dir[300], path[400];
    full_file_case("log-full", "cluster.log", dir, path);
    assert_int_equal(run("log-full", log, sizeof log, "%s --run-dir %s", STANDIN_JOB, dir), 0);
    expect_text(log, "/log-full/cluster.log: No space left on device; later lines are not kept there");
    const char *first = strstr(log, "[run] cannot write ");
    if (strstr(first + 1, "[run] cannot write ")) fail_msg("the failing log was reported more than once:\n%s", log);
}

/* --plot whose data files cannot be written whole (a full disk) exits 1
 * naming the file, and draws no truncated chart over the earlier one. */
static void test_plot_disk_full(void **state) {
    (void)state;
    static char log[16384];
    char dir[300], path[400], png[400];
    case_dir("plot-full", "metrics.jsonl", dir, path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 1; i <= 300; i++) fprintf(f, "{\"kind\": \"step\", \"step\": %d, \"loss\": %g}\n", i, 2.0 / i);
    assert_int_equal(fclose(f), 0);
    snprintf(png, sizeof png, "%s/metrics.png", dir);
    write_text(png, "the earlier chart");
    assert_int_equal(run_prog(DISK_FULL, "tessera-run", "plot-full", log, sizeof log, "--plot %s", dir), 1);
    expect_text(log, "/plot-full/plot-steps.dat: File too large");
    expect_file(png, "the earlier chart");
    assert_int_equal(count_entries(dir), 2);
}

int main(void) {
    if (tu_make_tmp_dir(base, sizeof base, "tessera-misuse")) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_file_not_regular),
        cmocka_unit_test(test_resume_keeps_each_step_once),
        cmocka_unit_test(test_epoch_shorter_than_a_step),
        cmocka_unit_test(test_no_validation_part),
        cmocka_unit_test(test_model_too_big),
        cmocka_unit_test(test_messages_name_the_thing),
        cmocka_unit_test(test_device_messages),
        cmocka_unit_test(test_generate_numbers),
        cmocka_unit_test(test_consolidate_trailing_slash),
        cmocka_unit_test(test_plot_leaves_nothing),
        cmocka_unit_test(test_metrics_disk_full),
        cmocka_unit_test(test_job_file_disk_full),
        cmocka_unit_test(test_cluster_log_unwritable),
        cmocka_unit_test(test_cluster_log_write_fails),
        cmocka_unit_test(test_plot_disk_full),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) tu_remove_dir(base);
    return rc;
}
