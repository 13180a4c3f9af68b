/* internal.h - state shared by the scheduler's files (not a public header).
 *
 * server.c owns the socket and the loop (a proto/zloop.h poll-and-drain
 * loop) and dispatches each validated message; members.c keeps the node
 * table (ranks, generations, step boundaries, admission, failure detection,
 * end of job); stop.c the orderly stop on a signal; barrier.c the named
 * barriers; blob.c the blob relay; reply.c
 * what is sent (replies, rejections, SHUTDOWN) and depends on no other
 * scheduler file. All run on the loop thread; every time judged against a
 * peer is read with sched_now_ms (the zloop clock, stalls left out).
 */
#ifndef TS_SCHED_INTERNAL_H
#define TS_SCHED_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "proto/secure.h"
#include "proto/wire.h"
#include "proto/zloop.h"
#include "scheduler/config.h"
#include "scheduler/sched.h"

typedef enum { NODE_PENDING, NODE_MEMBER, NODE_DEAD, NODE_LEFT } sched_node_state;
typedef enum { PHASE_RENDEZVOUS, PHASE_RUNNING, PHASE_DONE } sched_phase;

/* One process that ever joined (dead and departed ones are kept for status). */
typedef struct {
    ts_proto_identity id;
    sched_node_state state;
    int32_t rank;               /* -1 while pending */
    int32_t prev_rank;          /* asked for in JOIN, -1 none */
    ts_proto_role role;
    char address[TS_PROTO_ADDR_MAX + 1];
    char caps[TS_PROTO_CAPS_MAX + 1];
    uint64_t last_seen_ms;
    int64_t last_step;          /* -1 none */
    uint64_t step_generation;   /* the generation last_step was reported in (a joiner: the one before it) */
    int64_t last_barrier;       /* -1 none */
    uint64_t joined_generation;
    uint64_t join_order;
    bool stopped;               /* sent STOPPED: it took its last step and saved */
} sched_node;

typedef struct sched_barrier sched_barrier;
/* A recently released barrier (for members admitted after it opened). */
typedef struct {
    ts_proto_role role;
    int64_t id;
    uint64_t generation; /* generation in which it opened */
} sched_released;
#define SCHED_RELEASED_KEPT 64
typedef struct sched_blob sched_blob;
typedef struct sched_blob_wait sched_blob_wait;

struct ts_sched {
    ts_sched_config cfg;
    char endpoint[TS_SCHED_STR_MAX];
    ts_secure_keys keys;
    void *zctx, *sock;
    ts_secure_zap *zap;

    uv_loop_t loop;
    ts_zloop zloop;
    uv_timer_t rendezvous;
    uv_signal_t sigint, sigterm;
    bool loop_ready, stopping, rendezvous_warned;
    int exit_code;

    sched_phase phase;
    uint64_t generation;
    sched_node *nodes;
    size_t nnodes, cap_nodes;
    uint64_t join_counter;
    int32_t next_rank;          /* fresh ranks are never reused */
    bool change_pending;        /* a join/death/leave awaits its generation */
    bool workers_changed;       /* ... and it concerns workers: it waits for a step boundary */
    bool worker_completed;      /* some worker finished all steps */
    int declared_dead;          /* members declared dead so far (silent, or evicted) */
    char worker_caps[TS_PROTO_CAPS_MAX + 1]; /* the first worker's: the job's ("" until then) */
    uint64_t bad_messages;
    uint64_t started_ms;
    uint64_t last_call_ms;      /* when the rendezvous reached its minimum short of
                                   the expected workers (0: not yet) */
    int stop_signal;            /* the signal that asked the workers to stop (0: none) */
    uint64_t stop_deadline_ms;  /* when the job is shut down even if they did not */

    sched_barrier *barriers;
    sched_released released[SCHED_RELEASED_KEPT];
    size_t nreleased;
    sched_blob *blobs;
    size_t nblobs;
    sched_blob_wait *blob_waits;
};

/* The scheduler's clock in ms: monotonic, without the time it was stalled. */
static inline uint64_t sched_now_ms(ts_sched *s) { return ts_zloop_now_ms(&s->zloop); }

/* reply.c */
/* Sends m (stamped with job, generation, scheduler rank by the caller via
 * sched_msg_init) to a peer; failures are logged, never fatal. */
void sched_send(ts_sched *s, const ts_proto_identity *to, const ts_proto_msg *m,
                const ts_proto_payload *payloads, size_t npayloads);
