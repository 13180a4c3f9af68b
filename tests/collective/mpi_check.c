/* mpi_check.c - the MPI backend under mpirun: every collective against the
 * serial reference (collective_check.h), sizes from 1 element to 64 MiB,
 * f32 and bf16. Run as "mpirun -np N collective_mpi_check"; exits 0 on
 * every rank when all checks hold. */
#include <mpi.h>
#include <stdio.h>

#include "collective/mpi.h"
#include "collective_check.h"

int main(int argc, char **argv) {
    int provided = 0, r = 0, n = 0;
    provided = ts_comm_mpi_init(&argc, &argv);
    MPI_Comm world = MPI_COMM_WORLD;
    MPI_Comm_rank(world, &r);
    MPI_Comm_size(world, &n);
    CHECK(provided >= MPI_THREAD_SERIALIZED, "rank %d: MPI gives thread level %d", r, provided);
    ts_comm_config cfg = {.rank = r, .size = n, .generation = 1, .timeout_ms = 60000, .native = &world};
    ts_comm *c = ts_comm_create(&ts_comm_mpi_backend, &cfg);
    CHECK(c, "rank %d: communicator: %s", r, ts_last_error());
    static const int64_t counts[] = {1, 2, 7, 1001, 262147};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        check_all(c, r, n, counts[k], TS_F32);
        check_all(c, r, n, counts[k], TS_BF16);
    }
    check_all(c, r, n, ((int64_t)16 << 20) + 3, TS_F32);
    check_all(c, r, n, ((int64_t)32 << 20) + 3, TS_BF16);
    ts_comm_free(c);
    if (r == 0) printf("mpi backend: every collective holds for %d ranks\n", n);
    MPI_Finalize();
    return 0;
}
