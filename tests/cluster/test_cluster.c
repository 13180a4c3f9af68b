/* test_cluster.c - whole jobs of real processes on loopback.
 *
 * Each test starts tessera-run (or mpirun) on a small stand-in job with
 * short timeouts (heartbeat 100 ms) and checks the output, the exit status
 * and that no process is left behind. Run one test by name:
 * cluster_test_cluster <name> (ctest registers one entry per test).
 */
#include <dirent.h>
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
#include "proto/secure.h"

/* A stand-in job file; extra is spliced into "parallel" (may be ""). */
static const char *job_file(const char *name, int steps, int workers, int servers,
                            int step_ms, const char *extra) {
    char text[2048], file[128];
    snprintf(text, sizeof text,
             "{\"name\": \"%s\", \"steps\": %d, \"seed\": 3,\n"
             " \"parallel\": {\"strategy\": \"standin\", \"workers\": %d, "
             "\"servers\": %d, \"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 1000, "
             "\"barrier_timeout_ms\": 2000%s%s},\n"
             " \"standin\": {\"step_ms\": %d}}\n",
             name, steps, workers, servers, extra[0] ? ", " : "", extra, step_ms);
    snprintf(file, sizeof file, "%s.json", name);
    return th_write(file, text);
}


/* Lines of p's output that start with prefix and contain sub. */
static int count_lines(const th_proc *p, const char *prefix, const char *sub) {
    char *text = th_output(p);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        n += strncmp(line, prefix, strlen(prefix)) == 0 && strstr(line, sub) != NULL;
    free(text);
    return n;
}

/* (a) 1 scheduler + 2 ps + 4 workers run and shut down cleanly, in the
 * run folder the job's train.run_dir names. */
static void test_clean_run(void **state) {
    (void)state;
    const char *job = job_file("clean", 20, 4, 2, 0, "");
    char run_dir[512];
    snprintf(run_dir, sizeof run_dir, "train.run_dir=\"%s\"", th_path("run-clean"));
    const char *argv[] = {"tessera-run", job, "--set", run_dir, NULL};
    th_proc run = th_start("clean", argv);
    int rc = th_wait(&run, 30000);
    if (rc != 0) th_dump(&run, "tessera-run did not exit 0");
    if (th_count(&run, "] step 20 world 4 ") != 4) th_dump(&run, "not 4 workers at step 20");
    for (int rank = 0; rank < 6; rank++) { /* ps 0-1, workers 2-5 */
        char needle[64];
        snprintf(needle, sizeof needle, "[%s %d] shutdown (code 0)",
                 rank < 2 ? "ps" : "worker", rank);
        th_expect_output(&run, needle, 0);
    }
    th_expect_output(&run, "[run] job clean completed", 0);
    char path[512];
    snprintf(path, sizeof path, "%s/cluster.log", th_path("run-clean"));
    if (access(path, R_OK) != 0) th_dump(&run, "no cluster.log in train.run_dir");
    assert_int_equal(th_leftovers(), 0);
}

/* (b1) kill -9 of a worker without restarts: declared dead within the
 * timeout, a new generation without it, the others finish. */
static void test_kill_worker(void **state) {
    (void)state;
    const char *job = job_file("kill", 60, 4, 1, 40, "\"min_workers\": 3");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("run-kill"), NULL};
    th_proc run = th_start("kill", argv);
    /* a worker that is slower to load its data may join after the start */
    th_expect_output(&run, " world 4 loss ", 15000);
    pid_t victim = -1;
    int rank = th_joined_worker(&run, 2, &victim);
    assert_true(rank >= 0);
    double t0 = th_now_ms();
    kill(victim, SIGKILL);
    th_expect_output(&run, "declared dead", 3000);
    double dt = th_now_ms() - t0;
    if (dt > 1000 + 1000) /* heartbeat timeout 1000 ms + slack */
        fail_msg("declared dead %.0f ms after kill -9 (timeout 1000 ms)", dt);
    th_expect_output(&run, "world size 4 -> 3 workers", 3000);
    int rc = th_wait(&run, 30000);
    if (rc != 0) th_dump(&run, "tessera-run did not exit 0 after losing a worker");
    char needle[128];
    /* a SIGKILL tessera-run did not send: it says so, and whether the OOM killer may have sent it */
    snprintf(needle, sizeof needle, "worker %d exited with signal 9 (SIGKILL, from another process", rank);
    th_expect_output(&run, needle, 0);
    th_expect_output(&run, "), restart budget 0 used up; the job goes on with 3 workers", 0);
    if (th_count(&run, "] step 60 world 3 ") != 3) th_dump(&run, "not 3 workers at step 60");
    assert_int_equal(th_leftovers(), 0);
}

