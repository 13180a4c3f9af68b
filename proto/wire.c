/* wire.c - message names, construction, and the header codec (msgpack-c). */
#include "proto/wire.h"

#include <stdlib.h>
#include <string.h>

const char *ts_proto_type_name(uint32_t t) {
    switch (t) {
    case TS_MSG_JOIN: return "join";
    case TS_MSG_JOIN_ACK: return "join-ack";
    case TS_MSG_HEARTBEAT: return "heartbeat";
    case TS_MSG_MEMBERSHIP: return "membership";
    case TS_MSG_BARRIER: return "barrier";
    case TS_MSG_BARRIER_RELEASE: return "barrier-release";
    case TS_MSG_STEP_DONE: return "step-done";
    case TS_MSG_ERROR: return "error";
    case TS_MSG_SHUTDOWN: return "shutdown";
    case TS_MSG_STATUS: return "status";
    case TS_MSG_STATUS_REPLY: return "status-reply";
    case TS_MSG_BLOB_PUT: return "blob-put";
    case TS_MSG_BLOB_GET: return "blob-get";
    case TS_MSG_BLOB_REPLY: return "blob-reply";
    case TS_MSG_STOP: return "stop";
    case TS_MSG_STOPPED: return "stopped";
    case TS_MSG_REGROUP: return "regroup";
    case TS_MSG_PUSH: return "push";
    case TS_MSG_PULL: return "pull";
    case TS_MSG_PULL_REPLY: return "pull-reply";
    case TS_MSG_COLLECTIVE: return "collective";
    case TS_MSG_ACK: return "ack";
    case TS_MSG_COMMIT: return "commit";
    case TS_MSG_COMMIT_REPLY: return "commit-reply";
    case TS_MSG_APPLY: return "apply";
    case TS_MSG_REDUCE: return "reduce";
    case TS_MSG_REDUCE_REPLY: return "reduce-reply";
    case TS_MSG_ROLLBACK: return "rollback";
    case TS_MSG_SNAPSHOT: return "snapshot";
    default: return "unknown";
    }
}

const uint32_t ts_proto_types[] = {
    TS_MSG_JOIN, TS_MSG_JOIN_ACK, TS_MSG_HEARTBEAT, TS_MSG_MEMBERSHIP, TS_MSG_BARRIER,
    TS_MSG_BARRIER_RELEASE, TS_MSG_STEP_DONE, TS_MSG_ERROR, TS_MSG_SHUTDOWN, TS_MSG_STATUS,
    TS_MSG_STATUS_REPLY, TS_MSG_BLOB_PUT, TS_MSG_BLOB_GET, TS_MSG_BLOB_REPLY, TS_MSG_STOP, TS_MSG_STOPPED, TS_MSG_REGROUP,
    TS_MSG_PUSH,
    TS_MSG_PULL, TS_MSG_PULL_REPLY, TS_MSG_COLLECTIVE, TS_MSG_ACK, TS_MSG_COMMIT,
    TS_MSG_COMMIT_REPLY, TS_MSG_APPLY, TS_MSG_REDUCE, TS_MSG_REDUCE_REPLY, TS_MSG_ROLLBACK,
    TS_MSG_SNAPSHOT,
};
const size_t ts_proto_ntypes = sizeof ts_proto_types / sizeof ts_proto_types[0];

bool ts_proto_type_known(uint32_t t) { return strcmp(ts_proto_type_name(t), "unknown") != 0; }

const char *ts_proto_error_name(uint32_t e) {
    switch (e) {
    case TS_PROTO_OK: return "ok";
    case TS_PROTO_E_FRAMES: return "frames";
    case TS_PROTO_E_HEADER_SIZE: return "header-size";
    case TS_PROTO_E_MSGPACK: return "msgpack";
    case TS_PROTO_E_NOT_MAP: return "not-map";
    case TS_PROTO_E_VERSION: return "version";
    case TS_PROTO_E_TYPE: return "type";
    case TS_PROTO_E_MISSING: return "missing-field";
    case TS_PROTO_E_FIELD_TYPE: return "field-type";
    case TS_PROTO_E_FIELD_VALUE: return "field-value";
    case TS_PROTO_E_PAYLOAD_SIZE: return "payload-size";
    case TS_PROTO_E_PAYLOAD_LEN: return "payload-length";
    case TS_PROTO_E_RANGE: return "range";
    case TS_PROTO_E_GENERATION: return "stale-generation";
    case TS_PROTO_E_JOB: return "wrong-job";
    case TS_PROTO_E_MEMORY: return "memory";
    case TS_PROTO_E_AGAIN: return "again";
    case TS_PROTO_E_IO: return "io";
    case TS_PROTO_E_UNEXPECTED: return "unexpected";
    case TS_PROTO_E_REFUSED: return "refused";
    case TS_PROTO_E_BARRIER_TIMEOUT: return "barrier-timeout";
    case TS_PROTO_E_RENDEZVOUS_TIMEOUT: return "rendezvous-timeout";
    case TS_PROTO_E_NOT_FOUND: return "not-found";
    case TS_PROTO_E_INTERNAL: return "internal";
    case TS_PROTO_E_REDO: return "redo";
    case TS_PROTO_E_BEHIND: return "behind";
    case TS_PROTO_E_RETRY: return "retry";
    case TS_PROTO_E_SKIP: return "skip";
    default: return "unknown";
    }
}

