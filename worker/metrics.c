/* metrics.c - step and eval lines, progress bar, metrics.jsonl. */
#include "worker/metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/io/atomic.h"

static bool bar_shown;

/* The step a metrics.jsonl line is about ("step":N), or -1 when it names none. */
static int64_t line_step(const char *line) {
    const char *p = strstr(line, "\"step\":");
    return p ? strtoll(p + 7, NULL, 10) : -1;
}

/* Rewrites path keeping only the lines of steps up to last (and lines that
 * name no step); a missing file is fine. *kept: the last step a kept line
 * names, 0 when none does. */
static ts_status cut_after(const char *path, int64_t last, int64_t *kept) {
    *kept = 0;
    FILE *in = fopen(path, "r");
    if (!in) return errno == ENOENT ? TS_OK : ts_error(TS_ERR_IO, "metrics: cannot read %s: %s", path, strerror(errno));
    ts_io_atomic out;
    ts_status s = ts_io_atomic_open(&out, path);
    char *line = NULL;
    size_t cap = 0;
    int64_t dropped = 0;
    ssize_t len;
    while (!s && (len = getline(&line, &cap, in)) > 0) {
        int64_t step = line_step(line);
        if (step > last || line[len - 1] != '\n') { /* a later step, or a line cut short */
            dropped++;
            continue;
        }
        if (step > *kept) *kept = step;
        if (fputs(line, out.f) == EOF) s = ts_error(TS_ERR_IO, "metrics: cannot write %s: %s", out.tmp, strerror(errno));
    }
    free(line);
    fclose(in);
    if (s) {
        if (out.f) ts_io_atomic_abort(&out);
        return s;
    }
    if (dropped)
        printf("metrics: %lld lines of steps after %lld dropped from %s (those steps are logged again)\n",
               (long long)dropped, (long long)last, path);
    return ts_io_atomic_commit(&out);
}

FILE *ts_metrics_open_lines(const char *path, int64_t resumed_step, int64_t *last) {
    int64_t kept = 0;
    if (resumed_step > 0 && cut_after(path, resumed_step, &kept)) return NULL;
    if (last) *last = kept;
    FILE *f = fopen(path, resumed_step > 0 ? "a" : "w");
    if (!f) ts_error(TS_ERR_IO, "metrics: cannot open %s: %s", path, strerror(errno));
    return f;
}

FILE *ts_metrics_open(const char *run_dir, int64_t resumed_step, int64_t *last) {
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    return ts_metrics_open_lines(path, resumed_step, last);
}

void ts_metrics_banner(const ts_trainer *t) {
    static const char *archs[] = {"MLP", "CNN", "GPT"};
    const ts_model *m = t->model;
    /* the whole model's count, also where this process builds a part (a
     * pipeline stage) */
    ts_model_memory whole;
    long long n = ts_model_estimate(&t->spec, 1, 0, false, &whole) ? (long long)m->numel : (long long)whole.parameters;
    char part[64] = "";
    if (m->numel != n) snprintf(part, sizeof part, ", %lld of them here", (long long)m->numel);
    printf("job %s: %s with %lld parameters (%.2f MiB%s), %lld training samples, %lld steps of batch %lld\n",
           t->job.name, archs[t->spec.arch], n, (double)n * 4 / (1 << 20), part,
           (long long)ts_loader_length(t->loader), (long long)t->total_steps, (long long)t->job.train.batch_size);
    int64_t shape[TS_MAX_DIMS];
    ts_dtype dt;
    int nd = ts_model_input_shape(&t->spec, 1, shape, &dt);
    if (t->spec.arch == TS_ARCH_MLP) { /* images are flattened for the MLP */
        shape[1] = t->spec.widths[0];
        nd = 2;
    }
    /* a shared forward would wait for the other ranks' parameters */
    if (!t->strategy->shared_forward) ts_model_summary((ts_model *)m, stdout, dt, nd, shape);
    if (!t->val_set) printf("no validation part (data.val_fraction 0): no validation evaluations\n");
    if (t->step) printf("resumed at step %lld\n", (long long)t->step);
    else if (t->no_checkpoint) printf("--resume: no checkpoint in %s/checkpoints: training from the start\n", t->run_dir);
    fflush(stdout);
}