/* (b2) kill -9 with max_restarts = 1: tessera-run restarts the worker and it
 * rejoins with its old rank. */
static void test_restart_worker(void **state) {
    (void)state;
    const char *job = job_file("restart", 80, 3, 0, 40, "\"max_restarts\": 1, "
                               "\"min_workers\": 2, \"max_workers\": 3");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("run-restart"),
                          NULL};
    th_proc run = th_start("restart", argv);
    th_expect_output(&run, "] step 3 ", 15000);
    pid_t victim = -1;
    int rank = th_joined_worker(&run, 1, &victim);
    assert_true(rank >= 0);
    kill(victim, SIGKILL);
    char needle[128];
    snprintf(needle, sizeof needle, "[run] worker %d exited with signal 9 (SIGKILL", rank);
    th_expect_output(&run, needle, 5000);
    th_expect_output(&run, "); restarting it (restart 1 of 1)", 0);
    snprintf(needle, sizeof needle, "[worker %d] joined rank=%d ", rank, rank);
    if (th_wait_count(&run, needle, 2, 8000) != 0)
        th_dump(&run, "restarted worker did not rejoin with its rank");
    th_expect_output(&run, "its previous rank", 0);
    int rc = th_wait(&run, 30000);
    if (rc != 0) th_dump(&run, "tessera-run did not exit 0 after a restart");
    snprintf(needle, sizeof needle, "[worker %d] step 80 world 3 ", rank);
    th_expect_output(&run, needle, 0);
    assert_int_equal(th_leftovers(), 0);
}

/* (c) tessera-run --join adds a worker at a step boundary; the roster grows. */
static void test_join(void **state) {
    (void)state;
    /* long enough for a joiner that loads its data on a loaded machine */
    const char *job = job_file("join", 250, 2, 0, 40, "\"max_workers\": 3");
    const char *run_dir = th_path("run-join");
    const char *argv[] = {"tessera-run", job, "--run-dir", run_dir, NULL};
    th_proc run = th_start("join", argv);
    th_expect_output(&run, "] step 3 ", 15000);
    char addr[256], key[4200], addr_file[4200];
    snprintf(addr_file, sizeof addr_file, "%s/scheduler.addr", run_dir);
    snprintf(key, sizeof key, "%s/job.key", run_dir);
    assert_int_equal(th_read_line(addr_file, addr, sizeof addr, 2000), 0);

    const char *jargv[] = {"tessera-run", "--join", addr, "--key-file", key, job, NULL};
    th_proc joiner = th_start("joiner", jargv);
    th_expect_output(&joiner, "joined rank=", 20000);
    char *text = th_output(&joiner);
    const char *s = strstr(text, "start_step=");
    long start = s ? strtol(s + 11, NULL, 10) : -1;
    free(text);
    assert_true(start >= 3); /* entered at a step boundary, not at step 0 */
    th_expect_output(&joiner, "world=3", 0);
    th_expect_output(&run, "world size 2 -> 3 workers", 5000);

    const char *sargv[] = {"tessera-run", "--status", addr, "--key-file", key, NULL};
    th_proc status = th_start("join-status", sargv);
    assert_int_equal(th_wait(&status, 10000), 0);
    char *st = th_output(&status);
    int workers = 0;
    for (const char *p = st; (p = strstr(p, "worker")); p += 6) workers++;
    free(st);
    if (workers < 3) th_dump(&status, "status roster does not list 3 workers");

    assert_int_equal(th_wait(&joiner, 30000), 0);
    th_expect_output(&joiner, "step 250 world 3", 0);
    int rc = th_wait(&run, 30000);
    if (rc != 0) th_dump(&run, "tessera-run did not exit 0 with a joined worker");
    assert_int_equal(th_leftovers(), 0);
}

/* A key file with job_key's server lines and other_key's client lines. */
static const char *forge_key(const char *job_key, const char *other_key) {
    char text[2048] = "", line[512];
    const char *srcs[2] = {job_key, other_key};
    const char *want[2] = {"server-", "client-"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(srcs[i], "r");
        assert_non_null(f);
        while (fgets(line, sizeof line, f))
            if (strncmp(line, want[i], 7) == 0) strcat(text, line);
        fclose(f);
    }
    const char *path = th_write("forged.key", text);
    chmod(path, 0600);
    return path;
}

