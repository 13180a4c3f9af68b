/* test_nccl.c - the NCCL backend of the communicator on one GPU: a
 * 1-rank communicator runs every operation on device buffers (in place
 * and out of place, f32 and bf16, blocking and started), and an aborted
 * communicator fails what comes after with "abandoned". Skips with one
 * line where there is no CUDA device. */
#include <string.h>

#include "collective/comm.h"
#include "gpu_testing.h"

static int failures;

static void expect(bool ok, const char *what) {
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, ok ? "" : ": ", ok ? "" : ts_last_error());
    failures += !ok;
}

/* A device tensor of n f32 values i * 0.5 - 3 (or bf16 of them). */
static ts_tensor *values(ts_dtype dt, int64_t n) {
    ts_tensor *h = ts_tensor_arange(TS_F32, 0, (double)n, 1);
    for (int64_t i = 0; i < n; i++) ts_tensor_set(h, i, i * 0.5 - 3);
    ts_tensor *c = ts_tensor_copy_as(h, dt), *d = ts_tensor_to(c, ts_cuda(0));
    ts_tensor_release(h);
    ts_tensor_release(c);
    return d;
}

static bool same(const ts_tensor *a, const ts_tensor *b) { return gpu_max_rel(a, b) == 0; }

int main(void) {
    gpu_require_device();
    if (ts_cuda_set_device(0)) return 1;
    ts_comm_config cfg = {.rank = 0, .size = 1, .generation = 1, .timeout_ms = 20000};
    const ts_comm_backend *be = ts_comm_backend_find("nccl");
    ts_comm *c = be ? ts_comm_create(be, &cfg) : NULL;
    expect(c != NULL, "1-rank NCCL communicator");
    if (!c) return 1;
    const int64_t n = 1000003;
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    for (int k = 0; k < 2; k++) {
        ts_dtype dt = dts[k];
        ts_tensor *a = values(dt, n), *b = values(dt, n), *ref = ts_tensor_to(a, TS_CPU);
        char what[96];
        ts_reduce_op ops[3] = {TS_REDUCE_SUM, TS_REDUCE_AVG, TS_REDUCE_MAX};
        for (int o = 0; o < 3; o++) {
            snprintf(what, sizeof what, "allreduce %s %s in place", ts_dtype_name(dt),
                     o == 0   ? "sum"
                     : o == 1 ? "avg"
                              : "max");
            expect(!ts_comm_allreduce(c, ts_tensor_data(a), ts_tensor_data(a), n, dt, ops[o]) && same(a, ref), what);
        }
        ts_tensor_fill_(b, 0);
        snprintf(what, sizeof what, "allreduce %s out of place", ts_dtype_name(dt));
        expect(!ts_comm_allreduce(c, ts_tensor_data(a), ts_tensor_data(b), n, dt, TS_REDUCE_SUM) && same(b, ref), what);
        ts_tensor_fill_(b, 0);
        snprintf(what, sizeof what, "reduce_scatter %s", ts_dtype_name(dt));
        expect(!ts_comm_reduce_scatter(c, ts_tensor_data(a), ts_tensor_data(b), n, dt, TS_REDUCE_SUM) && same(b, ref),
               what);
        ts_tensor_fill_(b, 0);
        snprintf(what, sizeof what, "allgather %s", ts_dtype_name(dt));
        expect(!ts_comm_allgather(c, ts_tensor_data(a), ts_tensor_data(b), n, dt) && same(b, ref), what);
        snprintf(what, sizeof what, "broadcast %s", ts_dtype_name(dt));
        expect(!ts_comm_broadcast(c, ts_tensor_data(a), n, dt, 0) && same(a, ref), what);
        ts_comm_op op = {.kind = TS_COMM_ALLREDUCE,
                         .send = ts_tensor_data(a),
                         .recv = ts_tensor_data(a),
                         .count = n,
                         .dtype = dt,
                         .op = TS_REDUCE_SUM,
                         .step = 4};
        ts_comm_req *r1, *r2;
        bool started = !ts_comm_start(c, &op, &r1) && !ts_comm_start(c, &op, &r2);
        expect(started && !ts_comm_wait(r1) && !ts_comm_wait(r2) && same(a, ref), "two started allreduces");
        ts_tensor_release(a);
        ts_tensor_release(b);
        ts_tensor_release(ref);
    }
    expect(!ts_comm_barrier(c), "barrier");
    ts_comm_abort(c);
    expect(ts_comm_barrier(c) && strstr(ts_last_error(), "abandoned"),
           "an aborted communicator fails later operations");
    ts_comm_free(c);
    printf("%s: %d NCCL checks failed\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
