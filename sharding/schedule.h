/* schedule.h - the order in which a pipeline stage runs its micro-batches.
 *
 * Pure planning, like plan.h: given the schedule, the number of stages P,
 * the stage s and the micro-batches M of one batch, the 2M operations the
 * stage runs, in order (a forward or a backward of one micro-batch).
 *   gpipe  every forward, then every backward: M micro-batches' activations
 *          are held at once.
 *   1f1b   (PipeDream-flush) min(P - s - 1, M) forwards (warm-up), then one
 *          forward and one backward in turn, then the backwards left (cool-
 *          down): stage s holds at most P - s micro-batches' activations.
 * Backwards run in micro-batch order in both, so a stage adds its
 * gradients up in the order of a local run's gradient accumulation. Both
 * end every batch with all of its backwards (one optimizer step follows).
 */
#ifndef TS_SHARDING_SCHEDULE_H
#define TS_SHARDING_SCHEDULE_H

#include <stdbool.h>

#include "kernels/status.h"

typedef enum { TS_PIPE_FORWARD, TS_PIPE_BACKWARD } ts_pipe_kind;

typedef struct {
    ts_pipe_kind kind;
    int micro; /* micro-batch index, 0 .. M-1 */
} ts_pipe_op;

/* Fills ops[0 .. 2M) with stage's order under 1f1b (or gpipe when not
 * one_f_one_b); 0 <= stage < stages and micro >= 1 are required. */
ts_status ts_pipe_schedule(bool one_f_one_b, int stages, int stage, int micro, ts_pipe_op *ops);

/* The bubble of a pipeline of P stages over M micro-batches of equal cost:
 * (P - 1) / (M + P - 1), the fraction of each stage's time spent idle. */
double ts_pipe_bubble(int stages, int micro);

/* Plays the stages' orders out: stage s's forward costs fwd[s] and its
 * backward bwd[s]; a forward waits for the previous stage's forward of its
 * micro-batch and a backward for the next stage's backward, each plus
 * `handoff`. Puts the stages' mean idle share of the span (first start to
 * last end) in *bubble; fails if a stage is left waiting. */
ts_status ts_pipe_simulate(bool one_f_one_b, int stages, int micro, const double *fwd, const double *bwd,
                           double handoff, double *bubble);

#endif
