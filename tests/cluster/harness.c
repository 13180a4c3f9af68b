/* harness.c - process helpers for the cluster tests. */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmp_dir[256];
static pid_t started[64];
static int nstarted;

double th_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

const char *th_init(void) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/tessera-cluster-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    return tmp_dir;
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void th_finish(int keep) {
    if (keep)
        fprintf(stderr, "harness: outputs kept in %s\n", tmp_dir);
    else
        nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *th_path(const char *name) {
    static char slots[64][4096];
    static int next;
    char *p = slots[next++ % 64];
    snprintf(p, 4096, "%s/%s", tmp_dir, name);
    return p;
}

const char *th_write(const char *name, const char *text) {
    const char *path = th_path(name);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    return path;
}

th_proc th_start(const char *tag, const char *const *argv) {
    th_proc p;
    memset(&p, 0, sizeof p);
    p.status = -1;
    char name[256];
    snprintf(name, sizeof name, "%s.out", tag);
    snprintf(p.out, sizeof p.out, "%s", th_path(name));
    char prog[4096];
    const char *bin = getenv("TESSERA_BIN_DIR");
    if (strncmp(argv[0], "tessera-", 8) == 0 && bin)
        snprintf(prog, sizeof prog, "%s/%s", bin, argv[0]);
    else
        snprintf(prog, sizeof prog, "%s", argv[0]);
    fflush(NULL);
    p.pid = fork();
    if (p.pid == 0) {
        setpgid(0, 0);
        int fd = open(p.out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execvp(prog, (char *const *)argv);
        dprintf(2, "exec %s failed\n", prog);
        _exit(127);
    }
    if (nstarted < 64) started[nstarted++] = p.pid;
    return p;
}

/* Exit code of a wait status: code, or 128 + signal. */
static int decode(int ws) {
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

int th_wait(th_proc *p, int timeout_ms) {
    if (p->status >= 0) return p->status;
    double end = th_now_ms() + timeout_ms;
    int ws;
    while (th_now_ms() < end) {
        pid_t r = waitpid(p->pid, &ws, WNOHANG);
        if (r == p->pid) return p->status = decode(ws);
        sleep_ms(20);
    }
    fprintf(stderr, "harness: pid %d did not exit within %d ms; killing it\n",
            (int)p->pid, timeout_ms);
    kill(-p->pid, SIGKILL);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &ws, 0);
    p->status = decode(ws);
    return -1;
}

char *th_output(const th_proc *p) {
    FILE *f = fopen(p->out, "rb");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

int th_count(const th_proc *p, const char *needle) {
    char *text = th_output(p);
    int n = 0;
    for (const char *s = text; (s = strstr(s, needle)); s += strlen(needle)) n++;
    free(text);
    return n;
}

int th_wait_count(const th_proc *p, const char *needle, int n, int timeout_ms) {
    double end = th_now_ms() + timeout_ms;
    do {
        if (th_count(p, needle) >= n) return 0;
        sleep_ms(20);
    } while (th_now_ms() < end);
    return -1;
}

int th_wait_for(const th_proc *p, const char *needle, int timeout_ms) {
    return th_wait_count(p, needle, 1, timeout_ms);
}

/* Parent pid and command name of pid from /proc; 0 on success. */
static int proc_info(pid_t pid, pid_t *ppid, char *comm, size_t cap) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    if (!l || !r || r < l) return -1;
    size_t len = (size_t)(r - l - 1) < cap - 1 ? (size_t)(r - l - 1) : cap - 1;
    memcpy(comm, l + 1, len);
    comm[len] = '\0';
    char state;
    int pp;
    if (sscanf(r + 2, "%c %d", &state, &pp) != 2) return -1;
    *ppid = pp;
    return state == 'Z' ? 1 : 0;
}

/* Pids (sorted) of the children of parent, only those named comm if given. */
static int scan_children(pid_t parent, pid_t *out, int cap, const char *comm) {
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        pid_t pp;
        char c[64];
        if (pid <= 0 || proc_info(pid, &pp, c, sizeof c) < 0 || pp != parent) continue;
        if (comm && strncmp(c, comm, 15) != 0) continue; /* comm is 15 chars */
        if (n < cap) out[n++] = pid;
    }
    if (d) closedir(d);
    for (int i = 1; i < n; i++) /* by pid */
        for (int j = i; j > 0 && out[j] < out[j - 1]; j--) {
            pid_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

pid_t th_child(pid_t parent, const char *comm, int nth) {
    pid_t kids[256];
    int n = scan_children(parent, kids, 256, comm);
    return nth < n ? kids[nth] : -1;
}

int th_losses(const char *run_dir, double *loss, int max) {
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    int last = 0;
    for (int i = 0; i <= max; i++) loss[i] = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        int step;
        double l;
        if (sscanf(line, "{\"kind\":\"step\",\"step\":%d,\"loss\":%lf", &step, &l) == 2 && step >= 1 &&
            step <= max) {
            loss[step] = l;
            if (step > last) last = step;
        }
    }
    fclose(f);
    return last;
}

void th_expect_steps_once(const char *run_dir, int steps) {
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("no %s", path);
    int last = 0, step;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "{\"kind\":\"step\",\"step\":%d,", &step) != 1) continue;
        if (step != last + 1) {
            fclose(f);
            fail_msg("%s: step %d logged after step %d", path, step, last);
        }
        last = step;
    }
    fclose(f);
    if (last != steps) fail_msg("%s: the last step logged is %d, not %d", path, last, steps);
}

