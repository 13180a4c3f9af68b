/* wire_codec.c - header map encode (msgpack_packer) and strict
 * decode-and-validate (msgpack_unpack + object traversal).
 *
 * Both directions are driven by one field table, so a field's key, type and
 * domain are written down once. Before msgpack-c sees a header, scan_msgpack
 * walks its bytes and checks that every declared length and element count
 * fits in what remains of the frame: msgpack-c allocates arrays up front, and
 * a 5-byte header declaring 2^32 elements must never reach it.
 */
#include "proto/wire.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

_Static_assert(sizeof(ts_proto_type) == 4 && sizeof(ts_proto_role) == 4 &&
                   sizeof(ts_proto_dtype) == 4,
               "wire enums are stored as 32-bit fields");

/* Deepest container nesting a valid header uses is 3 (map > roster > entry). */
#define MAX_DEPTH 8

/* ---- errors ------------------------------------------------------------ */

/* Records "proto decode: ..." with the status that goes with e; returns e. */
static ts_proto_error fail(ts_proto_error e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ts_proto_error fail(ts_proto_error e, const char *fmt, ...) {
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ts_error(ts_proto_error_status(e), "proto decode: %s [%s]", buf, ts_proto_error_name(e));
    return e;
}

static const char *object_type_name(msgpack_object_type t) {
    switch (t) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "uint";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative int";
    case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_EXT: return "ext";
    default: return "unknown";
    }
}

/* ---- the field table --------------------------------------------------- */

typedef enum { F_UINT, F_INT, F_STR, F_BOOL, F_RANGES, F_LENGTHS, F_ROSTER, F_STEP_VALUES } field_kind;

typedef struct {
    const char *key;  /* wire key, or entry name for roster members */
    const char *name; /* struct field, for messages */
    field_kind kind;
    size_t off;       /* offset in ts_proto_msg / ts_proto_member */
    size_t width;     /* integer bytes (4 or 8), or string capacity */
    int64_t lo;       /* smallest allowed integer */
    uint64_t hi;      /* largest allowed integer */
} field_desc;

#define M(f) offsetof(ts_proto_msg, f), sizeof(((ts_proto_msg *)0)->f)
#define E(f) offsetof(ts_proto_member, f), sizeof(((ts_proto_member *)0)->f)

enum {
    K_V, K_T, K_JOB, K_G, K_S, K_R, K_LN, K_DT, K_RG, K_RO, K_AD, K_CA, K_PR, K_RK,
    K_ROS, K_NS, K_HB, K_HT, K_BT, K_LB, K_BI, K_CO, K_RE, K_BK, K_FD, K_PH, K_MN,
    K_MX, K_EP, K_OF, K_SV, K_CS, K_CF, K_COUNT
};

static const field_desc FIELDS[K_COUNT] = {
    [K_V] = {"v", "version", F_UINT, M(version), 0, UINT32_MAX},
    [K_T] = {"t", "type", F_UINT, M(type), 0, UINT32_MAX},
    [K_JOB] = {"job", "job", F_STR, M(job), 0, 0},
    [K_G] = {"g", "generation", F_UINT, M(generation), 0, UINT64_MAX},
    [K_S] = {"s", "step", F_INT, M(step), -1, INT64_MAX},
    [K_R] = {"r", "rank", F_INT, M(rank), TS_PROTO_RANK_SCHEDULER, INT32_MAX},
    [K_LN] = {"ln", "lengths", F_LENGTHS, 0, 0, 0, 0},
    [K_DT] = {"dt", "dtype", F_UINT, M(dtype), TS_PROTO_DT_F32, TS_PROTO_DT_U8},
    [K_RG] = {"rg", "ranges", F_RANGES, 0, 0, 0, 0},
    [K_RO] = {"ro", "role", F_UINT, M(role), TS_ROLE_SCHEDULER, TS_ROLE_WORKER},
    [K_AD] = {"ad", "address", F_STR, M(address), 0, 0},
    [K_CA] = {"ca", "caps", F_STR, M(caps), 0, 0},
    [K_PR] = {"pr", "prev_rank", F_INT, M(prev_rank), -1, INT32_MAX},
    [K_RK] = {"rk", "assigned_rank", F_INT, M(assigned_rank), 0, INT32_MAX},
    [K_ROS] = {"ros", "roster", F_ROSTER, 0, 0, 0, 0},
    [K_NS] = {"ns", "steps", F_INT, M(steps), 0, INT64_MAX},
    [K_HB] = {"hb", "heartbeat_ms", F_UINT, M(heartbeat_ms), 0, UINT32_MAX},
    [K_HT] = {"ht", "heartbeat_timeout_ms", F_UINT, M(heartbeat_timeout_ms), 0, UINT32_MAX},
    [K_BT] = {"bt", "barrier_timeout_ms", F_UINT, M(barrier_timeout_ms), 0, UINT32_MAX},
    [K_LB] = {"lb", "last_barrier", F_INT, M(last_barrier), -1, INT64_MAX},
    [K_BI] = {"bi", "barrier_id", F_INT, M(barrier_id), 0, INT64_MAX},
    [K_CO] = {"co", "code", F_UINT, M(code), 0, UINT32_MAX},
    [K_RE] = {"re", "reason", F_STR, M(reason), 0, 0},
    [K_BK] = {"bk", "key", F_STR, M(key), 0, 0},
    [K_FD] = {"fd", "found", F_BOOL, M(found), 0, 0},
    [K_PH] = {"ph", "phase", F_STR, M(phase), 0, 0},
    [K_MN] = {"mn", "min_workers", F_UINT, M(min_workers), 0, UINT32_MAX},
    [K_MX] = {"mx", "max_workers", F_UINT, M(max_workers), 0, UINT32_MAX},
    [K_EP] = {"ep", "epoch", F_INT, M(epoch), 0, INT64_MAX},
    [K_OF] = {"of", "offset", F_INT, M(offset), 0, INT64_MAX},
    [K_SV] = {"sv", "step_values", F_STEP_VALUES, 0, 0, 0, 0},
    [K_CS] = {"cs", "sequence", F_UINT, M(sequence), 0, UINT64_MAX},
    [K_CF] = {"cf", "flow", F_UINT, M(flow), 0, TS_PROTO_FLOW_MAX},
};

