/* supervise.c - spawning, output prefixing and stopping of child processes. */
#include "launch/supervise.h"

#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "launch/oom.h"

void ts_super_name(const ts_child *c, char *out, size_t cap) {
    if (c->role == TS_ROLE_SCHEDULER)
        snprintf(out, cap, "scheduler");
    else if (c->rank >= 0)
        snprintf(out, cap, "%s %d", ts_proto_role_name(c->role), c->rank);
    else
        snprintf(out, cap, "%s pid %d", ts_proto_role_name(c->role), c->proc.pid);
}

static void on_signal(uv_signal_t *h, int signum) {
    ts_super *s = h->data;
    if (s->on_signal) s->on_signal(s, signum);
}

static void kill_survivors(uv_timer_t *t) {
    ts_super *s = t->data;
    for (ts_child *c = s->children; c; c = c->next) {
        if (c->running) {
            char name[64];
            ts_super_name(c, name, sizeof name);
            fprintf(stderr, "[run] %s did not stop in time; killing it\n", name);
            ts_super_signal(c, SIGKILL);
        }
    }
}

ts_status ts_super_paths(char *exe, char *dir, size_t cap) {
    size_t size = cap;
    int rc = uv_exepath(exe, &size);
    if (rc != 0)
        return ts_error(TS_ERR_IO, "tessera-run: cannot find its own path: %s",
                        uv_strerror(rc));
    snprintf(dir, cap, "%s", exe);
    char *d = dirname(dir);
    memmove(dir, d, strlen(d) + 1);
    return TS_OK;
}

ts_status ts_super_init(ts_super *s, uv_loop_t *loop) {
    memset(s, 0, sizeof *s);
    s->loop = loop;
    ts_status st = ts_super_paths(s->self_exe, s->bin_dir, sizeof s->bin_dir);
    if (st != TS_OK) return st;

    uv_signal_init(loop, &s->sigint);
    uv_signal_init(loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_timer_init(loop, &s->kill_timer);
    s->kill_timer.data = s;
    /* none of these keep the loop alive: only children do */
    uv_unref((uv_handle_t *)&s->sigint);
    uv_unref((uv_handle_t *)&s->sigterm);
    uv_unref((uv_handle_t *)&s->kill_timer);
    return TS_OK;
}

/* One of child c's handles closed; after the last, report c done, free it. */
static void child_handle_closed(ts_child *c) {
    if (--c->handles_open > 0) return;
    ts_super *s = c->super;
    for (ts_child **p = &s->children; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    if (s->on_done && c->proc.pid != 0) s->on_done(c);
    free(c);
}

static void on_proc_closed(uv_handle_t *h) { child_handle_closed(h->data); }

static void on_pipe_closed(uv_handle_t *h) {
    ts_child_stream *st = h->data;
    child_handle_closed(st->child);
}

/* Says that s's log cannot take lines (errno), and stops writing it. */
static void drop_log(ts_super *s, const char *which) {
    fprintf(stderr, "[run] cannot write %s: %s; %s lines are not kept there\n", s->log_path, strerror(errno), which);
    if (s->log) fclose(s->log);
    s->log = NULL;
}

void ts_super_open_log(ts_super *s, const char *path) {
    snprintf(s->log_path, sizeof s->log_path, "%s", path);
    s->log = fopen(path, "w");
    if (!s->log) drop_log(s, "the children's");
}

/* One complete line from a child stream. */
static void child_line(ts_child_stream *st, const char *line) {
    ts_child *c = st->child;
    ts_super *s = c->super;
    if (st == &c->err) {
        if (line[0]) snprintf(c->last_err, sizeof c->last_err, "%s", line);
    } else {
        c->lines_out++;
        if (s->on_line && !s->on_line(c, line)) return;
    }
    char name[64];
    ts_super_name(c, name, sizeof name);
    fprintf(st->out, "[%s] %s\n", name, line);
    fflush(st->out);
    if (s->log && (fprintf(s->log, "[%s] %s\n", name, line) < 0 || fflush(s->log) != 0)) drop_log(s, "later");
}

static void alloc_read(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
    (void)hint;
    ts_child_stream *st = h->data;
    ts_super *s = st->child->super;
    buf->base = s->readbuf;
    buf->len = sizeof s->readbuf;
}

static void on_read(uv_stream_t *h, ssize_t n, const uv_buf_t *buf) {
    ts_child_stream *st = h->data;
    for (ssize_t i = 0; i < n; i++) {
        char ch = buf->base[i];
        if (ch == '\n' || st->len == sizeof st->line - 1) {
            st->line[st->len] = '\0';
            child_line(st, st->line);
            st->len = 0;
            if (ch == '\n') continue;
        }
        st->line[st->len++] = ch;
    }
    if (n < 0) { /* EOF or read error: flush and close */
        if (st->len) {
            st->line[st->len] = '\0';
            child_line(st, st->line);
            st->len = 0;
        }
        st->open = 0;
        uv_close((uv_handle_t *)&st->pipe, on_pipe_closed);
    }
}

static void on_exit_cb(uv_process_t *p, int64_t status, int term_signal) {
    ts_child *c = p->data;
    c->running = 0;
    c->exit_status = status;
    c->term_signal = term_signal;
    uv_close((uv_handle_t *)p, on_proc_closed);
}

static void stream_init(ts_super *s, ts_child *c, ts_child_stream *st, FILE *out) {
    uv_pipe_init(s->loop, &st->pipe, 0);
    st->pipe.data = st;
    st->child = c;
    st->out = out;
    st->open = 1;
}

ts_child *ts_super_spawn(ts_super *s, ts_proto_role role, int rank, const char *prog,
                         char *const *args) {
    size_t nargs = 0;
    while (args[nargs]) nargs++;
    ts_child *c = calloc(1, sizeof *c);
    char **argv = calloc(nargs + 5, sizeof *argv);
    if (!c || !argv) {
        free(c);
        free(argv);
        ts_error(TS_ERR_MEMORY, "tessera-run: out of memory spawning %s", prog);
        return NULL;
    }
    c->super = s;
    c->role = role;
    c->rank = rank;
    c->oom_kills = ts_oom_kills();
    stream_init(s, c, &c->out, stdout);
    stream_init(s, c, &c->err, stderr);
    char ppid[32], path[8192];
    snprintf(ppid, sizeof ppid, "%ld", (long)getpid());
    snprintf(path, sizeof path, "%s/%s", s->bin_dir, prog);
    argv[0] = s->self_exe;
    argv[1] = "--exec-child";
    argv[2] = ppid;
    argv[3] = path;
    memcpy(argv + 4, args, nargs * sizeof *argv);

    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&c->out.pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&c->err.pipe;
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.exit_cb = on_exit_cb;
    opt.file = s->self_exe;
    opt.args = argv;
    opt.flags = UV_PROCESS_DETACHED; /* own process group: killable as one */
    opt.stdio_count = 3;
    opt.stdio = stdio;
    c->proc.data = c;
    int rc = uv_spawn(s->loop, &c->proc, &opt);
    free(argv);
    if (rc != 0) {
        ts_error(TS_ERR_IO, "tessera-run: cannot start a %s (%s): %s",
                 ts_proto_role_name(role), path, uv_strerror(rc));
        c->proc.pid = 0; /* no on_done for a child that never ran */
        c->handles_open = 3;
        c->next = s->children;
        s->children = c;
        uv_close((uv_handle_t *)&c->proc, on_proc_closed);
        uv_close((uv_handle_t *)&c->out.pipe, on_pipe_closed);
        uv_close((uv_handle_t *)&c->err.pipe, on_pipe_closed);
        return NULL;
    }
    c->running = 1;
    c->handles_open = 3;
    c->next = s->children;
    s->children = c;
    uv_read_start((uv_stream_t *)&c->out.pipe, alloc_read, on_read);
    uv_read_start((uv_stream_t *)&c->err.pipe, alloc_read, on_read);
    if (s->stopping) ts_super_signal(c, s->stop_signal);
    return c;
}

int ts_super_live(const ts_super *s) {
    int n = 0;
    for (const ts_child *c = s->children; c; c = c->next)
        if (c->proc.pid != 0) n++;
    return n;
}

void ts_super_signal(ts_child *c, int signum) {
    if (!c->running) return;
    c->sent_kill |= signum == SIGKILL;
    pid_t pid = c->proc.pid;
    if (kill(-pid, signum) != 0) kill(pid, signum);
    if (signum != SIGKILL && signum != SIGCONT && kill(-pid, SIGCONT) != 0)
        kill(pid, SIGCONT);
}

int ts_super_stopped(const ts_child *c) {
    if (!c->running) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)c->proc.pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* the command name may hold spaces */
    return end && (end[2] == 'T' || end[2] == 't');
}

void ts_super_stop(ts_super *s, int signum, unsigned grace_ms) {
    if (s->stopping) return;
    s->stopping = 1;
    s->stop_signal = signum;
    for (ts_child *c = s->children; c; c = c->next) ts_super_signal(c, signum);
    uv_timer_start(&s->kill_timer, kill_survivors, grace_ms, 0);
}

void ts_super_close(ts_super *s) {
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->kill_timer, NULL);
    uv_run(s->loop, UV_RUN_DEFAULT);
}

