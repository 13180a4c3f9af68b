/* wire.h - Tessera wire messages: encode, strict decode-and-validate, send/recv.
 *
 * A message is one ZeroMQ multipart message: frame 1 is a msgpack map (the
 * header), frames 2.. are raw little-endian payload bytes (tensor data, blobs),
 * sent zero-copy and never msgpack-encoded. A ROUTER socket sees the peer's
 * identity frame before frame 1; there is no empty delimiter frame (peers are
 * DEALER sockets, never REQ).
 *
 * Header keys (short strings; the format is documented in proto/PROTOCOL.md):
 *   "v" version (uint, TS_PROTO_VERSION)  "t" type (uint, ts_proto_type)
 *   "job" job id (str)  "g" generation (uint)  "s" step (int)
 *   "r" sender rank (int; TS_PROTO_RANK_NONE before one is assigned)
 *   "ln" payload frame lengths (array of uint, one per payload frame)
 *   "dt" dtype (uint, optional)  "rg" ranges (array of [offset, len], optional)
 *   plus the type-specific keys listed with each field of ts_proto_msg.
 *
 * ts_proto_decode() is the one entry point for received bytes: it checks the
 * frames against a ts_proto_limits and returns a distinct ts_proto_error for
 * each kind of defect, with a message (ts_last_error()) naming the field.
 * It never reads past the end of a frame. Unknown header keys are ignored;
 * a known key given twice is an error.
 *
 * Ownership: a ts_proto_msg owns its ranges, lengths and roster arrays
 * (malloc'd; ts_proto_msg_free releases them). A decoded message's payload
 * views point into the received frames and live as long as those frames
 * (for ts_proto_recv: until the ts_proto_rx is released or reused).
 */
#ifndef TS_PROTO_WIRE_H
#define TS_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "kernels/status.h"

#define TS_PROTO_VERSION 1

/* Sender ranks with a special meaning ("r"). */
#define TS_PROTO_RANK_NONE (-1)      /* not yet assigned, or a status tool */
#define TS_PROTO_RANK_SCHEDULER (-2) /* the scheduler itself */

/* Longest strings (bytes, excluding the terminating NUL). */
#define TS_PROTO_JOB_MAX 63
#define TS_PROTO_ADDR_MAX 255
#define TS_PROTO_CAPS_MAX 255
#define TS_PROTO_REASON_MAX 511
#define TS_PROTO_KEY_MAX 127
#define TS_PROTO_PHASE_MAX 31
/* Largest COLLECTIVE flow number ("cf"). */
#define TS_PROTO_FLOW_MAX 255

/* Default limits (ts_proto_limits_default). */
#define TS_PROTO_DEFAULT_MAX_HEADER (64u * 1024u)
#define TS_PROTO_DEFAULT_MAX_FRAMES 64u
#define TS_PROTO_DEFAULT_MAX_PAYLOAD ((uint64_t)1 << 30)