/* A roster entry is a positional array with these elements. */
#define MEMBER_FIELDS 8
static const field_desc MEMBER[MEMBER_FIELDS] = {
    {"rank", "rank", F_INT, E(rank), 0, INT32_MAX},
    {"role", "role", F_UINT, E(role), TS_ROLE_SCHEDULER, TS_ROLE_WORKER},
    {"address", "address", F_STR, E(address), 0, 0},
    {"alive", "alive", F_BOOL, E(alive), 0, 0},
    {"last_step", "last_step", F_INT, E(last_step), -1, INT64_MAX},
    {"last_barrier", "last_barrier", F_INT, E(last_barrier), -1, INT64_MAX},
    {"heartbeat_age_ms", "heartbeat_age_ms", F_INT, E(heartbeat_age_ms), -1, INT64_MAX},
    {"joined_generation", "joined_generation", F_UINT, E(joined_generation), 0, UINT64_MAX},
};

/* Keys every message carries, in encoding order; "dt" and "rg" are optional. */
static const uint8_t COMMON[] = {K_V, K_T, K_JOB, K_G, K_S, K_R, K_LN};

/* The type-specific keys (all required) of type t; *n = 0 for none. */
static const uint8_t *type_fields(uint32_t t, size_t *n) {
    static const uint8_t join[] = {K_RO, K_AD, K_CA, K_PR};
    static const uint8_t ack[] = {K_RK, K_ROS, K_NS, K_HB, K_HT, K_BT};
    static const uint8_t heartbeat[] = {K_LB};
    static const uint8_t membership[] = {K_ROS};
    static const uint8_t barrier[] = {K_BI};
    static const uint8_t coded[] = {K_CO, K_RE};
    static const uint8_t status_reply[] = {K_ROS, K_NS, K_PH, K_MN, K_MX};
    static const uint8_t blob[] = {K_BK};
    static const uint8_t blob_reply[] = {K_BK, K_FD};
    static const uint8_t pull_reply[] = {K_EP, K_OF, K_SV};
    static const uint8_t collective[] = {K_CS, K_CF};
    static const uint8_t snapshot[] = {K_BI, K_OF};
#define LIST(a) (*n = sizeof a, a)
    switch (t) {
    case TS_MSG_JOIN: return LIST(join);
    case TS_MSG_JOIN_ACK: return LIST(ack);
    case TS_MSG_HEARTBEAT: return LIST(heartbeat);
    case TS_MSG_MEMBERSHIP: return LIST(membership);
    case TS_MSG_BARRIER: case TS_MSG_BARRIER_RELEASE: return LIST(barrier);
    case TS_MSG_ERROR: case TS_MSG_SHUTDOWN: case TS_MSG_STOP: case TS_MSG_REGROUP: return LIST(coded);
    case TS_MSG_STATUS_REPLY: return LIST(status_reply);
    case TS_MSG_BLOB_PUT: case TS_MSG_BLOB_GET: return LIST(blob);
    case TS_MSG_BLOB_REPLY: return LIST(blob_reply);
    case TS_MSG_PULL_REPLY: return LIST(pull_reply);
    case TS_MSG_REDUCE: case TS_MSG_REDUCE_REPLY: return LIST(barrier);
    case TS_MSG_COLLECTIVE: return LIST(collective);
    case TS_MSG_SNAPSHOT: return LIST(snapshot);
    default: *n = 0; return NULL;
    }
#undef LIST
}

/* True for types whose payload frames carry tensor data (any number). */
static bool carries_data(uint32_t t) { return (t >= TS_MSG_PUSH && t <= TS_MSG_COLLECTIVE) || t == TS_MSG_SNAPSHOT; }

/* True for types that carry exactly one frame of f64 values. */
static bool carries_values(uint32_t t) {
    return t == TS_MSG_COMMIT || t == TS_MSG_COMMIT_REPLY || t == TS_MSG_APPLY || t == TS_MSG_REDUCE ||
           t == TS_MSG_REDUCE_REPLY;
}

/* ---- integer storage --------------------------------------------------- */