void ts_super_describe_exit(const ts_child *c, char *out, size_t cap) {
    char who[64];
    ts_super_name(c, who, sizeof who);
    int64_t oom = c->term_signal == SIGKILL && !c->sent_kill && c->oom_kills >= 0 ? ts_oom_kills() - c->oom_kills : -1;
    if (c->term_signal == SIGKILL && !c->sent_kill && oom > 0)
        snprintf(out, cap, "%s exited with signal 9 (SIGKILL; the kernel's OOM killer killed %lld process%s meanwhile: "
                           "it may have run out of memory)", who, (long long)oom, oom == 1 ? "" : "es");
    else if (c->term_signal == SIGKILL && !c->sent_kill)
        snprintf(out, cap, "%s exited with signal 9 (SIGKILL, from another process%s)", who,
                 oom == 0 ? ": the kernel's OOM killer killed none meanwhile" : ", or the kernel's OOM killer");
    else if (c->term_signal)
        snprintf(out, cap, "%s exited with signal %d", who, c->term_signal);
    else
        snprintf(out, cap, "%s exited with status %lld", who,
                 (long long)c->exit_status);
}

int ts_super_exec_child(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "tessera-run --exec-child: expected PARENT_PID PROG ...\n");
        return 2;
    }
    /* die with tessera-run, even if it is killed -9 */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        fprintf(stderr, "tessera-run: PR_SET_PDEATHSIG: %s\n", strerror(errno));
        return 1;
    }
    if ((long)getppid() != strtol(argv[2], NULL, 10)) return 1; /* parent gone */
    execv(argv[3], argv + 3);
    fprintf(stderr, "tessera-run: cannot start %s: %s\n", argv[3], strerror(errno));
    return 127;
}
