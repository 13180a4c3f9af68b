/* pipeline.c - bench_pipeline: pipeline parallelism measured against its
 * theory and against one process, in one run.
 *
 * The model is an MLP of eight layers (and a 784 x 10 head), cut
 * (parallel.pipeline_stages) so that every stage does the same work: 784
 * wide, but the first layer's output is 944 wide, because stage 0 computes
 * no gradient for its input (the images), and 5 GEMMs of 784 x 944 weigh
 * what 6 of 784 x 784 do; every run is a
 * real tessera-run job (scheduler + P stage processes, strategy
 * "pipeline", parallel.timeline on) on Fashion-MNIST with micro-batches of
 * --rows samples, each stage at one thread. From the stages' timelines
 * (<run>/timeline/stage-S-replica-0.jsonl: each forward and backward interval per step) it
 * prints:
 *   1. the per-stage busy/idle timeline of one step for P = 2 and P = 4
 *      (M = 8, both schedules) as text, and all four as an SVG chart
 *      (--out FILE, default runs/bench-pipeline.svg);
 *   2. the bubble: per step, each stage's idle share of the step's span
 *      (first forward start to last backward end over all stages),
 *      averaged over stages and over the steps after --warmup, for P = 2
 *      and 4 and M = 1, 4, 8, 16 (1f1b), beside (P - 1) / (M + P - 1) and
 *      beside a model of the same schedule with the stages' measured
 *      costs and the measured hand-off between stages;
 *   3. stage 0's peak activation memory under gpipe and 1f1b (P = 4, M =
 *      16): the most the allocator holds after one of its forwards or
 *      backwards, beyond what it held at the step's start (what the
 *      micro-batches in flight keep, not one operation's temporaries),
 *      against one micro-batch's (M = 1);
 *   4. throughput: P = 2 (each stage one thread, M = 8) against one
 *      process with two threads at the same batch (local strategy), median
 *      samples/s over the steps after --warmup.
 * Each configuration runs --reps times; the figures are medians with the
 * spread (min..max) over the reps.
 *
 * The stages' links are CURVE-secured as every job's are by default;
 * --security none runs them in plain TCP (parallel.ring_security), as on a
 * trusted network, where a hand-off is not sealed and opened; --transport
 * ipc carries them over unix sockets (parallel.transport), as stages on one
 * host may. --chunks V > 1 runs interleaved 1F1B (parallel.chunks_per_stage:
 * the layers cut into P x V equal pieces, stage s holding pieces s, s + P,
 * ...) against its theory (P - 1) / (VM + P - 1), M = 4, 8, 16 only (M must
 * be a multiple of P), and 3 with both schedules interleaved.
 *
 * usage: bench_pipeline [--steps N] [--warmup W] [--rows R] [--reps K] [--out FILE]
 *                       [--security curve|none] [--transport tcp|ipc] [--chunks V]
 */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "sharding/schedule.h"

enum { MAX_STAGES = 4, MAX_MICRO = 16, MAX_CHUNKS = 2, MAX_STEPS = 64, MAX_REPS = 9 };
enum { MAX_OPS = 2 * MAX_CHUNKS * MAX_MICRO };

static char bin_dir[PATH_MAX], tmp_dir[64];
static int steps = 20, warmup = 5, rows = 16, reps = 3, chunks = 1;
static const char *security = "curve"; /* the stages' links: parallel.ring_security */
static const char *transport = "tcp";  /* and parallel.transport */

/* One stage's intervals in one step. */
typedef struct {
    double start, end; /* the stage's step */
    double held;       /* allocator bytes in use at its start */
    double peak;       /* the most in use after one of its intervals */
    int n;
    char kind[MAX_OPS];
    int micro[MAX_OPS], chunk[MAX_OPS];
    double t0[MAX_OPS], t1[MAX_OPS];
} stage_step;

/* A run's timeline: tl[step][stage]. */
typedef struct {
    int P, V, M, steps;
    stage_step tl[MAX_STEPS + 1][MAX_STAGES];
} timeline;

/* ---- running jobs ---- */

