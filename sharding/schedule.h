/* schedule.h - the order in which a pipeline stage runs its micro-batches.
 *
 * Pure planning, like plan.h: given the schedule, the number of stages P,
 * the model chunks V each stage holds, the stage s and the micro-batches M
 * of one batch, the 2VM operations the stage runs, in order (a forward or a
 * backward of one micro-batch through one of its chunks).
 *   gpipe  every forward, then every backward: M micro-batches' activations
 *          are held at once.
 *   1f1b   (PipeDream-flush) min(P - s - 1, M) forwards (warm-up), then one
 *          forward and one backward in turn, then the backwards left (cool-
 *          down): stage s holds at most P - s micro-batches' activations.
 * With V > 1 chunks (interleaved 1F1B, as Megatron's virtual stages) the
 * model is cut into PV pieces and stage s holds pieces s, s + P, ... (its
 * chunks 0 .. V-1): a micro-batch goes through every stage V times. The
 * forwards run in groups of P micro-batches, chunk by chunk (chunk 0 of
 * micro-batches 0 .. P-1, chunk 1 of the same, ..., then the next P), the
 * backwards likewise from the last chunk; 1f1b warms up with 2 (P - s - 1)
 * + (V - 1) P forwards (at most VM). M must be a multiple of P. The bubble
 * shrinks to (P - 1) / (VM + P - 1) for the price of V times the hand-offs.
 * Backwards run in micro-batch order per chunk, so a stage adds its
 * gradients up in the order of a local run's gradient accumulation. Every
 * schedule ends the batch with all of its backwards (one optimizer step
 * follows).
 */
#ifndef TS_SHARDING_SCHEDULE_H
#define TS_SHARDING_SCHEDULE_H

#include <stdbool.h>

#include "kernels/status.h"

typedef enum { TS_PIPE_FORWARD, TS_PIPE_BACKWARD } ts_pipe_kind;

typedef struct {
    ts_pipe_kind kind;
    int micro; /* micro-batch index, 0 .. M-1 */
    int chunk; /* the stage's model chunk, 0 .. V-1 */
} ts_pipe_op;

/* A pipeline: schedule, P stages of V chunks each, M micro-batches. */
typedef struct {
    bool one_f_one_b;
    int stages, chunks, micro;
} ts_pipe_shape;

/* Checks the shape: P, V, M >= 1, and M a multiple of P when V > 1. */
ts_status ts_pipe_check(const ts_pipe_shape *sh);

/* Fills ops[0 .. 2VM) with stage's order (0 <= stage < P). */
ts_status ts_pipe_schedule(const ts_pipe_shape *sh, int stage, ts_pipe_op *ops);

/* The bubble of the pipeline with micro-batches of equal cost per chunk:
 * (P - 1) / (VM + P - 1), the fraction of each stage's time spent idle. */
double ts_pipe_bubble(const ts_pipe_shape *sh);

/* Plays the stages' orders out: stage s's forward through one chunk costs
 * fwd[s] and its backward bwd[s]; a forward waits for the forward of its
 * micro-batch through the piece before (on the previous stage, or for
 * chunk c > 0 of stage 0, chunk c - 1 of the last stage) and a backward for
 * the backward through the piece after, each plus `handoff`. Puts the
 * stages' mean idle share of the span (first start to last end) in
 * *bubble; fails if a stage is left waiting. */
ts_status ts_pipe_simulate(const ts_pipe_shape *sh, const double *fwd, const double *bwd, double handoff,
                           double *bubble);

#endif
