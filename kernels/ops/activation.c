/* activation.c - relu, gelu (tanh form), sigmoid, tanh on the pointwise
 * map driver of elementwise.h; each element function sits next to its
 * derivative. */
#include "kernels/ops/activation.h"

#include <tgmath.h>

#include "kernels/ops/elementwise.h"

#define RELU_F(T, x, p) ((x) > 0 ? (x) : (T)0)
#define RELU_B(T, g, x, y, p) ((x) > 0 ? (g) : (T)0)
TS_MAP_KERNELS(relu, RELU_F, RELU_B)

/* u = k (x + a x^3), y = x (1 + tanh u) / 2,
 * dy/dx = (1 + t) / 2 + x (1 - t^2) k (1 + 3 a x^2) / 2 with t = tanh u. */
#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_A 0.044715
/* tanh u = 1 - 2 / (1 + e^(2u)): exp is far cheaper than libm's tanh and
 * saturates cleanly to +-1 */
#define GELU_T(T, x) ((T)1 - (T)2 / ((T)1 + exp((T)(2 * GELU_K) * ((x) + (T)GELU_A * (x) * (x) * (x)))))
#define GELU_F(T, x, p) ((T)0.5 * (x) * ((T)1 + GELU_T(T, x)))
#define GELU_D(T, x, t) \
    ((T)0.5 * ((T)1 + (t)) + (T)0.5 * (x) * ((T)1 - (t) * (t)) * (T)GELU_K * ((T)1 + (T)(3 * GELU_A) * (x) * (x)))
#define GELU_B(T, g, x, y, p) ((g)*GELU_D(T, x, GELU_T(T, x)))
TS_MAP_KERNELS(gelu, GELU_F, GELU_B)

/* exp of -|x| only, so neither branch overflows */
#define SIGMOID_F(T, x, p) ((x) >= 0 ? (T)1 / ((T)1 + exp(-(x))) : exp(x) / ((T)1 + exp(x)))
#define SIGMOID_B(T, g, x, y, p) ((g) * (y) * ((T)1 - (y)))
TS_MAP_KERNELS(sigmoid, SIGMOID_F, SIGMOID_B)

#define TANH_F(T, x, p) tanh(x)
#define TANH_B(T, g, x, y, p) ((g) * ((T)1 - (y) * (y)))
TS_MAP_KERNELS(tanh, TANH_F, TANH_B)

ts_tensor *ts_relu(ts_tensor *x) { return ts_map_apply(&relu_map, x, 0); }
ts_tensor *ts_gelu(ts_tensor *x) { return ts_map_apply(&gelu_map, x, 0); }
ts_tensor *ts_sigmoid(ts_tensor *x) { return ts_map_apply(&sigmoid_map, x, 0); }
ts_tensor *ts_tanh(ts_tensor *x) { return ts_map_apply(&tanh_map, x, 0); }
