/* threads.c - TESSERA_NUM_THREADS applied to OpenMP and OpenBLAS. */
#include "kernels/threads.h"

#include <omp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* OpenBLAS's runtime controls (declared in its cblas.h as well). */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char *openblas_get_config(void);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int current = 1;

/* Sets both thread counts. */
static void apply(int n) {
    current = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

static void init_once(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("TESSERA_NUM_THREADS");
    if (env && atoi(env) > 0) n = atoi(env);
    apply(n > 0 ? (int)n : 1);
}

void ts_threads_init(void) { pthread_once(&once, init_once); }

void ts_threads_set(int n) {
    ts_threads_init();
    apply(n < 1 ? 1 : n);
}

int ts_threads_get(void) {
    ts_threads_init();
    return current;
}

const char *ts_threads_blas_config(void) { return openblas_get_config(); }

int ts_threads_blas_threads(void) { return openblas_get_num_threads(); }

void ts_threads_passive(char **argv) {
    bool omp = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"), blas = !getenv("OPENBLAS_THREAD_TIMEOUT");
    if (!omp && !blas) return;
    if (omp && setenv("OMP_WAIT_POLICY", "passive", 1)) return;
    if (blas && setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1)) return;
    /* the program's own path, not /proc/self/exe: the kernel names a process
     * after the file it executes, and pgrep, top and killall would see "exe" */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        execv(self, argv);
    }
    execv("/proc/self/exe", argv); /* the file was replaced or removed since */
    /* exec failed: carry on with the libraries' default policies */
}