/* Writes the job and runs it with tessera-run in dir (P stages of V chunks,
 * threads per process); 0 on success. strategy "local" runs one process at
 * batch rows * M. */
static int run_job(const char *dir, const char *strategy, int P, int V, int M, const char *sched, int threads) {
    char job[PATH_MAX], text[2048], cmd[3 * PATH_MAX];
    snprintf(job, sizeof job, "%s.json", dir);
    int pipeline = strcmp(strategy, "pipeline") == 0;
    char par[512];
    /* the 17 units (fc0, relu0, ..., fc8) cut evenly: 2, 4 or 8 pieces of
     * equal work, the head with the last */
    int pieces = P * V;
    const char *cut = pieces == 2 ? "[8, 9]" : pieces == 4 ? "[4, 4, 4, 5]" : "[2, 2, 2, 2, 2, 2, 2, 3]";
    if (pipeline)
        snprintf(par, sizeof par, "\"strategy\": \"pipeline\", \"stages\": %d, \"micro_batches\": %d, "
                 "\"schedule\": \"%s\", \"timeline\": true, \"pipeline_stages\": %s, \"ring_security\": \"%s\", "
                 "\"transport\": \"%s\", \"chunks_per_stage\": %d", P, M, sched, cut, security, transport, V);
    else
        snprintf(par, sizeof par, "\"strategy\": \"local\"");
    snprintf(text, sizeof text,
             "{\"name\": \"bench-pipeline\", \"seed\": 1, \"steps\": %d,\n"
             " \"model\": {\"arch\": \"mlp\", \"hidden\": [944, 784, 784, 784, 784, 784, 784, 784]},\n"
             " \"data\": {\"kind\": \"fashion_mnist\", \"prefetch\": 0},\n"
             " \"optimizer\": {\"kind\": \"sgd\", \"lr\": 0.01},\n"
             " \"train\": {\"batch_size\": %d, \"log_every\": 1, \"eval_batches\": 1},\n"
             " \"parallel\": {%s}}\n", steps, rows * M, par);
    FILE *f = fopen(job, "w");
    if (!f || fputs(text, f) < 0 || fclose(f)) {
        fprintf(stderr, "bench_pipeline: cannot write %s\n", job);
        return 1;
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && TESSERA_NUM_THREADS=%d '%s/tessera-run' '%s' --run-dir '%s' > '%s.log' 2>&1",
             dir, threads, bin_dir, job, dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_pipeline: %s failed; see %s.log\n", job, dir);
        return 1;
    }
    return 0;
}

/* Reads the stages' timeline files of run folder dir into tl. */
static int read_timeline(const char *dir, int P, int M, timeline *tl) {
    memset(tl, 0, sizeof *tl);
    tl->P = P;
    tl->M = M;
    for (int s = 0; s < P; s++) {
        char path[PATH_MAX + 64], line[1 << 16];
        snprintf(path, sizeof path, "%s/timeline/stage-%d-replica-0.jsonl", dir, s);
        FILE *f = fopen(path, "r");
        if (!f) {
            fprintf(stderr, "bench_pipeline: no timeline %s\n", path);
            return 1;
        }
        while (fgets(line, sizeof line, f)) {
            json_t *j = json_loads(line, 0, NULL), *ops = j ? json_object_get(j, "ops") : NULL;
            int step = j ? (int)json_integer_value(json_object_get(j, "step")) : 0;
            if (j && step >= 1 && step <= MAX_STEPS && json_is_array(ops)) {
                stage_step *ss = &tl->tl[step][s];
                tl->V = (int)json_integer_value(json_object_get(j, "chunks"));
                ss->start = json_real_value(json_object_get(j, "start"));
                ss->end = json_real_value(json_object_get(j, "end"));
                ss->held = json_number_value(json_object_get(j, "held"));
                ss->peak = ss->held;
                size_t i;
                json_t *op;
                json_array_foreach(ops, i, op) {
                    if (ss->n == MAX_OPS) break;
                    ss->kind[ss->n] = json_string_value(json_array_get(op, 0))[0];
                    ss->micro[ss->n] = (int)json_integer_value(json_array_get(op, 1));
                    ss->chunk[ss->n] = (int)json_integer_value(json_array_get(op, 5));
                    ss->t0[ss->n] = json_real_value(json_array_get(op, 2));
                    ss->t1[ss->n] = json_real_value(json_array_get(op, 3));
                    double held = json_number_value(json_array_get(op, 4));
                    if (held > ss->peak) ss->peak = held;
                    ss->n++;
                }
                if (step > tl->steps) tl->steps = step;
            }
            json_decref(j);
        }
        fclose(f);
    }
    return 0;
}

