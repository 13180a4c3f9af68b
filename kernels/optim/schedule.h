/* schedule.h - learning-rate schedules as pure functions of the step.
 *
 * step counts optimizer steps already taken (0 for the first step, like
 * PyTorch's scheduler last_epoch), so the lr for step t of optim.h (t >= 1)
 * is ts_schedule_lr(s, t - 1). The same config gives the same lr on every
 * process, so a PS shard and a worker never need to send it.
 *   constant: base_lr
 *   step:     base_lr * gamma^floor(step / step_size)          (StepLR)
 *   cosine:   linear warmup base_lr * (step+1) / warmup_steps for
 *             step < warmup_steps, then min_lr + (base_lr - min_lr) *
 *             (1 + cos(pi * (step - warmup) / (total - warmup))) / 2,
 *             and min_lr from total_steps on.
 */
#ifndef TS_OPTIM_SCHEDULE_H
#define TS_OPTIM_SCHEDULE_H

#include <stdint.h>

#include "kernels/status.h"

typedef enum { TS_SCHEDULE_CONSTANT, TS_SCHEDULE_STEP, TS_SCHEDULE_COSINE } ts_schedule_kind;

typedef struct {
    ts_schedule_kind kind;
    double base_lr;
    /* step */
    int64_t step_size;
    double gamma;
    /* cosine with linear warmup */
    int64_t warmup_steps, total_steps;
    double min_lr;
} ts_schedule;

/* Checks the fields the kind uses (base_lr, min_lr >= 0 and finite,
 * step_size >= 1, gamma >= 0, 0 <= warmup_steps < total_steps, min_lr <=
 * base_lr); the error names the field. */
ts_status ts_schedule_check(const ts_schedule *s);

/* The learning rate after `step` steps; NaN if s fails ts_schedule_check or
 * step < 0. Pure: no state, same answer every call. */
double ts_schedule_lr(const ts_schedule *s, int64_t step);

/* "constant", "step", "cosine" and the reverse (-1 if unknown). */
const char *ts_schedule_kind_name(ts_schedule_kind kind);
int ts_schedule_kind_parse(const char *name);

#endif