/* (d) a client without the job key is refused; with it, it works. Also:
 * SIGTERM to tessera-run stops the whole job, nothing left. */
static void test_key_required(void **state) {
    (void)state;
    const char *job = job_file("key", 0, 1, 0, 20, "");
    const char *run_dir = th_path("run-key");
    const char *argv[] = {"tessera-run", job, "--run-dir", run_dir, NULL};
    th_proc run = th_start("key", argv);
    char addr[256], key[4200], addr_file[4200];
    snprintf(addr_file, sizeof addr_file, "%s/scheduler.addr", run_dir);
    snprintf(key, sizeof key, "%s/job.key", run_dir);
    assert_int_equal(th_read_line(addr_file, addr, sizeof addr, 10000), 0);
    th_expect_output(&run, "] step 2 ", 10000);

    const char *good[] = {"tessera-run", "--status", addr, "--key-file", key, NULL};
    th_proc ok = th_start("status-good", good);
    assert_int_equal(th_wait(&ok, 10000), 0);
    th_expect_output(&ok, "running", 0);

    const char *other = th_path("other.key");
    assert_int_equal(ts_secure_keygen(other, NULL), TS_OK);
    const char *bad[] = {"tessera-run", "--status", addr, "--key-file", other, NULL};
    th_proc refused = th_start("status-bad", bad);
    int rc = th_wait(&refused, 15000);
    if (rc == 0) th_dump(&refused, "status with a foreign key succeeded");
    /* knows the server's public key, not the job's client secret */
    const char *forged = forge_key(key, other);
    const char *fbad[] = {"tessera-run", "--status", addr, "--key-file", forged, NULL};
    th_proc forged_status = th_start("status-forged", fbad);
    rc = th_wait(&forged_status, 15000);
    if (rc == 0) th_dump(&forged_status, "status with a forged client key succeeded");
    const char *wbad[] = {"tessera-worker", "--scheduler", addr, "--key-file", forged,
                          "--job", job, "--set", "parallel.join_timeout_ms=3000", NULL};
    th_proc intruder = th_start("worker-bad", wbad);
    th_wait(&intruder, 15000);
    if (intruder.status == 0) th_dump(&intruder, "worker with a forged key joined");
    th_expect_output(&intruder, "join failed", 0);
    /* the job did not change: still one worker */
    if (th_count(&run, "world size 1 -> 2") != 0) th_dump(&run, "intruder joined");

    kill(run.pid, SIGTERM);
    rc = th_wait(&run, 10000);
    assert_int_equal(rc, 128 + SIGTERM);
    th_expect_output(&run, "interrupted by SIGTERM", 0);
    assert_int_equal(th_leftovers(), 0);
}

/* True when pid is gone or a zombie. */
static int dead(pid_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *r = strrchr(buf, ')');
    return r && r[1] == ' ' && r[2] == 'Z';
}

/* tessera-run killed -9: its children die with it (parent death signal). */
static void test_launcher_killed(void **state) {
    (void)state;
    const char *job = job_file("killed", 0, 2, 1, 20, "");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("run-killed"), NULL};
    th_proc run = th_start("killed", argv);
    th_expect_output(&run, "] step 2 ", 15000);
    char *text = th_output(&run);
    pid_t pids[8];
    int n = 0;
    for (const char *s = text; n < 8 && (s = strstr(s, " pid ")); s += 5)
        pids[n++] = (pid_t)atoi(s + 5);
    free(text);
    assert_int_equal(n, 4); /* scheduler, 1 ps, 2 workers */
    kill(run.pid, SIGKILL);
    assert_int_equal(th_wait(&run, 5000), 128 + SIGKILL);
    double t0 = th_now_ms();
    for (int i = 0; i < n; i++) {
        while (!dead(pids[i]) && th_now_ms() - t0 < 3000) usleep(20000);
        if (!dead(pids[i])) fail_msg("pid %d outlived tessera-run", (int)pids[i]);
    }
    /* they were re-parented to the test (subreaper) and are reaped here */
    assert_int_equal(th_leftovers(), n);
}

/* (e) a barrier one worker never reaches (SIGSTOP): every other worker gets
 * the error naming it within the timeout; tessera-run fails with it. */