/* The span of one step over all stages: first interval start to last end. */
static void step_span(const timeline *tl, int step, double *lo, double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int s = 0; s < tl->P; s++) {
        const stage_step *ss = &tl->tl[step][s];
        for (int i = 0; i < ss->n; i++) {
            if (ss->t0[i] < *lo) *lo = ss->t0[i];
            if (ss->t1[i] > *hi) *hi = ss->t1[i];
        }
    }
}

/* The mean idle share of the stages over the steps after the warm-up. */
static double bubble(const timeline *tl) {
    double sum = 0;
    int n = 0;
    for (int step = warmup + 1; step <= tl->steps; step++) {
        double lo, hi;
        step_span(tl, step, &lo, &hi);
        if (!(hi > lo)) continue;
        for (int s = 0; s < tl->P; s++) {
            double busy = 0;
            const stage_step *ss = &tl->tl[step][s];
            for (int i = 0; i < ss->n; i++) busy += ss->t1[i] - ss->t0[i];
            sum += 1 - busy / (hi - lo);
            n++;
        }
    }
    return n ? sum / n : NAN;
}

/* ---- what the bubble is made of ---- */

/* The medians over the steps after the warm-up of each stage's forward and
 * backward of one micro-batch through one chunk (F[s], B[s]), and of the
 * hand-off *x: from the end of an operation to the start of the one it
 * feeds on the neighbour stage (forward to the next piece, backward to the
 * previous), where that stage was idle, waiting for it. */
static void stage_costs(const timeline *tl, double *F, double *B, double *x) {
    static double f[MAX_STEPS * MAX_OPS], b[MAX_STEPS * MAX_OPS], h[MAX_STEPS * MAX_OPS * MAX_STAGES];
    size_t nh = 0;
    for (int s = 0; s < tl->P; s++) {
        size_t nf = 0, nb = 0;
        for (int step = warmup + 1; step <= tl->steps; step++) {
            const stage_step *ss = &tl->tl[step][s];
            for (int i = 0; i < ss->n; i++) {
                if (ss->kind[i] == 'F') f[nf++] = ss->t1[i] - ss->t0[i];
                else b[nb++] = ss->t1[i] - ss->t0[i];
                int from = ss->chunk[i] * tl->P + s + (ss->kind[i] == 'F' ? -1 : 1); /* the piece it waits for */
                if (from < 0 || from >= tl->P * tl->V) continue;
                const stage_step *up = &tl->tl[step][from % tl->P];
                for (int j = 0; j < up->n; j++)
                    if (up->kind[j] == ss->kind[i] && up->micro[j] == ss->micro[i] && up->chunk[j] == from / tl->P &&
                        (i == 0 || ss->t1[i - 1] <= up->t1[j]))
                        h[nh++] = ss->t0[i] - up->t1[j];
            }
        }
        F[s] = nf ? bench_upper_median(f, nf) : 0;
        B[s] = nb ? bench_upper_median(b, nb) : 0;
    }
    *x = nh ? bench_upper_median(h, nh) : 0;
}

/* ---- charts ---- */

/* Prints one step of tl as rows of characters: F forward, B backward,
 * '.' idle, width columns over the step's span. */
static void print_chart(const char *title, const timeline *tl, int step, int width) {
    double lo, hi;
    step_span(tl, step, &lo, &hi);
    printf("%s, step %d (%.1f ms; F forward, B backward, . idle)\n", title, step, hi - lo);
    for (int s = 0; s < tl->P; s++) {
        char row[256];
        memset(row, '.', (size_t)width);
        row[width] = '\0';
        const stage_step *ss = &tl->tl[step][s];
        for (int i = 0; i < ss->n; i++) {
            int a = (int)((ss->t0[i] - lo) / (hi - lo) * width), b = (int)((ss->t1[i] - lo) / (hi - lo) * width);
            for (int c = a; c <= b && c < width; c++) row[c] = ss->kind[i];
        }
        printf("  stage %d |%s|\n", s, row);
    }
}