static void store_int(void *base, const field_desc *f, int64_t v) {
    char *p = (char *)base + f->off;
    if (f->width == 4) {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

static void store_uint(void *base, const field_desc *f, uint64_t v) {
    char *p = (char *)base + f->off;
    if (f->width == 4) {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

static int64_t load_int(const void *base, const field_desc *f) {
    const char *p = (const char *)base + f->off;
    if (f->width == 4) {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint64_t load_uint(const void *base, const field_desc *f) {
    const char *p = (const char *)base + f->off;
    if (f->width == 4) {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ---- pre-scan of the raw msgpack bytes -------------------------------- */

static uint64_t read_be(const uint8_t *p, size_t k) {
    uint64_t v = 0;
    for (size_t i = 0; i < k; i++) v = (v << 8) | p[i];
    return v;
}

/* Checks that p[0..n) is exactly one msgpack object whose every declared
 * length and element count fits in the bytes that remain, nested at most
 * MAX_DEPTH deep. Reads nothing outside p[0..n). */
static ts_proto_error scan_msgpack(const uint8_t *p, size_t n) {
    uint64_t pending[MAX_DEPTH + 1];
    int depth = 0;
    size_t pos = 0;
    pending[0] = 1;
    while (depth >= 0) {
        if (pending[depth] == 0) {
            depth--;
            continue;
        }
        pending[depth]--;
        if (pos >= n)
            return fail(TS_PROTO_E_MSGPACK, "header truncated at byte %zu of %zu", pos, n);
        size_t at = pos;
        uint8_t b = p[pos++];
        size_t lenbytes = 0; /* big-endian length/count that follows b */
        uint64_t fixed = 0;  /* bytes of body with no length prefix */
        uint64_t extra = 0;  /* ext type byte */
        int kind = 0;        /* 0 scalar/bytes, 1 array, 2 map */
        uint64_t count = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool */
        } else if (b >= 0x80 && b <= 0x8f) {
            kind = 2, count = b & 0x0f;
        } else if (b >= 0x90 && b <= 0x9f) {
            kind = 1, count = b & 0x0f;
        } else if (b >= 0xa0 && b <= 0xbf) {
            fixed = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4: case 0xd9: lenbytes = 1; break;          /* bin8, str8 */
            case 0xc5: case 0xda: lenbytes = 2; break;          /* bin16, str16 */
            case 0xc6: case 0xdb: lenbytes = 4; break;          /* bin32, str32 */
            case 0xc7: lenbytes = 1, extra = 1; break;          /* ext8 */
            case 0xc8: lenbytes = 2, extra = 1; break;          /* ext16 */
            case 0xc9: lenbytes = 4, extra = 1; break;          /* ext32 */
            case 0xca: case 0xce: case 0xd2: fixed = 4; break;  /* float32, u32, i32 */
            case 0xcb: case 0xcf: case 0xd3: fixed = 8; break;  /* float64, u64, i64 */
            case 0xcc: case 0xd0: fixed = 1; break;
            case 0xcd: case 0xd1: fixed = 2; break;
            case 0xd4: fixed = 2; break;                        /* fixext 1..16 */
            case 0xd5: fixed = 3; break;
            case 0xd6: fixed = 5; break;
            case 0xd7: fixed = 9; break;
            case 0xd8: fixed = 17; break;
            case 0xdc: kind = 1, lenbytes = 2; break;
            case 0xdd: kind = 1, lenbytes = 4; break;
            case 0xde: kind = 2, lenbytes = 2; break;
            case 0xdf: kind = 2, lenbytes = 4; break;
            default:
                return fail(TS_PROTO_E_MSGPACK, "header byte %zu is 0x%02x, not a msgpack type",
                            at, b);
            }
        }
        if (lenbytes) {
            if (n - pos < lenbytes)
                return fail(TS_PROTO_E_MSGPACK, "header truncated in the length at byte %zu", at);
            uint64_t v = read_be(p + pos, lenbytes);
            pos += lenbytes;
            if (kind) count = v;
            else fixed = v + extra;
        }
        if (kind) {
            uint64_t elems = kind == 2 ? 2 * count : count;
            if (elems > n - pos)
                return fail(TS_PROTO_E_MSGPACK,
                            "header %s at byte %zu declares %" PRIu64
                            " elements but only %zu bytes remain",
                            kind == 2 ? "map" : "array", at, count, n - pos);
            if (elems) {
                if (depth == MAX_DEPTH)
                    return fail(TS_PROTO_E_MSGPACK, "header nests deeper than %d at byte %zu",
                                MAX_DEPTH, at);
                pending[++depth] = elems;
            }
        } else {
            if (fixed > n - pos)
                return fail(TS_PROTO_E_MSGPACK,
                            "header item at byte %zu declares %" PRIu64
                            " bytes but only %zu remain",
                            at, fixed, n - pos);
            pos += (size_t)fixed;
        }
    }
    if (pos != n)
        return fail(TS_PROTO_E_MSGPACK, "header has %zu trailing bytes after the map", n - pos);
    return TS_PROTO_OK;
}

/* ---- decoding fields --------------------------------------------------- */

/* Decoding context: the message type's name and a path prefix for entries. */
typedef struct {
    const char *tname;
    const ts_proto_limits *lim;
} dctx;

static ts_proto_error bad_type(const dctx *c, const char *path, const field_desc *f,
                               const msgpack_object *o, const char *want) {
    return fail(TS_PROTO_E_FIELD_TYPE, "%s: field \"%s%s\" (%s) is %s, expected %s", c->tname,
                path, f->key, f->name, object_type_name(o->type), want);
}

/* Reads an integer object into *v within [lo, hi] (hi <= INT64_MAX). */
static ts_proto_error get_int(const dctx *c, const char *path, const field_desc *f,
                              const msgpack_object *o, int64_t *v) {
    int64_t hi = f->hi > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)f->hi;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)hi)
            return fail(TS_PROTO_E_FIELD_VALUE,
                        "%s: field \"%s%s\" (%s) is %" PRIu64 ", above %" PRId64, c->tname, path,
                        f->key, f->name, o->via.u64, hi);
        *v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
    } else {
        return bad_type(c, path, f, o, "int");
    }
    if (*v < f->lo)
        return fail(TS_PROTO_E_FIELD_VALUE, "%s: field \"%s%s\" (%s) is %" PRId64 ", below %" PRId64,
                    c->tname, path, f->key, f->name, *v, f->lo);
    return TS_PROTO_OK;
}

/* Reads an unsigned integer object into *v within [lo, hi]. */
static ts_proto_error get_uint(const dctx *c, const char *path, const field_desc *f,
                               const msgpack_object *o, uint64_t *v) {
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return fail(TS_PROTO_E_FIELD_VALUE, "%s: field \"%s%s\" (%s) is negative (%" PRId64 ")",
                    c->tname, path, f->key, f->name, o->via.i64);
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return bad_type(c, path, f, o, "uint");
    *v = o->via.u64;
    if (*v < (uint64_t)f->lo || *v > f->hi)
        return fail(TS_PROTO_E_FIELD_VALUE,
                    "%s: field \"%s%s\" (%s) is %" PRIu64 ", outside [%" PRId64 ", %" PRIu64 "]",
                    c->tname, path, f->key, f->name, *v, f->lo, f->hi);
    return TS_PROTO_OK;
}

/* Decodes a scalar field (int, uint, str, bool) of object o into base. */
static ts_proto_error get_scalar(const dctx *c, const char *path, const field_desc *f,
                                 const msgpack_object *o, void *base) {
    ts_proto_error e = TS_PROTO_OK;
    switch (f->kind) {
    case F_INT: {
        int64_t v = 0;
        if (!(e = get_int(c, path, f, o, &v))) store_int(base, f, v);
        return e;
    }
    case F_UINT: {
        uint64_t v = 0;
        if (!(e = get_uint(c, path, f, o, &v))) store_uint(base, f, v);
        return e;
    }
    case F_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN) return bad_type(c, path, f, o, "bool");
        *(bool *)((char *)base + f->off) = o->via.boolean;
        return TS_PROTO_OK;
    case F_STR: {
        if (o->type != MSGPACK_OBJECT_STR) return bad_type(c, path, f, o, "str");
        size_t len = o->via.str.size;
        if (len >= f->width)
            return fail(TS_PROTO_E_FIELD_VALUE, "%s: field \"%s%s\" (%s) is %zu bytes, limit %zu",
                        c->tname, path, f->key, f->name, len, f->width - 1);
        if (len && memchr(o->via.str.ptr, 0, len))
            return fail(TS_PROTO_E_FIELD_VALUE, "%s: field \"%s%s\" (%s) contains a NUL byte",
                        c->tname, path, f->key, f->name);
        char *dst = (char *)base + f->off;
        if (len) memcpy(dst, o->via.str.ptr, len);
        dst[len] = '\0';
        return TS_PROTO_OK;
    }
    default:
        return fail(TS_PROTO_E_FIELD_TYPE, "%s: field \"%s\" is not a scalar", c->tname, f->key);
    }
}

/* Checks that o is an array of at most max elements. */
static ts_proto_error get_array(const dctx *c, const field_desc *f, const msgpack_object *o,
                                size_t max) {
    if (o->type != MSGPACK_OBJECT_ARRAY) return bad_type(c, "", f, o, "array");
    if (o->via.array.size > max)
        return fail(TS_PROTO_E_FIELD_VALUE, "%s: field \"%s\" (%s) has %u entries, limit %zu",
                    c->tname, f->key, f->name, o->via.array.size, max);
    return TS_PROTO_OK;
}

/* Allocates n zeroed elements of size sz (NULL for n == 0). */
static ts_proto_error alloc_n(const dctx *c, const field_desc *f, size_t n, size_t sz,
                              void **out) {
    *out = NULL;
    if (!n) return TS_PROTO_OK;
    *out = calloc(n, sz);
    if (!*out)
        return fail(TS_PROTO_E_MEMORY, "%s: cannot allocate %zu %s", c->tname, n, f->name);
    return TS_PROTO_OK;
}

static ts_proto_error get_lengths(const dctx *c, const field_desc *f, const msgpack_object *o,
                                  ts_proto_msg *m) {
    ts_proto_error e = get_array(c, f, o, c->lim->max_frames);
    if (e) return e;
    size_t n = o->via.array.size;
    if ((e = alloc_n(c, f, n, sizeof *m->lengths, (void **)&m->lengths))) return e;
    m->nlengths = n;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *x = &o->via.array.ptr[i];
        if (x->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return fail(TS_PROTO_E_FIELD_TYPE, "%s: field \"ln[%zu]\" (payload length) is %s, "
                        "expected uint", c->tname, i, object_type_name(x->type));
        uint64_t v = x->via.u64;
        if (v > c->lim->max_payload_bytes || total + v > c->lim->max_payload_bytes)
            return fail(TS_PROTO_E_PAYLOAD_SIZE,
                        "%s: field \"ln[%zu]\" declares %" PRIu64 " bytes, payload limit is %" PRIu64,
                        c->tname, i, v, c->lim->max_payload_bytes);
        total += v;
        m->lengths[i] = v;
    }
    return TS_PROTO_OK;
}

static ts_proto_error get_ranges(const dctx *c, const field_desc *f, const msgpack_object *o,
                                 ts_proto_msg *m) {
    ts_proto_error e = get_array(c, f, o, c->lim->max_ranges);
    if (e) return e;
    size_t n = o->via.array.size;
    if ((e = alloc_n(c, f, n, sizeof *m->ranges, (void **)&m->ranges))) return e;
    m->nranges = n;
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *x = &o->via.array.ptr[i];
        if (x->type != MSGPACK_OBJECT_ARRAY || x->via.array.size != 2)
            return fail(TS_PROTO_E_FIELD_TYPE, "%s: field \"rg[%zu]\" is %s, expected "
                        "[offset, len]", c->tname, i, object_type_name(x->type));
        for (int k = 0; k < 2; k++) {
            const msgpack_object *y = &x->via.array.ptr[k];
            if (y->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                return fail(TS_PROTO_E_FIELD_TYPE, "%s: field \"rg[%zu].%s\" is %s, expected uint",
                            c->tname, i, k ? "len" : "offset", object_type_name(y->type));
        }
        m->ranges[i].offset = x->via.array.ptr[0].via.u64;
        m->ranges[i].len = x->via.array.ptr[1].via.u64;
        if (m->ranges[i].len == 0)
            return fail(TS_PROTO_E_FIELD_VALUE, "%s: field \"rg[%zu]\" is empty (len 0)",
                        c->tname, i);
    }
    return TS_PROTO_OK;
}

static ts_proto_error get_roster(const dctx *c, const field_desc *f, const msgpack_object *o,
                                 ts_proto_msg *m) {
    ts_proto_error e = get_array(c, f, o, c->lim->max_roster);
    if (e) return e;
    size_t n = o->via.array.size;
    if ((e = alloc_n(c, f, n, sizeof *m->roster, (void **)&m->roster))) return e;
    m->nroster = n;
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *x = &o->via.array.ptr[i];
        if (x->type != MSGPACK_OBJECT_ARRAY || x->via.array.size != MEMBER_FIELDS)
            return fail(TS_PROTO_E_FIELD_TYPE, "%s: field \"ros[%zu]\" is %s of %u, expected "
                        "array of %d", c->tname, i, object_type_name(x->type),
                        x->type == MSGPACK_OBJECT_ARRAY ? x->via.array.size : 1, MEMBER_FIELDS);
        char path[32];
        snprintf(path, sizeof path, "ros[%zu].", i);
        for (int k = 0; k < MEMBER_FIELDS; k++)
            if ((e = get_scalar(c, path, &MEMBER[k], &x->via.array.ptr[k], &m->roster[i])))
                return e;
    }
    return TS_PROTO_OK;
}