double th_peak_mib(const char *run_dir) {
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    double peak = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        const char *at = strncmp(line, "{\"kind\":\"step\",", 15) ? NULL : strstr(line, "\"peak_bytes\":");
        double b;
        if (at && sscanf(at, "\"peak_bytes\":%lf", &b) == 1 && b / (1 << 20) > peak) peak = b / (1 << 20);
    }
    fclose(f);
    return peak;
}

int th_leftovers(void) {
    sleep_ms(500);
    pid_t kids[256];
    int n = scan_children(getpid(), kids, 256, NULL), left = 0;
    for (int i = 0; i < n; i++) {
        int ours = 0;
        for (int j = 0; j < nstarted; j++) ours |= started[j] == kids[i];
        if (ours) continue;
        char c[64];
        pid_t pp;
        proc_info(kids[i], &pp, c, sizeof c);
        fprintf(stderr, "harness: left behind: pid %d (%s)\n", (int)kids[i], c);
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
        left++;
    }
    return left;
}

int th_read_line(const char *path, char *out, size_t cap, int timeout_ms) {
    double end = th_now_ms() + timeout_ms;
    do {
        FILE *f = fopen(path, "r");
        if (f) {
            int ok = fgets(out, (int)cap, f) != NULL;
            fclose(f);
            if (ok) {
                out[strcspn(out, "\n")] = '\0';
                return 0;
            }
        }
        sleep_ms(20);
    } while (th_now_ms() < end);
    return -1;
}

void th_dump(const th_proc *p, const char *why) {
    char *text = th_output(p);
    fprintf(stderr, "---- %s ----\n%s---- end ----\n", p->out, text);
    free(text);
    fail_msg("%s", why);
}

void th_expect_output(const th_proc *p, const char *needle, int timeout_ms) {
    if (th_wait_for(p, needle, timeout_ms) != 0) {
        char why[512];
        snprintf(why, sizeof why, "no \"%s\" in the output within %d ms", needle, timeout_ms);
        th_dump(p, why);
    }
}