/* Appends one step of tl to the SVG at vertical offset y (pixels). */
static void svg_chart(FILE *f, const char *title, const timeline *tl, int step, int y) {
    double lo, hi;
    step_span(tl, step, &lo, &hi);
    const double x0 = 80, w = 900, rowh = 22;
    fprintf(f, "<text x=\"10\" y=\"%d\" font-size=\"14\">%s, step %d: %.1f ms</text>\n", y + 14, title, step, hi - lo);
    for (int s = 0; s < tl->P; s++) {
        double ry = y + 22 + s * rowh;
        fprintf(f, "<text x=\"10\" y=\"%.0f\" font-size=\"12\">stage %d</text>\n", ry + 15, s);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#eeeeee\"/>\n", x0, ry, w,
                rowh - 4);
        const stage_step *ss = &tl->tl[step][s];
        for (int i = 0; i < ss->n; i++) {
            double a = x0 + (ss->t0[i] - lo) / (hi - lo) * w, b = x0 + (ss->t1[i] - lo) / (hi - lo) * w;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"%s\"/>"
                    "<text x=\"%.1f\" y=\"%.0f\" font-size=\"10\" fill=\"white\">%d</text>\n",
                    a, ry, b - a > 0.5 ? b - a : 0.5, rowh - 4, ss->kind[i] == 'F' ? "#3b7dd8" : "#d8763b", a + 2,
                    ry + 13, ss->micro[i]);
        }
    }
}

/* ---- the figures ---- */

/* Stage 0's activation bytes: the median over the steps after the warm-up
 * of its peak beyond what it held at the step's start. */
static double stage0_activations(const timeline *tl) {
    double v[MAX_STEPS];
    int n = 0;
    for (int step = warmup + 1; step <= tl->steps; step++) v[n++] = tl->tl[step][0].peak - tl->tl[step][0].held;
    return n ? bench_upper_median(v, (size_t)n) : NAN;
}

/* The median of the leader's samples/s over the steps after the warm-up,
 * from dir/metrics.jsonl. */
static int read_metrics(const char *dir, double *samples_per_s) {
    char path[PATH_MAX + 32], line[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    double sps[MAX_STEPS + 1];
    int n = 0;
    while (fgets(line, sizeof line, f) && n <= MAX_STEPS) {
        json_t *j = json_loads(line, 0, NULL);
        const char *kind = j ? json_string_value(json_object_get(j, "kind")) : NULL;
        if (kind && !strcmp(kind, "step") && json_integer_value(json_object_get(j, "step")) > warmup)
            sps[n++] = json_number_value(json_object_get(j, "samples_per_s"));
        json_decref(j);
    }
    fclose(f);
    if (!n) return 1;
    *samples_per_s = bench_upper_median(sps, (size_t)n);
    return 0;
}

/* Median and spread of v[n]. */
static void summary(double *v, int n, double *med, double *lo, double *hi) {
    bench_sort(v, (size_t)n);
    *med = v[n / 2];
    *lo = v[0];
    *hi = v[n - 1];
}

static int parse_args(int argc, char **argv, char *out, size_t cap) {
    snprintf(out, cap, "runs/bench-pipeline.svg");
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--steps") && v) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && v) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && v) snprintf(out, cap, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--security") && v && (!strcmp(v, "curve") || !strcmp(v, "none")))
            security = argv[++i];
        else if (!strcmp(argv[i], "--transport") && v && (!strcmp(v, "tcp") || !strcmp(v, "ipc")))
            transport = argv[++i];
        else if (!strcmp(argv[i], "--chunks") && v && atoi(v) >= 1 && atoi(v) <= MAX_CHUNKS) chunks = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_pipeline [--steps N] [--warmup W] [--rows R] [--reps K] [--out FILE] "
                            "[--security curve|none] [--transport tcp|ipc] [--chunks 1..%d]\n", MAX_CHUNKS);
            return 1;
        }
    }
    if (steps < 2 || steps > MAX_STEPS || warmup < 0 || warmup >= steps || rows < 1 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench_pipeline: --steps 2..%d, --warmup below it, --rows >= 1, --reps 1..%d\n", MAX_STEPS,
                MAX_REPS);
        return 1;
    }
    return 0;
}