/* Reads "sv": an array of none or TS_STEP_VALUES floats. */
static ts_proto_error get_step_values(const dctx *c, const field_desc *f, const msgpack_object *o,
                                      ts_proto_msg *m) {
    ts_proto_error e = get_array(c, f, o, TS_STEP_VALUES);
    if (e) return e;
    size_t n = o->via.array.size;
    if (n != 0 && n != TS_STEP_VALUES)
        return fail(TS_PROTO_E_FIELD_VALUE, "%s: field \"sv\" (%s) has %zu entries, expected 0 or %d", c->tname,
                    f->name, n, TS_STEP_VALUES);
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *x = &o->via.array.ptr[i];
        if (x->type != MSGPACK_OBJECT_FLOAT32 && x->type != MSGPACK_OBJECT_FLOAT64)
            return fail(TS_PROTO_E_FIELD_TYPE, "%s: field \"sv[%zu]\" is %s, expected float", c->tname, i,
                        object_type_name(x->type));
        m->step_values[i] = x->via.f64;
    }
    m->nstep_values = (uint32_t)n;
    return TS_PROTO_OK;
}

/* Decodes field k from its object. */
static ts_proto_error get_field(const dctx *c, int k, const msgpack_object *o, ts_proto_msg *m) {
    const field_desc *f = &FIELDS[k];
    switch (f->kind) {
    case F_LENGTHS: return get_lengths(c, f, o, m);
    case F_RANGES: return get_ranges(c, f, o, m);
    case F_ROSTER: return get_roster(c, f, o, m);
    case F_STEP_VALUES: return get_step_values(c, f, o, m);
    default: return get_scalar(c, "", f, o, m);
    }
}

