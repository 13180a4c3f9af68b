/* test_device.c - devices and the kernel table: device names, the errors
 * for tensors on different devices and for a device without kernels, ops
 * dispatched to a registered backend (a stand-in device whose memory is
 * its own and whose kernels are the CPU's), copies between devices, and
 * gradient hooks that fail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/autograd.h"
#include "kernels/ops/activation.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/norm.h"
#include "kernels/ops/reduce.h"
#include "kernels/ops/softmax.h"
#include "kernels/ops/view.h"
#include "kernels/tensor.h"
#include "op_testing.h"

/* ---- names ---- */

static void test_device_names_and_parsing(void **state) {
    (void)state;
    assert_string_equal(ts_device_name(TS_CPU), "cpu");
    assert_string_equal(ts_device_name(ts_cuda(0)), "cuda:0");
    assert_string_equal(ts_device_name(ts_cuda(3)), "cuda:3");
    ts_device d;
    assert_int_equal(ts_device_parse("cpu", &d), TS_OK);
    assert_true(ts_device_equal(d, TS_CPU));
    assert_int_equal(ts_device_parse("cuda", &d), TS_OK);
    assert_true(ts_device_equal(d, ts_cuda(0)));
    assert_int_equal(ts_device_parse("cuda:2", &d), TS_OK);
    assert_true(ts_device_equal(d, ts_cuda(2)));
    const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "", NULL};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(ts_device_parse(bad[i], &d), TS_ERR_VALUE);
        assert_non_null(strstr(ts_last_error(), "is not a device"));
    }
}

/* A tensor whose storage says cuda:index but is host memory nobody may
 * read through a kernel (the checks must stop every op first). */
static ts_tensor *unbacked_on(ts_device d, int nd, const int64_t *shape) {
    static float host[64];
    ts_storage *s = ts_storage_wrap_on(d, host, sizeof host, NULL, NULL);
    ts_tensor *t = ts_tensor_from_storage(s, TS_F32, 0, nd, shape, NULL);
    ts_storage_release(s);
    assert_non_null(t);
    return t;
}

/* ---- errors, before any backend is registered for cuda ---- */

static void test_mixed_devices_are_refused(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_ones(TS_F32, SHAPE(2, 3)), *b = unbacked_on(ts_cuda(0), SHAPE(3, 2));
    expect_error(ts_matmul(a, b), "matmul: expected all tensors on the same device, got cpu and cuda:0");
    ts_tensor *c = unbacked_on(ts_cuda(1), SHAPE(2, 3));
    expect_error(ts_add(a, c), "add: expected all tensors on the same device, got cpu and cuda:1");
    ts_tensor *w = ts_tensor_ones(TS_F32, SHAPE(3));
    expect_error(ts_layernorm(c, w, NULL, 1e-5), "layernorm: expected all tensors on the same device, got cuda:1 and cpu");
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(c);
    ts_tensor_release(w);
}

static void test_device_without_kernels(void **state) {
    (void)state;
    if (ts_backend_of("probe", ts_cuda(0))) {
        print_message("skipped: this build has kernels for cuda\n");
        return;
    }
    ts_tensor *x = unbacked_on(ts_cuda(0), SHAPE(2, 3));
    expect_error(ts_layernorm(x, NULL, NULL, 1e-5), "layernorm: no kernels for device cuda:0 in this build");
    expect_error(ts_softmax(x, -1), "softmax: no kernels for device cuda:0 in this build");
    expect_error(ts_tensor_empty_on(ts_cuda(0), TS_F32, SHAPE(4)), "no kernels for device cuda:0 in this build");
    expect_error(ts_tensor_to(x, TS_CPU), "no kernels for device cuda:0 in this build");
    ts_tensor_release(x);
}

/* ---- a stand-in device: its own memory, the CPU's kernels ---- */

static ts_backend fake;
static ts_memory_kernels fake_memory;
static int64_t fake_live; /* bytes allocated on the stand-in device */

static void *fake_alloc(int index, size_t n) {
    assert_int_equal(index, 0);
    fake_live += (int64_t)n;
    return malloc(n ? n : 1);
}

static void fake_free(int index, void *p, size_t n) {
    (void)index;
    fake_live -= (int64_t)n;
    free(p);
}

static void register_fake_cuda(void) {
    if (fake.name) return;
    const ts_backend *cpu = ts_backend_cpu();
    assert_non_null(cpu);
    fake = *cpu;
    fake.name = "fake cuda";
    fake_memory = *cpu->memory;
    fake_memory.alloc = fake_alloc;
    fake_memory.free = fake_free;
    fake.memory = &fake_memory;
    assert_int_equal(ts_backend_register(TS_DEVICE_CUDA, &fake), TS_OK);
}

