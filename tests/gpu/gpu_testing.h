/* gpu_testing.h - what the GPU tests share: the skip on machines without
 * a CUDA device, copies to and from the device, and comparisons. */
#ifndef TS_TESTS_GPU_TESTING_H
#define TS_TESTS_GPU_TESTING_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/ops/cuda/runtime.h"
#include "kernels/tensor.h"

/* The exit status ctest reads as "skipped" (SKIP_RETURN_CODE). */
#define GPU_SKIP 77

/* Exits with GPU_SKIP after one line when there is no CUDA device. */
static inline void gpu_require_device(void) {
    if (ts_cuda_device_count() > 0) return;
    printf("no CUDA device: skipped\n");
    exit(GPU_SKIP);
}

/* A leaf copy of host tensor t on cuda:0 (requires_grad as t's), or exits. */
static inline ts_tensor *gpu_leaf(const ts_tensor *t) {
    ts_tensor *g = ts_tensor_to(t, ts_cuda(0));
    if (!g) {
        fprintf(stderr, "upload: %s\n", ts_last_error());
        exit(1);
    }
    g->requires_grad = t->requires_grad;
    return g;
}

/* Largest |a - b| / (1 + |b|) over the elements of a (any device) and b
 * (host), same numel; reports where it is. */
static inline double gpu_max_rel(const ts_tensor *a, const ts_tensor *b) {
    ts_tensor *h = ts_tensor_to(a, TS_CPU);
    if (!h) return INFINITY;
    double worst = 0;
    int64_t n = ts_tensor_numel(h);
    if (n != ts_tensor_numel(b)) worst = INFINITY;
    for (int64_t i = 0; i < n && worst < INFINITY; i++) {
        double x = ts_tensor_get(h, i), y = ts_tensor_get(b, i), d = fabs(x - y) / (1 + fabs(y));
        if (isnan(x) != isnan(y)) d = INFINITY;
        if (d > worst) worst = d;
    }
    ts_tensor_release(h);
    return worst;
}

#endif
