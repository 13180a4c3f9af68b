/* env.c - tessera-run --env: what this build and machine offer. */
#include <omp.h>
#include <stdio.h>
#include <unistd.h>
#include <zmq.h>

#include "kernels/threads.h"
#include "launch/train.h"
#if TESSERA_WITH_MPI
#include <mpi.h>
#endif

int ts_launch_env(void) {
    int major, minor, patch;
    zmq_version(&major, &minor, &patch);
    printf("Tessera %s (%s build)\n", TESSERA_VERSION, TESSERA_BUILD_TYPE);
    printf("  build options: CUDA %s, NCCL %s, MPI %s\n", TESSERA_WITH_CUDA ? "on" : "off",
           TESSERA_WITH_NCCL ? "on" : "off", TESSERA_WITH_MPI ? "on" : "off");
    printf("  CPUs online: %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("  threads: %d (TESSERA_NUM_THREADS), OpenMP max %d\n", ts_threads_get(), omp_get_max_threads());
    printf("  BLAS: OpenBLAS %s, %d threads\n", ts_threads_blas_config(), ts_threads_blas_threads());
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
    printf("  CUDA: built; devices are listed by the CUDA backend\n");
#else
    printf("  CUDA: not built (no CUDA device)\n");
#endif
    return 0;
}
