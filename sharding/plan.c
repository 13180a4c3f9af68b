/* plan.c - balanced ranges and pipeline stage cuts. */
#include "sharding/plan.h"

#include <stdlib.h>

ts_status ts_plan_ranges(int64_t n, int parts, int64_t align, ts_range *out) {
    if (n < 0 || parts < 1 || align < 1)
        return ts_error(TS_ERR_VALUE, "plan: cannot split %lld elements into %d parts aligned to %lld",
                        (long long)n, parts, (long long)align);
    int64_t units = (n + align - 1) / align; /* aligned blocks, the last maybe short */
    int64_t start = 0;
    for (int p = 0; p < parts; p++) {
        /* the extra blocks go to the last parts, which also hold the short one */
        int64_t blocks = units / parts + (p >= parts - units % parts ? 1 : 0);
        int64_t end = start + blocks * align;
        if (end > n) end = n;
        out[p] = (ts_range){start, end - start};
        start = end;
    }
    return TS_OK;
}

int ts_plan_owner(const ts_range *plan, int parts, int64_t i) {
    int lo = 0, hi = parts - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (i < plan[mid].offset) hi = mid - 1;
        else if (i >= plan[mid].offset + plan[mid].len) lo = mid + 1;
        else return plan[mid].len ? mid : -1;
    }
    return -1;
}

/* Whether units fit into at most stages runs of total cost <= cap; fills
 * first[] greedily when they do. */
static int fits(const double *costs, int units, int stages, double cap, int *first) {
    int s = 0;
    double run = 0;
    first[0] = 0;
    for (int u = 0; u < units; u++) {
        if (costs[u] > cap) return 0;
        /* open a new stage when this unit does not fit, or when the units
         * left are only just enough to give each remaining stage one */
        if ((run + costs[u] > cap || units - u == stages - 1 - s) && u > first[s]) {
            if (++s == stages) return 0;
            first[s] = u;
            run = 0;
        }
        run += costs[u];
    }
    return s == stages - 1;
}

ts_status ts_plan_stages(const double *costs, int units, int stages, int *first) {
    if (stages < 1 || units < stages)
        return ts_error(TS_ERR_VALUE, "plan: cannot cut %d units into %d pipeline stages", units, stages);
    double lo = 0, hi = 0;
    for (int u = 0; u < units; u++) {
        if (!(costs[u] >= 0))
            return ts_error(TS_ERR_VALUE, "plan: unit %d has cost %g", u, costs[u]);
        hi += costs[u];
        if (costs[u] > lo) lo = costs[u];
    }
    /* binary search on the largest stage cost */
    for (int it = 0; it < 100 && hi - lo > 1e-9 * (hi > 1 ? hi : 1); it++) {
        double mid = (lo + hi) / 2;
        if (fits(costs, units, stages, mid, first)) hi = mid;
        else lo = mid;
    }
    if (!fits(costs, units, stages, hi, first))
        return ts_error(TS_ERR_STATE, "plan: no cut of %d units into %d stages found", units, stages);
    return TS_OK;
}

int64_t ts_plan_shard_len(int64_t len, int shards) { return (len + shards - 1) / shards; }

ts_range ts_plan_shard_range(int64_t len, int shards, int r) {
    int64_t n = ts_plan_shard_len(len, shards), lo = r * n, hi = lo + n;
    if (lo > len) lo = len;
    if (hi > len) hi = len;
    return (ts_range){lo, hi - lo};
}
