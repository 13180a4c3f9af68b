/* fit.c - the memory check before a model is built (contract in fit.h). */
#include "worker/fit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/optim/optim.h"
#include "proto/job_model.h"
#include "worker/trainer.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* The number in a one-line file; false when unreadable or not a number
 * ("max", an absent controller). */
static bool read_number(const char *path, uint64_t *v) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[64] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (!ok || end == buf || errno) return false;
    *v = x;
    return true;
}

/* Lowers *room to what is left under each memory limit from the cgroup
 * folder mount/path up to mount (limit and usage file names by version). */
static void cgroup_room(const char *mount, const char *path, const char *limit_file, const char *usage_file,
                        uint64_t *room, char *source, size_t cap) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s%s", mount, path);
    for (;;) {
        char lp[1100], up[1100];
        uint64_t limit, usage;
        snprintf(lp, sizeof lp, "%s/%s", dir, limit_file);
        snprintf(up, sizeof up, "%s/%s", dir, usage_file);
        if (read_number(lp, &limit) && limit < (1ull << 62) && read_number(up, &usage)) {
            uint64_t left = usage < limit ? limit - usage : 0;
            if (left < *room) {
                *room = left;
                snprintf(source, cap, "cgroup limit %s", lp);
            }
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(mount)) break;
        *slash = '\0';
    }
}

ts_status ts_fit_available(uint64_t *bytes, char *source, size_t cap) {
    uint64_t room = UINT64_MAX;
    snprintf(source, cap, "MemAvailable");
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) room = (uint64_t)kb * 1024;
    if (f) fclose(f);
    f = fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *path = strrchr(line, ':');
        if (!path) continue;
        *path++ = '\0';
        if (strncmp(line, "0:", 2) == 0 && line[2] == '\0') {
            cgroup_room("/sys/fs/cgroup", path, "memory.max", "memory.current", &room, source, cap);
            cgroup_room("/sys/fs/cgroup/unified", path, "memory.max", "memory.current", &room, source, cap);
        } else if (strstr(line, ":memory")) {
            cgroup_room("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes", &room,
                        source, cap);
        }
    }
    if (f) fclose(f);
    if (room == UINT64_MAX) return ts_error(TS_ERR_IO, "memory: neither /proc/meminfo nor a cgroup limit could be read");
    *bytes = room;
    return TS_OK;
}

/* A pipeline stage holds about 1/P of the model, and the activations of
 * the micro-batches in flight (M under gpipe, at most P under 1f1b) of its
 * 1/P of the layers. */
static void pipeline_share(const ts_job *job, ts_model_memory *e) {
    const ts_job_parallel *p = &job->parallel;
    if (p->strategy != TS_STRATEGY_PIPELINE) return;
    double P = p->stages, M = p->micro_batches, held = p->schedule == TS_PIPE_GPIPE || M < P ? M : P;
    e->param_bytes /= P;
    e->grad_bytes /= P;
    e->optim_bytes /= P;
    e->activation_bytes *= held / M / P;
    e->total_bytes = e->param_bytes + e->grad_bytes + e->optim_bytes + e->activation_bytes;
}

ts_status ts_fit_check(const ts_job *job, uint64_t available, const char *source) {
    ts_model_spec spec;
    ts_status st = ts_job_model_spec(job, &spec);
    if (st) return st;
    ts_optim_config oc;
    if ((st = ts_job_optim_config(job, &oc))) return st;
    ts_model_memory e;
    if ((st = ts_model_estimate(&spec, job->train.batch_size, ts_optim_state_slots(&oc), job->train.bf16, &e)))
        return st;
    pipeline_share(job, &e);
    if (e.total_bytes <= (double)available) return TS_OK;
    static const char *const archs[] = {"mlp", "cnn", "gpt"};
    return ts_error(TS_ERR_MEMORY,
                    "model: %s of %.3g parameters needs about %.1f GiB to train (parameters %.1f, gradients %.1f, "
                    "optimizer state %.1f, activations %.1f GiB at train.batch_size %lld) but %.1f GiB are available "
                    "(%s); make the model or the batch smaller, or pass --force to try anyway",
                    archs[job->model.arch], e.parameters, e.total_bytes / GIB, e.param_bytes / GIB, e.grad_bytes / GIB,
                    e.optim_bytes / GIB, e.activation_bytes / GIB, (long long)job->train.batch_size,
                    (double)available / GIB, source);
}

ts_status ts_fit_check_here(const ts_job *job) {
    uint64_t available;
    char source[1200];
    ts_status st = ts_fit_available(&available, source, sizeof source);
    return st ? st : ts_fit_check(job, available, source);
}
