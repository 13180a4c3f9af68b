/* buckets.c - gradient buckets all-reduced while backward goes on. */
#include "worker/buckets.h"

#include <stdlib.h>

typedef struct {
    int64_t lo, hi;   /* range of the flat gradient buffer */
    int64_t ready;    /* elements whose gradients are final this step */
    ts_comm_req *req; /* its all-reduce in flight, or NULL */
} bucket;

struct ts_buckets {
    bucket *b;
    int n;
    uint16_t *wire; /* bf16 copies of the gradients, or NULL */
};

ts_buckets *ts_buckets_new(const ts_model *m, double bucket_mb, bool bf16_wire) {
    if (bf16_wire && m->device.type != TS_DEVICE_CPU) { /* the bf16 copies are made on the host */
        ts_error(TS_ERR_UNSUPPORTED, "buckets: parallel.wire_dtype bf16 with a model on %s (NCCL sends f32)",
                 ts_device_name(m->device));
        return NULL;
    }
    ts_buckets *bs = calloc(1, sizeof *bs);
    if (bs) bs->b = calloc((size_t)m->n_params + 1, sizeof *bs->b);
    if (bs && bs->b && bf16_wire) bs->wire = malloc((size_t)(m->numel + 1) * 2);
    if (!bs || !bs->b || (bf16_wire && !bs->wire)) {
        ts_buckets_free(bs);
        ts_error(TS_ERR_MEMORY, "buckets: out of memory for the buckets of %lld gradients", (long long)m->numel);
        return NULL;
    }
    int64_t target = (int64_t)(bucket_mb * (1 << 20) / sizeof(float));
    if (target < 1) target = 1;
    int64_t hi = m->numel;
    for (int i = m->n_params - 1; i >= 0; i--) {
        int64_t lo = m->params[i].offset;
        if (hi - lo >= target || i == 0) {
            bs->b[bs->n++] = (bucket){.lo = i == 0 ? 0 : lo, .hi = hi};
            hi = lo;
        }
    }
    return bs;
}

void ts_buckets_free(ts_buckets *b) {
    if (!b) return;
    ts_buckets_drop(b);
    free(b->b);
    free(b->wire);
    free(b);
}

void ts_buckets_reset(ts_buckets *b) {
    for (int i = 0; i < b->n; i++) b->b[i].ready = 0;
}

/* Starts the all-reduce (average) of bucket k. */
static ts_status launch(ts_buckets *bs, ts_comm *c, float *g, bucket *b, int64_t step) {
    ts_comm_op op = {.kind = TS_COMM_ALLREDUCE, .count = b->hi - b->lo, .op = TS_REDUCE_AVG, .step = step};
    if (bs->wire) {
        for (int64_t i = b->lo; i < b->hi; i++) bs->wire[i] = ts_bf16_from_f32(g[i]);
        op.send = op.recv = bs->wire + b->lo;
        op.dtype = TS_BF16;
    } else {
        op.send = op.recv = g + b->lo;
        op.dtype = TS_F32;
    }
    return ts_comm_start(c, &op, &b->req);
}

ts_status ts_buckets_ready(ts_buckets *bs, ts_comm *c, float *grads, int64_t offset, int64_t len, int64_t step) {
    ts_status st = TS_OK;
    for (int i = 0; !st && i < bs->n; i++) {
        bucket *b = &bs->b[i];
        int64_t lo = offset > b->lo ? offset : b->lo, hi = offset + len < b->hi ? offset + len : b->hi;
        if (hi <= lo) continue;
        b->ready += hi - lo;
        if (b->ready == b->hi - b->lo) st = launch(bs, c, grads, b, step);
    }
    return st;
}

static ts_status plain_wait(void *ctx, ts_comm_req *req) {
    (void)ctx;
    return ts_comm_wait(req);
}

ts_status ts_buckets_wait(ts_buckets *bs, float *g, ts_buckets_wait_fn wait, void *ctx) {
    if (!wait) wait = plain_wait;
    ts_status first = TS_OK;
    for (int i = 0; i < bs->n; i++) {
        bucket *b = &bs->b[i];
        if (b->req) {
            ts_status st = wait(ctx, b->req);
            b->req = NULL;
            if (st && !first) first = st;
        }
        if (!first && bs->wire)
            for (int64_t k = b->lo; k < b->hi; k++) g[k] = ts_f32_from_bf16(bs->wire[k]);
    }
    return first;
}

void ts_buckets_drop(ts_buckets *bs) {
    for (int i = 0; i < bs->n; i++) {
        if (bs->b[i].req) ts_comm_wait(bs->b[i].req);
        bs->b[i].req = NULL;
    }
}
