/* member.h - a node's membership in a job: the client side of the scheduler.
 *
 * ts_member_join() connects a CURVE DEALER socket to the scheduler, sends
 * JOIN (role, address, capabilities, optional previous rank) and waits for
 * JOIN_ACK: rank, generation, roster and run settings. From then on an
 * internal I/O thread owns the socket: it sends HEARTBEATs (carrying the last
 * step and barrier) every heartbeat_ms, receives MEMBERSHIP / STOP / SHUTDOWN
 * at any time, and carries the caller's requests. Blocking calls (barrier, blob
 * put/get) wait for their answer with a timeout; a timeout or a scheduler
 * error is returned as ts_status with a message naming the scheduler address
 * (and, for barriers, the scheduler's text naming the missing ranks).
 *
 * A silent scheduler: the scheduler answers every HEARTBEAT. When nothing
 * came from it for the heartbeat timeout and its connection is down (the
 * process died, its host closed the connection), or for 10 heartbeat
 * timeouts (at least 30 s) while the connection stays open (a stopped,
 * paused or swapping scheduler whose host still answers is waited for that
 * long), the node is told to shut down (ts_member_shutdown_requested, code
 * 1, "scheduler tcp://... silent for N ms (connection lost, ...)") and a
 * waiting request fails with the same text. Every node gets this without
 * code of its own.
 *
 * Thread safety: any thread may call any function on a ts_member; blocking
 * requests are served one at a time. Conversation: scheduler/README.md.
 */
#ifndef TS_MEMBERSHIP_MEMBER_H
#define TS_MEMBERSHIP_MEMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/status.h"
#include "proto/wire.h"

typedef struct ts_member ts_member;

/* What a node tells the scheduler when joining. */
typedef struct {
    const char *scheduler; /* endpoint, e.g. "tcp://127.0.0.1:5555" (required) */
    const char *job;       /* job id (required) */
    const char *key_file;  /* job key file; NULL = env TESSERA_KEY_FILE */
    ts_proto_role role;    /* TS_ROLE_PS or TS_ROLE_WORKER */
    const char *address;   /* endpoint this node serves on; NULL = none */
    const char *caps;      /* free-form capabilities; NULL = none */
    int32_t prev_rank;     /* rank held before (rejoin), -1 = none */
    int timeout_ms;        /* wait for JOIN_ACK; <= 0 = 60000 */
} ts_member_options;

/* The node's place in the job (as of the last JOIN_ACK / MEMBERSHIP). */
typedef struct {
    int32_t rank;
    uint64_t generation;
    int64_t start_step;      /* last step the job had finished at admission (-1 none) */
    int64_t steps;           /* steps of the job, 0 = until shut down */
    uint32_t heartbeat_ms;
    uint32_t heartbeat_timeout_ms;
    uint32_t barrier_timeout_ms;
} ts_member_info;

/* Joins the job; *out is the membership (free with ts_member_close). Fails
 * with TS_ERR_TIMEOUT when no JOIN_ACK came in time, TS_ERR_PEER when the
 * scheduler refused (job full, handshake refused), TS_ERR_STATE when it
 * shut the job down instead (rendezvous timed out, the job is stopping). */
ts_status ts_member_join(const ts_member_options *opt, ts_member **out);

/* Copies the node's rank, generation and settings into *info. */
void ts_member_info_get(ts_member *m, ts_member_info *info);

/* Copies the current roster (live members) into a malloc'd array (*roster,
 * *n; free() it) and its generation into *generation (may be NULL). */
ts_status ts_member_roster(ts_member *m, ts_proto_member **roster, size_t *n,
                           uint64_t *generation);

/* True once when a new generation was announced since the last call (or
 * since join); then *generation and the roster (*roster, *n, malloc'd, may
 * be NULL to skip) hold it. */
bool ts_member_poll_membership(ts_member *m, uint64_t *generation,
                               ts_proto_member **roster, size_t *n);

/* Reports that this worker finished step (steps count from 1); also carried
 * by the following heartbeats. Does not wait. */
ts_status ts_member_step_done(ts_member *m, int64_t step);

/* True (and stays true) once the scheduler sent STOP: the job is to stop
 * after a step its workers agree on; reason (may be NULL) gets the
 * scheduler's words. */
bool ts_member_stop_asked(ts_member *m, char *reason, size_t cap);

/* Reports that this worker stopped after step, as STOP asked, its
 * checkpoint saved: the scheduler ends the job once every live worker
 * did. Does not wait. */
ts_status ts_member_stopped(ts_member *m, int64_t step);

/* Asks the scheduler for a new generation of the same members (REGROUP):
 * a collective of this node's generation failed and none came, as when a
 * peer paused without being declared dead. Does not wait. */
ts_status ts_member_ask_regroup(ts_member *m, const char *reason);

/* Waits until every live member of this node's role reached barrier id.
 * timeout_ms <= 0: the scheduler's barrier timeout plus a margin. Fails with
 * TS_ERR_TIMEOUT and the scheduler's text ("rank 3 finished step 182 but did
 * not reach barrier 183") when the barrier timed out, TS_ERR_STATE when the
 * job was shut down while waiting. */
ts_status ts_member_barrier(ts_member *m, int64_t id, int timeout_ms);

/* Stores size bytes (at most 64 KiB) under key at the scheduler; waits for
 * the acknowledgement. */
ts_status ts_member_blob_put(ts_member *m, const char *key, const void *data, size_t size);

/* Fetches the blob under key, waiting (up to timeout_ms, <= 0: the barrier
 * timeout plus a margin) until some rank put it; *data is malloc'd (free()).
 * TS_ERR_INDEX when nobody put it in time. */
ts_status ts_member_blob_get(ts_member *m, const char *key, int timeout_ms, void **data,
                             size_t *size);

/* True once the scheduler sent SHUTDOWN (job finished or stopped), declared
 * this node dead or evicted it, or was found silent; *code (may be NULL) gets
 * the suggested exit code, reason (may be NULL) the scheduler's words or the
 * silence naming it. */
bool ts_member_shutdown_requested(ts_member *m, int *code, char *reason, size_t cap);

/* Tells the scheduler this node leaves the job (a SHUTDOWN from the node),
 * then closes like ts_member_close. NULL is fine. */
void ts_member_leave(ts_member *m, const char *reason);

/* Stops heartbeats, closes the socket and frees m without telling the
 * scheduler (it will declare the node dead after the heartbeat timeout).
 * NULL is fine. */
void ts_member_close(ts_member *m);

/* One-shot status query (tessera-run --status): connects to scheduler with
 * the key file (NULL = env TESSERA_KEY_FILE), sends STATUS and returns the
 * STATUS_REPLY in *reply (free with ts_proto_msg_free). */
ts_status ts_member_status_query(const char *scheduler, const char *key_file, int timeout_ms,
                                 ts_proto_msg *reply);

#endif
