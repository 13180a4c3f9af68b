/* activation.c - relu, gelu (tanh form), sigmoid, tanh: maps of the
 * pointwise driver (elementwise.h), each element function and its
 * derivative side by side in the device's pointwise kernels. */
#include "kernels/ops/activation.h"

#include "kernels/ops/elementwise.h"

ts_tensor *ts_relu(ts_tensor *x) { return ts_map_apply(TS_MAP_RELU, x, 0); }
ts_tensor *ts_gelu(ts_tensor *x) { return ts_map_apply(TS_MAP_GELU, x, 0); }
ts_tensor *ts_sigmoid(ts_tensor *x) { return ts_map_apply(TS_MAP_SIGMOID, x, 0); }
ts_tensor *ts_tanh(ts_tensor *x) { return ts_map_apply(TS_MAP_TANH, x, 0); }
