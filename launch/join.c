/* join.c - tessera-run --join: one more worker for a running job, writing
 * into the job's run folder. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch/argv.h"
#include "launch/launch.h"
#include "launch/supervise.h"
#include "proto/secure.h"
#include "worker/node.h"

/* The folder of file path (cap bytes): "." when it names none. */
static void folder_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, cap, ".");
    else snprintf(dir, cap, "%.*s", slash == path ? 1 : (int)(slash - path), path);
}

/* The run folder the worker writes into: the given one, else the key
 * file's folder when it is a run folder (it holds scheduler.addr, as the
 * one tessera-run made does), else the worker's default (ts_worker_run_dir). */
static bool choose_run_dir(const ts_launch_join_opts *o, char *dir, size_t cap) {
    char probe[PATH_MAX + 32];
    if (o->run_dir) {
        snprintf(dir, cap, "%s", o->run_dir);
        return false;
    }
    folder_of(o->key_file, dir, cap);
    snprintf(probe, sizeof probe, "%s/scheduler.addr", dir);
    if (access(probe, F_OK) == 0) return true;
    ts_worker_run_dir(o->job, NULL, dir, cap);
    return false;
}

/* Whether run folder dir is the job's: its job.key holds the keys of the
 * key file the worker joins with (true too when the key file does not
 * load: the worker says why). */
static bool job_folder(const char *dir, const char *key_file) {
    ts_secure_keys mine, there;
    char path[PATH_MAX + 16];
    if (ts_secure_load(key_file, &mine)) return true;
    snprintf(path, sizeof path, "%s/job.key", dir);
    return ts_secure_load(path, &there) == TS_OK && strcmp(mine.server_public, there.server_public) == 0 &&
           strcmp(mine.client_public, there.client_public) == 0;
}

int ts_launch_join(const ts_launch_join_opts *o) {
    char exe[PATH_MAX], bin[PATH_MAX], prog[PATH_MAX + 32], dir[PATH_MAX];
    if (ts_super_paths(exe, bin, sizeof bin) != TS_OK) {
        fprintf(stderr, "%s\n", ts_last_error());
        return 1;
    }
    if (choose_run_dir(o, dir, sizeof dir)) fprintf(stderr, "[run] run folder %s (the key file's)\n", dir);
    if (!job_folder(dir, o->key_file)) {
        bool sharded = o->job->parallel.strategy == TS_STRATEGY_FSDP;
        fprintf(stderr,
                "tessera-run --join: %s%s is not the job's run folder (its job.key is missing or not %s): %s; give "
                "the folder of the job's scheduler.addr and job.key with --run-dir\n",
                sharded ? "" : "warning: ", dir, o->key_file,
                sharded ? "an fsdp worker writes its shards of every checkpoint into the job's"
                        : "should this worker come to lead the job, its metrics and checkpoints go there");
        if (sharded) return 2;
    }
    snprintf(prog, sizeof prog, "%s/tessera-worker", bin);
    ts_argv a = {0};
    ts_argv_push(&a, prog);
    ts_cluster_node_args(&a, o->address, o->key_file, o->job_path, o->sets, o->nsets);
    if (o->rank >= 0) ts_argv_pushf(&a, "--rank=%d", o->rank);
    if (o->force) ts_argv_push(&a, "--force");
    ts_argv_push(&a, "--run-dir");
    ts_argv_push(&a, dir);
    if (!ts_argv_ok(&a)) {
        fprintf(stderr, "tessera-run: out of memory\n");
        return 1;
    }
    fflush(NULL);
    execv(prog, a.v);
    perror(prog);
    ts_argv_free(&a);
    return 127;
}
