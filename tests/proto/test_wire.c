/* test_wire.c - wire messages: round trips of every type, each malformed
 * input's distinct error code and field-naming message, real DEALER/ROUTER
 * sockets with zero-copy payloads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>

#include <msgpack.h>

#include "proto/fuzz/frames.h"
#include "proto/wire.h"


/* Fills m with distinctive values in every field type t uses. */
static void sample(ts_proto_msg *m, uint32_t t) {
    ts_proto_msg_init(m, (ts_proto_type)t, "job-7", 3, 5);
    m->step = 41;
    switch (t) {
    case TS_MSG_JOIN:
        m->role = TS_ROLE_WORKER;
        strcpy(m->address, "tcp://127.0.0.1:5555");
        strcpy(m->caps, "cpu threads=2");
        m->prev_rank = 4;
        break;
    case TS_MSG_JOIN_ACK:
    case TS_MSG_MEMBERSHIP:
    case TS_MSG_STATUS_REPLY: {
        ts_proto_member r[3];
        memset(r, 0, sizeof r);
        for (int i = 0; i < 3; i++) {
            r[i].rank = i;
            r[i].role = i == 0 ? TS_ROLE_PS : TS_ROLE_WORKER;
            snprintf(r[i].address, sizeof r[i].address, "tcp://127.0.0.1:%d", 6000 + i);
            r[i].alive = i != 2;
            r[i].last_step = 10 * i - 1;
            r[i].last_barrier = i - 1;
            r[i].heartbeat_age_ms = 100 * i - 1;
            r[i].joined_generation = (uint64_t)i + 1;
        }
        assert_int_equal(ts_proto_msg_set_roster(m, r, 3), TS_OK);
        m->assigned_rank = 2;
        m->steps = 200;
        m->heartbeat_ms = 100;
        m->heartbeat_timeout_ms = 1500;
        m->barrier_timeout_ms = 4000;
        strcpy(m->phase, "running");
        m->min_workers = 2;
        m->max_workers = 6;
        break;
    }
    case TS_MSG_HEARTBEAT: m->last_barrier = 40; break;
    case TS_MSG_BARRIER:
    case TS_MSG_BARRIER_RELEASE: m->barrier_id = 41; break;
    case TS_MSG_ERROR:
    case TS_MSG_SHUTDOWN:
    case TS_MSG_STOP:
    case TS_MSG_REGROUP:
        m->code = TS_PROTO_E_BARRIER_TIMEOUT;
        strcpy(m->reason, "rank 3 finished step 182 but did not reach barrier 183");
        break;
    case TS_MSG_BLOB_PUT:
    case TS_MSG_BLOB_GET:
    case TS_MSG_BLOB_REPLY:
        strcpy(m->key, "nccl-unique-id");
        m->found = true;
        break;
    case TS_MSG_COMMIT:
    case TS_MSG_COMMIT_REPLY:
    case TS_MSG_APPLY:
    case TS_MSG_REDUCE:
    case TS_MSG_REDUCE_REPLY:
        m->dtype = TS_PROTO_DT_F64;
        m->barrier_id = 2;
        break;
    case TS_MSG_ACK:
    case TS_MSG_ROLLBACK: break;
    case TS_MSG_SNAPSHOT:
        m->barrier_id = 2;
        m->offset = 1280;
        break;
    default: {
        m->epoch = 3;
        m->offset = 1280;
        m->step_values[TS_STEP_LOSS] = 2.302585, m->step_values[TS_STEP_LR] = 3e-4;
        m->step_values[TS_STEP_GRAD_NORM] = 0.75;
        m->nstep_values = t == TS_MSG_PULL_REPLY ? TS_STEP_VALUES : 0;
        ts_proto_range rg[2] = {{0, 4}, {10, 2}};
        m->sequence = 1u << 20;
        m->flow = 1;
        m->dtype = TS_PROTO_DT_F32;
        assert_int_equal(ts_proto_msg_set_ranges(m, rg, 2), TS_OK);
        break;
    }
    }
}

/* Payload frames type t carries in the samples (bytes, count). */
static size_t sample_payload(uint32_t t, ts_proto_frame *fr, const float *data) {
    if (t == TS_MSG_BLOB_PUT || t == TS_MSG_BLOB_REPLY) {
        fr[0] = (ts_proto_frame){data, 7};
        return 1;
    }
    if (t == TS_MSG_PUSH || t == TS_MSG_PULL_REPLY || t == TS_MSG_COLLECTIVE || t == TS_MSG_SNAPSHOT) {
        fr[0] = (ts_proto_frame){data, 16};
        fr[1] = (ts_proto_frame){data + 4, 8};
        return 2;
    }
    if (t >= TS_MSG_COMMIT && t <= TS_MSG_REDUCE_REPLY) {
        fr[0] = (ts_proto_frame){data, 24};
        return 1;
    }
    return 0;
}