/* Finds each known key's value in the map (unknown keys are skipped). */
static ts_proto_error index_keys(const msgpack_object *map, const msgpack_object *val[K_COUNT]) {
    for (int k = 0; k < K_COUNT; k++) val[k] = NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return fail(TS_PROTO_E_NOT_MAP, "header key #%u is %s, expected str", i,
                        object_type_name(kv->key.type));
        for (int k = 0; k < K_COUNT; k++) {
            size_t kl = strlen(FIELDS[k].key);
            if (kv->key.via.str.size == kl && memcmp(kv->key.via.str.ptr, FIELDS[k].key, kl) == 0) {
                if (val[k])
                    return fail(TS_PROTO_E_FIELD_VALUE, "header key \"%s\" (%s) appears twice",
                                FIELDS[k].key, FIELDS[k].name);
                val[k] = &kv->val;
                break;
            }
        }
    }
    return TS_PROTO_OK;
}

/* Decodes required field k. */
static ts_proto_error need(const dctx *c, const msgpack_object *const val[K_COUNT], int k,
                           ts_proto_msg *m) {
    if (!val[k])
        return fail(TS_PROTO_E_MISSING, "%s: required field \"%s\" (%s) is missing", c->tname,
                    FIELDS[k].key, FIELDS[k].name);
    return get_field(c, k, val[k], m);
}

