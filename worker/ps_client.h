/* ps_client.h - a worker's side of the parameter-server conversation.
 *
 * The client keeps one CURVE DEALER per shard, connected to the shard's
 * primary as the job's roster names it (sharding/keys.h chains), and knows
 * the key table (the same ts_keys_plan the shards make). It pushes
 * gradient ranges from the model's flat gradient buffer (zero-copy in f32,
 * through a bf16 copy with parallel.wire_dtype bf16), commits steps,
 * applies them, pulls parameters into the model's flat parameter buffer and
 * reduces small sums at shard 0 (ps/README.md has the conversation).
 *
 * Everything a step sent is kept until the step ends: when a shard's
 * primary changes (a backup promoted, a shard restarted) the client
 * connects to the new one and sends it the step's messages again (the
 * shards treat repeats as such); a "retry" answer does the same a moment
 * later. Waits follow the membership, stop when the job is shut down, and
 * give up after parallel.barrier_timeout_ms (at least 4 heartbeat
 * timeouts) without progress, naming the shard and rank that did not
 * answer - or, for a shard left without a live server, since which
 * generation and its last server; with no_restarts such a wait ends at
 * once. A "redo" or "behind" answer ends the wait with TS_ERR_STATE and
 * the event (ts_ps_client_event) says what the shard asked for.
 *
 * One thread uses a client (the trainer's).
 */
#ifndef TS_WORKER_PS_CLIENT_H
#define TS_WORKER_PS_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/data/loader.h"
#include "membership/member.h"
#include "proto/job.h"
#include "sharding/plan.h"

typedef struct ts_ps_client ts_ps_client;

typedef struct {
    const ts_job *job;
    ts_member *member;          /* the worker's membership (borrowed) */
    const char *key_file;       /* the job key file */
    const ts_range *tensors;    /* the model's parameters (offset order), for the key table */
    int n_tensors;
    int64_t numel;
    float *params;              /* the model's flat parameters: pulls write them */
    const float *grads;         /* the model's flat gradients: pushes read them */
    bool no_restarts;           /* nothing restarts a shard's server (mpirun): a wait on a shard with none ends */
} ts_ps_client_config;

/* What a shard asked for when a wait ended with TS_ERR_STATE. */
typedef enum {
    TS_PS_NONE,
    TS_PS_REDO,     /* the workers changed: compute the step again in generation `generation` */
    TS_PS_BEHIND,   /* a shard restarted at `step`: roll the job back to it */
    TS_PS_FINISHED, /* the scheduler ended the job (or declared this worker dead) */
    TS_PS_SKIP,     /* the reduction of `step` cannot be done again by the workers of `generation` */
} ts_ps_event_kind;

typedef struct {
    ts_ps_event_kind kind;
    uint64_t generation;
    int64_t step;
    int shard;
} ts_ps_event;

/* Milliseconds a client spent sending pushes and waiting for pulls and for
 * the other workers (commits, reductions), since the last reset. */
typedef struct {
    double push_ms, pull_ms, wait_ms;
} ts_ps_times;

/* Connects to the shards of the job's current roster. */
ts_ps_client *ts_ps_client_create(const ts_ps_client_config *c);
void ts_ps_client_free(ts_ps_client *c);

/* The event that ended the last wait with TS_ERR_STATE. */
ts_ps_event ts_ps_client_event(const ts_ps_client *c);

/* The roster the client follows: its generation, this worker's place among
 * the live workers (ranks ascending; -1 when not among them) and their
 * number. Takes a new generation first, if one was announced. */
void ts_ps_client_workers(ts_ps_client *c, uint64_t *generation, int *index, int *workers);

/* Waits until the roster reaches generation g (TS_ERR_STATE with event
 * FINISHED when the job ends, TS_ERR_TIMEOUT when it does not come). */
ts_status ts_ps_client_await_generation(ts_ps_client *c, uint64_t g);

/* Starts step `step` (1-based: the step whose gradients follow) computed by
 * the workers of generation g: forgets what the last step sent. */
void ts_ps_client_begin(ts_ps_client *c, int64_t step, uint64_t g);

/* The gradients of [offset, offset + len) are final: pushes them, per
 * shard, once a shard has enough ready (or all of its keys). */
ts_status ts_ps_client_ready(ts_ps_client *c, int64_t offset, int64_t len);

/* Commits the step at every shard with the values of shard.h's COMMIT
 * (pushing what is still pending first). wait: waits for every shard's
 * COMMIT_REPLY and returns in out[] (TS_DECIDED_VALUES) shard 0's loss
 * sum, samples and workers with the sum over shards of their squared
 * norms. */
ts_status ts_ps_client_commit(ts_ps_client *c, const double *values, bool wait, double *out);

/* Sends APPLY of the step with the squared norm of the job's gradient. */
ts_status ts_ps_client_apply(ts_ps_client *c, double sq_norm);

/* Asks every shard for its keys at step >= want (unless it was asked for
 * that step already). */
ts_status ts_ps_client_pull(ts_ps_client *c, int64_t want);

/* Whether a pull is on its way. */
bool ts_ps_client_pulling(const ts_ps_client *c);

/* What a pull's answers say of the step of their parameters: the data
 * position after it and, when the shards applied the step themselves, the
 * loss, learning rate and gradient norm its workers logged -
 * for a worker that adopts the step without having computed it. */
typedef struct {
    int64_t step;
    ts_loader_pos pos;
    bool logged; /* loss, lr and grad_norm hold the step's */
    double loss, lr, grad_norm;
} ts_ps_pulled;

/* Waits for the pull's answers (written into params) until every shard
 * answered with the same step; a shard ahead makes the others be asked
 * again for its step. *out: that step, as its answers describe it. */
ts_status ts_ps_client_pull_wait(ts_ps_client *c, ts_ps_pulled *out);

/* Sums v[0..n), computed in generation g, over the workers of step at
 * shard 0 (reduction id of step). TS_ERR_STATE with event REDO when the
 * workers changed before the sums were done: compute them again in the
 * event's generation and send the same reduction; with event SKIP when a
 * worker left and another joined after the step: there are none. */
ts_status ts_ps_client_reduce(ts_ps_client *c, int64_t step, int64_t id, uint64_t g, double *v, int n);

/* Takes every shard back to its checkpoint of step `to`; *at is the
 * step they all reached (lower when a shard has no later checkpoint). */
ts_status ts_ps_client_rollback(ts_ps_client *c, int64_t to, int64_t *at);

/* Time spent so far; reset to zero by the call. */
ts_ps_times ts_ps_client_times(ts_ps_client *c);

#endif