static void test_stopped_worker(void **state) {
    (void)state;
    /* heartbeat timeout well above the barrier timeout: the barrier fails
     * first */
    const char *job = job_file("stop", 200, 3, 0, 20, "\"heartbeat_timeout_ms\": 8000, "
                               "\"barrier_timeout_ms\": 1500");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("run-stop"), NULL};
    th_proc run = th_start("stop", argv);
    th_expect_output(&run, "] step 3 ", 15000);
    pid_t victim = -1;
    int rank = th_joined_worker(&run, 2, &victim);
    assert_true(rank >= 0);
    double t0 = th_now_ms();
    kill(victim, SIGSTOP);
    char needle[64];
    snprintf(needle, sizeof needle, "rank %d finished step", rank);
    /* both other workers report the barrier failure naming the stopped rank */
    while (count_lines(&run, "[worker ", needle) < 2 && th_now_ms() - t0 < 1500 + 2500)
        usleep(20000);
    if (count_lines(&run, "[worker ", needle) < 2)
        th_dump(&run, "the other workers did not both get the barrier error naming it");
    int rc = th_wait(&run, 15000);
    assert_int_not_equal(rc, 0);
    char *text = th_output(&run);
    const char *last = strstr(text, "[run] job stop failed: ");
    int names_it = last && strstr(last, needle) && strstr(last, "did not reach barrier");
    free(text);
    if (!names_it) th_dump(&run, "the failure reason does not name the stopped rank");
    assert_int_equal(th_leftovers(), 0);
}

/* The scheduler stopped (SIGSTOP) for stall_ms, heartbeat timeout 2 s, while
 * every node keeps heartbeating, then continued: it reads the queued
 * heartbeats before judging anyone and does not count its own stall, so
 * nobody is declared dead and the job finishes. */
static void stall_scheduler(const char *name, int servers, int workers, int stall_ms) {
    char extra[160], run_dir[64];
    snprintf(extra, sizeof extra, "\"heartbeat_timeout_ms\": 2000, \"barrier_timeout_ms\": %d",
             stall_ms + 8000);
    const char *job = job_file(name, 100, workers, servers, 20, extra);
    snprintf(run_dir, sizeof run_dir, "run-%s", name);
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path(run_dir), NULL};
    th_proc run = th_start(name, argv);
    th_expect_output(&run, "] step 5 ", 15000);
    pid_t sched = th_scheduler_pid(&run);
    assert_true(sched > 0);
    kill(sched, SIGSTOP);
    usleep((useconds_t)stall_ms * 1000);
    kill(sched, SIGCONT);
    int rc = th_wait(&run, 60000);
    if (rc != 0) th_dump(&run, "tessera-run did not exit 0 after the scheduler stall");
    if (th_count(&run, "declared dead") != 0) th_dump(&run, "a member was declared dead");
    char needle[64];
    snprintf(needle, sizeof needle, "] step 100 world %d ", workers);
    if (th_count(&run, needle) != workers) th_dump(&run, "not every worker finished in the same world");
    assert_int_equal(th_leftovers(), 0);
}

static void test_scheduler_stall(void **state) {
    (void)state;
    stall_scheduler("stall", 1, 3, 3000);
}

/* The same with 8 nodes and a 10 s stall. */
static void test_scheduler_stall_8_nodes(void **state) {
    (void)state;
    stall_scheduler("stall8", 2, 6, 10000);
}

/* The scheduler tessera-run started is killed -9: the job fails naming
 * that, without the scheduler's last log line as if it were the reason. */
static void test_scheduler_killed_run(void **state) {
    (void)state;
    const char *job = job_file("sched-kill", 100000, 2, 1, 20, "");
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path("run-sched-kill"), NULL};
    th_proc run = th_start("sched-kill", argv);
    th_expect_output(&run, "] step 5 ", 15000);
    pid_t sched = th_scheduler_pid(&run);
    assert_true(sched > 0);
    kill(sched, SIGKILL);
    if (th_wait(&run, 30000) <= 0) th_dump(&run, "tessera-run did not fail when its scheduler was killed");
    if (th_count(&run, "[run] job sched-kill failed: scheduler exited with signal 9 (SIGKILL") != 1)
        th_dump(&run, "the failure is not the scheduler's death alone");
    assert_int_equal(th_leftovers(), 0);
}

/* The scheduler dies (kill -9) and no tessera-run supervises: the ps and the
 * worker started by hand each notice the silent scheduler within the
 * heartbeat timeout and exit non-zero naming it. */
