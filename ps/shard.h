/* shard.h - one parameter-server shard: its keys, their optimizer state,
 * and the rules by which workers' pushes become updates.
 *
 * A shard holds the range [offset, offset + len) of the model's flat
 * parameter buffer and the optimizer state for it, initialised from the job
 * seed exactly as a local run initialises those elements (or restored from
 * the shard's checkpoint). It is a state machine without sockets: the
 * server (server.c) hands it every request in the order it decided, and the
 * shard answers through the reply function of its config. A backup replays
 * the same sequence with replies off and so holds the same bits; a spare
 * first takes the primary's whole state (snapshot.c), then does the same.
 *
 * Requests (ps/README.md has the conversation):
 *   PUSH      stages a worker's gradient for ranges of step "s" (answered
 *             only when refused: the COMMIT's reply covers the pushes)
 *   COMMIT    the worker's pushes of step "s" are complete (f64 values:
 *             loss sum, samples, its own squared gradient norm, lr, data
 *             epoch and offset after the step)
 *   APPLY     applies the decided step "s" (value: the squared norm of the
 *             job's whole averaged gradient, for clipping)
 *   PULL      parameters of ranges at step >= "s"
 *   REDUCE    sums f64 values over the live workers (evaluation)
 *   ROLLBACK  back to the checkpoint of step "s"
 * Consistency: sync sums the live workers' gradients of step t in rank
 * order once every one committed (the step is then "decided": each commit
 * gets the shard's partial squared norm of the averaged gradient), and
 * applies it on the first APPLY; pulls of step t wait for it. async applies
 * each worker's gradient at its COMMIT (clipped by its own norm); bounded
 * does the same, but holds the pull of a worker that finished step t until
 * every live worker finished t - staleness.
 * Every request is validated first (ranges inside the shard, dtype, sizes,
 * that the sender is a live worker, the step); a bad one gets an ERROR
 * naming what is wrong and is counted. When the live workers change while
 * a sync step is not decided, its stagings are dropped and each waiting
 * commit is answered "redo" (generation g): a half-pushed step is never
 * half-applied.
 */
#ifndef TS_PS_SHARD_H
#define TS_PS_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/nn/model.h"
#include "proto/job.h"
#include "proto/wire.h"

typedef struct ts_shard ts_shard;

/* Sends m (with payload frames) to the peer `to`; the shard's replies. */
typedef void ts_shard_reply_fn(void *ctx, const ts_proto_identity *to, const ts_proto_msg *m,
                               const ts_proto_payload *payload, size_t npayload);

typedef struct {
    const ts_job *job;      /* borrowed; outlives the shard */
    int shard, shards;      /* this shard's index and the job's shard count */
    int rank;               /* this process's rank, in its messages */
    const char *root;       /* its checkpoint folder, <dir>/shard-<shard> beside the other
                             * shards' (a resume with another shard count reads theirs);
                             * NULL: no checkpoints */
    ts_shard_reply_fn *reply;
    void *ctx;
} ts_shard_config;

/* Builds the shard: plans the key table of the job's model m (built from
 * the job with its seed, whole; borrowed) with sharding/keys.h, and takes
 * this shard's range with m's values. */
ts_shard *ts_shard_create(const ts_shard_config *c, const ts_model *m);
void ts_shard_free(ts_shard *s);

/* This shard's key range. */
void ts_shard_range(const ts_shard *s, int64_t *offset, int64_t *len);

/* The step its parameters are at (sync: steps applied; async and bounded:
 * the step every live worker finished) and the updates applied. */
int64_t ts_shard_step(const ts_shard *s);
int64_t ts_shard_updates(const ts_shard *s);

/* Requests refused so far. */
uint64_t ts_shard_refused(const ts_shard *s);

/* Whether replies are sent (off while the shard is a backup). */
void ts_shard_set_replies(ts_shard *s, bool on);
/* Whether the shard writes its checkpoints (the primary does). */
void ts_shard_set_writer(ts_shard *s, bool on);

/* Handles one decoded request from peer `from`. */
void ts_shard_handle(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m);

/* The live workers are now w[0..n) (ascending ranks, each with the
 * generation it joined in, 0 when not known), from generation g. A worker
 * that joined again under its rank (a restart) counts as one that left
 * and one that joined. */
void ts_shard_workers(ts_shard *s, uint64_t g, const ts_proto_member *w, int n);

/* The generation in which the live workers last changed (0: never). */
uint64_t ts_shard_workers_generation(const ts_shard *s);

/* ---- checkpoints (store.c) ---- */

/* Writes the shard's checkpoint of its current step into its folder
 * (safetensors of its keys and optimizer state, the step, updates and data
 * position, its range in "extra"), atomically; keeps the newest
 * max(2, train.keep_checkpoints). Its folder goes to path unless NULL. */
ts_status ts_shard_save(ts_shard *s, char *path, size_t cap);

/* The writer's checkpoint: saves unless this step is saved already, and
 * says so, or why it failed, on the log. No-op without a folder or when
 * the shard is not the writer. */
void ts_shard_checkpoint(ts_shard *s);

/* Restores the checkpoint of step (-1: the newest) from the shard's folder;
 * *found says whether there was one (with step -1 none is fine: the shard
 * keeps its state). Step 0 needs none: its keys are the seed's. A
 * checkpoint of another range or model is refused naming both. When the
 * run's checkpoints of that step were written by another number of shards
 * (the job resumed with another parallel.servers), the shard's range is
 * rebuilt from theirs, at the newest step (up to that one) they all hold. */
ts_status ts_shard_restore(ts_shard *s, int64_t step, bool *found);

/* ---- the whole state, for a spare (snapshot.c) ---- */

/* A shard's whole state as three arrays: the record (steps, the decided
 * step, the reductions, each worker's bookkeeping and coverage), the f64
 * values (the decided ones, each worker's commit and reduction) and the
 * stream of floats (parameters, optimizer state, the decided gradient,
 * each worker's staging). */
typedef struct {
    int64_t *head;
    size_t nhead;
    double *values;
    size_t nvalues;
    float *data;
    int64_t ndata;
} ts_shard_state;

/* Sets st's three sizes to those of the shard's state now. */
void ts_shard_snapshot_size(const ts_shard *s, ts_shard_state *st);

/* Writes the state into st's arrays, sized by ts_shard_snapshot_size with
 * nothing handled in between. */
void ts_shard_snapshot(const ts_shard *s, const ts_shard_state *st);

/* Checks a record against this shard (its keys, its optimizer's state
 * slots, counts, flags, ranks in order, spans inside its keys) and that
 * nvalues values go with it; *ndata is the floats its stream holds. The
 * message names the field that is wrong. */
ts_status ts_shard_state_check(const ts_shard *s, const int64_t *head, size_t nhead, size_t nvalues,
                               int64_t *ndata);

/* Makes the shard's state that of the snapshot (head, values, data), which
 * is checked first: a bad one, or one whose stream has another length,
 * changes nothing. Waiting pulls are dropped (a spare has none). */
ts_status ts_shard_install(ts_shard *s, const int64_t *head, size_t nhead, const double *values, size_t nvalues,
                           const float *data, int64_t ndata);

/* The live workers (rank and joined generation), ascending, *n of them
 * (malloc'd; NULL when memory ran out). */
ts_proto_member *ts_shard_live_workers(const ts_shard *s, int *n);

#endif