/* Message types ("t"). Numbers are part of the wire format: never renumber. */
typedef enum {
    TS_MSG_JOIN = 1,         /* node -> scheduler: role, address, caps, prev_rank */
    TS_MSG_JOIN_ACK = 2,     /* scheduler -> node: rank, roster, run settings */
    TS_MSG_HEARTBEAT = 3,    /* node -> scheduler: step ("s"), last_barrier; answered
                                scheduler -> node ("s" the job's step) */
    TS_MSG_MEMBERSHIP = 4,   /* scheduler -> all: new generation ("g") + roster */
    TS_MSG_BARRIER = 5,      /* node -> scheduler: barrier_id */
    TS_MSG_BARRIER_RELEASE = 6, /* scheduler -> waiting nodes: barrier_id */
    TS_MSG_STEP_DONE = 7,    /* worker -> scheduler: finished step ("s") */
    TS_MSG_ERROR = 8,        /* either way: code + reason */
    TS_MSG_SHUTDOWN = 9,     /* scheduler -> all (or a node: "I am done"): code + reason */
    TS_MSG_STATUS = 10,      /* tool -> scheduler: status query */
    TS_MSG_STATUS_REPLY = 11,/* scheduler -> tool: roster, phase, settings */
    TS_MSG_BLOB_PUT = 12,    /* node -> scheduler: key, 1 payload frame = bytes */
    TS_MSG_BLOB_GET = 13,    /* node -> scheduler: key */
    TS_MSG_BLOB_REPLY = 14,  /* scheduler -> node: key, found, payload if found */
    TS_MSG_STOP = 15,        /* scheduler -> workers: stop the job after a step they agree on,
                                save it, report STOPPED: code + reason */
    TS_MSG_STOPPED = 16,     /* worker -> scheduler: stopped after step "s", its checkpoint saved */
    TS_MSG_REGROUP = 17,     /* worker -> scheduler: a collective of generation "g" failed and no
                                new generation came: make one (reason) */
    /* The parallel strategies. PUSH, PULL, PULL_REPLY and ACK through
     * ROLLBACK are the parameter-server conversation (ps/README.md). */
    TS_MSG_PUSH = 32,        /* worker -> shard: gradients of step "s" for ranges "rg" */
    TS_MSG_PULL = 33,        /* worker -> shard: parameters of ranges "rg" at step >= "s" */
    TS_MSG_PULL_REPLY = 34,  /* shard -> worker: parameters at step "s", data position "ep"/"of",
                                the step's logged values "sv" */
    TS_MSG_COLLECTIVE = 35,  /* rank -> rank: "cs" sequence, "cf" flow, one range, 1 payload frame */
    TS_MSG_ACK = 40,         /* shard -> worker / backup -> primary: done (PUSH, ROLLBACK, forwards) */
    TS_MSG_COMMIT = 41,      /* worker -> shard: its pushes of step "s" are complete; 1 f64 frame */
    TS_MSG_COMMIT_REPLY = 42,/* shard -> worker: the step is decided; 1 f64 frame */
    TS_MSG_APPLY = 43,       /* worker -> shard: apply decided step "s"; 1 f64 frame */
    TS_MSG_REDUCE = 44,      /* worker -> shard: sum f64 values "bi" of step "s" over the workers */
    TS_MSG_REDUCE_REPLY = 45,/* shard -> worker: the sums; 1 f64 frame */
    TS_MSG_ROLLBACK = 46,    /* worker -> shard: return to the checkpoint of step "s" */
    TS_MSG_SNAPSHOT = 47,    /* primary -> spare: part "bi" of the shard's state, floats from "of" */
} ts_proto_type;

/* Decode/validation outcomes and ERROR message codes ("co"). Values are part
 * of the wire format. The first group is produced by ts_proto_decode/recv;
 * the second group is for application replies (scheduler, ps). */
typedef enum {
    TS_PROTO_OK = 0,
    TS_PROTO_E_FRAMES = 1,       /* no header frame, or more frames than allowed */
    TS_PROTO_E_HEADER_SIZE = 2,  /* header frame larger than max_header_bytes */
    TS_PROTO_E_MSGPACK = 3,      /* header is not one well-formed msgpack object
                                    (truncated, trailing bytes, too deep) */
    TS_PROTO_E_NOT_MAP = 4,      /* header is msgpack but not a map with str keys */
    TS_PROTO_E_VERSION = 5,      /* unknown or unsupported protocol version */
    TS_PROTO_E_TYPE = 6,         /* unknown message type */
    TS_PROTO_E_MISSING = 7,      /* a required field is absent */
    TS_PROTO_E_FIELD_TYPE = 8,   /* a field has the wrong msgpack type */
    TS_PROTO_E_FIELD_VALUE = 9,  /* a field's value is out of its domain (too long,
                                    negative, duplicate key, NUL in string, ...) */
    TS_PROTO_E_PAYLOAD_SIZE = 10,/* declared or actual payload over max_payload_bytes */
    TS_PROTO_E_PAYLOAD_LEN = 11, /* "ln" disagrees with the payload frames received */
    TS_PROTO_E_RANGE = 12,       /* a range is out of the model's bounds */
    TS_PROTO_E_GENERATION = 13,  /* generation older than the current one */
    TS_PROTO_E_JOB = 14,         /* job id is not this job's */
    TS_PROTO_E_MEMORY = 15,      /* out of memory while decoding */
    TS_PROTO_E_AGAIN = 16,       /* recv: no message available (non-blocking/timeout) */
    TS_PROTO_E_IO = 17,          /* recv: socket error */
    /* Application-level codes carried by ERROR messages. */
    TS_PROTO_E_UNEXPECTED = 32,  /* valid message not acceptable in this state */
    TS_PROTO_E_REFUSED = 33,     /* request refused (world full, unknown rank, ...) */
    TS_PROTO_E_BARRIER_TIMEOUT = 34,   /* some ranks never reached a barrier */
    TS_PROTO_E_RENDEZVOUS_TIMEOUT = 35,/* too few nodes joined in time */
    TS_PROTO_E_NOT_FOUND = 36,   /* unknown blob key or similar */
    TS_PROTO_E_INTERNAL = 37,    /* the replying process failed internally */
    TS_PROTO_E_REDO = 38,        /* the workers changed: compute step "s" again in generation "g" */
    TS_PROTO_E_BEHIND = 39,      /* the shard restarted at step "s": roll the job back to it */
    TS_PROTO_E_RETRY = 40,       /* not now (generation not seen yet, not the primary): send again */
    TS_PROTO_E_SKIP = 41,        /* the reduction of step "s" cannot be done again by the workers of
                                  * generation "g" (one joined after the step): go on without it */
} ts_proto_error;