/* ---- validation against frames and limits ------------------------------ */

/* Checks "ln" against the payload frames and the type's payload rules. */
static ts_proto_error check_payload(const dctx *c, const ts_proto_msg *m,
                                    const ts_proto_frame *payload, size_t npayload) {
    if (m->nlengths != npayload)
        return fail(TS_PROTO_E_PAYLOAD_LEN, "%s: field \"ln\" lists %zu payload frames but %zu "
                    "arrived", c->tname, m->nlengths, npayload);
    for (size_t i = 0; i < npayload; i++)
        if (m->lengths[i] != payload[i].size)
            return fail(TS_PROTO_E_PAYLOAD_LEN, "%s: field \"ln[%zu]\" says %" PRIu64
                        " bytes but payload frame %zu has %zu", c->tname, i, m->lengths[i], i,
                        payload[i].size);
    size_t want = 0;
    bool exact = true;
    if (m->type == TS_MSG_BLOB_PUT) want = 1;
    else if (m->type == TS_MSG_BLOB_REPLY) want = m->found ? 1 : 0;
    else if (carries_values(m->type)) want = 1;
    else if (carries_data(m->type)) exact = false;
    if (exact && npayload != want)
        return fail(TS_PROTO_E_PAYLOAD_LEN, "%s: carries %zu payload frames, expected %zu",
                    c->tname, npayload, want);
    if (carries_values(m->type) && (payload[0].size == 0 || payload[0].size % 8 != 0))
        return fail(TS_PROTO_E_PAYLOAD_LEN, "%s: its values frame has %zu bytes, not a whole number of "
                    "f64 values", c->tname, payload[0].size);
    if ((m->type == TS_MSG_PUSH || m->type == TS_MSG_PULL_REPLY) && m->dtype && m->nranges) {
        uint64_t elems = 0, bytes = 0;
        for (size_t i = 0; i < m->nranges; i++)
            elems = m->ranges[i].len > UINT64_MAX - elems ? UINT64_MAX : elems + m->ranges[i].len;
        for (size_t i = 0; i < npayload; i++) bytes += m->lengths[i];
        uint64_t es = ts_proto_dtype_size(m->dtype);
        if (elems > bytes / es || elems * es != bytes)
            return fail(TS_PROTO_E_PAYLOAD_LEN, "%s: ranges cover %" PRIu64 " elements of "
                        "dtype %u (%" PRIu64 " bytes each) but the payload holds %" PRIu64
                        " bytes", c->tname, elems, (unsigned)m->dtype, es, bytes);
    }
    return TS_PROTO_OK;
}

/* Checks every range against overflow and the model size. */
static ts_proto_error check_ranges(const dctx *c, const ts_proto_msg *m) {
    for (size_t i = 0; i < m->nranges; i++) {
        const ts_proto_range *r = &m->ranges[i];
        if (r->offset > UINT64_MAX - r->len)
            return fail(TS_PROTO_E_RANGE, "%s: range rg[%zu] = [%" PRIu64 ", +%" PRIu64
                        ") overflows", c->tname, i, r->offset, r->len);
        if (c->lim->model_size && r->offset + r->len > c->lim->model_size)
            return fail(TS_PROTO_E_RANGE, "%s: range rg[%zu] = [%" PRIu64 ", %" PRIu64
                        ") is outside the model [0, %" PRIu64 ")", c->tname, i, r->offset,
                        r->offset + r->len, c->lim->model_size);
    }
    return TS_PROTO_OK;
}

static bool is_int(const msgpack_object *o) {
    return o && (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
                 o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER);
}

/* True when integer object o equals v. */
static bool int_is(const msgpack_object *o, uint64_t v) {
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == v;
}

/* Prints integer object o into buf (24 bytes) and returns buf. */
static const char *int_text(const msgpack_object *o, char *buf) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) snprintf(buf, 24, "%" PRIu64, o->via.u64);
    else snprintf(buf, 24, "%" PRId64, o->via.i64);
    return buf;
}

