/* conv_bias_t.h - the conv2d bias gradient of one dtype (a dtype
 * template, see cpu.h; included by conv.c). */
#include "kernels/ops/cpu/dtype.h"

/* db[o] = sum of dout[n][o][l]: per-image sums in T, totals in double. */
static void FN(bias_grad)(const ts_conv_geom *g, const T *dout, T *db) {
    int64_t L = g->Ho * g->Wo;
#pragma omp parallel for schedule(static) if (g->N * g->O * L > TS_PAR_MIN)
    for (int64_t o = 0; o < g->O; o++) {
        double s = 0;
        for (int64_t n = 0; n < g->N; n++) {
            const T *r = dout + (n * g->O + o) * L;
            T sn = 0;
#pragma omp simd reduction(+ : sn)
            for (int64_t l = 0; l < L; l++) sn += r[l];
            s += sn;
        }
        db[o] = (T)s;
    }
}