/* Encodes m with the given payload frames; returns the frame array in fr
 * (fr[0] = header, caller frees fr[0].data). */
static size_t encode_frames(ts_proto_msg *m, const ts_proto_frame *payload, size_t np,
                            ts_proto_frame *fr) {
    uint64_t lens[8];
    for (size_t i = 0; i < np; i++) lens[i] = payload[i].size;
    free(m->lengths);
    m->lengths = NULL;
    m->nlengths = 0;
    m->lengths = np ? malloc(np * sizeof *lens) : NULL;
    if (np) memcpy(m->lengths, lens, np * sizeof *lens);
    m->nlengths = np;
    void *buf;
    size_t size;
    assert_int_equal(ts_proto_encode(m, &buf, &size), TS_OK);
    fr[0] = (ts_proto_frame){buf, size};
    for (size_t i = 0; i < np; i++) fr[i + 1] = payload[i];
    return np + 1;
}

static void assert_same(const ts_proto_msg *a, const ts_proto_msg *b) {
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->type, b->type);
    assert_string_equal(a->job, b->job);
    assert_int_equal(a->generation, b->generation);
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->rank, b->rank);
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->nranges, b->nranges);
    for (size_t i = 0; i < a->nranges; i++) {
        assert_int_equal(a->ranges[i].offset, b->ranges[i].offset);
        assert_int_equal(a->ranges[i].len, b->ranges[i].len);
    }
    assert_int_equal(a->nlengths, b->nlengths);
    for (size_t i = 0; i < a->nlengths; i++) assert_int_equal(a->lengths[i], b->lengths[i]);
    switch (a->type) {
    case TS_MSG_JOIN:
        assert_int_equal(a->role, b->role);
        assert_string_equal(a->address, b->address);
        assert_string_equal(a->caps, b->caps);
        assert_int_equal(a->prev_rank, b->prev_rank);
        break;
    case TS_MSG_JOIN_ACK:
    case TS_MSG_MEMBERSHIP:
    case TS_MSG_STATUS_REPLY:
        assert_int_equal(a->nroster, b->nroster);
        for (size_t i = 0; i < a->nroster; i++) {
            const ts_proto_member *x = &a->roster[i], *y = &b->roster[i];
            assert_int_equal(x->rank, y->rank);
            assert_int_equal(x->role, y->role);
            assert_string_equal(x->address, y->address);
            assert_int_equal(x->alive, y->alive);
            assert_int_equal(x->last_step, y->last_step);
            assert_int_equal(x->last_barrier, y->last_barrier);
            assert_int_equal(x->heartbeat_age_ms, y->heartbeat_age_ms);
            assert_int_equal(x->joined_generation, y->joined_generation);
        }
        if (a->type == TS_MSG_JOIN_ACK) {
            assert_int_equal(a->assigned_rank, b->assigned_rank);
            assert_int_equal(a->steps, b->steps);
            assert_int_equal(a->heartbeat_ms, b->heartbeat_ms);
            assert_int_equal(a->heartbeat_timeout_ms, b->heartbeat_timeout_ms);
            assert_int_equal(a->barrier_timeout_ms, b->barrier_timeout_ms);
        }
        if (a->type == TS_MSG_STATUS_REPLY) {
            assert_int_equal(a->steps, b->steps);
            assert_string_equal(a->phase, b->phase);
            assert_int_equal(a->min_workers, b->min_workers);
            assert_int_equal(a->max_workers, b->max_workers);
        }
        break;
    case TS_MSG_HEARTBEAT: assert_int_equal(a->last_barrier, b->last_barrier); break;
    case TS_MSG_BARRIER:
    case TS_MSG_BARRIER_RELEASE:
    case TS_MSG_REDUCE:
    case TS_MSG_REDUCE_REPLY: assert_int_equal(a->barrier_id, b->barrier_id); break;
    case TS_MSG_PULL_REPLY:
        assert_int_equal(a->epoch, b->epoch);
        assert_int_equal(a->offset, b->offset);
        assert_int_equal(a->nstep_values, b->nstep_values);
        for (uint32_t i = 0; i < a->nstep_values; i++) assert_true(a->step_values[i] == b->step_values[i]);
        break;
    case TS_MSG_ERROR:
    case TS_MSG_SHUTDOWN:
    case TS_MSG_STOP:
    case TS_MSG_REGROUP:
        assert_int_equal(a->code, b->code);
        assert_string_equal(a->reason, b->reason);
        break;
    case TS_MSG_BLOB_PUT:
    case TS_MSG_BLOB_GET:
    case TS_MSG_BLOB_REPLY:
        assert_string_equal(a->key, b->key);
        if (a->type == TS_MSG_BLOB_REPLY) assert_int_equal(a->found, b->found);
        break;
    default: break;
    }
}

