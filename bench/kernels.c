/* kernels.c - Tessera vs PyTorch on the issue-2 kernels, in one run.
 *
 * Cases: matmul [4096x768]·[768x3072] forward and its two backward GEMMs
 * (dA = dC·Bᵀ, dB = Aᵀ·dC, on transposed views as backward passes them),
 * layernorm [8,256,768] forward+backward, causal attention [8,8,256,64]
 * forward+backward; each at 1 and 2 threads (ts_threads_set, the
 * TESSERA_NUM_THREADS knob; torch.set_num_threads plus OpenBLAS's count)
 * and under every CPU capability this machine offers: the bench runs
 * itself again per capability with TESSERA_CPU_CAPABILITY set, each run
 * against its own PyTorch server whose own kernels are held to the same
 * vector ISA (bench_torch_isa_env). The first line gives the CPU model and
 * its measured FMA peak (fma_peak.h).
 * The PyTorch side is bench/kernels_torch.py, run by /usr/bin/python3 as a
 * server: each repetition runs Tessera then PyTorch, so load on a shared
 * machine hits both alike. Times are medians of the repetitions after
 * warm-up; the ratio is Tessera / PyTorch (< 1: Tessera faster). Like
 * tessera-run, the bench first makes idle OpenMP and OpenBLAS workers
 * sleep (ts_threads_passive); the PyTorch server inherits it.
 *
 * usage: bench_kernels [--reps N] [--warmup N] [--threads 1,2] [--cases matmul,layernorm,attention]
 *                      [--capabilities default,avx2,avx512] [--torch-native] [--cpu-time]
 * (--torch-native: PyTorch keeps its best vector ISA in every row;
 * --cpu-time: both sides timed by process CPU time, for a loaded machine,
 * meaningful at one thread)
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "fma_peak.h"
#include "kernels/autograd.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/cpu/capability.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/norm.h"
#include "kernels/ops/view.h"
#include "kernels/tensor.h"
#include "kernels/threads.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define MAX_REPS 64

static void die(const char *what) {
    fprintf(stderr, "bench_kernels: %s: %s\n", what, ts_last_error());
    exit(1);
}

static double median(double *t, int n) {
    bench_sort(t, (size_t)n);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* ---- the PyTorch server ---- */

static FILE *py_in, *py_out;
static pid_t py_pid;

