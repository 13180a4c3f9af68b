/* test_onnx.c - ONNX export judged by real ONNX tools.
 *
 * An MLP, the CNN and a GPT (random weights, every vector parameter too)
 * are exported with ts_onnx_export and by `tessera-run --export-onnx` from a
 * weights file and a job. ONNX's checker with full shape inference
 * (tests/launch/onnx_check.py, /usr/bin/python3 with python3-onnx) accepts
 * every file, and ONNX Runtime (tests/launch/onnx_ort.js, onnxruntime-node)
 * reproduces Tessera's logits within 1e-4 at two batch sizes (the GPT also
 * at two sequence lengths, one of them the whole block). The export's own
 * validation refuses a model missing an initializer, one whose nodes are out
 * of order and bytes that are no model, naming what is wrong. Both tools
 * come with scripts/install-deps.sh; the test fails without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kernels/autograd.h"
#include "kernels/io/onnx.h"
#include "kernels/io/safetensors.h"

#if !TESSERA_WITH_ONNX
int main(void) {
    fprintf(stderr, "test_onnx: this build has no ONNX support (scripts/install-deps.sh installs protobuf-c-compiler, "
                    "libprotobuf-c-dev and libonnx-dev; then rebuild)\n");
    return 1;
}
#else
#include "onnx/onnx.pb-c.h"
#include "proto/job_model.h"
#include "../test_util.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    return tu_make_tmp_dir(dir, sizeof dir, "tessera_onnx");
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

/* Runs a shell command; fails the test unless it exits 0. */
static void must_run(const char *cmd) {
    printf("$ %s\n", cmd);
    fflush(stdout);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
        fail_msg("'%s' failed (exit %d)", cmd, rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
}

static const char *source_dir(void) {
    const char *s = getenv("TESSERA_SOURCE_DIR");
    return s ? s : ".";
}

/* Writes input x and m's logits on it as <tag>_io<k>.safetensors. */
static void write_io(ts_model *m, const char *tag, int k, ts_tensor *x) {
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *y = ts_model_forward(m, x);
    ts_grad_set_enabled(prev);
    assert_non_null(y);
    char path[256];
    snprintf(path, sizeof path, "%s/%s_io%d.safetensors", dir, tag, k);
    const char *names[] = {"input", "logits"};
    ts_tensor *ts[] = {x, y};
    assert_int_equal(ts_safetensors_write(path, 2, names, ts, 0, NULL, NULL), TS_OK);
    ts_tensor_release(y);
}

/* Random inputs of b samples (T tokens for the GPT) for spec. */
static ts_tensor *make_input(const ts_model_spec *s, int64_t b, int64_t T, uint64_t seed) {
    int64_t shape[TS_MAX_DIMS];
    ts_dtype dt;
    int nd = ts_model_input_shape(s, b, shape, &dt);
    if (dt == TS_I64) shape[1] = T;
    ts_tensor *u = ts_tensor_rand(ts_key_from_seed(seed), TS_F32, nd, shape);
    assert_non_null(u);
    if (dt != TS_I64) return u;
    ts_tensor *ids = ts_tensor_empty(TS_I64, nd, shape);
    for (int64_t i = 0; i < ts_tensor_numel(u); i++) ts_tensor_set(ids, i, (double)(int64_t)(ts_tensor_get(u, i) * 256));
    ts_tensor_release(u);
    return ids;
}

/* Builds spec with random weights (vectors too, so a LayerNorm's or a
 * bias's place shows), exports it as <tag>.onnx and writes two inputs with
 * their logits. */
static void export_case(const char *tag, const ts_model_spec *s, int64_t b0, int64_t b1, int64_t t0, int64_t t1) {
    ts_model *m = ts_model_build(s, 0, -1, ts_key_from_seed(11), TS_F32);
    assert_non_null(m);
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].ndim == 1) {
            ts_tensor *r = ts_tensor_rand(ts_key_from_seed(100 + (uint64_t)i), TS_F32, 1, m->params[i].shape);
            assert_int_equal(ts_tensor_copy_(m->params[i].value, r), TS_OK);
            ts_tensor_release(r);
        }
    ts_model_train(m, false);
    char path[256];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, tag);
    if (ts_onnx_export(m, s, path)) fail_msg("%s", ts_last_error());
    ts_tensor *x0 = make_input(s, b0, t0, 1), *x1 = make_input(s, b1, t1, 2);
    write_io(m, tag, 0, x0);
    write_io(m, tag, 1, x1);
    ts_tensor_release(x0);
    ts_tensor_release(x1);
    ts_model_free(m);
}