static void test_round_trip_every_type(void **state) {
    (void)state;
    float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    lim.model_size = 12;
    lim.generation = 3;
    lim.job = "job-7";
    for (size_t i = 0; i < ts_proto_ntypes; i++) {
        ts_proto_msg m, d;
        ts_proto_frame pay[2], fr[3];
        sample(&m, ts_proto_types[i]);
        size_t np = sample_payload(ts_proto_types[i], pay, data);
        size_t nf = encode_frames(&m, pay, np, fr);
        ts_proto_error e = ts_proto_decode(fr, nf, &lim, &d);
        if (e) fail_msg("%s: %s", ts_proto_type_name(ts_proto_types[i]), ts_last_error());
        assert_same(&m, &d);
        assert_int_equal(d.nlengths, np);
        for (size_t k = 0; k < np; k++) {
            assert_ptr_equal(d.payload[k].data, pay[k].data);
            assert_int_equal(d.payload[k].size, pay[k].size);
        }
        assert_string_not_equal(ts_proto_type_name(ts_proto_types[i]), "unknown");
        free((void *)fr[0].data);
        ts_proto_msg_free(&m);
        ts_proto_msg_free(&d);
    }
}

static void test_names_are_distinct(void **state) {
    (void)state;
    for (uint32_t a = 0; a < 64; a++)
        for (uint32_t b = a + 1; b < 64; b++)
            if (strcmp(ts_proto_error_name(a), "unknown"))
                assert_string_not_equal(ts_proto_error_name(a), ts_proto_error_name(b));
    ts_proto_role r;
    assert_int_equal(ts_proto_role_parse("ps", &r), TS_OK);
    assert_int_equal(r, TS_ROLE_PS);
    assert_int_equal(ts_proto_role_parse("workr", &r), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "workr"));
    assert_int_equal(ts_proto_dtype_size(TS_PROTO_DT_BF16), 2);
}

/* ---- hand-built headers ------------------------------------------------ */

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} hb;

static void hb_init(hb *h) {
    msgpack_sbuffer_init(&h->sb);
    msgpack_packer_init(&h->pk, &h->sb, msgpack_sbuffer_write);
}

static void key(hb *h, const char *k) { msgpack_pack_str_with_body(&h->pk, k, strlen(k)); }
static void kv_uint(hb *h, const char *k, uint64_t v) { key(h, k); msgpack_pack_uint64(&h->pk, v); }
static void kv_int(hb *h, const char *k, int64_t v) { key(h, k); msgpack_pack_int64(&h->pk, v); }
static void kv_str(hb *h, const char *k, const char *v) {
    key(h, k);
    msgpack_pack_str_with_body(&h->pk, v, strlen(v));
}

/* Packs a map header for the 7 common keys (minus `omit`) plus `extra`, and
 * the common keys of a message of type t with no payload. */
static void common(hb *h, uint32_t t, const char *omit, int extra) {
    const char *keys[] = {"v", "t", "job", "g", "s", "r", "ln"};
    msgpack_pack_map(&h->pk, 7 - (omit != NULL) + extra);
    for (int i = 0; i < 7; i++) {
        if (omit && strcmp(omit, keys[i]) == 0) continue;
        switch (i) {
        case 0: kv_uint(h, "v", TS_PROTO_VERSION); break;
        case 1: kv_uint(h, "t", t); break;
        case 2: kv_str(h, "job", "job-7"); break;
        case 3: kv_uint(h, "g", 3); break;
        case 4: kv_int(h, "s", 9); break;
        case 5: kv_int(h, "r", 1); break;
        case 6: key(h, "ln"); msgpack_pack_array(&h->pk, 0); break;
        }
    }
}

/* Packs a PULL_REPLY header with no ranges whose "sv" array has n
 * entries, to be packed next. */
static void pull_reply_head(hb *h, uint32_t n) {
    common(h, TS_MSG_PULL_REPLY, NULL, 3);
    kv_int(h, "ep", 0);
    kv_int(h, "of", 0);
    key(h, "sv");
    msgpack_pack_array(&h->pk, n);
}

/* Decodes h's bytes as a header with no payload under lim (default when
 * NULL); frees h; returns the code. */
static ts_proto_error decode_hb(hb *h, const ts_proto_limits *lim) {
    ts_proto_frame f = {h->sb.data, h->sb.size};
    ts_proto_msg m;
    ts_proto_error e = ts_proto_decode(&f, 1, lim, &m);
    ts_proto_msg_free(&m);
    msgpack_sbuffer_destroy(&h->sb);
    return e;
}