int th_joined_worker(const th_proc *p, int nth, pid_t *pid) {
    char *text = th_output(p);
    const char *needle = "[run] worker rank ";
    int rank = -1, k = 0;
    for (const char *s = text; (s = strstr(s, needle)); s += strlen(needle), k++) {
        int r, q;
        if (k == nth && sscanf(s + strlen(needle), "%d is pid %d", &r, &q) == 2) {
            rank = r;
            *pid = (pid_t)q;
        }
    }
    free(text);
    return rank;
}

pid_t th_scheduler_pid(const th_proc *run) {
    char *text = th_output(run);
    const char *s = strstr(text, "[run] scheduler is pid ");
    pid_t pid = s ? (pid_t)atoi(s + strlen("[run] scheduler is pid ")) : -1;
    free(text);
    return pid;
}

/* ---- training jobs ---- */

const char *th_job_file(const char *name, const char *arch, int steps, int batch, int accum, const char *parallel) {
    char text[4096], model[512];
    bool wide = strstr(arch, "-wide") != NULL;
    if (strncmp(arch, "gpt", 3) == 0)
        snprintf(model, sizeof model,
                 "\"model\": {\"arch\": \"gpt\", \"n_layer\": %d, \"n_head\": 2, \"n_embd\": %d, \"block_size\": 16, "
                 "\"dropout\": %s, \"checkpoint\": %s}, \"data\": {\"kind\": \"text\", \"val_fraction\": 0.05}, "
                 "\"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.003, \"clip_norm\": 0.5}",
                 wide ? 8 : 2, wide ? 256 : 32, strcmp(arch, "gpt-dropout") == 0 ? "0.1" : "0.0",
                 strcmp(arch, "gpt-ckpt") == 0 ? "true" : "false");
    else if (strcmp(arch, "cnn") == 0)
        snprintf(model, sizeof model,
                 "\"model\": {\"arch\": \"cnn\"}, \"data\": {\"kind\": \"fashion_mnist\"}, "
                 "\"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.002, \"clip_norm\": 1.0}");
    else
        snprintf(model, sizeof model,
                 "\"model\": {\"arch\": \"mlp\", \"hidden\": %s}, \"data\": {\"kind\": \"fashion_mnist\"}, "
                 "\"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.002}",
                 strcmp(arch, "mlp-wide") == 0 ? "[512, 512, 512]" : "[64, 48, 32]");
    snprintf(text, sizeof text,
             "{\"name\": \"%s\", \"seed\": 5, \"steps\": %d, %s,\n"
             " \"schedule\": {\"kind\": \"constant\"},\n"
             " \"train\": {\"batch_size\": %d, \"accum_steps\": %d, \"log_every\": 1, \"eval_every\": 0, "
             "\"eval_batches\": 4, \"checkpoint_every\": 10%s},\n"
             " \"parallel\": {%s}}\n",
             name, steps, model, batch, accum, strstr(arch, "bf16") ? ", \"precision\": \"bf16\"" : "", parallel);
    char file[128];
    snprintf(file, sizeof file, "%s.json", name);
    return th_write(file, text);
}

