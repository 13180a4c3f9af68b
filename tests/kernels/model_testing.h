/* model_testing.h - helpers shared by the whole-model training tests
 * (gradient accumulation, mixed precision): fixed synthetic data for a model
 * spec and the mean cross-entropy over a slice of it. Include after
 * <cmocka.h>. */
#ifndef TS_TESTS_MODEL_TESTING_H
#define TS_TESTS_MODEL_TESTING_H

#include "kernels/nn/models.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/view.h"
#include "kernels/tensor.h"

/* n samples for spec: uniform inputs with labels i*7 mod classes, or for
 * token models uniform tokens in [0, classes) with targets tok*5+1 mod
 * classes. Same data on every call. */
static inline void synth_data(const ts_model_spec *spec, int64_t n, int64_t classes, ts_tensor **x, ts_tensor **y) {
    int64_t shape[TS_MAX_DIMS];
    ts_dtype dt;
    int nd = ts_model_input_shape(spec, n, shape, &dt);
    ts_tensor *u = ts_tensor_rand(ts_key_from_seed(5), TS_F32, nd, shape);
    assert_non_null(u);
    if (dt == TS_I64) {
        *x = ts_tensor_empty(TS_I64, nd, shape);
        *y = ts_tensor_empty(TS_I64, nd, shape);
        for (int64_t i = 0; i < ts_tensor_numel(u); i++) {
            int64_t tok = (int64_t)(ts_tensor_get(u, i) * (double)classes);
            ts_tensor_set(*x, i, (double)tok);
            ts_tensor_set(*y, i, (double)((tok * 5 + 1) % classes));
        }
        ts_tensor_release(u);
    } else {
        *x = u;
        *y = ts_tensor_empty(TS_I64, 1, (int64_t[]){n});
        for (int64_t i = 0; i < n; i++) ts_tensor_set(*y, i, (double)((i * 7) % classes));
    }
}

/* Mean cross-entropy of m over samples [first, first + n) of (x, y), the
 * logits' last dim being classes. */
static inline ts_tensor *slice_loss(ts_model *m, ts_tensor *x, ts_tensor *y, int64_t classes, int64_t first,
                                    int64_t n) {
    ts_tensor *xs = ts_narrow(x, 0, first, n), *ys = ts_narrow(y, 0, first, n);
    ts_tensor *out = ts_model_forward(m, xs);
    assert_non_null(out);
    ts_tensor *flat = ts_reshape(out, 2, (int64_t[]){-1, classes});
    ts_tensor *yflat = ts_reshape(ys, 1, (int64_t[]){-1});
    ts_tensor *loss = ts_cross_entropy(flat, yflat, -100, TS_REDUCTION_MEAN);
    assert_non_null(loss);
    ts_tensor *all[] = {xs, ys, out, flat, yflat};
    for (int i = 0; i < 5; i++) ts_tensor_release(all[i]);
    return loss;
}

#endif