ts_status ts_proto_error_status(ts_proto_error e) {
    switch (e) {
    case TS_PROTO_OK: return TS_OK;
    case TS_PROTO_E_GENERATION:
    case TS_PROTO_E_UNEXPECTED:
    case TS_PROTO_E_REDO:
    case TS_PROTO_E_BEHIND:
    case TS_PROTO_E_SKIP: return TS_ERR_STATE;
    case TS_PROTO_E_RETRY: return TS_ERR_TIMEOUT;
    case TS_PROTO_E_JOB:
    case TS_PROTO_E_REFUSED: return TS_ERR_PEER;
    case TS_PROTO_E_RANGE: return TS_ERR_INDEX;
    case TS_PROTO_E_MEMORY: return TS_ERR_MEMORY;
    case TS_PROTO_E_AGAIN:
    case TS_PROTO_E_BARRIER_TIMEOUT:
    case TS_PROTO_E_RENDEZVOUS_TIMEOUT: return TS_ERR_TIMEOUT;
    case TS_PROTO_E_IO: return TS_ERR_IO;
    case TS_PROTO_E_NOT_FOUND: return TS_ERR_VALUE;
    case TS_PROTO_E_INTERNAL: return TS_ERR_PEER;
    default: return TS_ERR_FORMAT;
    }
}

const char *ts_proto_role_name(uint32_t r) {
    switch (r) {
    case TS_ROLE_NONE: return "none";
    case TS_ROLE_SCHEDULER: return "scheduler";
    case TS_ROLE_PS: return "ps";
    case TS_ROLE_WORKER: return "worker";
    default: return "unknown";
    }
}

ts_status ts_proto_role_parse(const char *name, ts_proto_role *out) {
    static const ts_proto_role roles[] = {TS_ROLE_SCHEDULER, TS_ROLE_PS, TS_ROLE_WORKER};
    for (size_t i = 0; name && i < sizeof roles / sizeof roles[0]; i++) {
        if (strcmp(name, ts_proto_role_name(roles[i])) == 0) {
            *out = roles[i];
            return TS_OK;
        }
    }
    return ts_error(TS_ERR_VALUE, "role: '%s' is not one of scheduler, ps, worker",
                    name ? name : "(null)");
}

size_t ts_proto_dtype_size(uint32_t dt) {
    switch (dt) {
    case TS_PROTO_DT_F32: case TS_PROTO_DT_I32: return 4;
    case TS_PROTO_DT_F64: case TS_PROTO_DT_I64: return 8;
    case TS_PROTO_DT_F16: case TS_PROTO_DT_BF16: return 2;
    case TS_PROTO_DT_U8: return 1;
    default: return 0;
    }
}

void ts_proto_limits_default(ts_proto_limits *lim) {
    memset(lim, 0, sizeof *lim);
    lim->max_header_bytes = TS_PROTO_DEFAULT_MAX_HEADER;
    lim->max_frames = TS_PROTO_DEFAULT_MAX_FRAMES;
    lim->max_payload_bytes = TS_PROTO_DEFAULT_MAX_PAYLOAD;
    lim->max_roster = 4096;
    lim->max_ranges = 4096;
}

void ts_proto_msg_init(ts_proto_msg *m, ts_proto_type type, const char *job,
                       uint64_t generation, int32_t rank) {
    memset(m, 0, sizeof *m);
    m->version = TS_PROTO_VERSION;
    m->type = type;
    if (job) {
        size_t n = strlen(job);
        if (n > TS_PROTO_JOB_MAX) n = TS_PROTO_JOB_MAX;
        memcpy(m->job, job, n);
    }
    m->generation = generation;
    m->rank = rank;
    m->prev_rank = -1;
    m->assigned_rank = -1;
    m->last_barrier = -1;
    m->barrier_id = -1;
}

void ts_proto_msg_free(ts_proto_msg *m) {
    if (!m) return;
    free(m->ranges);
    free(m->lengths);
    free(m->roster);
    memset(m, 0, sizeof *m);
}

/* Copies n elements of size sz into a fresh malloc'd array (*dst, *dn). */
static ts_status copy_array(void **dst, size_t *dn, const void *src, size_t n, size_t sz,
                            const char *what) {
    void *p = NULL;
    if (n) {
        p = malloc(n * sz);
        if (!p) return ts_error(TS_ERR_MEMORY, "%s: cannot allocate %zu entries", what, n);
        memcpy(p, src, n * sz);
    }
    free(*dst);
    *dst = p;
    *dn = n;
    return TS_OK;
}

ts_status ts_proto_msg_set_roster(ts_proto_msg *m, const ts_proto_member *r, size_t n) {
    return copy_array((void **)&m->roster, &m->nroster, r, n, sizeof *r, "roster");
}

ts_status ts_proto_msg_set_ranges(ts_proto_msg *m, const ts_proto_range *r, size_t n) {
    return copy_array((void **)&m->ranges, &m->nranges, r, n, sizeof *r, "ranges");
}

ts_status ts_proto_set_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n + 1 > cap)
        return ts_error(TS_ERR_VALUE, "string field: %zu bytes do not fit in %zu", n, cap - 1);
    memcpy(dst, src, n + 1);
    return TS_OK;
}

void ts_proto_msg_values(ts_proto_msg *m, int64_t id, const double *v, int n, ts_proto_payload *p) {
    m->dtype = TS_PROTO_DT_F64;
    m->barrier_id = id;
    *p = (ts_proto_payload){v, (size_t)n * sizeof *v, NULL, NULL};
}

void ts_proto_msg_error(ts_proto_msg *m, const char *job, uint64_t generation,
                        int32_t rank, uint32_t code, const char *reason) {
    ts_proto_msg_init(m, TS_MSG_ERROR, job, generation, rank);
    m->code = code;
    if (reason) {
        size_t n = strlen(reason);
        if (n > TS_PROTO_REASON_MAX) n = TS_PROTO_REASON_MAX;
        memcpy(m->reason, reason, n);
    }
}