/* ts_proto_msg_init with this scheduler's job, generation and rank. */
void sched_msg_init(ts_sched *s, ts_proto_msg *m, ts_proto_type type);
/* Sends an ERROR (code, reason) to a peer. */
void sched_send_error(ts_sched *s, const ts_proto_identity *to, uint32_t code,
                      const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Counts a refused message, logs it and answers its sender with an ERROR
 * (code, reason). */
void sched_reject(ts_sched *s, const ts_proto_identity *id, const sched_node *n,
                  uint32_t code, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Sends SHUTDOWN(code, reason) to every node and ends the loop. */
void sched_shutdown(ts_sched *s, int code, const char *reason);
/* Hex text of an identity (for logs), into buf of at least 2*8+3 bytes. */
const char *sched_id_text(const ts_proto_identity *id, char *buf, size_t cap);

/* members.c */
sched_node *sched_node_find(ts_sched *s, const ts_proto_identity *id);
sched_node *sched_node_by_rank(ts_sched *s, int32_t rank);
/* Lowest last step among live workers (-1: none reported or no worker). */
int64_t sched_job_step(const ts_sched *s);
size_t sched_count(const ts_sched *s, sched_node_state st, ts_proto_role role);
void sched_on_join(ts_sched *s, const ts_proto_identity *id, const ts_proto_msg *m);
void sched_on_step_done(ts_sched *s, sched_node *n, const ts_proto_msg *m);
void sched_on_leave(ts_sched *s, sched_node *n, const ts_proto_msg *m);
/* A worker's REGROUP: the next generation of the same members. */
void sched_on_regroup(ts_sched *s, sched_node *n, const ts_proto_msg *m);
/* Evicts the members stuck[0..n) of one role — alive, heartbeating, but
 * holding the job up past a timeout (a barrier; later a collective) — like
 * dead ones, when the job keeps its minimum of that role without them
 * (workers: --min-workers; servers: all are needed, none is evicted). Each
 * gets ERROR refused "rank R evicted: <why>"; the change waits for the next
 * step boundary like a death. The caller re-checks barriers and advances.
 * False, evicting nobody, when the job could not go on without them. */
bool sched_evict(ts_sched *s, sched_node *const *stuck, size_t n, const char *why);
/* Periodic: declares silent members dead, drops silent joiners. */
void sched_check_liveness(ts_sched *s);
/* Starts a new generation if a change waits and the workers are at a step
 * boundary; then ends the job if every worker finished. */
void sched_advance(ts_sched *s);
/* Fills a roster (all live members, or every node when all is set); the
 * caller frees *out. */
ts_status sched_roster(ts_sched *s, bool all, ts_proto_member **out, size_t *n);
/* Rendezvous deadline passed: refuses the waiting joiners and fails. */
void sched_rendezvous_expired(ts_sched *s);
/* Starts the job once a rendezvous' last call has run out (each tick). */
void sched_rendezvous_tick(ts_sched *s);
void sched_rendezvous_warn(ts_sched *s);

/* stop.c */
/* SIGINT or SIGTERM: sends the live workers STOP (the first signal while
 * they train), else shuts the job down at once. */
void sched_stop_begin(ts_sched *s, int signum);
/* Refuses a worker's join into the stopping job with a SHUTDOWN (the
 * joiner gives up instead of asking again). */
void sched_stop_refuse(ts_sched *s, const ts_proto_identity *id);
/* A worker's STOPPED: it took its last step and saved it. */
void sched_on_stopped(ts_sched *s, sched_node *n, const ts_proto_msg *m);
/* While stopping (after every change and each tick): shuts the job down
 * once every live worker stopped, or when they ran out of time. */
void sched_stop_check(ts_sched *s);

/* barrier.c */
void sched_on_barrier(ts_sched *s, sched_node *n, const ts_proto_msg *m);
/* Re-checks open barriers after members died or left. */
void sched_barriers_recheck(ts_sched *s);
bool sched_barriers_open(const ts_sched *s);
void sched_barriers_free(ts_sched *s);

/* blob.c */
void sched_on_blob_put(ts_sched *s, sched_node *n, const ts_proto_msg *m);
void sched_on_blob_get(ts_sched *s, sched_node *n, const ts_proto_msg *m);
void sched_blob_expire(ts_sched *s);
void sched_blobs_free(ts_sched *s);

#endif
