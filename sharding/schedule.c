/* schedule.c - gpipe and 1f1b orders of a pipeline stage. */
#include "sharding/schedule.h"

#include <stdlib.h>

ts_status ts_pipe_schedule(bool one_f_one_b, int stages, int stage, int micro, ts_pipe_op *ops) {
    if (stages < 1 || stage < 0 || stage >= stages || micro < 1)
        return ts_error(TS_ERR_VALUE, "pipeline schedule: stage %d of %d stages with %d micro-batches", stage,
                        stages, micro);
    int warm = one_f_one_b ? stages - stage - 1 : micro;
    if (warm > micro) warm = micro;
    int n = 0, fwd = 0, bwd = 0;
    while (fwd < warm) ops[n++] = (ts_pipe_op){TS_PIPE_FORWARD, fwd++};
    while (fwd < micro) { /* steady state: one forward, one backward */
        ops[n++] = (ts_pipe_op){TS_PIPE_FORWARD, fwd++};
        ops[n++] = (ts_pipe_op){TS_PIPE_BACKWARD, bwd++};
    }
    while (bwd < micro) ops[n++] = (ts_pipe_op){TS_PIPE_BACKWARD, bwd++};
    return TS_OK;
}

double ts_pipe_bubble(int stages, int micro) { return (double)(stages - 1) / (micro + stages - 1); }

ts_status ts_pipe_simulate(bool one_f_one_b, int stages, int micro, const double *fwd, const double *bwd,
                           double handoff, double *bubble) {
    size_t n = (size_t)stages * (size_t)micro;
    ts_pipe_op *ops = stages > 0 && micro > 0 ? malloc(2 * n * sizeof *ops) : NULL;
    double *fdone = malloc((n + 1) * sizeof *fdone), *bdone = malloc((n + 1) * sizeof *bdone);
    double *clock = calloc((size_t)stages + 1, sizeof *clock);
    int *next = calloc((size_t)stages + 1, sizeof *next);
    ts_status st = ops && fdone && bdone && clock && next
                       ? TS_OK
                       : ts_error(TS_ERR_VALUE, "pipeline simulation: %d stages, %d micro-batches", stages, micro);
    for (int s = 0; !st && s < stages; s++) st = ts_pipe_schedule(one_f_one_b, stages, s, micro, ops + 2 * s * micro);
    for (size_t i = 0; !st && i < n; i++) fdone[i] = bdone[i] = -1;
    for (bool progress = !st; progress;) {
        progress = false;
        for (int s = 0; s < stages; s++) {
            if (next[s] == 2 * micro) continue;
            ts_pipe_op op = ops[2 * s * micro + next[s]];
            bool forward = op.kind == TS_PIPE_FORWARD;
            int from = forward ? s - 1 : s + 1; /* the stage it waits for */
            double ready = clock[s];
            if (from >= 0 && from < stages) {
                double done = (forward ? fdone : bdone)[from * micro + op.micro];
                if (done < 0) continue;
                if (done + handoff > ready) ready = done + handoff;
            }
            clock[s] = ready + (forward ? fwd[s] : bwd[s]);
            (forward ? fdone : bdone)[s * micro + op.micro] = clock[s];
            next[s]++;
            progress = true;
        }
    }
    double span = 0, idle = 0;
    for (int s = 0; !st && s < stages; s++) {
        if (next[s] != 2 * micro) st = ts_error(TS_ERR_STATE, "pipeline simulation: stage %d was left waiting", s);
        if (clock[s] > span) span = clock[s];
    }
    for (int s = 0; !st && s < stages; s++) idle += 1 - micro * (fwd[s] + bwd[s]) / span;
    if (!st) *bubble = idle / stages;
    free(ops), free(fdone), free(bdone), free(clock), free(next);
    return st;
}