/* 1 and 2: timelines and the bubble against the theory, and against the
 * model of the same schedule with the stages' measured costs and hand-off
 * (what the theory leaves out). */
static int bubbles(FILE *svg) {
    static const int Ps[] = {2, 4}, Ms[] = {1, 4, 8, 16};
    static timeline tl;
    int y = 10;
    printf("\n## bubble (1f1b%s; idle share of the step's span, median over %d reps [min..max])\n",
           chunks > 1 ? " interleaved" : "", reps);
    printf("model: the schedule with the stages' measured forward F and backward B per micro-batch and the\n"
           "measured hand-off x between stages (theory: F and B equal on every stage, x = 0)\n");
    printf("%-3s %-3s %-7s %-7s %-22s %-8s %-8s %s\n", "P", "M", "theory", "model", "measured", "-theory", "-model",
           "F / B per stage ms, x ms");
    for (int pi = 0; pi < 2; pi++)
        for (int mi = 0; mi < 4; mi++) {
            int P = Ps[pi], M = Ms[mi];
            if (M % P && chunks > 1) continue; /* interleaving needs a multiple of P */
            ts_pipe_shape shape = {true, P, chunks, M};
            double b[MAX_REPS], mod[MAX_REPS], F[MAX_STAGES], B[MAX_STAGES], x = 0, med, lo, hi, mmed, mlo, mhi;
            for (int r = 0; r < reps; r++) {
                char dir[PATH_MAX];
                snprintf(dir, sizeof dir, "%s/p%d-m%d-1f1b", tmp_dir, P, M);
                if (run_job(dir, "pipeline", P, chunks, M, "1f1b", 1) || read_timeline(dir, P, M, &tl)) return 1;
                b[r] = bubble(&tl);
                stage_costs(&tl, F, B, &x);
                if (ts_pipe_simulate(&shape, F, B, x, &mod[r])) mod[r] = NAN;
            }
            summary(b, reps, &med, &lo, &hi);
            summary(mod, reps, &mmed, &mlo, &mhi);
            double theory = ts_pipe_bubble(&shape);
            char costs[256];
            int n = 0;
            for (int s = 0; s < P; s++) n += snprintf(costs + n, sizeof costs - (size_t)n, "%s%.2f/%.2f", s ? " " : "", F[s], B[s]);
            snprintf(costs + n, sizeof costs - (size_t)n, ", x %.2f", x);
            printf("%-3d %-3d %-7.3f %-7.3f %.3f [%.3f..%.3f]   %+-8.1f %+-8.1f %s\n", P, M, theory, mmed, med, lo, hi,
                   100 * (med - theory), 100 * (med - mmed), costs);
        }
    printf("\n## timelines (one step after the warm-up)\n");
    for (int pi = 0; pi < 2; pi++)
        for (int k = 0; k < 2; k++) {
            const char *sched = k ? "1f1b" : "gpipe";
            char dir[PATH_MAX], title[64];
            snprintf(dir, sizeof dir, "%s/p%d-m8-%s", tmp_dir, Ps[pi], sched);
            if (run_job(dir, "pipeline", Ps[pi], chunks, 8, sched, 1) || read_timeline(dir, Ps[pi], 8, &tl)) return 1;
            snprintf(title, sizeof title, "P = %d, M = 8, %s", Ps[pi], sched);
            print_chart(title, &tl, warmup + 1, 96);
            svg_chart(svg, title, &tl, warmup + 1, y);
            y += 40 + 22 * Ps[pi];
        }
    return 0;
}

/* 3: stage 0's activation memory, gpipe against 1f1b (with --chunks, both
 * interleaved, against one plain micro-batch). */