/* Asserts code e and that the last message contains `needle`. */
static void expect(ts_proto_error got, ts_proto_error want, const char *needle) {
    if (got != want)
        fail_msg("got %s, want %s: %s", ts_proto_error_name(got), ts_proto_error_name(want),
                 ts_last_error());
    if (needle && !strstr(ts_last_error(), needle))
        fail_msg("message \"%s\" does not mention %s", ts_last_error(), needle);
}

static void test_minimal_header_decodes(void **state) {
    (void)state;
    hb h;
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, NULL, 0);
    expect(decode_hb(&h, NULL), TS_PROTO_OK, NULL);
}

static void test_random_bytes(void **state) {
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15u;
    unsigned char buf[256];
    for (int it = 0; it < 20000; it++) {
        size_t n = 1 + (size_t)(x % sizeof buf);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = (unsigned char)x;
        }
        ts_proto_frame f = {buf, n};
        ts_proto_msg m;
        ts_proto_error e = ts_proto_decode(&f, 1, NULL, &m);
        assert_int_not_equal(e, TS_PROTO_OK);
        assert_string_not_equal(ts_proto_error_name(e), "unknown");
        assert_true(strlen(ts_last_error()) > 0);
    }
}

static void test_truncated_msgpack(void **state) {
    (void)state;
    ts_proto_msg m, d;
    ts_proto_frame fr[1];
    sample(&m, TS_MSG_JOIN_ACK);
    encode_frames(&m, NULL, 0, fr);
    for (size_t n = 1; n < fr[0].size; n++) {
        ts_proto_frame f = {fr[0].data, n};
        expect(ts_proto_decode(&f, 1, NULL, &d), TS_PROTO_E_MSGPACK, "header");
    }
    /* one byte more than the map: trailing garbage */
    unsigned char *longer = malloc(fr[0].size + 1);
    memcpy(longer, fr[0].data, fr[0].size);
    longer[fr[0].size] = 0xc0;
    ts_proto_frame f = {longer, fr[0].size + 1};
    expect(ts_proto_decode(&f, 1, NULL, &d), TS_PROTO_E_MSGPACK, "trailing");
    ts_proto_frame empty = {longer, 0};
    expect(ts_proto_decode(&empty, 1, NULL, &d), TS_PROTO_E_MSGPACK, "empty");
    free(longer);
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
}

static void test_wrong_field_types(void **state) {
    (void)state;
    hb h;
    /* generation as a string */
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, "g", 1);
    kv_str(&h, "g", "three");
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_TYPE, "\"g\" (generation) is str");
    /* job id as an integer */
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, "job", 1);
    kv_uint(&h, "job", 7);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_TYPE, "\"job\"");
    /* role as a string in a JOIN */
    hb_init(&h);
    common(&h, TS_MSG_JOIN, NULL, 4);
    kv_str(&h, "ro", "worker");
    kv_str(&h, "ad", "");
    kv_str(&h, "ca", "");
    kv_int(&h, "pr", -1);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_TYPE, "\"ro\" (role)");
    /* a roster entry with a string rank */
    hb_init(&h);
    common(&h, TS_MSG_MEMBERSHIP, NULL, 1);
    key(&h, "ros");
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_array(&h.pk, 8);
    msgpack_pack_str_with_body(&h.pk, "0", 1);
    for (int i = 0; i < 7; i++) msgpack_pack_uint64(&h.pk, 0);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_TYPE, "ros[0].rank");
    /* "ln" entries must be uints */
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, "ln", 1);
    key(&h, "ln");
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_double(&h.pk, 1.5);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_TYPE, "ln[0]");
    /* a pull reply's step values are floats */
    hb_init(&h);
    pull_reply_head(&h, 3);
    msgpack_pack_double(&h.pk, 2.5);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_double(&h.pk, 0.5);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_TYPE, "sv[1]");
}

static void test_missing_fields(void **state) {
    (void)state;
    const char *keys[] = {"v", "t", "job", "g", "s", "r", "ln"};
    for (int i = 0; i < 7; i++) {
        hb h;
        hb_init(&h);
        common(&h, TS_MSG_HEARTBEAT, keys[i], 1);
        kv_int(&h, "lb", 3);
        char needle[16];
        snprintf(needle, sizeof needle, "\"%s\"", keys[i]);
        expect(decode_hb(&h, NULL), TS_PROTO_E_MISSING, needle);
    }
    hb h;
    hb_init(&h);
    common(&h, TS_MSG_HEARTBEAT, NULL, 0);
    expect(decode_hb(&h, NULL), TS_PROTO_E_MISSING, "\"lb\" (last_barrier)");
    hb_init(&h);
    common(&h, TS_MSG_PULL_REPLY, NULL, 2);
    kv_int(&h, "ep", 0);
    kv_int(&h, "of", 0);
    expect(decode_hb(&h, NULL), TS_PROTO_E_MISSING, "\"sv\" (step_values)");
}