/* The values of t (any device) as a CPU tensor. */
static ts_tensor *on_host(const ts_tensor *t) {
    ts_tensor *h = ts_tensor_to(t, TS_CPU);
    assert_non_null(h);
    assert_true(ts_device_equal(ts_tensor_device(h), TS_CPU));
    return h;
}

static void assert_same_values(const ts_tensor *a, const ts_tensor *b) {
    ts_tensor *ha = on_host(a), *hb = on_host(b);
    assert_int_equal(ts_tensor_numel(ha), ts_tensor_numel(hb));
    for (int64_t i = 0; i < ts_tensor_numel(ha); i++) assert_true(ts_tensor_get(ha, i) == ts_tensor_get(hb, i));
    ts_tensor_release(ha);
    ts_tensor_release(hb);
}

static void test_copies_between_devices(void **state) {
    (void)state;
    register_fake_cuda();
    int64_t live = fake_live;
    ts_tensor *x = ts_tensor_arange(TS_F32, 0, 12, 1), *x2 = ts_reshape(x, SHAPE(3, 4));
    ts_tensor *xt = ts_transpose(x2, 0, 1); /* a strided view goes over whole */
    ts_tensor *d = ts_tensor_to(xt, ts_cuda(0));
    assert_non_null(d);
    assert_true(ts_device_equal(ts_tensor_device(d), ts_cuda(0)));
    assert_true(fake_live > live);
    assert_same_values(d, xt);
    assert_true(ts_tensor_item(d) == 0.0);
    /* copy_ from the device into a strided CPU view, and back */
    ts_tensor *back = ts_tensor_zeros(TS_F32, SHAPE(3, 4)), *bt = ts_transpose(back, 0, 1);
    assert_int_equal(ts_tensor_copy_(bt, d), TS_OK);
    assert_same_values(back, x2);
    ts_tensor *z = ts_tensor_zeros_on(ts_cuda(0), TS_F64, SHAPE(4, 3));
    assert_int_equal(ts_tensor_copy_(z, xt), TS_OK); /* converting on the way */
    assert_same_values(z, xt);
    ts_tensor *to[] = {x, x2, xt, d, back, bt, z};
    for (int i = 0; i < 7; i++) ts_tensor_release(to[i]);
    assert_int_equal(fake_live, live);
}

/* A small model's loss on whatever device its inputs are. */
static ts_tensor *small_model(ts_tensor *x, ts_tensor *w, ts_tensor *lnw, ts_tensor *targets) {
    ts_tensor *h = ts_matmul(x, w), *n = h ? ts_layernorm(h, lnw, NULL, 1e-5) : NULL;
    ts_tensor *a = n ? ts_gelu(n) : NULL, *s = a ? ts_softmax(a, -1) : NULL;
    ts_tensor *l = s ? ts_cross_entropy(s, targets, -100, TS_REDUCTION_MEAN) : NULL;
    ts_tensor_release(h);
    ts_tensor_release(n);
    ts_tensor_release(a);
    ts_tensor_release(s);
    return l;
}

static void test_ops_run_on_the_inputs_device(void **state) {
    (void)state;
    register_fake_cuda();
    ts_tensor *x = leaf_of(1, TS_F32, SHAPE(6, 5)), *w = leaf_of(2, TS_F32, SHAPE(5, 8));
    ts_tensor *lnw = leaf_of(3, TS_F32, SHAPE(8));
    ts_tensor *t = ts_tensor_zeros(TS_I64, SHAPE(6));
    for (int i = 0; i < 6; i++) ts_tensor_set(t, i, i);
    /* on the CPU */
    ts_tensor *loss = small_model(x, w, lnw, t);
    assert_non_null(loss);
    assert_int_equal(ts_backward(loss, NULL), TS_OK);
    ts_tensor *gx = ts_tensor_copy_as(x->grad, TS_F32), *gw = ts_tensor_copy_as(w->grad, TS_F32);
    ts_zero_grad(x);
    ts_zero_grad(w);
    ts_zero_grad(lnw);
    /* the same through the stand-in device: leaves moved differentiably */
    ts_device cuda = ts_cuda(0);
    ts_tensor *dx = ts_to_device(x, cuda), *dw = ts_to_device(w, cuda), *dl = ts_to_device(lnw, cuda);
    ts_tensor *dt = ts_tensor_to(t, cuda);
    ts_tensor *dloss = small_model(dx, dw, dl, dt);
    assert_non_null(dloss);
    assert_true(ts_device_equal(ts_tensor_device(dloss), cuda));
    assert_same_values(dloss, loss);
    assert_int_equal(ts_backward(dloss, NULL), TS_OK);
    assert_true(ts_device_equal(ts_tensor_device(x->grad), TS_CPU));
    assert_same_values(x->grad, gx);
    assert_same_values(w->grad, gw);
    /* attention and a reduction keep their outputs there too */
    ts_tensor *q = ts_tensor_randn(ts_key_from_seed(4), TS_F32, SHAPE(1, 2, 5, 4)), *dq = ts_tensor_to(q, cuda);
    ts_tensor *o = ts_attention(dq, dq, dq, true, 0), *r = ts_sum_all(dq), *ro = ts_sum_all(q);
    assert_true(ts_device_equal(ts_tensor_device(o), cuda) && ts_device_equal(ts_tensor_device(r), cuda));
    assert_same_values(r, ro);
    ts_tensor *rel[] = {x, w, lnw, t, loss, gx, gw, dx, dw, dl, dt, dloss, q, dq, o, r, ro};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) ts_tensor_release(rel[i]);
}