void th_kill_in_eval(const char *name, const char *strategy, const char *parallel_extra) {
    char text[4096], file[128];
    snprintf(text, sizeof text,
             "{\"name\": \"%s\", \"seed\": 5, \"steps\": 40,\n"
             " \"model\": {\"arch\": \"mlp\", \"hidden\": [1024, 1024]},\n"
             " \"data\": {\"kind\": \"fashion_mnist\", \"val_fraction\": 0.3},\n"
             " \"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.001}, \"schedule\": {\"kind\": \"constant\"},\n"
             " \"train\": {\"batch_size\": 32, \"log_every\": 1, \"eval_every\": 20, \"eval_batches\": 0, "
             "\"checkpoint_every\": 10},\n"
             " \"parallel\": {\"strategy\": \"%s\", \"workers\": 4, \"min_workers\": 2, \"heartbeat_ms\": 100, "
             "\"heartbeat_timeout_ms\": 3000%s}}\n",
             name, strategy, parallel_extra);
    snprintf(file, sizeof file, "%s.json", name);
    const char *job = th_write(file, text);
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path(name), NULL};
    th_proc run = th_start(name, argv);
    if (th_wait_count(&run, "joined rank=", 4, 60000) != 0) th_dump(&run, "not 4 workers joined");
    /* the leader logs step 20 once every worker has finished it, and then evaluates */
    if (th_wait_for(&run, "step 20/40", 120000) != 0) th_dump(&run, "no step 20");
    pid_t victim = -1;
    if (th_joined_worker(&run, 2, &victim) < 0) th_dump(&run, "no third worker's pid");
    kill(victim, SIGKILL);
    if (th_wait_for(&run, "world size 4 -> 3 workers", 30000) != 0) th_dump(&run, "no new generation of 3");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after losing a worker in evaluation");
    if (th_count(&run, "evaluation at step 20 abandoned") < 1) th_dump(&run, "no survivor abandoned the evaluation");
    if (th_count(&run, "eval test at step 40") < 1) th_dump(&run, "no final evaluation");
    /* every evaluation logged scored the whole set (val_fraction 0.3 of
     * 60000 samples; 10000 test samples), none the survivors' part alone */
    if (th_count(&run, "eval val at step") != th_count(&run, "% (18000 samples)") ||
        th_count(&run, "eval test at step") != th_count(&run, "% (10000 samples)"))
        th_dump(&run, "an evaluation logged did not score the whole set");
    if (th_count(&run, "goes back") > 0) th_dump(&run, "the scheduler refused the steps of a job that moved back");
}

