/* frames.h - the fuzzer's input format, shared by the fuzz target and the
 * seed corpus generator.
 *
 * Byte 0 selects the limits (bit 0: model size 100, bit 1: current
 * generation 3, bit 2: job "job-7", bit 3: 64-byte header limit). Then up
 * to FUZZ_MAX_FRAMES frames, each a 2-byte little-endian length and that many
 * bytes (the last frame is cut short at the end of the input).
 */
#ifndef TS_FUZZ_FRAMES_H
#define TS_FUZZ_FRAMES_H

#include "proto/wire.h"

#define FUZZ_MAX_FRAMES 17
#define FUZZ_JOB "job-7"

/* Limits selected by the flags byte. */
static inline void fuzz_limits(uint8_t flags, ts_proto_limits *lim) {
    ts_proto_limits_default(lim);
    lim->max_frames = FUZZ_MAX_FRAMES - 1;
    if (flags & 1) lim->model_size = 100;
    if (flags & 2) lim->generation = 3;
    if (flags & 4) lim->job = FUZZ_JOB;
    if (flags & 8) lim->max_header_bytes = 64;
}

#endif