static void test_registering_the_cpu_is_refused(void **state) {
    (void)state;
    assert_int_equal(ts_backend_register(TS_DEVICE_CPU, ts_backend_cpu()), TS_ERR_VALUE);
    assert_int_equal(ts_backend_register(TS_DEVICE_CUDA, NULL), TS_ERR_VALUE);
}

/* ---- gradient hooks ---- */

typedef struct {
    int calls, fail_at;
} hook_state;

static ts_status counting_hook(ts_tensor *t, void *ctx) {
    hook_state *h = ctx;
    h->calls++;
    if (h->calls == h->fail_at)
        return ts_error(TS_ERR_PEER, "bucket of %s: the all-reduce did not start (call %d)", ts_shape_str(t), h->calls);
    return TS_OK;
}

static void test_failing_grad_hook_stops_backward(void **state) {
    (void)state;
    ts_tensor *a = leaf(5, SHAPE(3)), *b = leaf(6, SHAPE(3));
    hook_state ha = {0, 0}, hb = {0, 1};
    a->grad_hook = counting_hook;
    a->grad_hook_ctx = &ha;
    b->grad_hook = counting_hook;
    b->grad_hook_ctx = &hb;
    /* y = sum(a * b) + sum(b): b's hook runs (and fails) once both its
     * gradients are in; the pass stops there, before a's last one */
    ts_tensor *p = ts_mul(a, b), *s1 = ts_sum_all(p), *s2 = ts_sum_all(b), *y = ts_add(s1, s2);
    assert_int_equal(ts_backward(y, NULL), TS_ERR_PEER);
    assert_string_equal(ts_last_error(), "bucket of [3]: the all-reduce did not start (call 1)");
    assert_int_equal(hb.calls, 1);
    for (int i = 0; i < 3; i++) assert_true(ts_tensor_get(b->grad, i) == ts_tensor_get(a, i) + 1.0);
    /* a hook that succeeds runs once per pass, after the leaf's last gradient */
    ha = (hook_state){0, 0};
    hb = (hook_state){0, 0};
    ts_tensor *p2 = ts_mul(a, b), *s3 = ts_sum_all(p2), *y2 = ts_add(s3, b), *y3 = ts_sum_all(y2);
    assert_int_equal(ts_backward(y3, NULL), TS_OK);
    assert_int_equal(ha.calls, 1);
    assert_int_equal(hb.calls, 1);
    /* and on a leaf differentiated by itself */
    ts_tensor *c = leaf(7, SHAPE(1));
    hook_state hc = {0, 1};
    c->grad_hook = counting_hook;
    c->grad_hook_ctx = &hc;
    assert_int_equal(ts_backward(c, NULL), TS_ERR_PEER);
    ts_tensor *rel[] = {a, b, p, s1, s2, y, p2, s3, y2, y3, c};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) ts_tensor_release(rel[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_names_and_parsing),
        cmocka_unit_test(test_mixed_devices_are_refused),
        cmocka_unit_test(test_device_without_kernels),
        cmocka_unit_test(test_registering_the_cpu_is_refused),
        cmocka_unit_test(test_copies_between_devices),
        cmocka_unit_test(test_ops_run_on_the_inputs_device),
        cmocka_unit_test(test_failing_grad_hook_stops_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