void th_interrupt_resume(const char *name, int steps, int batch, const char *parallel, int at) {
    char whole[160];
    snprintf(whole, sizeof whole, "%s-whole", name);
    double *want = calloc((size_t)steps + 1, sizeof *want), *got = calloc((size_t)steps + 1, sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    th_run_job(whole, "mlp", steps, batch, 1, parallel, false, want);

    const char *job = th_job_file(name, "mlp", steps, batch, 1, parallel);
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_proc run = th_start(name, argv);
    char needle[64];
    snprintf(needle, sizeof needle, "] step %d/%d ", at, steps);
    if (th_wait_for(&run, needle, 120000) != 0) th_dump(&run, "the job did not reach the step to interrupt");
    kill(run.pid, SIGINT);
    if (th_wait(&run, 60000) != 128 + SIGINT) th_dump(&run, "tessera-run did not exit 128 + SIGINT");
    if (th_count(&run, "its workers stopped and saved a checkpoint") != 1) th_dump(&run, "the job did not stop");
    char *out = th_output(&run);
    const char *said = strstr(out, "job stopped by SIGINT after step ");
    int stopped = said ? atoi(said + strlen("job stopped by SIGINT after step ")) : -1;
    free(out);
    if (stopped <= at || stopped >= steps) th_dump(&run, "the scheduler did not say after which step the job stopped");
    /* nothing lost: the last step logged is the one saved */
    if (th_losses(dir, got, steps) != stopped) th_dump(&run, "the metrics go on past the step the job stopped at");
    char ckpt[4300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-%d", dir, stopped);
    if (access(ckpt, F_OK) != 0) th_dump(&run, "no checkpoint of the step the job stopped at");
    if (strstr(parallel, "\"ps\"")) {
        snprintf(ckpt, sizeof ckpt, "%s/ps/shard-0/step-%d", dir, stopped);
        if (access(ckpt, F_OK) != 0) th_dump(&run, "no shard checkpoint of the step the job stopped at");
    }

    char tag[160];
    snprintf(tag, sizeof tag, "%s-resumed", name);
    const char *again[] = {"tessera-run", job, "--run-dir", dir, "--resume", NULL};
    th_run_losses(tag, again, dir, got, steps);
    th_expect_steps_once(dir, steps);
    th_expect_same(got, want, 1, steps, "interrupted and resumed");
    free(want);
    free(got);
}

void th_fault_logs_every_step(const char *name, int steps, const char *parallel, const char *fault, int k,
                              const char *says) {
    char whole[160];
    snprintf(whole, sizeof whole, "%s-whole", name);
    double *want = calloc((size_t)steps + 1, sizeof *want), *got = calloc((size_t)steps + 1, sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    th_run_job(whole, "mlp", k, 16, 1, parallel, false, want);

    char faulty[1024];
    snprintf(faulty, sizeof faulty, "%s, \"min_workers\": 2, \"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 5000",
             parallel);
    const char *job = th_job_file(name, "mlp", steps, 16, 1, faulty);
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    setenv("TESSERA_FAULT", fault, 1);
    th_proc run = th_start(name, argv);
    unsetenv("TESSERA_FAULT");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after the fault");
    if (th_count(&run, says) < 1) th_dump(&run, "the fault did not happen as it should");
    /* a ps job's servers join first: its workers' generation comes later */
    bool began = strstr(parallel, "\"ps\"") ? th_count(&run, " servers, 4 workers [") >= 1
                                            : th_count(&run, "generation 1 at step -1: 0 servers, 4 workers") == 1;
    if (!began) th_dump(&run, "the job began without 4");
    th_expect_steps_once(dir, steps);
    th_losses(dir, got, steps);
    th_expect_same(got, want, 1, k, "the steps up to the fault, against a run without it");
    free(want);
    free(got);
}

double th_eval_accuracy(const char *run, int step) {
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-%d", run, step);
    const char *argv[] = {"tessera-run", "--eval", ckpt, NULL};
    th_proc p = th_start("eval", argv);
    if (th_wait(&p, 60000) != 0) th_dump(&p, "tessera-run --eval failed");
    char *text = th_output(&p);
    const char *a = strstr(text, "accuracy ");
    double acc = a ? atof(a + 9) : -1;
    free(text);
    if (acc < 0) th_dump(&p, "no accuracy in the evaluation");
    return acc;
}

/* The test accuracy (%) run/metrics.jsonl gives for step, -1 when it
 * has no test pass there. */
static double logged_test_accuracy(const char *run, int step) {
    char path[4200], line[1024], want[64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    snprintf(want, sizeof want, "\"split\":\"test\",\"step\":%d,", step);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double acc = -1;
    while (fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "\"accuracy\":");
        if (strstr(line, want) && a) acc = 100 * atof(a + 11);
    }
    fclose(f);
    return acc;
}

void th_expect_end_written(const char *run, int steps) {
    th_expect_steps_once(run, steps);
    double logged = logged_test_accuracy(run, steps), eval = th_eval_accuracy(run, steps);
    if (logged < 0) fail_msg("%s: metrics.jsonl has no test pass at step %d", run, steps);
    if (logged - eval > 0.006 || eval - logged > 0.006)
        fail_msg("%s: the test pass at step %d logged %.2f%%, --eval of its checkpoint gives %.2f%%", run, steps,
                 logged, eval);
}

th_proc th_start_joiner(const char *tag, const char *job, const char *dir, const char *const *more) {
    char addr[256], key[4200], addr_file[4200];
    snprintf(addr_file, sizeof addr_file, "%s/scheduler.addr", dir);
    snprintf(key, sizeof key, "%s/job.key", dir);
    assert_int_equal(th_read_line(addr_file, addr, sizeof addr, 2000), 0);
    const char *argv[16] = {"tessera-run", "--join", addr, "--key-file", key, job};
    for (int i = 0; more && more[i] && i < 8; i++) argv[6 + i] = more[i];
    return th_start(tag, argv);
}

/* Fails unless the scheduler ended the job (SHUTDOWN) after the final
 * evaluation: a job that ended while its workers evaluated has them
 * stopped, and killed when the evaluation and the final checkpoint take
 * longer than tessera-run's grace. */
static void expect_end_after_eval(const th_proc *p) {
    char *text = th_output(p);
    const char *end = strstr(text, "SHUTDOWN (code 0)"), *eval = NULL;
    for (const char *at = text; (at = strstr(at, "eval test at step")); at++) eval = at;
    bool early = end && eval && eval > end;
    free(text);
    if (early) th_dump(p, "the job ended before its final evaluation was over");
}

void th_run_losses(const char *tag, const char *const *argv, const char *run_dir, double *loss, int steps) {
    th_proc p = th_start(tag, argv);
    if (th_wait(&p, 240000) != 0) th_dump(&p, "the run did not exit 0");
    if (th_losses(run_dir, loss, steps) != steps) th_dump(&p, "the run did not log every step");
    expect_end_after_eval(&p);
}

void th_run_job(const char *name, const char *arch, int steps, int batch, int accum, const char *parallel,
                bool resume, double *loss) {
    const char *job = th_job_file(name, arch, steps, batch, accum, parallel);
    const char *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, resume ? "--resume" : NULL, NULL};
    th_run_losses(name, argv, dir, loss, steps);
}

void th_expect_same(const double *got, const double *want, int from, int to, const char *what) {
    for (int s = from; s <= to; s++)
        if (!(fabs(got[s] - want[s]) <= 1e-5 * fabs(want[s])))
            fail_msg("%s: step %d loss %.7f, local %.7f", what, s, got[s], want[s]);
}

void th_copy_run(const char *from, const char *to) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    assert_int_equal(system(cmd), 0);
}

char *th_run_tool(const char *tag, const char *const *argv) {
    th_proc p = th_start(tag, argv);
    if (th_wait(&p, 120000) != 0) th_dump(&p, "the command did not exit 0");
    return th_output(&p);
}

void th_expect_export_whole(const char *tag, const char *ckpt) {
    char whole[4300], whole_ckpt[4400], onnx[2][4300], cmd[9000];
    snprintf(whole, sizeof whole, "%s", th_path(tag));
    snprintf(whole_ckpt, sizeof whole_ckpt, "%s/step-", whole);
    const char *cargv[] = {"tessera-run", "--consolidate", ckpt, "--out", whole, NULL};
    free(th_run_tool(tag, cargv));
    const char *step = strrchr(ckpt, '-'); /* ".../step-<k>" */
    assert_non_null(step);
    strncat(whole_ckpt, step + 1, sizeof whole_ckpt - strlen(whole_ckpt) - 1);
    const char *from[2] = {ckpt, whole_ckpt};
    for (int i = 0; i < 2; i++) {
        snprintf(onnx[i], sizeof onnx[i], "%s-%d.onnx", th_path(tag), i);
        const char *eargv[] = {"tessera-run", "--export-onnx", from[i], "-o", onnx[i], NULL};
        free(th_run_tool(tag, eargv));
    }
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", onnx[0], onnx[1]);
    if (system(cmd) != 0) fail_msg("%s: the ONNX export of %s differs from its consolidated copy's", tag, ckpt);
}

void th_need_mpirun(void) {
    if (system("command -v mpirun > /dev/null 2>&1") != 0) {
        fprintf(stderr, "mpirun not found: skipping the MPI test\n");
        skip();
    }
}

int th_mpirun_status(th_proc *p, int timeout_ms) {
    int rc = th_wait(p, timeout_ms);
    char *text = th_output(p);
    int no_mpi = strstr(text, "no MPI support") != NULL;
    free(text);
    if (no_mpi) {
        fprintf(stderr, "tessera-run built without MPI: skipping the MPI test\n");
        skip();
    }
    return rc;
}

void th_wait_mpirun(th_proc *p, int timeout_ms) {
    if (th_mpirun_status(p, timeout_ms) != 0) th_dump(p, "mpirun of tessera-run --mpi did not exit 0");
}
