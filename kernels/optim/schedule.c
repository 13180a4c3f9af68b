/* schedule.c - constant, step and warmup+cosine learning-rate schedules. */
#include "kernels/optim/schedule.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const char *const schedule_names[] = {"constant", "step", "cosine"};

const char *ts_schedule_kind_name(ts_schedule_kind kind) {
    return (unsigned)kind < 3 ? schedule_names[kind] : "unknown";
}

int ts_schedule_kind_parse(const char *name) {
    for (int k = 0; name && k < 3; k++)
        if (strcmp(name, schedule_names[k]) == 0) return k;
    return -1;
}

static bool bad_lr(double v) { return !(v >= 0) || isinf(v); }

/* Writes what is wrong with s into msg and returns false, or returns true.
 * Shared by ts_schedule_check (which reports) and ts_schedule_lr (which
 * must stay pure and leave the caller's error message alone). */
static bool schedule_valid(const ts_schedule *s, char *msg, size_t n) {
    if (!s) return snprintf(msg, n, "schedule: config is NULL"), false;
    if ((unsigned)s->kind > TS_SCHEDULE_COSINE)
        return snprintf(msg, n, "schedule: unknown kind %d (constant, step, cosine)", (int)s->kind), false;
    const char *kn = ts_schedule_kind_name(s->kind);
    if (bad_lr(s->base_lr))
        return snprintf(msg, n, "schedule %s: base_lr = %g must be finite and >= 0", kn, s->base_lr), false;
    if (s->kind == TS_SCHEDULE_STEP) {
        if (s->step_size < 1)
            return snprintf(msg, n, "schedule step: step_size = %lld must be >= 1", (long long)s->step_size), false;
        if (bad_lr(s->gamma))
            return snprintf(msg, n, "schedule step: gamma = %g must be finite and >= 0", s->gamma), false;
    } else if (s->kind == TS_SCHEDULE_COSINE) {
        if (bad_lr(s->min_lr) || s->min_lr > s->base_lr)
            return snprintf(msg, n, "schedule cosine: min_lr = %g must be in [0, base_lr = %g]", s->min_lr,
                            s->base_lr),
                   false;
        if (s->warmup_steps < 0 || s->total_steps <= s->warmup_steps)
            return snprintf(msg, n,
                            "schedule cosine: need 0 <= warmup_steps < total_steps (warmup_steps %lld, "
                            "total_steps %lld)",
                            (long long)s->warmup_steps, (long long)s->total_steps),
                   false;
    }
    return true;
}

ts_status ts_schedule_check(const ts_schedule *s) {
    char msg[256];
    return schedule_valid(s, msg, sizeof msg) ? TS_OK : ts_error(TS_ERR_VALUE, "%s", msg);
}

double ts_schedule_lr(const ts_schedule *s, int64_t step) {
    char msg[256];
    if (step < 0 || !schedule_valid(s, msg, sizeof msg)) return NAN;
    switch (s->kind) {
    case TS_SCHEDULE_CONSTANT: return s->base_lr;
    case TS_SCHEDULE_STEP: return s->base_lr * pow(s->gamma, (double)(step / s->step_size));
    case TS_SCHEDULE_COSINE:
        if (step < s->warmup_steps) return s->base_lr * (double)(step + 1) / (double)s->warmup_steps;
        if (step >= s->total_steps) return s->min_lr;
        {
            double progress = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
            return s->min_lr + (s->base_lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
        }
    }
    return NAN;
}
