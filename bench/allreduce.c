/* allreduce.c - allreduce bus bandwidth of Tessera's communicators against
 * Open MPI's own MPI_Allreduce, on the same buffers in the same run.
 *
 *   mpirun -np N --bind-to none build/bin/bench_allreduce [--sizes 1,16,64,256]
 *       [--bind HOST] [--reps R] [--only ring|mpi|raw]
 *
 * For each size (MiB of f32) it times, with a barrier before every
 * repetition and the median kept: raw MPI_Allreduce (in place), Tessera's
 * MPI backend, and the ZeroMQ ring over tcp (ports bound at --bind, default
 * 127.0.0.1; on a virtual cluster 0.0.0.0, each port then named by its
 * node's host name) and over ipc, CURVE-secured as in a job, and over tcp
 * without CURVE (parallel.ring_security "none", for trusted networks).
 * Bus bandwidth is 2(N-1)/N * bytes / time, the figure NCCL's tests print:
 * what each rank's link carries per second. Every result is checked. Rank 0
 * prints one row per size and transport, with the ratio to raw MPI.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if TESSERA_WITH_MPI

#include <mpi.h>

#include "bench_util.h"
#include "collective/mpi.h"
#include "collective/ring.h"
#include "proto/secure.h"

typedef struct {
    const char *name;
    ts_comm *comm; /* NULL: raw MPI_Allreduce */
} transport;

/* Fills buf with rank r's values (exact small integers, so sums check). */
static void fill(float *buf, int64_t n, int r) {
    for (int64_t i = 0; i < n; i++) buf[i] = (float)(r + 1 + (i & 7));
}

/* The median seconds of reps allreduces of n floats over t; -1 when a
 * result was wrong or a call failed. */