static void torch_start(void) {
    int to[2], from[2];
    if (pipe(to) || pipe(from)) {
        perror("bench_kernels: pipe");
        exit(1);
    }
    py_pid = fork();
    if (py_pid < 0) {
        perror("bench_kernels: fork");
        exit(1);
    }
    if (py_pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execl("/usr/bin/python3", "python3", TESSERA_SOURCE_DIR "/bench/kernels_torch.py", (char *)NULL);
        perror("bench_kernels: exec /usr/bin/python3");
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    py_in = fdopen(to[1], "w");
    py_out = fdopen(from[0], "r");
}

/* Sends one request and returns the reply line (static buffer). */
static const char *torch_ask(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *torch_ask(const char *fmt, ...) {
    static char line[256];
    va_list ap;
    va_start(ap, fmt);
    vfprintf(py_in, fmt, ap);
    va_end(ap);
    fputc('\n', py_in);
    fflush(py_in);
    if (!fgets(line, sizeof line, py_out) || !strncmp(line, "error", 5)) {
        fprintf(stderr, "bench_kernels: the PyTorch side failed (is torch importable by /usr/bin/python3?)\n");
        exit(1);
    }
    line[strcspn(line, "\n")] = 0;
    return line;
}

static void torch_stop(void) {
    fclose(py_in);
    fclose(py_out);
    waitpid(py_pid, NULL, 0);
}

/* ---- cases ---- */

/* A case: its tensors and one run (returns 0 on success). */
typedef struct bench_case bench_case;
struct bench_case {
    const char *name;
    int rep_scale; /* cheap cases run more repetitions */
    ts_tensor *t[5];
    int (*run)(bench_case *c);
};

static ts_tensor *randn(uint64_t seed, int nd, const int64_t *shape, bool grad) {
    ts_tensor *t = ts_tensor_randn(ts_key_from_seed(seed), TS_F32, nd, shape);
    if (!t || (grad && ts_set_requires_grad(t, true))) die("randn");
    return t;
}

/* t[0]·t[1] (views, as backward passes them) */
static int run_matmul(bench_case *c) {
    ts_tensor *y = ts_matmul(c->t[0], c->t[1]);
    ts_tensor_release(y);
    return y == NULL;
}

/* backward of y with gradient t[3]; the leaves t[0..2] start without grads */
static int backward_of(bench_case *c, ts_tensor *y) {
    int rc = !y || ts_backward(y, c->t[3]) != TS_OK;
    ts_tensor_release(y);
    return rc;
}

static void drop_grads(bench_case *c) {
    for (int i = 0; i < 3; i++) {
        ts_tensor_release(c->t[i]->grad);
        c->t[i]->grad = NULL;
    }
}

static int run_layernorm(bench_case *c) {
    drop_grads(c);
    return backward_of(c, ts_layernorm(c->t[0], c->t[1], c->t[2], 1e-5));
}

static int run_attention(bench_case *c) {
    drop_grads(c);
    return backward_of(c, ts_attention(c->t[0], c->t[1], c->t[2], true, 0.0));
}

/* Makes the tensors of case c. */
static void setup(bench_case *c) {
    if (!strncmp(c->name, "matmul", 6)) {
        ts_tensor *a = randn(1, SHAPE(4096, 768), false), *b = randn(2, SHAPE(768, 3072), false);
        ts_tensor *dc = randn(3, SHAPE(4096, 3072), false);
        if (!strcmp(c->name, "matmul_fwd")) {
            c->t[0] = ts_tensor_retain(a);
            c->t[1] = ts_tensor_retain(b);
        } else if (!strcmp(c->name, "matmul_bwd_dA")) {
            c->t[0] = ts_tensor_retain(dc);
            c->t[1] = ts_transpose(b, 0, 1);
        } else {
            c->t[0] = ts_transpose(a, 0, 1);
            c->t[1] = ts_tensor_retain(dc);
        }
        ts_tensor_release(a);
        ts_tensor_release(b);
        ts_tensor_release(dc);
        if (!c->t[0] || !c->t[1]) die(c->name);
    } else if (!strcmp(c->name, "layernorm_fwd_bwd")) {
        c->t[0] = randn(4, SHAPE(8, 256, 768), true);
        c->t[1] = randn(5, SHAPE(768), true);
        c->t[2] = randn(6, SHAPE(768), true);
        c->t[3] = randn(7, SHAPE(8, 256, 768), false);
    } else {
        for (int i = 0; i < 3; i++) c->t[i] = randn(8 + (uint64_t)i, SHAPE(8, 8, 256, 64), true);
        c->t[3] = randn(11, SHAPE(8, 8, 256, 64), false);
    }
}

static void teardown(bench_case *c) {
    for (int i = 0; i < 5; i++) {
        ts_tensor_release(c->t[i]);
        c->t[i] = NULL;
    }
}

static bench_case cases[] = {
    {"matmul_fwd", 1, {0}, run_matmul},
    {"matmul_bwd_dA", 1, {0}, run_matmul},
    {"matmul_bwd_dB", 1, {0}, run_matmul},
    {"layernorm_fwd_bwd", 4, {0}, run_layernorm},
    {"attention_fwd_bwd", 2, {0}, run_attention},
};

/* Runs every case at every thread count under this process's CPU
 * capability, each row against PyTorch; returns the number of targets
 * missed. */
static int run_cases(const char *cap, const char *threads, const char *want, int reps, int warmup) {
    signal(SIGPIPE, SIG_IGN);
    torch_start();
    int missed = 0;
    char list[64];
    snprintf(list, sizeof list, "%s", threads);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int nt = atoi(tok);
        ts_threads_set(nt);
        char blas[64];
        snprintf(blas, sizeof blas, "%s", torch_ask("threads %d", nt));
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            bench_case *c = &cases[ci];
            char family[16];
            snprintf(family, sizeof family, "%.*s", (int)strcspn(c->name, "_"), c->name);
            if (!strstr(want, family)) continue;
            setup(c);
            for (int i = 0; i < warmup; i++)
                if (c->run(c)) die(c->name);
            char note[128];
            snprintf(note, sizeof note, "%s", torch_ask("warm %s %d", c->name, warmup) + 3);
            int n = reps * c->rep_scale;
            double ts[MAX_REPS], th[MAX_REPS];
            for (int r = 0; r < n; r++) { /* interleaved: Tessera, then PyTorch */
                double t0 = bench_clock_ms();
                if (c->run(c)) die(c->name);
                ts[r] = bench_clock_ms() - t0;
                th[r] = atof(torch_ask("time %s", c->name));
            }
            teardown(c);
            double mt = median(ts, n), mh = median(th, n), ratio = mt / mh;
            double target = strcmp(family, "matmul") ? 1.0 : 1.05;
            bool ok = ratio <= target;
            missed += !ok;
            printf("%-20s %-8s %7d %12.2f %12.2f %8.3f %7s%s  %s (torch %s, blas threads %s)\n", c->name, cap, nt, mt,
                   mh, ratio, target > 1 ? "<=1.05" : "<=1.00", ok ? " " : "!", note, tok, blas + 3);
            fflush(stdout);
        }
    }
    torch_stop();
    return missed;
}

