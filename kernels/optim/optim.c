/* optim.c - configs and the SGD / Adam / AdamW step kernels over a range. */
#include "kernels/optim/optim.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* Ranges shorter than this run on one thread. */
#define OPTIM_OMP_MIN 32768

ts_optim_config ts_optim_defaults(ts_optim_kind kind) {
    ts_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    c.weight_decay = kind == TS_OPTIM_ADAMW ? 0.01 : 0.0;
    return c;
}

static const char *const kind_names[] = {"sgd", "adam", "adamw"};

const char *ts_optim_kind_name(ts_optim_kind kind) {
    return (unsigned)kind < 3 ? kind_names[kind] : "unknown";
}

int ts_optim_kind_parse(const char *name) {
    for (int k = 0; name && k < 3; k++)
        if (strcmp(name, kind_names[k]) == 0) return k;
    return -1;
}

static ts_status check_nonneg(const char *field, double v) {
    if (!(v >= 0) || isinf(v)) return ts_error(TS_ERR_VALUE, "optim: %s = %g must be finite and >= 0", field, v);
    return TS_OK;
}

ts_status ts_optim_check(const ts_optim_config *cfg) {
    if (!cfg) return ts_error(TS_ERR_VALUE, "optim: config is NULL");
    if ((unsigned)cfg->kind > TS_OPTIM_ADAMW)
        return ts_error(TS_ERR_VALUE, "optim: unknown kind %d (sgd, adam, adamw)", (int)cfg->kind);
    ts_status s;
    if ((s = check_nonneg("weight_decay", cfg->weight_decay))) return s;
    if (cfg->kind == TS_OPTIM_SGD) {
        if ((s = check_nonneg("momentum", cfg->momentum))) return s;
        if ((s = check_nonneg("dampening", cfg->dampening))) return s;
        if (cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0))
            return ts_error(TS_ERR_VALUE,
                            "optim: nesterov needs momentum > 0 and dampening = 0 (momentum %g, dampening %g)",
                            cfg->momentum, cfg->dampening);
        return TS_OK;
    }
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1))
        return ts_error(TS_ERR_VALUE, "optim: %s beta1 = %g must be in [0, 1)", ts_optim_kind_name(cfg->kind),
                        cfg->beta1);
    if (!(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return ts_error(TS_ERR_VALUE, "optim: %s beta2 = %g must be in [0, 1)", ts_optim_kind_name(cfg->kind),
                        cfg->beta2);
    return check_nonneg("eps", cfg->eps);
}

int ts_optim_state_slots(const ts_optim_config *cfg) {
    if (cfg->kind == TS_OPTIM_SGD) return cfg->momentum != 0 ? 1 : 0;
    return 2;
}

/* ---- kernels over one run of elements with fixed multipliers ---- */

typedef struct {
    float *p;
    const float *g;
    float *s0, *s1; /* state slots (momentum buffer, or m and v) */
    int64_t n;
    double lr, wd;  /* already scaled by the group */
} optim_run;

static void sgd_run(const ts_optim_config *cfg, int64_t t, const optim_run *r) {
    const float lr = (float)r->lr, wd = (float)r->wd, mom = (float)cfg->momentum;
    const float damp = (float)(1.0 - cfg->dampening);
    const bool first = t == 1, nesterov = cfg->nesterov, use_buf = r->s0 != NULL;
    float *restrict p = r->p, *restrict buf = r->s0;
    const float *restrict g = r->g;
    const int64_t n = r->n;
#pragma omp parallel for if (n > OPTIM_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (wd != 0) d = d + wd * p[i];
        if (use_buf) {
            float b = first ? d : mom * buf[i] + damp * d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] = p[i] - lr * d;
    }
}

static void adam_run(const ts_optim_config *cfg, int64_t t, const optim_run *r) {
    const double bc1 = 1.0 - pow(cfg->beta1, (double)t);
    const double bc2 = 1.0 - pow(cfg->beta2, (double)t);
    const float step_size = (float)(r->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float b1 = (float)cfg->beta1, b2 = (float)cfg->beta2, eps = (float)cfg->eps;
    const float c1 = (float)(1.0 - cfg->beta1), c2 = (float)(1.0 - cfg->beta2);
    const bool decoupled = cfg->kind == TS_OPTIM_ADAMW;
    const float l2 = decoupled ? 0.0f : (float)r->wd;
    const float shrink = decoupled ? (float)(1.0 - r->lr * r->wd) : 1.0f;
    float *restrict p = r->p, *restrict m = r->s0, *restrict v = r->s1;
    const float *restrict g = r->g;
    const int64_t n = r->n;
#pragma omp parallel for if (n > OPTIM_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i] * shrink;
        float gi = g[i] + l2 * pi;
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step_size * (mi / denom);
    }
}

static void run_kind(const ts_optim_config *cfg, int64_t t, const optim_run *r) {
    if (cfg->kind == TS_OPTIM_SGD) sgd_run(cfg, t, r);
    else adam_run(cfg, t, r);
}

