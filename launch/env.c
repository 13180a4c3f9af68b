/* env.c - tessera-run --env: what this build and machine offer. */
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kernels/ops/cpu/capability.h"
#include "kernels/threads.h"
#include "launch/train.h"
#if TESSERA_WITH_MPI
#include <mpi.h>
#endif
#if TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if TESSERA_WITH_NCCL
#include <nccl.h>
#endif

/* "CPU kernels: avx2 (...)": the capability in use and why, what this CPU
 * offers and what the build has; false when TESSERA_CPU_CAPABILITY was
 * refused (the line says why). */
static bool print_cpu_kernels(void) {
    char offered[64] = "", built[64] = "";
    for (int c = 0; c < TS_NCPU_CAPS; c++) {
        const char *name = ts_cpu_capability_name((ts_cpu_capability)c);
        if (ts_cpu_capability_supported((ts_cpu_capability)c))
            snprintf(offered + strlen(offered), sizeof offered - strlen(offered), "%s%s", offered[0] ? ", " : "", name);
        if (ts_cpu_capability_backend((ts_cpu_capability)c))
            snprintf(built + strlen(built), sizeof built - strlen(built), "%s%s", built[0] ? ", " : "", name);
    }
    ts_cpu_capability use;
    if (ts_cpu_capability_get(&use)) {
        printf("  CPU kernels: refused: %s\n", ts_last_error());
        return false;
    }
    printf("  CPU kernels: %s (%s; this CPU offers %s; built: %s)\n", ts_cpu_capability_name(use),
           ts_cpu_capability_forced() ? "set by TESSERA_CPU_CAPABILITY" : "the best this CPU offers", offered, built);
    return true;
}

int ts_launch_env(void) {
    int major, minor, patch;
    zmq_version(&major, &minor, &patch);
    printf("Tessera %s (%s build)\n", TESSERA_VERSION, TESSERA_BUILD_TYPE);
    printf("  build options: CUDA %s, NCCL %s, MPI %s\n", TESSERA_WITH_CUDA ? "on" : "off",
           TESSERA_WITH_NCCL ? "on" : "off", TESSERA_WITH_MPI ? "on" : "off");
    printf("  CPUs online: %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    bool kernels_ok = print_cpu_kernels();
    printf("  threads: %d (TESSERA_NUM_THREADS), OpenMP max %d\n", ts_threads_get(), omp_get_max_threads());
    printf("  BLAS: %s, %d threads\n", ts_threads_blas_config(), ts_threads_blas_threads());
    printf("  ZeroMQ %d.%d.%d, CURVE %s\n", major, minor, patch, zmq_has("curve") ? "available" : "NOT available");
#if TESSERA_WITH_MPI
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    for (int i = 0; i < len; i++)
        if (version[i] == '\n' || version[i] == ',') {
            version[i] = '\0';
            break;
        }
    printf("  MPI: %s\n", version);
#else
    printf("  MPI: not built\n");
#endif
#if TESSERA_WITH_CUDA
    int runtime = 0, driver = 0, count = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    cudaError_t err = cudaGetDeviceCount(&count);
    printf("  CUDA: runtime %d.%d, driver %d.%d\n", runtime / 1000, runtime % 1000 / 10, driver / 1000,
           driver % 1000 / 10);
    if (err != cudaSuccess || count == 0)
        printf("    no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    for (int d = 0; d < count; d++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
            printf("    device %d: %s, %.1f GiB, compute capability %d.%d\n", d, p.name,
                   (double)p.totalGlobalMem / (1 << 30), p.major, p.minor);
    }
#else
    printf("  CUDA: not built (no CUDA device)\n");
#endif
#if TESSERA_WITH_NCCL
    int nccl = 0;
    ncclGetVersion(&nccl);
    printf("  NCCL: %d.%d.%d\n", nccl / 10000, nccl / 100 % 100, nccl % 100);
#else
    printf("  NCCL: not built\n");
#endif
    return kernels_ok ? 0 : 1;
}