static void test_field_values(void **state) {
    (void)state;
    hb h;
    /* rank below -2 */
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, "r", 1);
    kv_int(&h, "r", -7);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_VALUE, "\"r\" (rank)");
    /* job id longer than the limit */
    char longjob[TS_PROTO_JOB_MAX + 2];
    memset(longjob, 'j', sizeof longjob - 1);
    longjob[sizeof longjob - 1] = 0;
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, "job", 1);
    kv_str(&h, "job", longjob);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_VALUE, "\"job\"");
    /* NUL inside a string */
    hb_init(&h);
    common(&h, TS_MSG_BLOB_GET, NULL, 1);
    key(&h, "bk");
    msgpack_pack_str_with_body(&h.pk, "a\0b", 3);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_VALUE, "NUL");
    /* duplicate key */
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, NULL, 1);
    kv_uint(&h, "g", 4);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_VALUE, "twice");
    /* unknown dtype */
    hb_init(&h);
    common(&h, TS_MSG_PULL, NULL, 1);
    kv_uint(&h, "dt", 99);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_VALUE, "\"dt\" (dtype)");
    /* a pull reply has all its step values or none */
    hb_init(&h);
    pull_reply_head(&h, 2);
    msgpack_pack_double(&h.pk, 2.5);
    msgpack_pack_double(&h.pk, 1e-3);
    expect(decode_hb(&h, NULL), TS_PROTO_E_FIELD_VALUE, "\"sv\" (step_values) has 2 entries, expected 0 or 3");
    hb_init(&h);
    pull_reply_head(&h, 0);
    expect(decode_hb(&h, NULL), TS_PROTO_OK, NULL);
    /* unknown keys are ignored */
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, NULL, 1);
    kv_str(&h, "zz", "future");
    expect(decode_hb(&h, NULL), TS_PROTO_OK, NULL);
}

static void test_not_a_map(void **state) {
    (void)state;
    hb h;
    hb_init(&h);
    msgpack_pack_array(&h.pk, 2);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_uint64(&h.pk, 2);
    expect(decode_hb(&h, NULL), TS_PROTO_E_NOT_MAP, "array");
    hb_init(&h);
    msgpack_pack_map(&h.pk, 1);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_uint64(&h.pk, 2);
    expect(decode_hb(&h, NULL), TS_PROTO_E_NOT_MAP, "key #0");
}

static void test_huge_declared_lengths(void **state) {
    (void)state;
    ts_proto_msg m;
    /* array32 / map32 / str32 / bin32 declaring ~4G items in a few bytes */
    const unsigned char arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
    const unsigned char map[] = {0x81, 0xa1, 'v', 0xdf, 0xff, 0xff, 0xff, 0xff};
    const unsigned char str[] = {0x81, 0xdb, 0xff, 0xff, 0xff, 0xf0, 'v'};
    const unsigned char bin[] = {0xc6, 0x7f, 0xff, 0xff, 0xff};
    const unsigned char *cases[] = {arr, map, str, bin};
    const size_t sizes[] = {sizeof arr, sizeof map, sizeof str, sizeof bin};
    for (int i = 0; i < 4; i++) {
        ts_proto_frame f = {cases[i], sizes[i]};
        expect(ts_proto_decode(&f, 1, NULL, &m), TS_PROTO_E_MSGPACK, "declares");
    }
    /* deep nesting */
    unsigned char deep[40];
    memset(deep, 0x91, sizeof deep);
    deep[39] = 0xc0;
    ts_proto_frame f = {deep, sizeof deep};
    expect(ts_proto_decode(&f, 1, NULL, &m), TS_PROTO_E_MSGPACK, "deeper");
    /* a payload length above the limit */
    hb h;
    hb_init(&h);
    common(&h, TS_MSG_PUSH, "ln", 1);
    key(&h, "ln");
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint64(&h.pk, (uint64_t)1 << 40);
    expect(decode_hb(&h, NULL), TS_PROTO_E_PAYLOAD_SIZE, "ln[0]");
    /* a roster declaring more entries than allowed */
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    lim.max_roster = 2;
    ts_proto_msg big;
    sample(&big, TS_MSG_MEMBERSHIP);
    ts_proto_frame fr[1];
    encode_frames(&big, NULL, 0, fr);
    expect(ts_proto_decode(fr, 1, &lim, &m), TS_PROTO_E_FIELD_VALUE, "\"ros\" (roster) has 3");
    free((void *)fr[0].data);
    ts_proto_msg_free(&big);
}

