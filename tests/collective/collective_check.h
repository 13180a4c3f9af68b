/* collective_check.h - every collective of a communicator checked against
 * a serial reference, from inside one rank: the data of rank r is a known
 * function of (r, i), so each rank computes what it must receive. Used by
 * the ring test (forked ranks) and the MPI check (mpirun). A failed check
 * ends the rank's process with a message (exit 1). Header only. */
#ifndef TS_TESTS_COLLECTIVE_CHECK_H
#define TS_TESTS_COLLECTIVE_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collective/comm.h"

/* Rank r's value at element i: small multiples of 1/2, so that sums of up
 * to 8 of them are exact in f32 and in bf16, whatever the order. */
static inline float value(int r, int64_t i) { return (float)(r + 1) + 0.5f * (float)(i % 8) - (float)(i % 3); }

static inline void fill(void *buf, ts_dtype dt, int r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == TS_F32) ((float *)buf)[i] = value(r, i);
        else ((uint16_t *)buf)[i] = ts_bf16_from_f32(value(r, i));
    }
}

static inline float at(const void *buf, ts_dtype dt, int64_t i) {
    return dt == TS_F32 ? ((const float *)buf)[i] : ts_f32_from_bf16(((const uint16_t *)buf)[i]);
}

/* The reduction of every rank's value at i. */
static inline float reduced(ts_reduce_op op, int n, int64_t i, ts_dtype dt) {
    float acc = op == TS_REDUCE_MAX ? value(0, i) : 0;
    for (int r = 0; r < n; r++) acc = op == TS_REDUCE_MAX ? (value(r, i) > acc ? value(r, i) : acc) : acc + value(r, i);
    if (op == TS_REDUCE_AVG) acc = dt == TS_F32 ? acc / (float)n : ts_f32_from_bf16(ts_bf16_from_f32(acc / (float)n));
    return acc;
}

/* Ends this rank with a message when cond is false. */
#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            _exit(1);                                                          \
        }                                                                      \
    } while (0)

/* Every collective on a buffer of count elements of dt, checked against
 * the reference: allreduce, broadcast and send/recv move count elements;
 * reduce_scatter and allgather move n blocks of ceil(count / n). */
static inline void check_all(ts_comm *c, int r, int n, int64_t count, ts_dtype dt) {
    int64_t block = (count + n - 1) / n;
    size_t es = ts_dtype_size(dt), bytes = (size_t)count * es, bbytes = (size_t)block * es;
    size_t cap = bytes > bbytes * (size_t)n ? bytes : bbytes * (size_t)n;
    char *a = malloc(cap + 1), *b = malloc(cap + 1);
    CHECK(a && b, "out of memory");
    static const ts_reduce_op ops[] = {TS_REDUCE_SUM, TS_REDUCE_AVG, TS_REDUCE_MAX};
    for (int k = 0; k < 3; k++) {
        fill(a, dt, r, count);
        bool in_place = k == 1;
        ts_status st = ts_comm_allreduce(c, a, in_place ? a : b, count, dt, ops[k]);
        CHECK(!st, "rank %d: allreduce of %lld: %s", r, (long long)count, ts_last_error());
        const char *out = in_place ? a : b;
        for (int64_t i = 0; i < count; i++)
            CHECK(at(out, dt, i) == reduced(ops[k], n, i, dt), "rank %d: allreduce op %d of %lld %s: [%lld] = %g, want %g",
                  r, k, (long long)count, ts_dtype_name(dt), (long long)i, at(out, dt, i), reduced(ops[k], n, i, dt));
    }
    /* reduce_scatter: block q of rank r's input holds value(r, q * block + i) */
    fill(a, dt, r, block * n);
    CHECK(!ts_comm_reduce_scatter(c, a, b, block, dt, TS_REDUCE_SUM), "rank %d: reduce_scatter: %s", r, ts_last_error());
    for (int64_t i = 0; i < block; i++)
        CHECK(at(b, dt, i) == reduced(TS_REDUCE_SUM, n, (int64_t)r * block + i, dt), "rank %d: reduce_scatter [%lld]", r,
              (long long)i);
    /* reduce_scatter in place: the result lands in the rank's own slot */
    fill(a, dt, r, block * n);
    CHECK(!ts_comm_reduce_scatter(c, a, a + bbytes * (size_t)r, block, dt, TS_REDUCE_AVG),
          "rank %d: reduce_scatter in place: %s", r, ts_last_error());
    for (int64_t i = 0; i < block; i++)
        CHECK(at(a + bbytes * (size_t)r, dt, i) == reduced(TS_REDUCE_AVG, n, (int64_t)r * block + i, dt),
              "rank %d: reduce_scatter in place [%lld]", r, (long long)i);
    /* allgather in place: own block already in its slot */
    memset(b, 0, bbytes * (size_t)n);
    fill(b + bbytes * (size_t)r, dt, r, block);
    CHECK(!ts_comm_allgather(c, b + bbytes * (size_t)r, b, block, dt), "rank %d: allgather: %s", r, ts_last_error());
    for (int q = 0; q < n; q++)
        for (int64_t i = 0; i < block; i++)
            CHECK(at(b + bbytes * (size_t)q, dt, i) == value(q, i), "rank %d: allgather block %d [%lld]", r, q,
                  (long long)i);
    /* broadcast from the last rank */
    fill(a, dt, r, count);
    CHECK(!ts_comm_broadcast(c, a, count, dt, n - 1), "rank %d: broadcast: %s", r, ts_last_error());
    for (int64_t i = 0; i < count; i++) CHECK(at(a, dt, i) == value(n - 1, i), "rank %d: broadcast [%lld]", r, (long long)i);
    /* send around the ring: even ranks send first */
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    fill(a, dt, r, count);
    memset(b, 0, bytes);
    if (r % 2 == 0) {
        CHECK(!ts_comm_send(c, a, count, dt, next), "rank %d: send: %s", r, ts_last_error());
        CHECK(!ts_comm_recv(c, b, count, dt, prev), "rank %d: recv: %s", r, ts_last_error());
    } else {
        CHECK(!ts_comm_recv(c, b, count, dt, prev), "rank %d: recv: %s", r, ts_last_error());
        CHECK(!ts_comm_send(c, a, count, dt, next), "rank %d: send: %s", r, ts_last_error());
    }
    for (int64_t i = 0; i < count; i++) CHECK(at(b, dt, i) == value(prev, i), "rank %d: recv [%lld]", r, (long long)i);
    CHECK(!ts_comm_barrier(c), "rank %d: barrier: %s", r, ts_last_error());
    free(a);
    free(b);
}

#endif
