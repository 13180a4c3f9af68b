/* make_corpus.c - writes the fuzzer's seed corpus: one valid message of
 * every type, in the input format of frames.h, into the folder argv[1]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"


/* Fills m (type t) with valid values; returns the payload frame count and
 * sizes in lens. */
static size_t fill(ts_proto_msg *m, uint32_t t, uint64_t *lens) {
    static const ts_proto_member roster[2] = {
        {0, TS_ROLE_PS, "tcp://127.0.0.1:7001", true, 5, 4, 12, 1},
        {1, TS_ROLE_WORKER, "tcp://127.0.0.1:7002", false, -1, -1, -1, 2},
    };
    static const ts_proto_range ranges[2] = {{0, 8}, {50, 4}};
    ts_proto_msg_init(m, (ts_proto_type)t, FUZZ_JOB, 3, 1);
    m->step = 5;
    m->role = TS_ROLE_WORKER;
    strcpy(m->address, "tcp://127.0.0.1:7002");
    strcpy(m->caps, "cpu");
    m->assigned_rank = 1;
    m->steps = 10;
    m->heartbeat_ms = 100;
    m->heartbeat_timeout_ms = 1000;
    m->barrier_timeout_ms = 3000;
    m->last_barrier = 4;
    m->barrier_id = 5;
    m->code = TS_PROTO_E_BARRIER_TIMEOUT;
    strcpy(m->reason, "rank 1 finished step 4 but did not reach barrier 5");
    strcpy(m->key, "nccl-id");
    m->found = true;
    strcpy(m->phase, "running");
    m->min_workers = 1;
    m->max_workers = 4;
    m->epoch = 2;
    m->offset = 4096;
    m->step_values[TS_STEP_LOSS] = 2.25, m->step_values[TS_STEP_LR] = 1e-3, m->step_values[TS_STEP_GRAD_NORM] = 0.5;
    m->nstep_values = TS_STEP_VALUES;
    m->sequence = 9;
    m->flow = 1;
    if (t == TS_MSG_JOIN_ACK || t == TS_MSG_MEMBERSHIP || t == TS_MSG_STATUS_REPLY)
        ts_proto_msg_set_roster(m, roster, 2);
    if (t == TS_MSG_BLOB_PUT || t == TS_MSG_BLOB_REPLY) {
        lens[0] = 16;
        return 1;
    }
    if (t == TS_MSG_COMMIT || t == TS_MSG_COMMIT_REPLY || t == TS_MSG_APPLY || t == TS_MSG_REDUCE ||
        t == TS_MSG_REDUCE_REPLY) {
        m->dtype = TS_PROTO_DT_F64;
        lens[0] = 32;
        return 1;
    }
    if (t == TS_MSG_ACK || t == TS_MSG_ROLLBACK) return 0;
    if (t == TS_MSG_SNAPSHOT) { /* the record and the values of part 0 */
        lens[0] = 32, lens[1] = 16;
        return 2;
    }
    if (t >= TS_MSG_PUSH) {
        m->dtype = TS_PROTO_DT_F32;
        ts_proto_msg_set_ranges(m, ranges, 2);
        if (t == TS_MSG_PULL) return 0;
        lens[0] = 32, lens[1] = 16;
        return 2;
    }
    return 0;
}

static void put_frame(FILE *f, const void *p, size_t n) {
    unsigned char len[2] = {(unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
    fwrite(len, 1, 2, f);
    fwrite(p, 1, n, f);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus DIR\n");
        return 2;
    }
    unsigned char zeros[64] = {0};
    for (size_t i = 0; i < ts_proto_ntypes; i++) {
        ts_proto_msg m;
        uint64_t lens[2];
        size_t np = fill(&m, ts_proto_types[i], lens);
        m.lengths = malloc(sizeof lens);
        memcpy(m.lengths, lens, sizeof lens);
        m.nlengths = np;
        void *buf;
        size_t size;
        if (ts_proto_encode(&m, &buf, &size) != TS_OK) {
            fprintf(stderr, "make_corpus: %s\n", ts_last_error());
            return 1;
        }
        char path[512];
        snprintf(path, sizeof path, "%s/%s.bin", argv[1], ts_proto_type_name(ts_proto_types[i]));
        FILE *f = fopen(path, "wb");
        if (!f) {
            perror(path);
            return 1;
        }
        fputc(7, f); /* model size, generation and job checks on */
        put_frame(f, buf, size);
        for (size_t k = 0; k < np; k++) put_frame(f, zeros, (size_t)lens[k]);
        fclose(f);
        free(buf);
        ts_proto_msg_free(&m);
    }
    return 0;
}
