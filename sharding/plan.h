/* plan.h - pure planning over the flat parameter buffer.
 *
 * No I/O, no state: given sizes, these functions say who owns which part.
 * A parameter-server key range and an FSDP shard are both a contiguous
 * range [offset, offset + len) of a model's flat buffer (DESIGN.md, "the
 * flat buffer"), so one balanced split serves both; a pipeline plan cuts a
 * list of unit costs into contiguous stages.
 */
#ifndef TS_SHARDING_PLAN_H
#define TS_SHARDING_PLAN_H

#include <stdint.h>

#include "kernels/status.h"

typedef struct {
    int64_t offset, len;
} ts_range;

/* Splits [0, n) into parts contiguous ranges whose lengths differ by at
 * most align (each boundary a multiple of align, align >= 1; the last range
 * takes the remainder). Ranges may be empty when n is small. */
ts_status ts_plan_ranges(int64_t n, int parts, int64_t align, ts_range *out);

/* The index of the range of plan (parts ranges, from ts_plan_ranges) that
 * holds element i, or -1 when i is outside [0, n). */
int ts_plan_owner(const ts_range *plan, int parts, int64_t i);

/* FSDP shards: a unit of len elements is padded to a multiple of shards
 * and cut into shards equal pieces of ts_plan_shard_len elements; shard r
 * holds the unit's elements [r * shard_len, (r + 1) * shard_len), of which
 * ts_plan_shard_range gives the real ones (offset relative to the unit;
 * the last shards may be short or empty). shards >= 1. */
int64_t ts_plan_shard_len(int64_t len, int shards);
ts_range ts_plan_shard_range(int64_t len, int shards, int r);

/* Cuts units with the given costs (>= 0) into stages contiguous runs that
 * minimise the largest run's total cost; first[s] is the first unit of
 * stage s (first[0] = 0). Every stage gets at least one unit, so stages <=
 * units is required. */
ts_status ts_plan_stages(const double *costs, int units, int stages, int *first);

#endif
