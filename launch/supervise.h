/* supervise.h - child processes of tessera-run on one libuv loop.
 *
 * A supervisor spawns role processes (scheduler, ps, worker) with uv_spawn,
 * each in its own process group, through tessera-run's own "--exec-child"
 * trampoline, which sets PR_SET_PDEATHSIG(SIGKILL) before exec so that no
 * child outlives tessera-run even when tessera-run itself is killed -9.
 * Every line a child writes is printed with a "[role rank] " prefix (stdout
 * to stdout, stderr to stderr) and appended to an optional log file; the
 * child's last stderr line is kept for failure reasons. SIGINT and SIGTERM
 * received by tessera-run are handed to the owner's callback.
 *
 * A child is "done" once it exited and both its pipes reached end of file;
 * only then is on_done called, so the last output line is known. The owner
 * decides what follows (restart, fail, carry on).
 */
#ifndef TS_SUPERVISE_H
#define TS_SUPERVISE_H

#include <stdio.h>
#include <uv.h>

#include "kernels/status.h"
#include "proto/wire.h"

enum { TS_LINE_MAX = 4096 };

typedef struct ts_super ts_super;
typedef struct ts_child ts_child;

/* Stream of one child: the pipe and the unfinished line. */
typedef struct {
    uv_pipe_t pipe;
    ts_child *child;
    FILE *out;              /* our stdout or stderr */
    char line[TS_LINE_MAX];
    size_t len;
    int open;
} ts_child_stream;

struct ts_child {
    ts_super *super;
    ts_proto_role role;
    int rank;             /* job rank shown in prefixes; -1 unknown (the
                             prefix then shows the pid); the owner sets it
                             once the child has learnt its rank */
    uv_process_t proc;
    ts_child_stream out, err;
    int running;          /* spawned and not yet exited */
    int64_t exit_status;
    int term_signal;
    int sent_kill;        /* tessera-run sent it SIGKILL */
    int64_t oom_kills;    /* ts_oom_kills() when it started */
    int handles_open;     /* proc + pipes not yet closed */
    char last_err[TS_LINE_MAX]; /* last stderr line, for failure reasons */
    int lines_out;        /* stdout lines seen so far */
    void *user;           /* owner's data */
    ts_child *next;
};

/* Called for every complete stdout line of child c (without the newline),
 * before it is printed; return 0 to suppress printing it. */
typedef int (*ts_line_cb)(ts_child *c, const char *line);
/* Called once child c is done (exited, pipes drained). c stays valid until
 * the callback returns, then it is freed. */
typedef void (*ts_done_cb)(ts_child *c);
/* Called when tessera-run receives SIGINT or SIGTERM. */
typedef void (*ts_signal_cb)(ts_super *s, int signum);

struct ts_super {
    uv_loop_t *loop;
    char self_exe[4096];  /* tessera-run, for the --exec-child trampoline */
    char bin_dir[4096];   /* where tessera-scheduler/-ps/-worker live */
    FILE *log;            /* every child line also goes here; may be NULL */
    char log_path[4096];  /* its path, for the message when it fails */
    ts_line_cb on_line;
    ts_done_cb on_done;
    ts_signal_cb on_signal;
    uv_signal_t sigint, sigterm;
    uv_timer_t kill_timer;
    ts_child *children;   /* live list, newest first */
    int stopping;         /* ts_super_stop called */
    int stop_signal;      /* the signal it sent */
    void *user;
    char readbuf[65536];  /* libuv read buffer, consumed at once */
};

/* Path of the running tessera-run into exe and its folder (where
 * tessera-scheduler, -ps and -worker live) into dir; each cap bytes. */
ts_status ts_super_paths(char *exe, char *dir, size_t cap);

/* Sets up s on loop: finds tessera-run's own path and the binary folder,
 * installs the SIGINT/SIGTERM handlers. */
ts_status ts_super_init(ts_super *s, uv_loop_t *loop);

/* Starts bin_dir/<prog> with args (NULL-terminated, without argv[0]) as the
 * child (role, rank); rank -1 when not known yet. Returns the child or NULL (message set). */
ts_child *ts_super_spawn(ts_super *s, ts_proto_role role, int rank, const char *prog,
                         char *const *args);

/* Number of children that are spawned and not yet done. */
int ts_super_live(const ts_super *s);

/* Sends signum to child c's process group (SIGCONT too, so that a stopped
 * child can act on it). */
void ts_super_signal(ts_child *c, int signum);

/* True when child c runs but is stopped (SIGSTOP, SIGTSTP: state T in
 * /proc/PID/stat). */
int ts_super_stopped(const ts_child *c);

/* Stops every child: signum (SIGTERM, or the SIGINT tessera-run got) now,
 * SIGKILL to any still running after grace_ms. Idempotent. */
void ts_super_stop(ts_super *s, int signum, unsigned grace_ms);

/* Opens path (truncated) as s->log. When it cannot be opened, or later
 * written, that is said once on stderr naming it, and the lines go on to
 * the terminal only. */
void ts_super_open_log(ts_super *s, const char *path);

/* Closes the signal handlers and timer so the loop can end once every child
 * is done. */
void ts_super_close(ts_super *s);

/* The child as people read it: "worker 2", "worker pid 1234" (rank not
 * known), "scheduler". */
void ts_super_name(const ts_child *c, char *out, size_t cap);

/* Reason text of a done child: "worker 2 exited with status 1", "... with
 * signal 11"; for a SIGKILL tessera-run did not send, whether the kernel's
 * OOM killer killed a process meanwhile ("worker 2 exited with signal 9
 * (SIGKILL; the kernel's OOM killer killed 1 process meanwhile: it may
 * have run out of memory)"); out gets at most cap bytes. */
void ts_super_describe_exit(const ts_child *c, char *out, size_t cap);

/* The "--exec-child PARENT_PID PROG ARGS..." trampoline: sets the parent
 * death signal, checks the parent is still PARENT_PID, execs PROG. Returns
 * only on failure (exit status for main). */
int ts_super_exec_child(int argc, char **argv);

#endif