static int memory(void) {
    static timeline tl;
    const int V = chunks;
    const struct {
        int M, chunks;
        const char *sched;
    } runs[] = {{1, 1, "1f1b"}, {16, V, "gpipe"}, {16, V, "1f1b"}};
    double act[3];
    for (int k = 0; k < 3; k++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/mem-%d-%d-%s", tmp_dir, runs[k].M, runs[k].chunks, runs[k].sched);
        if (run_job(dir, "pipeline", 4, runs[k].chunks, runs[k].M, runs[k].sched, 1) ||
            read_timeline(dir, 4, runs[k].M, &tl))
            return 1;
        act[k] = stage0_activations(&tl);
    }
    /* 1f1b holds its warm-up and one more: P of the stage's micro-batches,
     * interleaved 2 (P - 1) + (V - 1) P + 1 chunks' of 1 / V each */
    double theory = V == 1 ? 4 : (2.0 * 3 + (V - 1) * 4 + 1) / V;
    printf("\n## stage 0 peak activation memory (P = 4, M = 16, %d chunks per stage, micro-batch of %d; one plain "
           "micro-batch holds %.3f MiB)\n", V, rows, act[0] / (1 << 20));
    printf("gpipe %.3f MiB = %.1f micro-batches, 1f1b %.3f MiB = %.1f micro-batches (theory, the chunks' own "
           "activations: 16 and %.1f); "
           "1f1b / gpipe = %.2f\n", act[1] / (1 << 20), act[1] / act[0], act[2] / (1 << 20), act[2] / act[0], theory,
           act[2] / act[1]);
    return 0;
}

/* 4: P = 2 against one process at the same batch, threads split fairly. */
static int throughput(void) {
    printf("\n## throughput at batch %d: P = 2 (1 thread per stage, M = 8, 1f1b, %d chunks per stage) against one "
           "process (2 threads)\n", rows * 8, chunks);
    double pipe[MAX_REPS], local[MAX_REPS], ratio[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/tp-local", tmp_dir);
        if (run_job(dir, "local", 1, 1, 8, "", 2) || read_metrics(dir, &local[r])) return 1;
        snprintf(dir, sizeof dir, "%s/tp-pipe", tmp_dir);
        if (run_job(dir, "pipeline", 2, chunks, 8, "1f1b", 1) || read_metrics(dir, &pipe[r])) return 1;
        ratio[r] = pipe[r] / local[r];
    }
    double m[3], lo[3], hi[3];
    summary(local, reps, &m[0], &lo[0], &hi[0]);
    summary(pipe, reps, &m[1], &lo[1], &hi[1]);
    summary(ratio, reps, &m[2], &lo[2], &hi[2]);
    printf("one process %.0f samples/s [%.0f..%.0f], P = 2 %.0f samples/s [%.0f..%.0f]: P = 2 / one = %.2f "
           "[%.2f..%.2f]\n", m[0], lo[0], hi[0], m[1], lo[1], hi[1], m[2], lo[2], hi[2]);
    return 0;
}

int main(int argc, char **argv) {
    char out[PATH_MAX];
    if (parse_args(argc, argv, out, sizeof out)) return 2;
    if (bench_bin_dir(bin_dir, sizeof bin_dir)) return 1;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/bench-pipeline-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    FILE *svg = fopen(out, "w");
    if (!svg) {
        fprintf(stderr, "bench_pipeline: cannot write %s\n", out);
        return 1;
    }
    fprintf(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"%d\" "
            "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", 4 * 40 + 22 * 12 + 20);
    printf("bench_pipeline: MLP of 8 layers 784 wide (the first 944), micro-batches of %d rows, %d chunks per stage, "
           "%d steps (first %d warm-up), %d reps; runs in %s\n", rows, chunks, steps, warmup, reps, tmp_dir);
    int rc = bubbles(svg) || memory() || throughput();
    fprintf(svg, "</svg>\n");
    fclose(svg);
    if (!rc) printf("\nchart: %s\n", out);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (!rc && system(cmd) != 0) fprintf(stderr, "bench_pipeline: could not remove %s\n", tmp_dir);
    return rc;
}
