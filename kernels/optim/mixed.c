/* mixed.c - bf16 parameter copies and f32 gradient accumulation. */
#include "kernels/optim/mixed.h"

#include "kernels/ops/cpu/capability.h"
#include "kernels/optim/clip.h"

const ts_optim_kernels *ts_mixed_kernels(void) {
    const ts_backend *b = ts_backend_cpu();
    return (b ? b : ts_cpu_capability_backend(TS_CPU_DEFAULT))->optim;
}

static ts_status check_range(const char *op, const void *a, const void *b, int64_t len) {
    if (len < 0) return ts_error(TS_ERR_VALUE, "%s: length %lld is negative", op, (long long)len);
    if (len > 0 && (!a || !b)) return ts_error(TS_ERR_VALUE, "%s: NULL buffer for %lld elements", op, (long long)len);
    return TS_OK;
}

ts_status ts_mixed_to_bf16(const float *master, uint16_t *out, int64_t len) {
    ts_status s = check_range("mixed to_bf16", master, out, len);
    return s ? s : ts_mixed_kernels()->to_bf16(master, out, len);
}

ts_status ts_mixed_accumulate(float *acc, const void *g, ts_dtype dtype, int64_t len, float scale) {
    ts_status s = check_range("mixed accumulate", acc, g, len);
    if (s) return s;
    if (dtype != TS_F32 && dtype != TS_BF16)
        return ts_error(TS_ERR_DTYPE, "mixed accumulate: gradient dtype %s is not f32 or bf16", ts_dtype_name(dtype));
    return ts_mixed_kernels()->accumulate(acc, g, dtype, len, scale);
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