/* Runs this program again with TESSERA_CPU_CAPABILITY=cap and --child;
 * returns the targets it missed (or -1 when it failed). */
static int run_capability(const char *cap, int argc, char **argv) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char *args[64];
        int n = 0;
        for (int i = 0; i < argc && n < 60; i++) args[n++] = argv[i];
        args[n++] = "--child";
        args[n++] = (char *)cap;
        args[n] = NULL;
        char isa[128];
        bench_torch_isa_env(cap, isa, sizeof isa); /* the PyTorch server's kernels alike */
        setenv("TESSERA_CPU_CAPABILITY", cap, 1);
        for (char *save = NULL, *kv = strtok_r(isa, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) putenv(kv);
        execv("/proc/self/exe", args);
        perror("bench_kernels: exec");
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) >= 100) return -1;
    return WEXITSTATUS(status);
}

int main(int argc, char **argv) {
    ts_threads_passive(argv);
    int reps = 7, warmup = 2;
    const char *threads = "1,2", *want = "matmul,layernorm,attention", *caps = NULL, *child = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = argv[++i];
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) want = argv[++i];
        else if (!strcmp(argv[i], "--capabilities") && i + 1 < argc) caps = argv[++i];
        else if (!strcmp(argv[i], "--child") && i + 1 < argc) child = argv[++i];
        else if (!strcmp(argv[i], "--torch-native")) setenv("BENCH_TORCH_NATIVE", "1", 1);
        else if (!strcmp(argv[i], "--cpu-time")) setenv("BENCH_CLOCK", "cpu", 1);
        else {
            fprintf(stderr,
                    "usage: %s [--reps N] [--warmup N] [--threads 1,2] [--cases matmul,layernorm,attention] "
                    "[--capabilities default,avx2,avx512] [--torch-native] [--cpu-time]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS / 4 || warmup < 0) {
        fprintf(stderr, "bench_kernels: --reps must be 1..%d and --warmup >= 0\n", MAX_REPS / 4);
        return 2;
    }
    for (const char *p = threads; *p; p++)
        if ((*p < '0' || *p > '9') && *p != ',') {
            fprintf(stderr, "bench_kernels: bad thread list '%s'\n", threads);
            return 2;
        }
    if (child) {
        int missed = run_cases(child, threads, want, reps, warmup);
        return missed < 99 ? missed : 99;
    }
    char cpu[128], list[64];
    bench_cpu_model(cpu, sizeof cpu);
    printf("CPU: %s; FMA peak (%s, a loop of independent FMAs):", cpu, fma_peak_isa());
    snprintf(list, sizeof list, "%s", threads);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ","))
        printf(" %.1f GFLOP/s at %d thread%s", fma_peak_gflops(atoi(tok)), atoi(tok), atoi(tok) > 1 ? "s" : "");
    printf("\n%-20s %-8s %7s %12s %12s %8s %8s  %s\n", "case", "cpu caps", "threads", "tessera ms", "torch ms", "ratio",
           "target", "torch reference");
    int missed = 0;
    for (int c = 0; c < TS_NCPU_CAPS; c++) {
        const char *name = ts_cpu_capability_name((ts_cpu_capability)c);
        bool asked = caps && strstr(caps, name);
        if (caps ? !asked : !ts_cpu_capability_supported((ts_cpu_capability)c)) continue;
        ts_cpu_capability parsed;
        if (ts_cpu_capability_parse(name, &parsed)) {
            printf("%-20s %-8s skipped: %s\n", "(all)", name, ts_last_error());
            continue;
        }
        int m = run_capability(name, argc, argv);
        if (m < 0) {
            fprintf(stderr, "bench_kernels: the %s run failed\n", name);
            return 1;
        }
        missed += m;
    }
    printf("(ratio = tessera / torch; cpu caps = TESSERA_CPU_CAPABILITY, and %s; medians of %d reps (x4 layernorm, x2 "
           "attention) after %d warm-up, interleaved; ! = target missed: %d)\n",
           getenv("BENCH_TORCH_NATIVE") ? "PyTorch at its best ISA in every row" : "the ISA of PyTorch's own kernels",
           reps, warmup, missed);
    return 0;
}
