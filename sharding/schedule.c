/* schedule.c - gpipe, 1f1b and interleaved orders of a pipeline stage. */
#include "sharding/schedule.h"

#include <stdlib.h>

ts_status ts_pipe_check(const ts_pipe_shape *sh) {
    if (sh->stages < 1 || sh->chunks < 1 || sh->micro < 1)
        return ts_error(TS_ERR_VALUE, "pipeline schedule: %d stages of %d chunks with %d micro-batches", sh->stages,
                        sh->chunks, sh->micro);
    if (sh->chunks > 1 && sh->micro % sh->stages != 0)
        return ts_error(TS_ERR_VALUE, "pipeline schedule: %d micro-batches with %d chunks per stage: interleaving "
                        "needs a multiple of the %d stages", sh->micro, sh->chunks, sh->stages);
    return TS_OK;
}

/* The k-th forward (or backward) of a stage: in groups of P micro-batches
 * (one group of all M when V = 1), chunk by chunk, the backwards from the
 * last chunk. */
static ts_pipe_op nth(const ts_pipe_shape *sh, ts_pipe_kind kind, int k) {
    int size = sh->chunks > 1 ? sh->stages : sh->micro, V = sh->chunks; /* micro-batches per group */
    int group = k / (size * V), within = k % (size * V), chunk = within / size;
    return (ts_pipe_op){kind, group * size + within % size, kind == TS_PIPE_FORWARD ? chunk : V - 1 - chunk};
}

ts_status ts_pipe_schedule(const ts_pipe_shape *sh, int stage, ts_pipe_op *ops) {
    ts_status st = ts_pipe_check(sh);
    if (st) return st;
    int P = sh->stages, V = sh->chunks, total = V * sh->micro;
    if (stage < 0 || stage >= P)
        return ts_error(TS_ERR_VALUE, "pipeline schedule: stage %d of %d stages", stage, P);
    int warm = !sh->one_f_one_b ? total : V == 1 ? P - stage - 1 : 2 * (P - stage - 1) + (V - 1) * P;
    if (warm > total) warm = total;
    int n = 0, fwd = 0, bwd = 0;
    while (fwd < warm) ops[n++] = nth(sh, TS_PIPE_FORWARD, fwd++);
    while (fwd < total) { /* steady state: one forward, one backward */
        ops[n++] = nth(sh, TS_PIPE_FORWARD, fwd++);
        ops[n++] = nth(sh, TS_PIPE_BACKWARD, bwd++);
    }
    while (bwd < total) ops[n++] = nth(sh, TS_PIPE_BACKWARD, bwd++);
    return TS_OK;
}

double ts_pipe_bubble(const ts_pipe_shape *sh) {
    return (double)(sh->stages - 1) / ((double)sh->chunks * sh->micro + sh->stages - 1);
}

ts_status ts_pipe_simulate(const ts_pipe_shape *sh, const double *fwd, const double *bwd, double handoff,
                           double *bubble) {
    ts_status st = ts_pipe_check(sh);
    if (st) return st;
    int P = sh->stages, V = sh->chunks, M = sh->micro, per = 2 * V * M;
    size_t n = (size_t)P * (size_t)V * (size_t)M; /* done[(s * V + c) * M + m] */
    ts_pipe_op *ops = malloc((size_t)P * (size_t)per * sizeof *ops);
    double *fdone = malloc(n * sizeof *fdone), *bdone = malloc(n * sizeof *bdone);
    double *clock = calloc((size_t)P, sizeof *clock);
    int *next = calloc((size_t)P, sizeof *next);
    if (!ops || !fdone || !bdone || !clock || !next)
        st = ts_error(TS_ERR_MEMORY, "pipeline simulation: out of memory for %d stages", P);
    for (int s = 0; !st && s < P; s++) st = ts_pipe_schedule(sh, s, ops + (size_t)s * per);
    for (size_t i = 0; !st && i < n; i++) fdone[i] = bdone[i] = -1;
    for (bool progress = !st; progress;) {
        progress = false;
        for (int s = 0; s < P; s++) {
            if (next[s] == per) continue;
            ts_pipe_op op = ops[(size_t)s * per + next[s]];
            bool forward = op.kind == TS_PIPE_FORWARD;
            /* the piece it waits for: the one before (forward) or after it */
            int piece = op.chunk * P + s + (forward ? -1 : 1);
            double ready = clock[s];
            if (piece >= 0 && piece < P * V) {
                double done = (forward ? fdone : bdone)[((size_t)(piece % P) * V + piece / P) * M + op.micro];
                if (done < 0) continue;
                if (done + handoff > ready) ready = done + handoff;
            }
            clock[s] = ready + (forward ? fwd[s] : bwd[s]);
            (forward ? fdone : bdone)[((size_t)s * V + op.chunk) * M + op.micro] = clock[s];
            next[s]++;
            progress = true;
        }
    }
    double span = 0, idle = 0;
    for (int s = 0; !st && s < P; s++) {
        if (next[s] != per) st = ts_error(TS_ERR_STATE, "pipeline simulation: stage %d was left waiting", s);
        if (clock[s] > span) span = clock[s];
    }
    for (int s = 0; !st && s < P; s++) idle += 1 - V * M * (fwd[s] + bwd[s]) / span;
    if (!st) *bubble = idle / P;
    free(ops), free(fdone), free(bdone), free(clock), free(next);
    return st;
}
