/* keys.h - parameter-server planning: who holds which keys, who is primary.
 *
 * A key is an element of the model's flat parameter buffer. The key table
 * gives each of S shards its part of [0, numel): at the start one contiguous
 * range per shard (ts_keys_plan), balanced by bytes, its cuts moved to a
 * tensor boundary when one lies close to the balanced cut. Every node
 * computes the same table from the same tensors, so nothing is handed out.
 *
 * Re-planning (ts_keys_add_shard, ts_keys_remove_shard) keeps the table
 * balanced while moving as few keys as can be: a new shard takes the keys
 * each shard holds above the new fair share, a removed shard's keys go to
 * the shards below it; the moves say which range goes from whom to whom.
 * A shard may then hold several ranges (pieces).
 *
 * Chains (ts_keys_chains): with replicas, the server processes of shard k
 * are those whose rank % S == k. Its primary is the live one that joined
 * first (lowest joined generation, then rank); its backup is the next live
 * one only when that joined in the same generation as the primary - both
 * started from the same state, so the backup holds what the primary holds.
 * A process that joined later (a restart) is a spare without state.
 */
#ifndef TS_SHARDING_KEYS_H
#define TS_SHARDING_KEYS_H

#include <stdbool.h>
#include <stdint.h>

#include "sharding/plan.h"

/* One piece of the key table: a range and the shard that holds it. */
typedef struct {
    int64_t offset, len;
    int shard;
} ts_keys_piece;

/* A move of re-planning: the range goes from shard `from` to shard `to`. */
typedef struct {
    int64_t offset, len;
    int from, to;
} ts_keys_move;

/* Splits [0, numel) into shards contiguous ranges (out[k] for shard k)
 * balanced by bytes. tensors (n, sorted by offset, inside [0, numel)) are
 * the parameters; a cut moves to the nearest tensor boundary when that is
 * within an eighth of a fair share of the balanced cut, else it falls inside
 * a tensor, rounded down to 16 elements. Ranges may be empty only when
 * numel < shards. */
ts_status ts_keys_plan(const ts_range *tensors, int n, int64_t numel, int shards, ts_range *out);

/* Re-plans table (n pieces over [0, numel) held by shards 0..shards-1, in
 * offset order) for one more shard, numbered `shards`: every shard above
 * the new fair share numel / (shards + 1) gives the excess from the top of
 * its keys. *out (malloc'd, offset order) is the new table and *moves
 * (malloc'd) what moves; free both. */
ts_status ts_keys_add_shard(const ts_keys_piece *table, int n, int shards, ts_keys_piece **out, int *n_out,
                            ts_keys_move **moves, int *n_moves);

/* Re-plans table for shard `gone` leaving: its pieces go, in key order, to
 * the other shards below the new fair share numel / (shards - 1), each up
 * to its deficit; shards above `gone` are renumbered one down in *out (the
 * moves use the old numbers). Needs shards >= 2. Free *out and *moves. */
ts_status ts_keys_remove_shard(const ts_keys_piece *table, int n, int shards, int gone, ts_keys_piece **out,
                               int *n_out, ts_keys_move **moves, int *n_moves);

/* A live server process as the chains see it. */
typedef struct {
    int rank;
    uint64_t joined; /* generation in which it joined */
} ts_keys_server;

/* For each shard k < shards: primary[k] and backup[k] (ranks, -1 when
 * none) among the n live servers, by the rule in the header comment. */
void ts_keys_chains(const ts_keys_server *servers, int n, int shards, int *primary, int *backup);

#endif