static void test_payload_mismatch(void **state) {
    (void)state;
    float data[8] = {0};
    ts_proto_msg m, d;
    ts_proto_frame pay[2], fr[4];
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    /* header says 16 + 8 bytes; the second frame is one byte short */
    sample(&m, TS_MSG_PUSH);
    size_t np = sample_payload(TS_MSG_PUSH, pay, data);
    size_t nf = encode_frames(&m, pay, np, fr);
    fr[2].size = 7;
    expect(ts_proto_decode(fr, nf, &lim, &d), TS_PROTO_E_PAYLOAD_LEN, "ln[1]");
    /* a frame missing */
    expect(ts_proto_decode(fr, nf - 1, &lim, &d), TS_PROTO_E_PAYLOAD_LEN, "\"ln\" lists 2");
    /* ranges cover 6 f32 = 24 bytes; give them 24 bytes as 16+8 but f64 */
    fr[2].size = 8;
    free((void *)fr[0].data);
    m.dtype = TS_PROTO_DT_F64;
    nf = encode_frames(&m, pay, np, fr);
    expect(ts_proto_decode(fr, nf, &lim, &d), TS_PROTO_E_PAYLOAD_LEN, "ranges cover 6");
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
    /* a control message with a payload frame */
    sample(&m, TS_MSG_HEARTBEAT);
    nf = encode_frames(&m, pay, 1, fr);
    expect(ts_proto_decode(fr, nf, &lim, &d), TS_PROTO_E_PAYLOAD_LEN, "heartbeat: carries 1");
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
    /* a values message without its frame, with two, or with a partial f64 */
    sample(&m, TS_MSG_COMMIT);
    nf = encode_frames(&m, pay, 0, fr);
    expect(ts_proto_decode(fr, nf, &lim, &d), TS_PROTO_E_PAYLOAD_LEN, "commit: carries 0");
    free((void *)fr[0].data);
    nf = encode_frames(&m, pay, 2, fr);
    expect(ts_proto_decode(fr, nf, &lim, &d), TS_PROTO_E_PAYLOAD_LEN, "commit: carries 2");
    free((void *)fr[0].data);
    pay[0].size = 12;
    nf = encode_frames(&m, pay, 1, fr);
    expect(ts_proto_decode(fr, nf, &lim, &d), TS_PROTO_E_PAYLOAD_LEN, "12 bytes, not a whole number");
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
    /* too many frames */
    lim.max_frames = 1;
    sample(&m, TS_MSG_COLLECTIVE);
    nf = encode_frames(&m, pay, 2, fr);
    expect(ts_proto_decode(fr, nf, &lim, &d), TS_PROTO_E_FRAMES, "limit 1");
    expect(ts_proto_decode(fr, 0, &lim, &d), TS_PROTO_E_FRAMES, "no header");
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
}

static void test_ranges_out_of_bounds(void **state) {
    (void)state;
    ts_proto_msg m, d;
    ts_proto_frame fr[1];
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    lim.model_size = 100;
    ts_proto_range in[1] = {{90, 10}}, out[1] = {{90, 11}}, wrap[1] = {{UINT64_MAX, 2}};
    sample(&m, TS_MSG_PULL);
    ts_proto_msg_set_ranges(&m, in, 1);
    encode_frames(&m, NULL, 0, fr);
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_OK, NULL);
    ts_proto_msg_free(&d);
    free((void *)fr[0].data);
    ts_proto_msg_set_ranges(&m, out, 1);
    encode_frames(&m, NULL, 0, fr);
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_E_RANGE, "rg[0] = [90, 101)");
    free((void *)fr[0].data);
    ts_proto_msg_set_ranges(&m, wrap, 1);
    encode_frames(&m, NULL, 0, fr);
    lim.model_size = 0;
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_E_RANGE, "overflows");
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
}

static void test_generation_job_version_type(void **state) {
    (void)state;
    ts_proto_msg m, d;
    ts_proto_frame fr[1];
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    lim.generation = 4;
    lim.job = "job-7";
    sample(&m, TS_MSG_BARRIER); /* generation 3 */
    encode_frames(&m, NULL, 0, fr);
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_E_GENERATION, "\"g\" (generation) 3");
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
    sample(&m, TS_MSG_JOIN); /* joins are exempt */
    encode_frames(&m, NULL, 0, fr);
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_OK, NULL);
    ts_proto_msg_free(&d);
    lim.job = "job-8";
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_E_JOB, "job-8");
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);

    hb h;
    hb_init(&h);
    common(&h, 99, NULL, 0);
    expect(decode_hb(&h, NULL), TS_PROTO_E_TYPE, "\"t\" (type) is 99");
    hb_init(&h);
    common(&h, TS_MSG_STEP_DONE, "v", 1);
    kv_uint(&h, "v", 2);
    expect(decode_hb(&h, NULL), TS_PROTO_E_VERSION, "\"v\" (version) is 2");
}