static void test_scheduler_killed(void **state) {
    (void)state;
    const char *job = job_file("orphans", 0, 1, 1, 20, "");
    const char *key = th_path("orphans.key");
    assert_int_equal(ts_secure_keygen(key, NULL), TS_OK);
    const char *sargv[] = {"tessera-scheduler", "--bind", "tcp://127.0.0.1:0", "--job", "orphans",
                           "--key-file", key, "--servers", "1", "--min-workers", "1",
                           "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000", NULL};
    th_proc sched = th_start("orphans-scheduler", sargv);
    th_expect_output(&sched, "listening ", 10000);
    char *text = th_output(&sched), addr[256] = "";
    sscanf(strstr(text, "listening ") + 10, "%255s", addr);
    free(text);
    const char *pargv[] = {"tessera-ps", "--scheduler", addr, "--key-file", key, "--job", job, NULL};
    const char *wargv[] = {"tessera-worker", "--scheduler", addr, "--key-file", key, "--job", job,
                           NULL};
    th_proc ps = th_start("orphans-ps", pargv), worker = th_start("orphans-worker", wargv);
    th_expect_output(&worker, "step 3 ", 15000);
    th_expect_output(&ps, "joined rank=", 0);
    kill(sched.pid, SIGKILL);
    assert_int_equal(th_wait(&sched, 5000), 128 + SIGKILL);
    /* heartbeat timeout 1000 ms, plus slack for a loaded machine */
    int rc_ps = th_wait(&ps, 1000 + 4000), rc_worker = th_wait(&worker, 1000 + 4000);
    char needle[300];
    snprintf(needle, sizeof needle, "scheduler %s silent for ", addr);
    if (rc_ps <= 0) th_dump(&ps, "tessera-ps did not exit non-zero after the scheduler died");
    if (th_count(&ps, needle) == 0) th_dump(&ps, "tessera-ps did not name the silent scheduler");
    if (rc_worker <= 0) th_dump(&worker, "tessera-worker did not exit non-zero after the scheduler died");
    if (th_count(&worker, needle) == 0) th_dump(&worker, "tessera-worker did not name the silent scheduler");
    assert_int_equal(th_leftovers(), 0);
}

/* (f) the same small job under mpirun, SPMD and MPMD forms. */
static void test_mpirun(void **state) {
    (void)state;
    th_need_mpirun();
    const char *job = job_file("mpi", 10, 2, 1, 0, "");
    char run_bin[4200];
    snprintf(run_bin, sizeof run_bin, "%s/tessera-run", getenv("TESSERA_BIN_DIR"));
    const char *argv[] = {"mpirun", "-np", "4", "--oversubscribe", "--allow-run-as-root",
                          run_bin, "--mpi", job, NULL};
    th_proc spmd = th_start("mpi-spmd", argv);
    th_wait_mpirun(&spmd, 30000);
    assert_int_equal(th_count(&spmd, "step 10 world 2"), 2);
    assert_int_equal(th_count(&spmd, "shutdown (code 0)"), 3); /* ps + 2 workers */

    const char *mpmd[] = {"mpirun", "--oversubscribe", "--allow-run-as-root",
                          "-np", "1", run_bin, "--mpi", "--role", "worker", job, ":",
                          "-np", "1", run_bin, "--mpi", "--role", "scheduler", job, ":",
                          "-np", "1", run_bin, "--mpi", "--role", "ps", job, ":",
                          "-np", "1", run_bin, "--mpi", "--role", "worker", job, NULL};
    th_proc m = th_start("mpi-mpmd", mpmd);
    th_wait_mpirun(&m, 30000);
    assert_int_equal(th_count(&m, "step 10 world 2"), 2);
    assert_int_equal(th_leftovers(), 0);
}

/* mpirun with ranks that cannot make the job's world: a 2-stage pipeline
 * given 3 workers, and a ps job whose MPMD roles hold no ps. Every rank
 * stops before training with status 2 and the reason, within seconds. */
