/* groups.c - per-parameter optimizer options resolved into sorted ranges. */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/optim/optim.h"

typedef struct {
    int64_t offset, numel;
    float wd_scale;
    int index; /* position in the caller's list, for messages */
} named_span;

static int span_cmp(const void *a, const void *b) {
    const named_span *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Whether rule decays a parameter of this name and ndim. */
static bool rule_decays(const ts_optim_decay_rule *rule, const char *name, int ndim) {
    if (!rule) return true;
    if (ndim < rule->min_ndim) return false;
    for (int k = 0; k < rule->n_no_decay; k++)
        if (rule->no_decay[k] && fnmatch(rule->no_decay[k], name, 0) == 0) return false;
    return true;
}

/* Appends [offset, offset+len) with wd_scale, merging with an equal neighbour. */
static void push_range(ts_optim_groups *g, int64_t offset, int64_t len, float wd_scale) {
    if (len <= 0) return;
    if (g->n > 0) {
        ts_optim_group *last = &g->ranges[g->n - 1];
        if (last->wd_scale == wd_scale && last->lr_scale == 1.0f && last->offset + last->len == offset) {
            last->len += len;
            return;
        }
    }
    g->ranges[g->n++] = (ts_optim_group){.offset = offset, .len = len, .wd_scale = wd_scale, .lr_scale = 1.0f};
}

ts_status ts_optim_groups_build(ts_optim_groups *out, int64_t numel, const ts_optim_named *params, int n_params,
                                const ts_optim_decay_rule *rule) {
    if (!out) return ts_error(TS_ERR_VALUE, "optim groups: output is NULL");
    memset(out, 0, sizeof *out);
    if (numel < 0) return ts_error(TS_ERR_VALUE, "optim groups: numel %lld is negative", (long long)numel);
    if (n_params < 0 || (n_params > 0 && !params))
        return ts_error(TS_ERR_VALUE, "optim groups: bad parameter list (%d entries)", n_params);
    if (rule && rule->n_no_decay > 0 && !rule->no_decay)
        return ts_error(TS_ERR_VALUE, "optim groups: rule has %d no-decay patterns but no array", rule->n_no_decay);
    named_span *spans = malloc(sizeof *spans * (size_t)(n_params > 0 ? n_params : 1));
    /* at most one gap before each parameter plus one after the last */
    out->ranges = malloc(sizeof *out->ranges * (size_t)(2 * n_params + 1));
    if (!spans || !out->ranges) {
        free(spans);
        ts_optim_groups_free(out);
        return ts_error(TS_ERR_MEMORY, "optim groups: out of memory for %d parameters", n_params);
    }
    ts_status st = TS_OK;
    for (int i = 0; i < n_params && !st; i++) {
        const ts_optim_named *p = &params[i];
        const char *name = p->name ? p->name : "(null)";
        if (p->offset < 0 || p->numel < 0 || p->offset + p->numel > numel)
            st = ts_error(TS_ERR_INDEX, "optim groups: parameter '%s' range [%lld, %lld) is outside [0, %lld)", name,
                          (long long)p->offset, (long long)(p->offset + p->numel), (long long)numel);
        spans[i] = (named_span){p->offset, p->numel, rule_decays(rule, name, p->ndim) ? 1.0f : 0.0f, i};
    }
    if (!st) qsort(spans, (size_t)n_params, sizeof *spans, span_cmp);
    int64_t pos = 0;
    for (int i = 0; i < n_params && !st; i++) {
        if (spans[i].numel == 0) continue;
        if (spans[i].offset < pos) {
            const ts_optim_named *a = &params[spans[i].index];
            st = ts_error(TS_ERR_INDEX, "optim groups: parameter '%s' at [%lld, %lld) overlaps the one before it",
                          a->name ? a->name : "(null)", (long long)a->offset, (long long)(a->offset + a->numel));
            break;
        }
        push_range(out, pos, spans[i].offset - pos, 0.0f);
        push_range(out, spans[i].offset, spans[i].numel, spans[i].wd_scale);
        pos = spans[i].offset + spans[i].numel;
    }
    free(spans);
    if (st) {
        ts_optim_groups_free(out);
        return st;
    }
    push_range(out, pos, numel - pos, 0.0f);
    out->numel = numel;
    return TS_OK;
}

ts_status ts_optim_groups_uniform(ts_optim_groups *out, int64_t numel, float wd_scale) {
    if (!out) return ts_error(TS_ERR_VALUE, "optim groups: output is NULL");
    memset(out, 0, sizeof *out);
    if (numel < 0) return ts_error(TS_ERR_VALUE, "optim groups: numel %lld is negative", (long long)numel);
    out->ranges = malloc(sizeof *out->ranges);
    if (!out->ranges) return ts_error(TS_ERR_MEMORY, "optim groups: out of memory");
    out->n = numel > 0 ? 1 : 0;
    out->ranges[0] = (ts_optim_group){.offset = 0, .len = numel, .wd_scale = wd_scale, .lr_scale = 1.0f};
    out->numel = numel;
    return TS_OK;
}

void ts_optim_groups_free(ts_optim_groups *g) {
    if (!g) return;
    free(g->ranges);
    memset(g, 0, sizeof *g);
}

int ts_optim_groups_find(const ts_optim_groups *g, int64_t i) {
    if (!g) return -1;
    int lo = 0, hi = g->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const ts_optim_group *r = &g->ranges[mid];
        if (i < r->offset) hi = mid - 1;
        else if (i >= r->offset + r->len) lo = mid + 1;
        else return mid;
    }
    return -1;
}

float ts_optim_groups_wd_at(const ts_optim_groups *g, int64_t i) {
    int k = ts_optim_groups_find(g, i);
    return k < 0 ? -1.0f : g->ranges[k].wd_scale;
}
