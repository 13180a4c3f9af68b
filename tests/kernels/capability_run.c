/* capability_run.c - runs a kernel test under one CPU capability.
 *
 * usage: kernels_capability_run CAPABILITY TEST [ARGS...]
 * Runs TEST with TESSERA_CPU_CAPABILITY=CAPABILITY when this build and CPU
 * have it; otherwise prints one line saying what is missing and exits 77,
 * which ctest reports as skipped. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/ops/cpu/capability.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s CAPABILITY TEST [ARGS...]\n", argv[0]);
        return 2;
    }
    ts_cpu_capability c;
    if (ts_cpu_capability_parse(argv[1], &c)) {
        printf("skipped: %s\n", ts_last_error());
        return ts_last_status() == TS_ERR_UNSUPPORTED ? 77 : 2;
    }
    if (setenv("TESSERA_CPU_CAPABILITY", argv[1], 1)) {
        perror("capability_run: setenv");
        return 2;
    }
    execv(argv[2], argv + 2);
    perror("capability_run: exec");
    return 2;
}