/* The f64 values of a COMMIT (worker -> shard) and of a COMMIT_REPLY (shard
 * -> worker), in this order (ps/README.md). */
enum { TS_COMMIT_LOSS_SUM, TS_COMMIT_SAMPLES, TS_COMMIT_SQ_NORM, TS_COMMIT_LR, TS_COMMIT_EPOCH, TS_COMMIT_OFFSET,
       TS_COMMIT_STOP, TS_COMMIT_VALUES };
enum { TS_DECIDED_LOSS_SUM, TS_DECIDED_SAMPLES, TS_DECIDED_SQ_NORM, TS_DECIDED_WORKERS, TS_DECIDED_STOP,
       TS_DECIDED_VALUES };
/* A PULL_REPLY's "sv": the loss, learning rate and gradient norm of its
 * step, as the step's workers (sync) or the worker that finished it
 * (async, bounded) logged them. */
enum { TS_STEP_LOSS, TS_STEP_LR, TS_STEP_GRAD_NORM, TS_STEP_VALUES };
/* Added to a REDUCE's "bi" (the reduction's number in its step) at the
 * job's last step, after which every worker evaluates, joiners included. */
#define TS_REDUCE_FINAL ((int64_t)1 << 32)

/* Node roles ("ro", roster entries). */
typedef enum {
    TS_ROLE_NONE = 0,
    TS_ROLE_SCHEDULER = 1,
    TS_ROLE_PS = 2,
    TS_ROLE_WORKER = 3,
} ts_proto_role;

/* Wire dtypes ("dt"); element sizes from ts_proto_dtype_size. */
typedef enum {
    TS_PROTO_DT_NONE = 0,
    TS_PROTO_DT_F32 = 1,
    TS_PROTO_DT_F64 = 2,
    TS_PROTO_DT_F16 = 3,
    TS_PROTO_DT_BF16 = 4,
    TS_PROTO_DT_I32 = 5,
    TS_PROTO_DT_I64 = 6,
    TS_PROTO_DT_U8 = 7,
} ts_proto_dtype;

/* A read-only byte view of one frame. */
typedef struct {
    const void *data;
    size_t size;
} ts_proto_frame;

/* A ROUTER peer identity (ZeroMQ identities are 1..255 bytes). */
typedef struct {
    unsigned char data[255];
    size_t size;
} ts_proto_identity;

/* A half-open range [offset, offset + len) of the model's flat buffer. */
typedef struct {
    uint64_t offset;
    uint64_t len;
} ts_proto_range;

/* One roster entry ("ros": array of 8-element arrays, in this order). */
typedef struct {
    int32_t rank;
    ts_proto_role role;
    char address[TS_PROTO_ADDR_MAX + 1];
    bool alive;
    int64_t last_step;          /* -1 when none reported yet */
    int64_t last_barrier;       /* -1 when none reached yet */
    int64_t heartbeat_age_ms;   /* ms since last heartbeat; -1 unknown */
    uint64_t joined_generation; /* generation in which the node (re)joined */
} ts_proto_member;