static void test_oversized_header(void **state) {
    (void)state;
    ts_proto_msg m, d;
    ts_proto_frame fr[1];
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    sample(&m, TS_MSG_STATUS_REPLY);
    encode_frames(&m, NULL, 0, fr);
    lim.max_header_bytes = fr[0].size - 1;
    char needle[64];
    snprintf(needle, sizeof needle, "%zu bytes, limit %zu", fr[0].size, fr[0].size - 1);
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_E_HEADER_SIZE, needle);
    lim.max_header_bytes = fr[0].size;
    expect(ts_proto_decode(fr, 1, &lim, &d), TS_PROTO_OK, NULL);
    ts_proto_msg_free(&d);
    free((void *)fr[0].data);
    ts_proto_msg_free(&m);
}

static void test_encoder_refuses_bad_values(void **state) {
    (void)state;
    ts_proto_msg m;
    void *buf;
    size_t size;
    ts_proto_msg_init(&m, TS_MSG_BARRIER, "j", 1, 0); /* barrier_id -1 */
    assert_int_equal(ts_proto_encode(&m, &buf, &size), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "\"bi\" (barrier_id)"));
    ts_proto_msg_init(&m, TS_MSG_PULL_REPLY, "j", 1, 0);
    m.nstep_values = 2;
    assert_int_equal(ts_proto_encode(&m, &buf, &size), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "\"sv\" (step_values) has 2 entries"));
    ts_proto_msg_init(&m, (ts_proto_type)77, "j", 1, 0);
    assert_int_equal(ts_proto_encode(&m, &buf, &size), TS_ERR_VALUE);
    char big[TS_PROTO_REASON_MAX + 10];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(ts_proto_set_str(m.reason, sizeof m.reason, big), TS_ERR_VALUE);
    ts_proto_msg_error(&m, "j", 1, 0, TS_PROTO_E_RANGE, big);
    assert_int_equal(strlen(m.reason), TS_PROTO_REASON_MAX);
    assert_int_equal(ts_proto_encode(&m, &buf, &size), TS_OK);
    free(buf);
}

/* ---- real sockets ------------------------------------------------------ */

static int freed_count;
static void count_free(void *data, void *hint) {
    (void)hint;
    free(data);
    __atomic_add_fetch(&freed_count, 1, __ATOMIC_SEQ_CST);
}

static void test_dealer_router_exchange(void **state) {
    (void)state;
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    int timeout = 5000;
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t epl = sizeof ep;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &epl);
    assert_int_equal(zmq_connect(dealer, ep), 0);

    /* DEALER -> ROUTER: a PUSH with one zero-copy and one copied payload */
    ts_proto_msg m;
    sample(&m, TS_MSG_PUSH);
    float *owned = malloc(16);
    for (int i = 0; i < 4; i++) owned[i] = (float)i;
    float copied[2] = {10, 11};
    ts_proto_payload pay[2] = {{owned, 16, count_free, NULL}, {copied, 8, NULL, NULL}};
    freed_count = 0;
    assert_int_equal(ts_proto_send(dealer, NULL, &m, pay, 2, 0), TS_OK);
    copied[0] = -1; /* the copy was taken at send time */
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    lim.model_size = 12;
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);
    ts_proto_error e = ts_proto_recv(router, &lim, 0, &rx);
    if (e) fail_msg("%s", ts_last_error());
    assert_true(rx.identity.size > 0);
    assert_int_equal(rx.msg.type, TS_MSG_PUSH);
    assert_int_equal(rx.msg.nlengths, 2);
    const float *p0 = rx.msg.payload[0].data, *p1 = rx.msg.payload[1].data;
    assert_true(p0[3] == 3.0f && p1[0] == 10.0f);
    ts_proto_identity who = rx.identity;

    /* ROUTER -> DEALER: an ERROR reply to that identity */
    assert_int_equal(ts_proto_send_error(router, &who, "job-7", 3, TS_PROTO_RANK_SCHEDULER,
                                         TS_PROTO_E_UNEXPECTED, "push before join"),
                     TS_OK);
    e = ts_proto_recv(dealer, &lim, 0, &rx);
    if (e) fail_msg("%s", ts_last_error());
    assert_int_equal(rx.msg.type, TS_MSG_ERROR);
    assert_int_equal(rx.msg.code, TS_PROTO_E_UNEXPECTED);
    assert_string_equal(rx.msg.reason, "push before join");
    assert_int_equal(rx.msg.rank, TS_PROTO_RANK_SCHEDULER);

    /* a message with 70 frames: dropped whole, the next one still decodes */
    for (int i = 0; i < 70; i++) zmq_send(dealer, "x", 1, i < 69 ? ZMQ_SNDMORE : 0);
    ts_proto_msg hbm;
    sample(&hbm, TS_MSG_HEARTBEAT);
    assert_int_equal(ts_proto_send(dealer, NULL, &hbm, NULL, 0, 0), TS_OK);
    expect(ts_proto_recv(router, &lim, 0, &rx), TS_PROTO_E_FRAMES, "limit 64");
    assert_true(rx.identity.size > 0);
    assert_int_equal(rx.dropped_frames, 70 + 1 - (TS_PROTO_DEFAULT_MAX_FRAMES + 2));
    expect(ts_proto_recv(router, &lim, 0, &rx), TS_PROTO_OK, NULL);
    assert_int_equal(rx.msg.type, TS_MSG_HEARTBEAT);
    assert_int_equal(rx.msg.last_barrier, 40);

    /* random bytes as a header over the socket: an error, not a crash */
    zmq_send(dealer, "\xc1\x00\x01", 3, 0);
    expect(ts_proto_recv(router, &lim, 0, &rx), TS_PROTO_E_MSGPACK, "0xc1");

    /* nothing waiting */
    expect(ts_proto_recv(router, &lim, ZMQ_DONTWAIT, &rx), TS_PROTO_E_AGAIN, NULL);
    ts_proto_rx_release(&rx);
    ts_proto_msg_free(&m);
    ts_proto_msg_free(&hbm);
    zmq_close(dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
    assert_int_equal(__atomic_load_n(&freed_count, __ATOMIC_SEQ_CST), 1);
}

