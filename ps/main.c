/* main.c - tessera-ps: one parameter-server process of a job (ps.h). */
#include <stdio.h>

#include "kernels/threads.h"
#include "proto/job.h"
#include "ps/ps.h"

int main(int argc, char **argv) {
    ts_threads_passive(argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    ts_job_node_args a;
    if (ts_job_node_args_parse(argc, argv, true, &a) != TS_OK) {
        fprintf(stderr, "tessera-ps: %s\n", ts_last_error());
        return 2;
    }
    ts_ps_options o = {.job = &a.job, .scheduler = a.scheduler, .key_file = a.key_file, .rank = a.rank,
                       .run_dir = a.run_dir[0] ? a.run_dir : NULL, .resume = a.resume};
    return ts_ps_run(&o);
}