/* Decodes the fields of the header map into m and validates them. */
static ts_proto_error decode_map(const msgpack_object *root, const ts_proto_frame *payload,
                                 size_t npayload, const ts_proto_limits *lim, ts_proto_msg *m) {
    const msgpack_object *val[K_COUNT];
    dctx c = {"header", lim};
    ts_proto_error e = index_keys(root, val);
    if (e) return e;
    if (is_int(val[K_V]) && !int_is(val[K_V], TS_PROTO_VERSION))
        return fail(TS_PROTO_E_VERSION, "field \"v\" (version) is %s, this build speaks %d",
                    int_text(val[K_V], (char[24]){0}), TS_PROTO_VERSION);
    if ((e = need(&c, val, K_V, m))) return e;
    if (is_int(val[K_T]) && (val[K_T]->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                             val[K_T]->via.u64 > UINT32_MAX ||
                             !ts_proto_type_known((uint32_t)val[K_T]->via.u64)))
        return fail(TS_PROTO_E_TYPE, "field \"t\" (type) is %s, not a known message type",
                    int_text(val[K_T], (char[24]){0}));
    if ((e = need(&c, val, K_T, m))) return e;
    c.tname = ts_proto_type_name(m->type);
    for (size_t i = 2; i < sizeof COMMON; i++)
        if ((e = need(&c, val, COMMON[i], m))) return e;
    if (val[K_DT] && (e = get_field(&c, K_DT, val[K_DT], m))) return e;
    if (val[K_RG] && (e = get_field(&c, K_RG, val[K_RG], m))) return e;
    size_t nf;
    const uint8_t *tf = type_fields(m->type, &nf);
    for (size_t i = 0; i < nf; i++)
        if ((e = need(&c, val, tf[i], m))) return e;

    if (lim->job && strcmp(lim->job, m->job) != 0)
        return fail(TS_PROTO_E_JOB, "%s: field \"job\" is \"%s\", this is job \"%s\"", c.tname,
                    m->job, lim->job);
    if (lim->generation && m->type != TS_MSG_JOIN && m->type != TS_MSG_STATUS &&
        m->generation < lim->generation)
        return fail(TS_PROTO_E_GENERATION, "%s: field \"g\" (generation) %" PRIu64
                    " is stale, current generation is %" PRIu64, c.tname, m->generation,
                    lim->generation);
    if ((e = check_payload(&c, m, payload, npayload))) return e;
    return check_ranges(&c, m);
}

ts_proto_error ts_proto_decode(const ts_proto_frame *frames, size_t nframes,
                               const ts_proto_limits *lim, ts_proto_msg *out) {
    ts_proto_limits dl;
    memset(out, 0, sizeof *out);
    if (!lim) {
        ts_proto_limits_default(&dl);
        lim = &dl;
    }
    if (!frames || nframes == 0) return fail(TS_PROTO_E_FRAMES, "message has no header frame");
    if (nframes - 1 > lim->max_frames)
        return fail(TS_PROTO_E_FRAMES, "message has %zu payload frames, limit %zu", nframes - 1,
                    lim->max_frames);
    const ts_proto_frame *h = &frames[0];
    if (h->size > lim->max_header_bytes)
        return fail(TS_PROTO_E_HEADER_SIZE, "header frame is %zu bytes, limit %zu", h->size,
                    lim->max_header_bytes);
    if (h->size == 0) return fail(TS_PROTO_E_MSGPACK, "header frame is empty");
    ts_proto_error e = scan_msgpack(h->data, h->size);
    if (e) return e;

    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&u, h->data, h->size, &off);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR) {
        e = fail(TS_PROTO_E_MEMORY, "out of memory unpacking a %zu-byte header", h->size);
    } else if (r != MSGPACK_UNPACK_SUCCESS || off != h->size) {
        e = fail(TS_PROTO_E_MSGPACK, "msgpack-c refused the header (result %d at byte %zu)",
                 (int)r, off);
    } else if (u.data.type != MSGPACK_OBJECT_MAP) {
        e = fail(TS_PROTO_E_NOT_MAP, "header is a msgpack %s, expected map",
                 object_type_name(u.data.type));
    } else {
        e = decode_map(&u.data, frames + 1, nframes - 1, lim, out);
    }
    msgpack_unpacked_destroy(&u);
    if (e) {
        ts_proto_msg_free(out);
        return e;
    }
    out->payload = nframes > 1 ? frames + 1 : NULL;
    return TS_PROTO_OK;
}

/* ---- encoding ---------------------------------------------------------- */

typedef struct {
    msgpack_packer pk;
    int err; /* first packer failure */
} enc;

static void pk_str(enc *w, const char *s, size_t n) {
    w->err |= msgpack_pack_str_with_body(&w->pk, s, n);
}

