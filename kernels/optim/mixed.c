/* mixed.c - bf16 parameter copies and f32 gradient accumulation. */
#include "kernels/optim/mixed.h"

#include "kernels/optim/clip.h"

#define MIXED_OMP_MIN 32768

static ts_status check_range(const char *op, const void *a, const void *b, int64_t len) {
    if (len < 0) return ts_error(TS_ERR_VALUE, "%s: length %lld is negative", op, (long long)len);
    if (len > 0 && (!a || !b)) return ts_error(TS_ERR_VALUE, "%s: NULL buffer for %lld elements", op, (long long)len);
    return TS_OK;
}

ts_status ts_mixed_to_bf16(const float *master, uint16_t *out, int64_t len) {
    ts_status s = check_range("mixed to_bf16", master, out, len);
    if (s) return s;
#pragma omp parallel for if (len > MIXED_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < len; i++) out[i] = ts_bf16_from_f32(master[i]);
    return TS_OK;
}

ts_status ts_mixed_accumulate(float *acc, const void *g, ts_dtype dtype, int64_t len, float scale) {
    ts_status s = check_range("mixed accumulate", acc, g, len);
    if (s) return s;
    if (dtype == TS_F32) {
        const float *gf = g;
#pragma omp parallel for if (len > MIXED_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < len; i++) acc[i] += scale * gf[i];
    } else if (dtype == TS_BF16) {
        const uint16_t *gb = g;
#pragma omp parallel for if (len > MIXED_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < len; i++) acc[i] += scale * ts_f32_from_bf16(gb[i]);
    } else {
        return ts_error(TS_ERR_DTYPE, "mixed accumulate: gradient dtype %s is not f32 or bf16",
                        ts_dtype_name(dtype));
    }
    return TS_OK;
}

float ts_mixed_micro_scale(int k) {
    if (k < 1) {
        ts_error(TS_ERR_VALUE, "mixed: micro-batch count k = %d must be >= 1", k);
        return 0.0f;
    }
    return 1.0f / (float)k;
}

ts_status ts_mixed_average(float *acc, int64_t len, int k) {
    ts_status s = check_range("mixed average", acc, acc, len);
    if (s) return s;
    float f = ts_mixed_micro_scale(k);
    if (f == 0.0f) return ts_last_status();
    ts_clip_scale(acc, len, f);
    return TS_OK;
}