/* A message. Common fields are always encoded; a type-specific field is
 * encoded and decoded only for the types named beside it. */
typedef struct {
    /* common */
    uint32_t version;               /* "v" */
    ts_proto_type type;             /* "t" */
    char job[TS_PROTO_JOB_MAX + 1]; /* "job" */
    uint64_t generation;            /* "g" */
    int64_t step;                   /* "s" */
    int32_t rank;                   /* "r" sender */
    ts_proto_dtype dtype;           /* "dt" optional (NONE = absent) */
    ts_proto_range *ranges;         /* "rg" optional; owned */
    size_t nranges;
    uint64_t *lengths;              /* "ln"; owned. Decode: equals the payload
                                       frame sizes. Send: filled from payloads. */
    size_t nlengths;
    const ts_proto_frame *payload;  /* decode only: nlengths views into frames */

    /* JOIN */
    ts_proto_role role;                   /* "ro" */
    char address[TS_PROTO_ADDR_MAX + 1];  /* "ad" endpoint the node serves on ("" none) */
    char caps[TS_PROTO_CAPS_MAX + 1];     /* "ca" free-form capabilities */
    int32_t prev_rank;                    /* "pr" rank held before, or -1 */

    /* JOIN_ACK (rank + settings), MEMBERSHIP and STATUS_REPLY (roster) */
    int32_t assigned_rank;      /* "rk" JOIN_ACK */
    ts_proto_member *roster;    /* "ros" JOIN_ACK, MEMBERSHIP, STATUS_REPLY; owned */
    size_t nroster;
    int64_t steps;              /* "ns" JOIN_ACK, STATUS_REPLY: stand-in loop length */
    uint32_t heartbeat_ms;      /* "hb" JOIN_ACK: heartbeat interval */
    uint32_t heartbeat_timeout_ms; /* "ht" JOIN_ACK */
    uint32_t barrier_timeout_ms;   /* "bt" JOIN_ACK */

    /* HEARTBEAT */
    int64_t last_barrier;       /* "lb" last barrier id reached, -1 none */

    /* BARRIER, BARRIER_RELEASE, REDUCE, REDUCE_REPLY */
    int64_t barrier_id;         /* "bi" barrier, or the reduction's number within its step */

    /* ERROR, SHUTDOWN */
    uint32_t code;                       /* "co" ts_proto_error (ERROR) or exit code (SHUTDOWN) */
    char reason[TS_PROTO_REASON_MAX + 1];/* "re" */

    /* BLOB_PUT, BLOB_GET, BLOB_REPLY (blob bytes are payload frame 1) */
    char key[TS_PROTO_KEY_MAX + 1];      /* "bk" */
    bool found;                          /* "fd" BLOB_REPLY */

    /* PULL_REPLY: the data-loader position after the step of the parameters,
     * and what the step's workers logged of it (TS_STEP_*): none when the
     * shard did not apply the step itself (restored from a checkpoint) */
    int64_t epoch;                       /* "ep" */
    int64_t offset;                      /* "of" */
    double step_values[TS_STEP_VALUES];  /* "sv" array of 0 or TS_STEP_VALUES f64 */
    uint32_t nstep_values;

    /* STATUS_REPLY */
    char phase[TS_PROTO_PHASE_MAX + 1];  /* "ph" e.g. "rendezvous", "running", "done" */
    uint32_t min_workers;                /* "mn" */
    uint32_t max_workers;                /* "mx" */

    /* COLLECTIVE: one chunk of a communicator's operation; "rg" holds one
     * range, the chunk's elements within the operation's buffer */
    uint64_t sequence;                   /* "cs" the operation's number in its flow */
    uint32_t flow;                       /* "cf" which stream of the sender it belongs to */
} ts_proto_msg;

