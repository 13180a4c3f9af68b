/* serve_forward.c - the forward pass tessera-serve runs, timed alone.
 *
 * usage: bench_serve_forward CHECKPOINT_DIR|WEIGHTS[:JOB.json] BATCH... 
 * Loads the model as the server does (eval mode, no gradients) and, for
 * each batch size, runs forwards on random inputs for about a second after
 * a warm-up; prints "RESULT batch B median_ms M samples_per_s S" per size.
 * Threads: TESSERA_NUM_THREADS (OpenMP and OpenBLAS). bench/serve.sh runs
 * it beside ONNX Runtime (bench/serve_ort.js) at the same thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "kernels/autograd.h"
#include "kernels/threads.h"
#include "worker/model_open.h"

int main(int argc, char **argv) {
    ts_threads_passive(argv);
    if (argc < 3) {
        fprintf(stderr, "usage: bench_serve_forward CHECKPOINT_DIR|WEIGHTS[:JOB.json] BATCH...\n");
        return 2;
    }
    char *path = argv[1], *job = strrchr(path, ':');
    if (job) *job++ = '\0';
    ts_job j;
    ts_model_spec spec;
    ts_model *m = ts_worker_open_model(path, job, NULL, 0, &j, &spec);
    if (!m) {
        fprintf(stderr, "bench_serve_forward: %s\n", ts_last_error());
        return 1;
    }
    ts_grad_set_enabled(false);
    for (int a = 2; a < argc; a++) {
        int64_t b = atoll(argv[a]), shape[4];
        ts_dtype dt;
        int nd = ts_model_input_shape(&spec, b, shape, &dt);
        ts_tensor *x = ts_tensor_rand(ts_key_from_seed(1), TS_F32, nd, shape);
        double times[4096];
        int n = 0;
        for (int w = 0; w < 5; w++) ts_tensor_release(ts_model_forward(m, x));
        double start = bench_now_ms();
        while (n < 4096 && (n < 20 || bench_now_ms() - start < 1000)) {
            double t0 = bench_now_ms();
            ts_tensor *y = ts_model_forward(m, x);
            times[n++] = bench_now_ms() - t0;
            if (!y) {
                fprintf(stderr, "bench_serve_forward: %s\n", ts_last_error());
                return 1;
            }
            ts_tensor_release(y);
        }
        double med = bench_upper_median(times, (size_t)n);
        printf("RESULT batch %lld median_ms %.4f samples_per_s %.0f\n", (long long)b, med, (double)b / med * 1e3);
        ts_tensor_release(x);
    }
    ts_model_free(m);
    return 0;
}
