/* test_resume.c - a training run stopped by SIGINT or kill -9 after a
 * checkpoint and resumed gives the same losses as one that never stopped;
 * tessera-worker given the job alone trains it to tessera-run's losses;
 * bad job fields are refused by name. Runs the real programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STEPS 120

static char run_base[256];

/* Starts prog (tessera-run, tessera-worker) on the small MLP job in
 * run_dir with extra args. */
static pid_t start_prog(const char *prog, const char *run_dir, const char *extra) {
    const char *bin = getenv("TESSERA_BIN_DIR");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec %s/%s examples/mlp_fashion.json --run-dir %s --set steps=%d --set train.epochs=0 "
             "--set train.batch_size=64 --set train.log_every=1 "
             "--set train.checkpoint_every=8 --set train.eval_every=0 --set train.eval_batches=2 "
             "--set schedule.warmup_steps=4 %s "
             "> %s.log 2>&1",
             bin ? bin : "build/bin", prog, run_dir, STEPS, extra, run_dir);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static pid_t start_run(const char *run_dir, const char *extra) { return start_prog("tessera-run", run_dir, extra); }

static int wait_exit(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Loss of each step in run_dir/metrics.jsonl into loss[step] (0 if absent);
 * returns the highest step seen. */
static int read_losses(const char *run_dir, double *loss) {
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    int last = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        int step;
        double l;
        if (sscanf(line, "{\"kind\":\"step\",\"step\":%d,\"loss\":%lf", &step, &l) == 2 && step <= STEPS) {
            loss[step] = l;
            if (step > last) last = step;
        }
    }
    fclose(f);
    return last;
}

/* Waits until the run has logged at least step `step`. */
static void wait_for_step(const char *run_dir, int step) {
    double loss[STEPS + 1] = {0};
    for (int i = 0; i < 1200 && read_losses(run_dir, loss) < step; i++) usleep(10000);
    assert_true(read_losses(run_dir, loss) >= step);
}

static void reference(double *loss) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/straight", run_base);
    assert_int_equal(wait_exit(start_run(dir, "")), 0);
    assert_int_equal(read_losses(dir, loss), STEPS);
}

static void interrupted(int sig, int after_step, double *loss) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/sig%d", run_base, sig);
    pid_t pid = start_run(dir, "");
    wait_for_step(dir, after_step);
    kill(pid, sig);
    int code = wait_exit(pid);
    assert_true(code != 0);
    double partial[STEPS + 1] = {0};
    assert_true(read_losses(dir, partial) < STEPS);
    assert_int_equal(wait_exit(start_run(dir, "--resume")), 0);
    assert_int_equal(read_losses(dir, loss), STEPS);
}

static void test_sigint_then_resume(void **state) {
    (void)state;
    double a[STEPS + 1] = {0}, b[STEPS + 1] = {0};
    reference(a);
    interrupted(SIGINT, 5, b);
    for (int s = 1; s <= STEPS; s++) assert_true(a[s] == b[s]);
}

static void test_kill9_then_resume(void **state) {
    (void)state;
    double a[STEPS + 1] = {0}, b[STEPS + 1] = {0};
    reference(a);
    interrupted(SIGKILL, 20, b); /* after the checkpoint of step 16 */
    for (int s = 1; s <= STEPS; s++) assert_true(a[s] == b[s]);
}

/* The worker program trains a job alone through the same path. */
static void test_worker_trains_like_run(void **state) {
    (void)state;
    double a[STEPS + 1] = {0}, b[STEPS + 1] = {0};
    reference(a);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/worker", run_base);
    assert_int_equal(wait_exit(start_prog("tessera-worker", dir, "")), 0);
    assert_int_equal(read_losses(dir, b), STEPS);
    for (int s = 1; s <= STEPS; s++) assert_true(a[s] == b[s]);
}

static void test_bf16_tracks_f32(void **state) {
    (void)state;
    double a[STEPS + 1] = {0}, b[STEPS + 1] = {0};
    reference(a);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/bf16", run_base);
    assert_int_equal(wait_exit(start_run(dir, "--set train.precision=bf16")), 0);
    assert_int_equal(read_losses(dir, b), STEPS);
    for (int s = 1; s <= STEPS; s++) assert_true(fabs(a[s] - b[s]) <= 0.05 * a[1]);
    assert_true(b[STEPS] < 0.6 * b[1]);
}

static void test_bad_field_is_named(void **state) {
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/bad", run_base);
    assert_int_equal(wait_exit(start_run(dir, "--set optimizer.lr=fast")), 2);
    char path[400], text[4096] = {0};
    snprintf(path, sizeof path, "%s.log", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    fread(text, 1, sizeof text - 1, f);
    fclose(f);
    assert_non_null(strstr(text, "optimizer.lr: expected number, got string"));
}

int main(void) {
    snprintf(run_base, sizeof run_base, "/tmp/tessera-resume-%d", (int)getpid());
    char cmd[400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", run_base);
    if (system(cmd) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigint_then_resume),
        cmocka_unit_test(test_kill9_then_resume),
        cmocka_unit_test(test_worker_trains_like_run),
        cmocka_unit_test(test_bf16_tracks_f32),
        cmocka_unit_test(test_bad_field_is_named),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", run_base);
    if (system(cmd) != 0) return 1;
    return rc;
}