/* What a receiver accepts. Zero-initialise, then use ts_proto_limits_default. */
typedef struct {
    size_t max_header_bytes;    /* header frame size limit */
    size_t max_frames;          /* payload frames limit (header excluded) */
    uint64_t max_payload_bytes; /* total payload bytes limit */
    uint64_t model_size;        /* ranges must lie in [0, model_size) elements;
                                   0 = model unknown: only overflow is checked */
    uint64_t generation;        /* current generation: messages with g below it
                                   are stale (JOIN and STATUS exempt); 0 = no check */
    const char *job;            /* expected job id; NULL = any */
    size_t max_roster;          /* roster entries limit */
    size_t max_ranges;          /* ranges limit */
} ts_proto_limits;

/* A payload frame to send. With free_fn set the bytes are sent zero-copy and
 * ZeroMQ owns them: free_fn(data, hint) runs (on a ZeroMQ I/O thread) once
 * the bytes are no longer needed, also when the send fails. With free_fn NULL
 * the bytes are copied and the caller keeps ownership. */
typedef struct {
    const void *data;
    size_t size;
    zmq_free_fn *free_fn;
    void *hint;
} ts_proto_payload;

/* Received-message holder for ts_proto_recv. Zero-initialised (or after
 * ts_proto_rx_init) it is empty; recv reuses it, releasing what it held.
 * Call ts_proto_rx_release when done with the last message. */
typedef struct {
    ts_proto_msg msg;            /* valid when recv returned TS_PROTO_OK */
    ts_proto_identity identity;  /* ROUTER: sender identity (even if decode failed) */
    size_t dropped_frames;       /* frames received beyond the limit and discarded */
    /* private */
    zmq_msg_t *parts;
    ts_proto_frame *views;
    size_t nparts, cap;
} ts_proto_rx;

/* Short names: "join", "ok", "payload-length", "worker", "f32", ... ;
 * "unknown" for values outside the enums. */
const char *ts_proto_type_name(uint32_t t);
const char *ts_proto_error_name(uint32_t e);
const char *ts_proto_role_name(uint32_t r);
/* Parses "ps", "worker", "scheduler" into *out; TS_ERR_VALUE otherwise. */
ts_status ts_proto_role_parse(const char *name, ts_proto_role *out);
/* Element size in bytes; 0 for NONE or unknown codes. */
size_t ts_proto_dtype_size(uint32_t dt);
/* The ts_status that goes with a ts_proto_error (FORMAT, STATE, IO, ...). */
ts_status ts_proto_error_status(ts_proto_error e);
/* True for types that ts_proto_decode accepts. */
bool ts_proto_type_known(uint32_t t);

/* Every message type, in number order (for tests and the fuzz corpus). */
extern const uint32_t ts_proto_types[];
extern const size_t ts_proto_ntypes;

/* Fills *lim with the defaults above, no model size, generation or job. */
void ts_proto_limits_default(ts_proto_limits *lim);

/* Zeroes *m and sets version, type, job (truncated to TS_PROTO_JOB_MAX),
 * generation and sender rank; prev_rank, last_barrier, barrier_id = -1. */
void ts_proto_msg_init(ts_proto_msg *m, ts_proto_type type, const char *job,
                       uint64_t generation, int32_t rank);
/* Frees the arrays a message owns and zeroes it. NULL is fine. */
void ts_proto_msg_free(ts_proto_msg *m);
/* Copies n roster entries / ranges into *m (replacing what it held). */
ts_status ts_proto_msg_set_roster(ts_proto_msg *m, const ts_proto_member *r, size_t n);
ts_status ts_proto_msg_set_ranges(ts_proto_msg *m, const ts_proto_range *r, size_t n);
/* Copies a string into a fixed field; TS_ERR_VALUE (nothing copied) when it
 * is longer than cap - 1 bytes. Use as ts_proto_set_str(m->reason, sizeof m->reason, s). */
ts_status ts_proto_set_str(char *dst, size_t cap, const char *src);
/* Makes m (already initialised) carry n f64 values: dtype f64, "bi" id, and
 * *p the payload frame viewing v (copied when sent). */
void ts_proto_msg_values(ts_proto_msg *m, int64_t id, const double *v, int n, ts_proto_payload *p);
/* Builds an ERROR message (code, reason truncated to fit). */
void ts_proto_msg_error(ts_proto_msg *m, const char *job, uint64_t generation,
                        int32_t rank, uint32_t code, const char *reason);

