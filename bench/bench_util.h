/* bench_util.h - helpers shared by the benchmark programs: a monotonic
 * clock in milliseconds, sorting and medians of timing samples, and running
 * a child process whose "RESULT ..." line is parsed by the caller. Header
 * only (static inline), included by each benchmark source that needs it. */
#ifndef TS_BENCH_UTIL_H
#define TS_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Milliseconds on the monotonic clock (only differences mean anything). */
static inline double bench_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The clock a benchmark times its runs with: the monotonic clock, or the
 * process's CPU time when BENCH_CLOCK=cpu (the benches' --cpu-time: robust
 * on a loaded machine, meaningful for one thread). Milliseconds. */
static inline double bench_clock_ms(void) {
    const char *clock = getenv("BENCH_CLOCK");
    if (!clock || strcmp(clock, "cpu")) return bench_now_ms();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[n] ascending in place. */
static inline void bench_sort(double *v, size_t n) { qsort(v, n, sizeof *v, bench_cmp_double); }

/* Sorts v[n] (n > 0) and returns its upper median v[n / 2]. */
static inline double bench_upper_median(double *v, size_t n) {
    bench_sort(v, n);
    return v[n / 2];
}

/* Parses one output line of a child into out; nonzero when it was the
 * result line, zero for any other line (which is echoed to stderr). */
typedef int (*bench_parse_fn)(const char *line, void *out);

/* Runs cmd through the shell, feeding each line of its stdout to parse.
 * Returns 0 when some line parsed and the child exited 0; otherwise says
 * on stderr which command failed (prefixed with bench) and returns 1. */
static inline int bench_run_child(const char *bench, const char *cmd, bench_parse_fn parse, void *out) {
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "%s: cannot start '%s'\n", bench, cmd);
        return 1;
    }
    char line[512];
    int ok = 0;
    while (fgets(line, sizeof line, p)) {
        if (parse(line, out)) ok = 1;
        else fputs(line, stderr);
    }
    int rc = pclose(p);
    if (!ok || rc != 0) {
        fprintf(stderr, "%s: '%s' failed (status %d)\n", bench, cmd, rc);
        return 1;
    }
    return 0;
}

/* The folder of the running benchmark (where the project's binaries are)
 * into dir, cap bytes; 0, or -1 when /proc/self/exe cannot be read. */
static inline int bench_bin_dir(char *dir, size_t cap) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    snprintf(dir, cap, "%.*s", (int)(strrchr(self, '/') - self), self);
    return 0;
}

/* The environment that holds PyTorch's own kernels to the vector ISA of
 * Tessera's CPU capability cap ("default", "avx2", "avx512"): ATen's
 * dispatch (ATEN_CPU_CAPABILITY) and oneDNN's, which runs its convolutions
 * (ONEDNN_MAX_CPU_ISA; SSE4.1 is its lowest). Both sides call the same
 * OpenBLAS, which picks its kernels itself. With BENCH_TORCH_NATIVE set
 * (the benches' --torch-native) PyTorch keeps its best ISA (an empty
 * assignment of a variable nobody reads). */
static inline void bench_torch_isa_env(const char *cap, char *buf, size_t n) {
    const char *dnnl = !strcmp(cap, "default") ? "SSE41" : !strcmp(cap, "avx2") ? "AVX2" : "AVX512_CORE";
    if (getenv("BENCH_TORCH_NATIVE")) snprintf(buf, n, "BENCH_TORCH_ISA=native");
    else snprintf(buf, n, "ATEN_CPU_CAPABILITY=%s ONEDNN_MAX_CPU_ISA=%s", cap, dnnl);
}

/* The CPU's model name from /proc/cpuinfo into buf ("unknown CPU" when
 * it cannot be read), for the line every benchmark table begins with. */
static inline void bench_cpu_model(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        snprintf(buf, cap, "%s", colon + 2);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    if (f) fclose(f);
}

#endif