/* Redraws "[#####     ] step/total" on stderr. */
static void progress(int64_t step, int64_t total) {
    if (!isatty(STDERR_FILENO)) return;
    int width = 30, done = (int)(width * step / (total ? total : 1));
    fprintf(stderr, "\r[%.*s%*s] %lld/%lld", done, "##############################", width - done, "",
            (long long)step, (long long)total);
    fflush(stderr);
    bar_shown = true;
}

void ts_metrics_end_progress(void) {
    if (bar_shown) fputc('\n', stderr);
    bar_shown = false;
}

/* Flushes jsonl, the run's metrics.jsonl; TS_ERR_IO naming it when a
 * line written since the last flush did not reach it. */
static ts_status flushed(FILE *jsonl, const char *run_dir) {
    if (fflush(jsonl) == 0 && !ferror(jsonl)) return TS_OK;
    return ts_error(TS_ERR_IO, "metrics: cannot write %s/metrics.jsonl: %s", run_dir, strerror(errno));
}

ts_status ts_metrics_step(FILE *jsonl, const char *run_dir, const ts_step_stats *s, int64_t total_steps) {
    char rate[64];
    if (s->tokens_per_s > 0)
        snprintf(rate, sizeof rate, "%.0f tokens/s", s->tokens_per_s);
    else
        snprintf(rate, sizeof rate, "%.0f samples/s", s->samples_per_s);
    const ts_comm_times *c = &s->comm;
    double comm = c->push_ms + c->pull_ms + c->wait_ms;
    char split[128] = "";
    if (c->push_ms + c->pull_ms > 0) /* a parameter-server step */
        snprintf(split, sizeof split, " (compute %.1f, push %.1f, pull %.1f, wait %.1f)", s->step_ms - comm, c->push_ms,
                 c->pull_ms, c->wait_ms);
    else if (comm > 0) /* waits for peers (all-reduce, pipeline neighbours) */
        snprintf(split, sizeof split, " (compute %.1f, wait %.1f)", s->step_ms - comm, c->wait_ms);
    if (bar_shown) fputc('\r', stderr);
    if (s->adopted)
        printf("step %lld/%lld | loss %.4f | lr %.2e | taken under a leader that left before logging it\n",
               (long long)s->step, (long long)total_steps, s->loss, s->lr);
    else
        printf("step %lld/%lld | loss %.4f | lr %.2e | %s | %.1f ms%s | mem %.1f MiB (peak %.1f)\n",
               (long long)s->step, (long long)total_steps, s->loss, s->lr, rate, s->step_ms, split,
               (double)s->mem_bytes / (1 << 20), (double)s->peak_bytes / (1 << 20));
    fflush(stdout);
    progress(s->step, total_steps);
    if (!jsonl) return TS_OK;
    fprintf(jsonl,
            "{\"kind\":\"step\",\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_ms\":%.3f,"
            "\"samples_per_s\":%.1f,\"tokens_per_s\":%.1f,\"mem_bytes\":%zu,\"peak_bytes\":%zu,\"rss_peak_bytes\":%zu,"
            "\"push_ms\":%.3f,\"pull_ms\":%.3f,\"wait_ms\":%.3f,\"sent_bytes\":%llu}\n",
            (long long)s->step, s->loss, s->lr, s->grad_norm, s->step_ms, s->samples_per_s, s->tokens_per_s,
            s->mem_bytes, s->peak_bytes, s->rss_peak_bytes, c->push_ms, c->pull_ms, c->wait_ms,
            (unsigned long long)c->sent_bytes);
    return flushed(jsonl, run_dir);
}

ts_status ts_metrics_eval(FILE *jsonl, const char *run_dir, int64_t step, const char *split, const ts_eval_stats *e) {
    if (bar_shown) fputc('\r', stderr);
    if (e->accuracy >= 0)
        printf("eval %s at step %lld | loss %.4f | accuracy %.2f%% (%lld samples)\n", split, (long long)step,
               e->loss, 100 * e->accuracy, (long long)e->samples);
    else
        printf("eval %s at step %lld | loss %.4f | %.3f bits/byte (%lld sequences, %lld tokens)\n", split,
               (long long)step, e->loss, e->bits_per_byte, (long long)e->samples, (long long)e->predictions);
    fflush(stdout);
    if (!jsonl) return TS_OK;
    fprintf(jsonl, "{\"kind\":\"eval\",\"split\":\"%s\",\"step\":%lld,\"loss\":%.6f,\"accuracy\":%.6f,\"bpb\":%.6f}\n",
            split, (long long)step, e->loss, e->accuracy, e->bits_per_byte);
    return flushed(jsonl, run_dir);
}
