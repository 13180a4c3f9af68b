/* fit.c - the memory check before a model is built (contract in fit.h). */
#include "worker/fit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/data/idx.h"
#include "kernels/data/text.h"
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

/* Bytes the job's data set takes in memory: a text corpus's bytes (the
 * files' sizes); from the Fashion-MNIST files' headers each image file's
 * pixels as f32 plus the bytes read to make them, each label as i64 plus
 * its byte. 0 when a file cannot be read (the loading names it). */
static double data_bytes(const ts_job *job) {
    const char *path = job->data.path[0] ? job->data.path : NULL;
    if (job->data.kind == TS_JOB_TEXT) {
        int64_t n;
        return ts_text_size(path, &n) ? 0 : (double)n;
    }
    double bytes = 0;
    for (int train = 0; train < 2; train++) {
        char images[4096], labels[4096];
        int64_t pixels, n;
        if (ts_idx_fashion_mnist_paths(path, train, images, labels, sizeof images) ||
            ts_idx_numel(images, &pixels) || ts_idx_numel(labels, &n))
            return 0;
        bytes += 5.0 * (double)pixels + 9.0 * (double)n;
    }
    return bytes;
}

/* bytes as "312.4 MiB" or "2.31 GiB" into buf. */
static const char *size_str(double bytes, char *buf, size_t cap) {
    if (bytes < GIB) snprintf(buf, cap, "%.1f MiB", bytes / (1024.0 * 1024.0));
    else snprintf(buf, cap, "%.2f GiB", bytes / GIB);
    return buf;
}

ts_status ts_fit_check(const ts_job *job, int workers, uint64_t available, const char *source) {
    ts_model_spec spec;
    ts_status st = ts_job_model_spec(job, &spec);
    if (st) return st;
    ts_optim_config oc;
    if ((st = ts_job_optim_config(job, &oc))) return st;
    ts_model_memory e;
    if ((st = ts_model_estimate(&spec, job->train.batch_size, ts_optim_state_slots(&oc), job->train.bf16, &e)))
        return st;
    pipeline_share(job, &e);
    double data = data_bytes(job), each = e.total_bytes + data, total = each * (workers > 1 ? workers : 1);
    if (total <= (double)available) return TS_OK;
    static const char *const archs[] = {"mlp", "cnn", "gpt"};
    char sz[8][32], many[96] = "";
    if (workers > 1)
        snprintf(many, sizeof many, " in each of its %d workers on this machine, %s in all", workers,
                 size_str(total, sz[7], 32));
    return ts_error(TS_ERR_MEMORY,
                    "model: %s of %.3g parameters needs about %s to train%s (parameters %s, gradients %s, "
                    "optimizer state %s, activations %s at train.batch_size %lld, data set %s) but %s are available "
                    "(%s); make the model or the batch smaller%s, or pass --force to try anyway",
                    archs[job->model.arch], e.parameters, size_str(each, sz[0], 32), many,
                    size_str(e.param_bytes, sz[1], 32), size_str(e.grad_bytes, sz[2], 32), size_str(e.optim_bytes, sz[3], 32),
                    size_str(e.activation_bytes, sz[4], 32), (long long)job->train.batch_size,
                    size_str(data, sz[5], 32), size_str((double)available, sz[6], 32), source,
                    workers > 1 ? ", run fewer workers here" : "");
}

ts_status ts_fit_check_here(const ts_job *job, int workers) {
    uint64_t available;
    char source[1200];
    ts_status st = ts_fit_available(&available, source, sizeof source);
    return st ? st : ts_fit_check(job, workers, available, source);
}