static void test_mpirun_layout(void **state) {
    (void)state;
    th_need_mpirun();
    char run_bin[4200];
    snprintf(run_bin, sizeof run_bin, "%s/tessera-run", getenv("TESSERA_BIN_DIR"));
    const char *pipe = th_job_file("mpi-pipe", "mlp", 10, 8, 1, "\"strategy\": \"pipeline\", \"micro_batches\": 2");
    const char *ps = th_job_file("mpi-ps", "mlp", 10, 8, 1, "\"strategy\": \"ps\", \"servers\": 1");
    const char *spmd[] = {"mpirun", "-np", "4", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                          run_bin, "--mpi", pipe, NULL};
    const char *mpmd[] = {"mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                          "-np", "1", run_bin, "--mpi", "--role", "scheduler", ps, ":",
                          "-np", "2", run_bin, "--mpi", "--role", "worker", ps, NULL};
    const char *const *runs[] = {spmd, mpmd};
    const char *why[] = {"a pipeline of 2 stages x 1 replicas (parallel.data_parallel) needs exactly 2 workers",
                         "strategy \"ps\" needs at least one shard"};
    for (int i = 0; i < 2; i++) {
        th_proc p = th_start(i ? "mpi-layout-ps" : "mpi-layout-pipe", runs[i]);
        if (th_mpirun_status(&p, 30000) != 2 || th_count(&p, why[i]) != 1)
            th_dump(&p, "mpirun did not exit 2 naming the layout's fault");
        if (th_count(&p, "joined rank=") != 0) th_dump(&p, "a rank joined the job before the layout was refused");
        /* mpirun exits after the first rank's non-zero status without
         * reaping the others, which exited 2 as well: reap them here */
        th_leftovers();
    }
}

/* Folders /tmp/tessera-mpi-* whose job.key holds the text of key_file. */
static int key_copies(const char *key_file) {
    char want[2048], got[2048], path[600];
    FILE *f = fopen(key_file, "r");
    assert_non_null(f);
    size_t n = fread(want, 1, sizeof want, f);
    fclose(f);
    int copies = 0;
    DIR *tmp = opendir("/tmp");
    assert_non_null(tmp);
    for (struct dirent *e; (e = readdir(tmp));) {
        if (strncmp(e->d_name, "tessera-mpi-", 12) != 0) continue;
        snprintf(path, sizeof path, "/tmp/%s/job.key", e->d_name);
        FILE *k = fopen(path, "r");
        if (!k) continue;
        copies += fread(got, 1, sizeof got, k) == n && memcmp(got, want, n) == 0;
        fclose(k);
    }
    closedir(tmp);
    return copies;
}

/* A rank killed -9 under mpirun ends the job within seconds, and no rank
 * leaves the job key behind on disk (the killed one could not remove a
 * copy, and mpirun kills the others before they do). */
static void test_mpirun_killed_rank(void **state) {
    (void)state;
    th_need_mpirun();
    const char *key = th_path("mpi-kill.key");
    assert_int_equal(ts_secure_keygen(key, NULL), TS_OK);
    char extra[1024];
    snprintf(extra, sizeof extra, "\"key_file\": \"%s\"", key);
    const char *job = job_file("mpi-kill", 100000, 2, 1, 20, extra);
    char run_bin[4200];
    snprintf(run_bin, sizeof run_bin, "%s/tessera-run", getenv("TESSERA_BIN_DIR"));
    const char *argv[] = {"mpirun", "-np", "4", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                          run_bin, "--mpi", job, NULL};
    th_proc p = th_start("mpi-kill", argv);
    if (th_wait_for(&p, "step 5 world 2", 30000) != 0) th_dump(&p, "the job did not reach step 5");
    pid_t victim = th_child(p.pid, NULL, 3); /* mpirun's children are its ranks */
    if (victim <= 0) th_dump(&p, "mpirun has fewer than 4 ranks");
    kill(victim, SIGKILL);
    int rc = th_mpirun_status(&p, 20000);
    if (rc <= 0) th_dump(&p, "mpirun did not end non-zero within 20 s of a rank's death");
    assert_int_equal(key_copies(key), 0);
    th_leftovers();
}

int main(int argc, char **argv) {
    th_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_run),     cmocka_unit_test(test_kill_worker),
        cmocka_unit_test(test_restart_worker), cmocka_unit_test(test_join),
        cmocka_unit_test(test_key_required),  cmocka_unit_test(test_launcher_killed),
        cmocka_unit_test(test_stopped_worker), cmocka_unit_test(test_scheduler_stall),
        cmocka_unit_test(test_scheduler_stall_8_nodes), cmocka_unit_test(test_scheduler_killed),
        cmocka_unit_test(test_scheduler_killed_run),
        cmocka_unit_test(test_mpirun),        cmocka_unit_test(test_mpirun_layout),
        cmocka_unit_test(test_mpirun_killed_rank),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    th_finish(failed);
    return failed;
}
