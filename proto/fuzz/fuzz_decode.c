/* fuzz_decode.c - libFuzzer target for ts_proto_decode.
 *
 * Each frame is copied into its own exact-size heap block so that AddressSanitizer
 * flags any read past a frame's end. A message that decodes must re-encode,
 * and encode(decode(encode(decode(x)))) must equal encode(decode(x)) byte for
 * byte; anything else aborts.
 */
#include <stdlib.h>
#include <string.h>

#include "frames.h"

/* Encodes m, decodes the result with the same payload, and returns the
 * encoding (aborts when either step fails). */
static void *reencode(const ts_proto_msg *m, ts_proto_frame *fr, size_t nf,
                      const ts_proto_limits *lim, size_t *size, ts_proto_msg *again) {
    void *buf;
    if (ts_proto_encode(m, &buf, size) != TS_OK) abort();
    fr[0] = (ts_proto_frame){buf, *size};
    if (ts_proto_decode(fr, nf, lim, again) != TS_PROTO_OK) abort();
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ts_proto_limits lim;
    fuzz_limits(data[0], &lim);
    ts_proto_frame fr[FUZZ_MAX_FRAMES];
    void *owned[FUZZ_MAX_FRAMES];
    size_t nf = 0, pos = 1;
    while (pos < size && nf < FUZZ_MAX_FRAMES) {
        size_t len = size - pos;
        if (len >= 2) {
            size_t want = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
            pos += 2;
            len = size - pos < want ? size - pos : want;
        } else {
            pos += len;
            len = 0;
        }
        owned[nf] = malloc(len ? len : 1);
        if (len) memcpy(owned[nf], data + pos, len);
        fr[nf] = (ts_proto_frame){owned[nf], len};
        pos += len;
        nf++;
    }
    ts_proto_msg m;
    if (ts_proto_decode(fr, nf, &lim, &m) == TS_PROTO_OK) {
        ts_proto_frame copy[FUZZ_MAX_FRAMES];
        memcpy(copy, fr, nf * sizeof fr[0]);
        ts_proto_msg m2, m3;
        size_t s1, s2;
        void *e1 = reencode(&m, copy, nf, &lim, &s1, &m2);
        void *e2 = reencode(&m2, copy, nf, &lim, &s2, &m3);
        if (s1 != s2 || memcmp(e1, e2, s1) != 0) abort();
        free(e1);
        free(e2);
        ts_proto_msg_free(&m2);
        ts_proto_msg_free(&m3);
        ts_proto_msg_free(&m);
    }
    for (size_t i = 0; i < nf; i++) free(owned[i]);
    return 0;
}