static double time_allreduce(const transport *t, float *buf, int64_t n, int reps, int rank, int size) {
    double *ms = malloc(sizeof(double) * (size_t)reps);
    bool ok = ms != NULL;
    for (int k = -1; ok && k < reps; k++) { /* k = -1: warm-up */
        fill(buf, n, rank);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = bench_now_ms();
        if (t->comm) ok = ts_comm_allreduce(t->comm, buf, buf, n, TS_F32, TS_REDUCE_SUM) == TS_OK;
        else ok = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
        double dt = bench_now_ms() - t0;
        if (k >= 0) ms[k] = dt;
        float want0 = (float)(size * (size + 1) / 2), want = want0 + (float)(size * ((n - 1) & 7));
        ok = ok && buf[0] == want0 && buf[n - 1] == want;
        if (!ok && t->comm) fprintf(stderr, "rank %d: %s: %s\n", rank, t->name, ts_last_error());
    }
    int good = ok, all = 0;
    MPI_Allreduce(&good, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    double med = all ? bench_upper_median(ms, (size_t)reps) / 1e3 : -1;
    free(ms);
    return med;
}

/* A ring communicator whose ports are bound at endpoint (with %d for the
 * rank in ipc paths), CURVE-secured or not; endpoints meet through
 * MPI_Allgather. */
static ts_comm *ring_comm(const char *endpoint, const char *key, bool curve, int rank, int size,
                          ts_ring_port **port) {
    char ep[256];
    snprintf(ep, sizeof ep, endpoint, rank);
    *port = ts_ring_port_open(ep, key, "bench", curve);
    char mine[256] = "", *all = calloc((size_t)size, 256);
    if (*port) snprintf(mine, sizeof mine, "%s", ts_ring_port_endpoint(*port));
    else fprintf(stderr, "rank %d: port %s: %s\n", rank, ep, ts_last_error());
    MPI_Allgather(mine, 256, MPI_CHAR, all, 256, MPI_CHAR, MPI_COMM_WORLD);
    const char *peers[64];
    for (int i = 0; i < size && i < 64; i++) peers[i] = all + 256 * i;
    ts_comm_config cfg = {.rank = rank, .size = size, .generation = 1, .timeout_ms = 120000, .peers = peers,
                          .native = *port};
    ts_comm *c = *port ? ts_comm_create(&ts_comm_ring_backend, &cfg) : NULL;
    free(all);
    return c;
}

int main(int argc, char **argv) {
    int rank, size;
    ts_comm_mpi_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *sizes = "1,16,64,256", *bind = "127.0.0.1", *only = NULL;
    int reps = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes")) sizes = argv[i + 1];
        else if (!strcmp(argv[i], "--bind")) bind = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only")) only = argv[i + 1];
    }
    /* one job key for every rank: rank 0 makes it, the others read it */
    char dir[64] = "/tmp/tessera-bench-XXXXXX", key[128];
    if (rank == 0 && !mkdtemp(dir)) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(key, sizeof key, "%s/job.key", dir);
    if (rank == 0 && ts_secure_keygen(key, NULL) != TS_OK) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Barrier(MPI_COMM_WORLD);

    char tcp[300], ipc[300];
    snprintf(tcp, sizeof tcp, "tcp://%s:0", bind);
    snprintf(ipc, sizeof ipc, "ipc://%s/port-%%d", dir);
    MPI_Comm world = MPI_COMM_WORLD;
    ts_comm_config mcfg = {.rank = rank, .size = size, .generation = 1, .timeout_ms = 120000, .native = &world};
    ts_ring_port *ports[3] = {NULL};
    enum { NT = 5 };
    transport ts[NT] = {{"MPI_Allreduce (raw)", NULL},
                       {"tessera mpi backend", ts_comm_create(&ts_comm_mpi_backend, &mcfg)},
                       {"tessera ring tcp", ring_comm(tcp, key, true, rank, size, &ports[0])},
                       {"tessera ring ipc", ring_comm(ipc, key, true, rank, size, &ports[1])},
                       {"ring tcp, no CURVE", ring_comm(tcp, key, false, rank, size, &ports[2])}};
    if (rank == 0) {
        char cpu[256] = "?";
        FILE *f = popen("lscpu | sed -n 's/^Model name: *//p'", "r");
        if (f && fgets(cpu, sizeof cpu, f)) cpu[strcspn(cpu, "\n")] = 0;
        if (f) pclose(f);
        printf("allreduce of f32, %d processes, CPU %s, ring ports at %s\n", size, cpu, bind);
        printf("%8s  %-22s %10s %12s %10s\n", "MiB", "transport", "ms", "busbw GB/s", "vs raw");
    }
    for (const char *p = sizes; *p;) {
        double mib = atof(p);
        int64_t n = (int64_t)(mib * (1 << 18));
        float *buf = malloc((size_t)n * sizeof *buf);
        int r = reps > 0 ? reps : mib >= 64 ? 5 : 10;
        double raw = 0;
        for (int k = 0; k < NT; k++) {
            if (only && !strstr(ts[k].name, only) && k != 0) continue;
            if (k > 0 && !ts[k].comm) continue;
            double s = time_allreduce(&ts[k], buf, n, r, rank, size);
            if (k == 0) raw = s;
            double bus = s > 0 ? 2.0 * (size - 1) / size * (double)n * 4 / s / 1e9 : 0;
            if (rank == 0)
                printf("%8g  %-22s %10.2f %12.3f %10.2f\n", mib, ts[k].name, s * 1e3, bus, s > 0 && raw > 0 ? raw / s : 0);
        }
        free(buf);
        p = strchr(p, ',');
        p = p ? p + 1 : "";
    }
    for (int k = 1; k < NT; k++) ts_comm_free(ts[k].comm);
    for (int k = 0; k < 3; k++) ts_ring_port_close(ports[k]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        unlink(key);
        rmdir(dir);
    }
    MPI_Finalize();
    return 0;
}

#else

int main(void) {
    fprintf(stderr, "bench_allreduce: this build has no MPI (configure with TESSERA_WITH_MPI=ON)\n");
    return 2;
}

#endif