/* ---- the step over a slice ---- */

static ts_status check_slice(const ts_optim_config *cfg, int64_t t, double lr, const ts_optim_groups *groups,
                             const ts_optim_slice *sl) {
    ts_status s = ts_optim_check(cfg);
    if (s) return s;
    const char *kn = ts_optim_kind_name(cfg->kind);
    if (!sl) return ts_error(TS_ERR_VALUE, "optim %s: slice is NULL", kn);
    if (t < 1) return ts_error(TS_ERR_VALUE, "optim %s: step t = %lld must be >= 1", kn, (long long)t);
    if (!(lr >= 0) || isinf(lr)) return ts_error(TS_ERR_VALUE, "optim %s: lr = %g must be finite and >= 0", kn, lr);
    if (sl->offset < 0 || sl->len < 0)
        return ts_error(TS_ERR_INDEX, "optim %s: range [%lld, +%lld) has a negative offset or length", kn,
                        (long long)sl->offset, (long long)sl->len);
    if (sl->len == 0) return TS_OK;
    if (!sl->params || !sl->grads) return ts_error(TS_ERR_VALUE, "optim %s: params or grads is NULL", kn);
    int k = ts_optim_state_slots(cfg);
    if (k > 0 && !sl->state)
        return ts_error(TS_ERR_STATE, "optim %s: needs %d state slot(s) per element but state is NULL", kn, k);
    if (k > 1 && sl->stride < sl->len)
        return ts_error(TS_ERR_VALUE, "optim %s: state stride %lld is shorter than the range length %lld", kn,
                        (long long)sl->stride, (long long)sl->len);
    if (groups) {
        int64_t end = sl->offset + sl->len;
        if (groups->n <= 0 || !groups->ranges || end > groups->numel)
            return ts_error(TS_ERR_INDEX, "optim %s: range [%lld, %lld) is outside the groups' [0, %lld)", kn,
                            (long long)sl->offset, (long long)end, (long long)groups->numel);
    }
    return TS_OK;
}

/* Runs the kernel over flat elements [a, b) of the slice with the given multipliers. */
static void run_part(const ts_optim_config *cfg, int64_t t, double lr, const ts_optim_slice *sl, int64_t a,
                     int64_t b, float wd_scale, float lr_scale) {
    int64_t i = a - sl->offset;
    int k = ts_optim_state_slots(cfg);
    optim_run r = {
        .p = sl->params + i,
        .g = sl->grads + i,
        .s0 = k > 0 ? sl->state + i : NULL,
        .s1 = k > 1 ? sl->state + sl->stride + i : NULL,
        .n = b - a,
        .lr = lr * lr_scale,
        .wd = cfg->weight_decay * wd_scale,
    };
    run_kind(cfg, t, &r);
}

ts_status ts_optim_step_range(const ts_optim_config *cfg, int64_t t, double lr, const ts_optim_groups *groups,
                              const ts_optim_slice *slice) {
    ts_status s = check_slice(cfg, t, lr, groups, slice);
    if (s || slice->len == 0) return s;
    int64_t pos = slice->offset, end = slice->offset + slice->len;
    if (!groups) {
        run_part(cfg, t, lr, slice, pos, end, 1.0f, 1.0f);
        return TS_OK;
    }
    int gi = ts_optim_groups_find(groups, pos);
    while (pos < end) {
        const ts_optim_group *r = gi >= 0 && gi < groups->n ? &groups->ranges[gi] : NULL;
        if (!r || r->offset > pos || r->offset + r->len <= pos)
            return ts_error(TS_ERR_INDEX,
                            "optim %s: groups do not cover element %lld contiguously (range [%lld, %lld))",
                            ts_optim_kind_name(cfg->kind), (long long)pos, (long long)slice->offset,
                            (long long)end);
        int64_t stop = r->offset + r->len < end ? r->offset + r->len : end;
        run_part(cfg, t, lr, slice, pos, stop, r->wd_scale, r->lr_scale);
        pos = stop;
        gi++;
    }
    return TS_OK;
}

ts_status ts_optim_step_flat(const ts_optim_config *cfg, int64_t t, double lr, const ts_optim_groups *groups,
                             float *params, const float *grads, float *state, int64_t numel, int64_t offset,
                             int64_t len) {
    if (offset < 0 || len < 0 || offset + len > numel)
        return ts_error(TS_ERR_INDEX, "optim: range [%lld, +%lld) is outside the flat buffer of %lld elements",
                        (long long)offset, (long long)len, (long long)numel);
    ts_optim_slice sl = {
        .params = params ? params + offset : NULL,
        .grads = grads ? grads + offset : NULL,
        .state = state ? state + offset : NULL,
        .stride = numel,
        .offset = offset,
        .len = len,
    };
    return ts_optim_step_range(cfg, t, lr, groups, &sl);
}
