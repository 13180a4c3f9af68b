/* main.c - tessera-worker: one worker of a job, or a whole local run. */
#include <stdio.h>

#include "kernels/threads.h"
#include "worker/node.h"

int main(int argc, char **argv) {
    ts_threads_passive(argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    ts_job_node_args a;
    if (ts_job_node_args_parse(argc, argv, false, &a) != TS_OK) {
        fprintf(stderr, "tessera-worker: %s\n", ts_last_error());
        return 2;
    }
    char dir[TS_JOB_PATH_MAX + 16];
    ts_worker_run_dir(&a.job, a.run_dir, dir, sizeof dir);
    ts_worker_options o = {.job = &a.job,
                           .scheduler = a.scheduler[0] ? a.scheduler : NULL,
                           .key_file = a.key_file,
                           .rank = a.rank,
                           .run_dir = dir,
                           .resume = a.resume,
                           .force = a.force,
                           .prog = "tessera-worker"};
    return ts_worker_run(&o);
}
