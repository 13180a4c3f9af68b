/* clip.c - squared norms, scaling and clip-by-global-norm of flat ranges. */
#include "kernels/optim/clip.h"

#include <math.h>

#include "kernels/optim/mixed.h"

double ts_clip_sq_norm(const float *g, int64_t len) {
    double sum = 0;
    ts_mixed_kernels()->sq_norm(g, len, &sum);
    return sum;
}

void ts_clip_scale(float *g, int64_t len, float factor) { ts_mixed_kernels()->scale(g, len, factor); }

double ts_clip_coef(double total_norm, double max_norm) {
    double c = max_norm / (total_norm + 1e-6);
    return c > 1.0 ? 1.0 : c; /* NaN stays NaN, like torch.clamp */
}

ts_status ts_clip_grad_norm(float *g, int64_t len, double max_norm, bool error_if_nonfinite, double *total_norm) {
    if (len < 0 || (len > 0 && !g))
        return ts_error(TS_ERR_VALUE, "clip_grad_norm: bad gradient range (%lld elements%s)", (long long)len,
                        g ? "" : ", NULL buffer");
    if (!(max_norm > 0) || isinf(max_norm))
        return ts_error(TS_ERR_VALUE, "clip_grad_norm: max_norm = %g must be finite and > 0", max_norm);
    double norm = sqrt(ts_clip_sq_norm(g, len));
    if (total_norm) *total_norm = norm;
    if (error_if_nonfinite && !isfinite(norm))
        return ts_error(TS_ERR_VALUE, "clip_grad_norm: the total norm of %lld gradients is %g", (long long)len, norm);
    ts_clip_scale(g, len, (float)ts_clip_coef(norm, max_norm));
    return TS_OK;
}