/* Validates a scalar field of base against its domain and packs it. */
static ts_status put_scalar(enc *w, const char *path, const field_desc *f, const void *base) {
    switch (f->kind) {
    case F_INT: {
        int64_t v = load_int(base, f);
        if (v < f->lo || (v >= 0 && (uint64_t)v > f->hi))
            return ts_error(TS_ERR_VALUE, "proto encode: field \"%s%s\" (%s) = %" PRId64
                            " is outside [%" PRId64 ", %" PRIu64 "]", path, f->key, f->name, v,
                            f->lo, f->hi);
        w->err |= msgpack_pack_int64(&w->pk, v);
        return TS_OK;
    }
    case F_UINT: {
        uint64_t v = load_uint(base, f);
        if (v < (uint64_t)f->lo || v > f->hi)
            return ts_error(TS_ERR_VALUE, "proto encode: field \"%s%s\" (%s) = %" PRIu64
                            " is outside [%" PRId64 ", %" PRIu64 "]", path, f->key, f->name, v,
                            f->lo, f->hi);
        w->err |= msgpack_pack_uint64(&w->pk, v);
        return TS_OK;
    }
    case F_BOOL:
        w->err |= *(const bool *)((const char *)base + f->off) ? msgpack_pack_true(&w->pk)
                                                                : msgpack_pack_false(&w->pk);
        return TS_OK;
    case F_STR: {
        const char *s = (const char *)base + f->off;
        size_t n = strnlen(s, f->width);
        if (n >= f->width)
            return ts_error(TS_ERR_VALUE, "proto encode: field \"%s%s\" (%s) is not terminated",
                            path, f->key, f->name);
        pk_str(w, s, n);
        return TS_OK;
    }
    default:
        return ts_error(TS_ERR_VALUE, "proto encode: field \"%s\" is not a scalar", f->key);
    }
}

/* Packs field k of m (key and value). */
static ts_status put_field(enc *w, int k, const ts_proto_msg *m) {
    const field_desc *f = &FIELDS[k];
    ts_status s = TS_OK;
    pk_str(w, f->key, strlen(f->key));
    switch (f->kind) {
    case F_LENGTHS:
        w->err |= msgpack_pack_array(&w->pk, m->nlengths);
        for (size_t i = 0; i < m->nlengths; i++) w->err |= msgpack_pack_uint64(&w->pk, m->lengths[i]);
        return TS_OK;
    case F_RANGES:
        w->err |= msgpack_pack_array(&w->pk, m->nranges);
        for (size_t i = 0; i < m->nranges; i++) {
            if (m->ranges[i].len == 0)
                return ts_error(TS_ERR_VALUE, "proto encode: range rg[%zu] is empty", i);
            w->err |= msgpack_pack_array(&w->pk, 2);
            w->err |= msgpack_pack_uint64(&w->pk, m->ranges[i].offset);
            w->err |= msgpack_pack_uint64(&w->pk, m->ranges[i].len);
        }
        return TS_OK;
    case F_ROSTER:
        w->err |= msgpack_pack_array(&w->pk, m->nroster);
        for (size_t i = 0; i < m->nroster && !s; i++) {
            char path[32];
            snprintf(path, sizeof path, "ros[%zu].", i);
            w->err |= msgpack_pack_array(&w->pk, MEMBER_FIELDS);
            for (int j = 0; j < MEMBER_FIELDS && !s; j++)
                s = put_scalar(w, path, &MEMBER[j], &m->roster[i]);
        }
        return s;
    case F_STEP_VALUES:
        if (m->nstep_values != 0 && m->nstep_values != TS_STEP_VALUES)
            return ts_error(TS_ERR_VALUE, "proto encode: field \"sv\" (step_values) has %u entries, expected 0 or %d",
                            (unsigned)m->nstep_values, TS_STEP_VALUES);
        w->err |= msgpack_pack_array(&w->pk, m->nstep_values);
        for (uint32_t i = 0; i < m->nstep_values; i++) w->err |= msgpack_pack_double(&w->pk, m->step_values[i]);
        return TS_OK;
    default:
        return put_scalar(w, "", f, m);
    }
}

ts_status ts_proto_encode(const ts_proto_msg *m, void **out, size_t *size) {
    *out = NULL;
    *size = 0;
    if (!ts_proto_type_known(m->type))
        return ts_error(TS_ERR_VALUE, "proto encode: type %u is not a known message type",
                        (unsigned)m->type);
    if ((m->nlengths && !m->lengths) || (m->nranges && !m->ranges) ||
        (m->nroster && !m->roster))
        return ts_error(TS_ERR_VALUE, "proto encode: %s has a count without its array",
                        ts_proto_type_name(m->type));
    size_t nf;
    const uint8_t *tf = type_fields(m->type, &nf);
    bool dt = m->dtype != TS_PROTO_DT_NONE, rg = m->nranges > 0;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    enc w = {.err = 0};
    msgpack_packer_init(&w.pk, &sb, msgpack_sbuffer_write);
    w.err |= msgpack_pack_map(&w.pk, sizeof COMMON + nf + dt + rg);
    ts_status s = TS_OK;
    for (size_t i = 0; i < sizeof COMMON && !s; i++) s = put_field(&w, COMMON[i], m);
    if (!s && dt) s = put_field(&w, K_DT, m);
    if (!s && rg) s = put_field(&w, K_RG, m);
    for (size_t i = 0; i < nf && !s; i++) s = put_field(&w, tf[i], m);
    if (!s && w.err) s = ts_error(TS_ERR_MEMORY, "proto encode: msgpack buffer allocation failed");
    if (s) {
        msgpack_sbuffer_destroy(&sb);
        return s;
    }
    *size = sb.size;
    *out = msgpack_sbuffer_release(&sb);
    return TS_OK;
}
