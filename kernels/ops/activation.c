/* activation.c - relu, gelu (tanh form), sigmoid, tanh on the pointwise
 * map driver of elementwise.h; each element function sits next to its
 * derivative. */
#include "kernels/ops/activation.h"

#include <stdint.h>
#include <tgmath.h>

#include "kernels/ops/elementwise.h"

#define RELU_F(T, x, p) ((x) > 0 ? (x) : (T)0)
/* y > 0 exactly where x > 0 (NaN gives 0 either way), so backward keeps
 * only the output. */
#define RELU_B(T, g, x, y, p) ((y) > 0 ? (g) : (T)0)
TS_MAP_KERNELS(relu, RELU_F, RELU_B, TS_MAP_USES_Y)

/* u = k (x + a x^3), y = x (1 + tanh u) / 2,
 * dy/dx = (1 + t) / 2 + x (1 - t^2) k (1 + 3 a x^2) / 2 with t = tanh u. */
#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_A 0.044715
/* e^x for f32 without a libm call, so the gelu loops vectorise: x clamped
 * to [-87, 88] (e^x stays a normal float), x = n ln2 + r with |r| <= ln2/2
 * (ln2 split in two for an exact n ln2), e^r by its degree-7 Taylor
 * polynomial (truncation < 1e-8 relative), times 2^n built from the exponent
 * bits. Within 2 ulp of expf. */
static inline float gelu_expf(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    /* n = round(x / ln2): adding and removing 1.5 * 2^23 rounds to an integer
     * (floorf would block vectorisation) */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}

/* f32 uses gelu_expf, f64 (gradcheck) libm's exp. */
#define GELU_EXP(x) _Generic((x), float: gelu_expf, default: exp)(x)

/* tanh u = 1 - 2 / (1 + e^(2u)): exp is far cheaper than libm's tanh and
 * saturates cleanly to +-1 */
#define GELU_T(T, x) ((T)1 - (T)2 / ((T)1 + GELU_EXP((T)(2 * GELU_K) * ((x) + (T)GELU_A * (x) * (x) * (x)))))
#define GELU_F(T, x, p) ((T)0.5 * (x) * ((T)1 + GELU_T(T, x)))
#define GELU_D(T, x, t) \
    ((T)0.5 * ((T)1 + (t)) + (T)0.5 * (x) * ((T)1 - (t) * (t)) * (T)GELU_K * ((T)1 + (T)(3 * GELU_A) * (x) * (x)))
#define GELU_B(T, g, x, y, p) ((g)*GELU_D(T, x, GELU_T(T, x)))
TS_MAP_KERNELS(gelu, GELU_F, GELU_B, TS_MAP_USES_X)

/* exp of -|x| only, so neither branch overflows */
#define SIGMOID_F(T, x, p) ((x) >= 0 ? (T)1 / ((T)1 + exp(-(x))) : exp(x) / ((T)1 + exp(x)))
#define SIGMOID_B(T, g, x, y, p) ((g) * (y) * ((T)1 - (y)))
TS_MAP_KERNELS(sigmoid, SIGMOID_F, SIGMOID_B, TS_MAP_USES_Y)

#define TANH_F(T, x, p) tanh(x)
#define TANH_B(T, g, x, y, p) ((g) * ((T)1 - (y) * (y)))
TS_MAP_KERNELS(tanh, TANH_F, TANH_B, TS_MAP_USES_Y)

ts_tensor *ts_relu(ts_tensor *x) { return ts_map_apply(&relu_map, x, 0); }
ts_tensor *ts_gelu(ts_tensor *x) { return ts_map_apply(&gelu_map, x, 0); }
ts_tensor *ts_sigmoid(ts_tensor *x) { return ts_map_apply(&sigmoid_map, x, 0); }
ts_tensor *ts_tanh(ts_tensor *x) { return ts_map_apply(&tanh_map, x, 0); }