/* Encodes m's header map (with m->lengths as "ln") into a malloc'd buffer
 * (*out, *size; release with free()). Fails with TS_ERR_VALUE naming the
 * field when m holds something the decoder would refuse (unknown type,
 * string too long, NUL inside a string). */
ts_status ts_proto_encode(const ts_proto_msg *m, void **out, size_t *size);

/* Decodes and validates one message: frames[0] is the header, frames[1..]
 * the payload. On TS_PROTO_OK *out is filled (free with ts_proto_msg_free)
 * and out->payload points at frames + 1. On any other result *out holds
 * nothing to free and ts_last_error() names the field or limit. */
ts_proto_error ts_proto_decode(const ts_proto_frame *frames, size_t nframes,
                               const ts_proto_limits *lim, ts_proto_msg *out);

/* Sends m with its payload frames; the header's "ln" is taken from the
 * payloads (m->lengths is ignored). `to` is the peer identity on a ROUTER
 * socket, NULL on DEALER. flags: 0 or ZMQ_DONTWAIT (TS_ERR_TIMEOUT when it
 * would block). Payloads with free_fn are handed to ZeroMQ in every case. */
ts_status ts_proto_send(void *sock, const ts_proto_identity *to, const ts_proto_msg *m,
                        const ts_proto_payload *payloads, size_t npayloads, int flags);

/* Builds and sends an ERROR reply (no payload). */
ts_status ts_proto_send_error(void *sock, const ts_proto_identity *to, const char *job,
                              uint64_t generation, int32_t rank, uint32_t code,
                              const char *reason);

/* Receives one whole multipart message (all its frames, even past the limit:
 * the extra ones are counted in rx->dropped_frames and the result is
 * TS_PROTO_E_FRAMES) and decodes it into rx->msg. A ROUTER socket's first
 * frame becomes rx->identity (checked with getsockopt ZMQ_TYPE). flags: 0 or
 * ZMQ_DONTWAIT; ZMQ_RCVTIMEO is honoured. Returns TS_PROTO_E_AGAIN when no
 * message came, TS_PROTO_E_IO on a socket error, otherwise the decode result. */
ts_proto_error ts_proto_recv(void *sock, const ts_proto_limits *lim, int flags,
                             ts_proto_rx *rx);

/* Bytes a frame may carry beyond its content on the wire: the CURVE MESSAGE
 * command around it (name, nonce, MAC, flags), rounded up. */
#define TS_PROTO_FRAME_OVERHEAD 256u
/* A connection that has not finished its CURVE handshake by then is dropped. */
#define TS_PROTO_HANDSHAKE_MS 10000

/* Bounds what a peer can make sock hold, from the limits its receiver
 * applies. Every socket that receives Tessera messages calls it, before
 * bind/connect, with the limits it passes to ts_proto_recv (a shard with
 * its largest range, a ring with its largest chunk):
 * - ZMQ_MAXMSGSIZE = the largest frame lim allows (the header limit or the
 *   payload limit, whichever is larger, with max_frames 0 the header limit)
 *   plus TS_PROTO_FRAME_OVERHEAD. A peer whose frame declares more is
 *   disconnected at the frame's size field, before its bytes are buffered;
 *   this holds for the frames of the CURVE handshake too, i.e. before the
 *   peer has authenticated.
 * - ZMQ_HANDSHAKE_IVL = TS_PROTO_HANDSHAKE_MS.
 * So a connection without the key holds at most one such frame, for at most
 * TS_PROTO_HANDSHAKE_MS. TS_ERR_IO naming the option when libzmq refuses. */
ts_status ts_proto_limit_socket(void *sock, const ts_proto_limits *lim);

/* The endpoint peers should connect to for a socket bound at `bound`
 * (ZMQ_LAST_ENDPOINT): a wildcard address (0.0.0.0 or *) becomes this
 * host's name, anything else is copied. */
void ts_proto_public_endpoint(const char *bound, char *out, size_t cap);

/* Empties an rx (zero state). */
void ts_proto_rx_init(ts_proto_rx *rx);
/* Releases the frames, arrays and message an rx holds; it is empty and
 * reusable afterwards. */
void ts_proto_rx_release(ts_proto_rx *rx);

#endif
