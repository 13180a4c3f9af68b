/* optim.c - configs and the SGD / Adam / AdamW step kernels over a range. */
#include "kernels/optim/optim.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/ops/backend.h"

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

/* Runs the slice device's step kernel over flat elements [a, b) of the slice with
 * the given multipliers. */
static ts_status run_part(const ts_optim_kernels *k, const ts_optim_config *cfg, int64_t t, double lr,
                          const ts_optim_slice *sl, int64_t a, int64_t b, float wd_scale, float lr_scale) {
    int64_t i = a - sl->offset;
    int slots = ts_optim_state_slots(cfg);
    double lr_run = lr * lr_scale, wd = cfg->weight_decay * wd_scale;
    ts_optim_run r = {
        .params = sl->params + i,
        .grads = sl->grads + i,
        .s0 = slots > 0 ? sl->state + i : NULL,
        .s1 = slots > 1 ? sl->state + sl->stride + i : NULL,
        .n = b - a,
    };
    if (cfg->kind == TS_OPTIM_SGD) {
        r.lr = (float)lr_run;
        r.weight_decay = (float)wd;
        r.momentum = (float)cfg->momentum;
        r.damp_keep = (float)(1.0 - cfg->dampening);
        r.first = t == 1;
        r.nesterov = cfg->nesterov;
        return k->sgd(&r);
    }
    bool decoupled = cfg->kind == TS_OPTIM_ADAMW;
    double bc1 = 1.0 - pow(cfg->beta1, (double)t), bc2 = 1.0 - pow(cfg->beta2, (double)t);
    r.step_size = (float)(lr_run / bc1);
    r.bc2_sqrt = (float)sqrt(bc2);
    r.beta1 = (float)cfg->beta1;
    r.beta2 = (float)cfg->beta2;
    r.one_minus_beta1 = (float)(1.0 - cfg->beta1);
    r.one_minus_beta2 = (float)(1.0 - cfg->beta2);
    r.eps = (float)cfg->eps;
    r.l2 = decoupled ? 0.0f : (float)wd;
    r.shrink = decoupled ? (float)(1.0 - lr_run * wd) : 1.0f;
    return k->adam(&r);
}

ts_status ts_optim_step_range(const ts_optim_config *cfg, int64_t t, double lr, const ts_optim_groups *groups,
                              const ts_optim_slice *slice) {
    ts_status s = check_slice(cfg, t, lr, groups, slice);
    if (s || slice->len == 0) return s;
    const ts_backend *be = ts_backend_of("optim", slice->device);
    if (!be) return ts_last_status();
    int64_t pos = slice->offset, end = slice->offset + slice->len;
    if (!groups) return run_part(be->optim, cfg, t, lr, slice, pos, end, 1.0f, 1.0f);
    int gi = ts_optim_groups_find(groups, pos);
    while (pos < end) {
        const ts_optim_group *r = gi >= 0 && gi < groups->n ? &groups->ranges[gi] : NULL;
        if (!r || r->offset > pos || r->offset + r->len <= pos)
            return ts_error(TS_ERR_INDEX,
                            "optim %s: groups do not cover element %lld contiguously (range [%lld, %lld))",
                            ts_optim_kind_name(cfg->kind), (long long)pos, (long long)slice->offset,
                            (long long)end);
        int64_t stop = r->offset + r->len < end ? r->offset + r->len : end;
        if ((s = run_part(be->optim, cfg, t, lr, slice, pos, stop, r->wd_scale, r->lr_scale))) return s;
        pos = stop;
        gi++;
    }
    return TS_OK;
}

ts_status ts_optim_slice_sq_norm(const ts_optim_slice *slice, double *sum) {
    *sum = 0;
    const ts_backend *b = ts_backend_of("grad norm", slice->device);
    if (!b) return ts_last_status();
    return slice->len > 0 ? b->optim->sq_norm(slice->grads, slice->len, sum) : TS_OK;
}

ts_status ts_optim_slice_scale(const ts_optim_slice *slice, float factor) {
    const ts_backend *b = ts_backend_of("grad clip", slice->device);
    if (!b) return ts_last_status();
    /* the slices' gradients are their owner's writable memory; the slice
     * type only promises the step does not write them */
    return slice->len > 0 ? b->optim->scale((float *)slice->grads, slice->len, factor) : TS_OK;
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