static void test_runtimes_agree(void **state) {
    (void)state;
    ts_model_spec mlp = {.arch = TS_ARCH_MLP, .n_widths = 4, .widths = {784, 32, 16, 10}};
    ts_model_spec cnn = {.arch = TS_ARCH_CNN, .in_ch = 1, .img = 28, .ch1 = 4, .ch2 = 8, .kernel = 5, .classes = 10};
    ts_model_spec gpt = {.arch = TS_ARCH_GPT};
    gpt.gpt = (ts_gpt_config){256, 16, 2, 2, 32, 0.0};
    export_case("mlp", &mlp, 5, 1, 0, 0);
    export_case("cnn", &cnn, 3, 7, 0, 0);
    export_case("gpt", &gpt, 2, 3, 11, 16);

    /* the command line, from a weights file and the MLP example job */
    ts_job job;
    ts_model_spec spec;
    assert_int_equal(ts_job_load("examples/mlp_fashion.json", NULL, 0, &job), TS_OK);
    assert_int_equal(ts_job_model_spec(&job, &spec), TS_OK);
    ts_model *m = ts_model_build(&spec, 0, -1, ts_key_from_seed(3), TS_F32);
    assert_non_null(m);
    const char *names[16];
    ts_tensor *values[16];
    for (int i = 0; i < m->n_params; i++) {
        names[i] = m->params[i].name;
        values[i] = m->params[i].value;
    }
    char cmd[2048], weights[256];
    snprintf(weights, sizeof weights, "%s/mlp_weights.safetensors", dir);
    assert_int_equal(ts_safetensors_write(weights, m->n_params, names, values, 0, NULL, NULL), TS_OK);
    ts_model_free(m);
    const char *bin = getenv("TESSERA_BIN_DIR");
    snprintf(cmd, sizeof cmd, "%s/tessera-run --export-onnx %s examples/mlp_fashion.json -o %s/cli.onnx",
             bin ? bin : "build/bin", weights, dir);
    must_run(cmd);

    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/launch/onnx_check.py %s/mlp.onnx %s/cnn.onnx %s/gpt.onnx %s/cli.onnx",
             source_dir(), dir, dir, dir, dir);
    must_run(cmd);
    snprintf(cmd, sizeof cmd, "node %s/tests/launch/onnx_ort.js %s mlp cnn gpt", source_dir(), dir);
    must_run(cmd);
}

/* The exported MLP, unpacked. */
static Onnx__ModelProto *load_mlp(void) {
    ts_model_spec mlp = {.arch = TS_ARCH_MLP, .n_widths = 3, .widths = {784, 16, 10}};
    ts_model *m = ts_model_build(&mlp, 0, -1, ts_key_from_seed(1), TS_F32);
    char path[256];
    snprintf(path, sizeof path, "%s/small.onnx", dir);
    assert_int_equal(ts_onnx_export(m, &mlp, path), TS_OK);
    ts_model_free(m);
    assert_int_equal(ts_onnx_check_file(path), TS_OK);
    FILE *f = fopen(path, "rb");
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    Onnx__ModelProto *p = onnx__model_proto__unpack(NULL, n, buf);
    assert_non_null(p);
    return p;
}

/* ts_onnx_check of p fails with a message holding want. */
static void expect_refused(const Onnx__ModelProto *p, const char *want) {
    size_t n = onnx__model_proto__get_packed_size(p);
    uint8_t *buf = malloc(n);
    onnx__model_proto__pack(p, buf);
    assert_int_not_equal(ts_onnx_check(buf, n, "broken.onnx"), TS_OK);
    printf("  refused: %s\n", ts_last_error());
    if (!strstr(ts_last_error(), want)) fail_msg("'%s' not in: %s", want, ts_last_error());
    free(buf);
}

static void test_validation_refuses(void **state) {
    (void)state;
    Onnx__ModelProto *p = load_mlp();
    Onnx__GraphProto *g = p->graph;
    /* a missing initializer: drop fc1.weight */
    size_t ni = g->n_initializer, k = 0;
    while (k < ni && strcmp(g->initializer[k]->name, "fc1.weight")) k++;
    assert_true(k < ni);
    Onnx__TensorProto *dropped = g->initializer[k];
    g->initializer[k] = g->initializer[ni - 1];
    g->n_initializer = ni - 1;
    expect_refused(p, "reads 'fc1.weight'");
    g->initializer[k] = dropped;
    g->n_initializer = ni;
    /* a broken graph: the last node first, before what it reads exists */
    Onnx__NodeProto *last = g->node[g->n_node - 1];
    memmove(g->node + 1, g->node, sizeof *g->node * (g->n_node - 1));
    g->node[0] = last;
    expect_refused(p, "no graph input, initializer or output of an earlier node");
    /* an unknown operator */
    char *op = last->op_type;
    last->op_type = "FancyOp";
    expect_refused(p, "'FancyOp'");
    last->op_type = op;
    onnx__model_proto__free_unpacked(p, NULL);
    /* bytes that are no model */
    uint8_t junk[64];
    memset(junk, 0xff, sizeof junk);
    assert_int_not_equal(ts_onnx_check(junk, sizeof junk, "junk.onnx"), TS_OK);
    assert_non_null(strstr(ts_last_error(), "not an ONNX model"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtimes_agree),
        cmocka_unit_test(test_validation_refuses),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
#endif
