/* harness.c - child-process scheduler and helpers for tests/scheduler. */
#include "harness.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

long long th_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void th_start(th_sched *s, ...)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/tessera-sched-test-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->key, sizeof s->key, "%s/job.key", s->dir);
    snprintf(s->log, sizeof s->log, "%s/scheduler.log", s->dir);
    assert_int_equal(ts_secure_keygen(s->key, &s->keys), TS_OK);

    const char *bindir = getenv("TESSERA_BIN_DIR");
    assert_non_null(bindir);
    char exe[512];
    snprintf(exe, sizeof exe, "%s/tessera-scheduler", bindir);
    char *argv[64];
    int argc = 0;
    argv[argc++] = exe;
    argv[argc++] = "--bind";
    argv[argc++] = "tcp://127.0.0.1:0";
    argv[argc++] = "--job";
    argv[argc++] = "test";
    argv[argc++] = "--key-file";
    argv[argc++] = s->key;
    va_list ap;
    va_start(ap, s);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && argc < 62;)
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;

    int out[2];
    assert_int_equal(pipe(out), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int errfd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(out[1], 1);
        if (errfd >= 0)
            dup2(errfd, 2);
        close(out[0]);
        execv(exe, argv);
        _exit(127);
    }
    close(out[1]);
    s->pid = pid;
    char line[512];
    size_t n = 0;
    long long deadline = th_now_ms() + 10000;
    while (n < sizeof line - 1 && th_now_ms() < deadline) {
        struct pollfd p = {out[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(out[0], line + n, 1);
        if (r <= 0)
            break;
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(out[0]);
    if (strncmp(line, "listening ", 10) != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("tessera-scheduler did not print its endpoint (got '%s'; log %s)", line, s->log);
    }
    snprintf(s->endpoint, sizeof s->endpoint, "%s", line + 10);
}

int th_wait_exit(th_sched *s, int timeout_ms)
{
    long long deadline = th_now_ms() + timeout_ms;
    int status = 0;
    while (th_now_ms() < deadline) {
        pid_t r = waitpid(s->pid, &status, WNOHANG);
        if (r == s->pid) {
            s->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

int th_stop(th_sched *s)
{
    int code = 0;
    if (s->pid > 0) {
        /* the first SIGTERM asks the workers to stop; the members of a
         * test never answer, so a second one shuts the job down */
        kill(s->pid, SIGTERM);
        usleep(200 * 1000);
        kill(s->pid, SIGTERM);
        code = th_wait_exit(s, 5000);
    }
    char cmd[600];
    if (getenv("TESSERA_KEEP_TEST_DIR") == NULL) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", s->dir);
    }
    return code;
}

ts_member *th_join(const th_sched *s, ts_proto_role role, int prev_rank, int timeout_ms)
{
    ts_member_options o = {.scheduler = s->endpoint, .job = "test", .key_file = s->key,
                           .role = role, .address = "", .caps = "test", .prev_rank = prev_rank,
                           .timeout_ms = timeout_ms};
    ts_member *m = NULL;
    if (ts_member_join(&o, &m) != TS_OK) {
        fprintf(stderr, "join failed: %s\n", ts_last_error());
        return NULL;
    }
    return m;
}

typedef struct {
    const th_sched *s;
    ts_proto_role role;
    ts_member *m;
} join_arg;

static void *join_thread(void *p)
{
    join_arg *a = p;
    a->m = th_join(a->s, a->role, -1, 15000);
    return NULL;
}

void th_join_many(const th_sched *s, const ts_proto_role *roles, int n, ts_member **out)
{
    pthread_t t[64];
    join_arg a[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++) {
        a[i] = (join_arg){s, roles[i], NULL};
        assert_int_equal(pthread_create(&t[i], NULL, join_thread, &a[i]), 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        out[i] = a[i].m;
    }
    for (int i = 0; i < n; i++)
        assert_non_null(out[i]);
}

bool th_log_contains(const th_sched *s, const char *needle)
{
    FILE *f = fopen(s->log, "r");
    if (!f)
        return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

void *th_raw_socket(void *ctx, const th_sched *s)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(sock);
    int linger = 0, timeout = 3000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    assert_int_equal(ts_secure_client(sock, &s->keys), TS_OK);
    assert_int_equal(zmq_connect(sock, s->endpoint), 0);
    return sock;
}