static void test_send_refusal_frees_payload(void **state) {
    (void)state;
    void *ctx = zmq_ctx_new();
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    ts_proto_msg m;
    ts_proto_msg_init(&m, TS_MSG_BARRIER, "j", 1, 0); /* invalid: barrier_id -1 */
    freed_count = 0;
    ts_proto_payload pay = {malloc(8), 8, count_free, NULL};
    assert_int_equal(ts_proto_send(dealer, NULL, &m, &pay, 1, 0), TS_ERR_VALUE);
    assert_int_equal(freed_count, 1);
    /* no peer and DONTWAIT: would block */
    m.barrier_id = 1;
    pay.data = malloc(8);
    assert_int_equal(ts_proto_send(dealer, NULL, &m, &pay, 1, ZMQ_DONTWAIT), TS_ERR_TIMEOUT);
    zmq_close(dealer);
    zmq_ctx_term(ctx);
    assert_int_equal(freed_count, 2);
}

/* Every seed of the fuzz corpus is a valid message under its flags, so the
 * fuzzer starts from inputs that reach the deepest checks. */
static void test_fuzz_seeds_are_valid(void **state) {
    (void)state;
    const char *src = getenv("TESSERA_SOURCE_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/proto/fuzz/corpus", src ? src : ".");
    DIR *d = opendir(path);
    assert_non_null(d);
    int seen = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char file[1024];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        FILE *f = fopen(file, "rb");
        assert_non_null(f);
        unsigned char buf[4096];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        assert_true(n > 3);
        ts_proto_limits lim;
        fuzz_limits(buf[0], &lim);
        ts_proto_frame fr[FUZZ_MAX_FRAMES];
        size_t nf = 0;
        for (size_t pos = 1; pos + 2 <= n && nf < FUZZ_MAX_FRAMES;) {
            size_t len = (size_t)buf[pos] | (size_t)buf[pos + 1] << 8;
            pos += 2;
            assert_true(len <= n - pos);
            fr[nf++] = (ts_proto_frame){buf + pos, len};
            pos += len;
        }
        ts_proto_msg m;
        ts_proto_error err = ts_proto_decode(fr, nf, &lim, &m);
        if (err) fail_msg("%s: %s", e->d_name, ts_last_error());
        char want[64];
        snprintf(want, sizeof want, "%s.bin", ts_proto_type_name(m.type));
        assert_string_equal(want, e->d_name);
        ts_proto_msg_free(&m);
        seen++;
    }
    closedir(d);
    assert_int_equal(seen, (int)ts_proto_ntypes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_type),
        cmocka_unit_test(test_names_are_distinct),
        cmocka_unit_test(test_minimal_header_decodes),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_truncated_msgpack),
        cmocka_unit_test(test_wrong_field_types),
        cmocka_unit_test(test_missing_fields),
        cmocka_unit_test(test_field_values),
        cmocka_unit_test(test_not_a_map),
        cmocka_unit_test(test_huge_declared_lengths),
        cmocka_unit_test(test_payload_mismatch),
        cmocka_unit_test(test_ranges_out_of_bounds),
        cmocka_unit_test(test_generation_job_version_type),
        cmocka_unit_test(test_oversized_header),
        cmocka_unit_test(test_encoder_refuses_bad_values),
        cmocka_unit_test(test_dealer_router_exchange),
        cmocka_unit_test(test_send_refusal_frees_payload),
        cmocka_unit_test(test_fuzz_seeds_are_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
