/* test_cuda_host.c - the CUDA backend where there is no CUDA device (the
 * development machines): tensors on cuda:N, copies to them, ops on them,
 * pinned memory, streams and events are refused with an error naming the
 * device, never a crash; the allocator's stats stay zero; cuBLAS is not
 * loaded until the first GEMM. On a machine with a device, tests/gpu
 * covers the rest and this test skips it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/ops/backend.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/matmul.h"
#include "kernels/tensor.h"
#include "op_testing.h"
#if TESSERA_WITH_CUDA
#include "kernels/ops/cuda/runtime.h"
#endif

#if TESSERA_WITH_CUDA

/* True (after one line saying so) when a device is present. */
static bool device_present(void) {
    if (ts_cuda_device_count() == 0) return false;
    print_message("a CUDA device is present: tests/gpu covers the backend\n");
    return true;
}

/* True when a file whose name holds lib is mapped into this process. */
static bool mapped(const char *lib) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, lib) != NULL;
    fclose(f);
    return found;
}

/* cuBLAS costs every process that loads it a few tenths of a second, so
 * the backend opens it at the first GEMM: not before, and for good then
 * (the GEMM itself fails here for want of a device, after the opening). */
static void test_cublas_opened_at_first_gemm(void **state) {
    (void)state;
    assert_false(mapped("libcublas"));
    if (device_present()) return;
    const ts_backend *b = ts_backend_of("probe", ts_cuda(0));
    assert_non_null(b);
    float a = 1, x = 2, c = 0;
    assert_int_equal(b->matmul->gemm(TS_F32, false, false, 1, 1, 1, 1.0, &a, 1, &x, 1, 0.0, &c, 1), TS_ERR_DEVICE);
    assert_non_null(strstr(ts_last_error(), "matmul: CUDA says"));
    assert_true(mapped("libcublas"));
}

static void test_tensors_on_a_missing_device(void **state) {
    (void)state;
    if (device_present()) return;
    assert_non_null(ts_backend_of("probe", ts_cuda(0)));
    assert_string_equal(ts_backend_of("probe", ts_cuda(0))->name, "cuda");
    expect_error(ts_tensor_zeros_on(ts_cuda(0), TS_F32, SHAPE(4, 4)), "cuda:0: no CUDA device");
    expect_error(ts_tensor_empty_on(ts_cuda(3), TS_BF16, SHAPE(2)), "cuda:3: no CUDA device");
    ts_tensor *h = ts_tensor_ones(TS_F32, SHAPE(2, 3));
    expect_error(ts_tensor_to(h, ts_cuda(0)), "cuda:0: no CUDA device");
    /* a tensor that says cuda:0 (memory wrapped from elsewhere) reaches
     * the backend, which refuses to read it */
    static float host[6];
    ts_storage *s = ts_storage_wrap_on(ts_cuda(0), host, sizeof host, NULL, NULL);
    ts_tensor *x = ts_tensor_from_storage(s, TS_F32, 0, SHAPE(2, 3), NULL);
    ts_storage_release(s);
    assert_non_null(x);
    expect_error(ts_tensor_to(x, TS_CPU), "no CUDA device");
    assert_true(isnan(ts_tensor_item(x)));
    expect_error(ts_add(x, x), "no CUDA device");
    expect_error(ts_matmul(h, x), "matmul: expected all tensors on the same device, got cpu and cuda:0");
    ts_tensor_release(x);
    ts_tensor_release(h);
}

static void test_runtime_without_device(void **state) {
    (void)state;
    if (device_present()) return;
    assert_int_equal(ts_cuda_device_count(), 0);
    assert_int_equal(ts_cuda_set_device(0), TS_ERR_DEVICE);
    assert_non_null(strstr(ts_last_error(), "cuda:0: no CUDA device"));
    assert_int_equal(ts_cuda_synchronize(1), TS_ERR_DEVICE);
    assert_null(ts_cuda_alloc(0, 1024));
    assert_null(ts_cuda_stream_new(0));
    assert_non_null(strstr(ts_last_error(), "no CUDA device"));
    ts_alloc_stats st = ts_cuda_memory_stats(0);
    assert_int_equal(st.allocated, 0);
    assert_int_equal(st.reserved, 0);
    ts_cuda_reset_peak(0);
    ts_cuda_empty_cache(0);
    ts_cuda_free(0, NULL, 0);
    ts_cuda_host_free(NULL);
    void *p = ts_cuda_host_alloc(4096);
    if (p) ts_cuda_host_free(p); /* some drivers pin without a device */
    else assert_non_null(strstr(ts_last_error(), "pinned host memory: 4096 bytes refused"));
    ts_cuda_set_tf32(true);
    assert_true(ts_cuda_tf32());
    ts_cuda_set_tf32(false);
    assert_false(ts_cuda_tf32());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cublas_opened_at_first_gemm),
        cmocka_unit_test(test_tensors_on_a_missing_device),
        cmocka_unit_test(test_runtime_without_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void) {
    printf("skipped: built without CUDA\n");
    return 0;
}

#endif
