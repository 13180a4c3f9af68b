/* main.c - tessera-worker: one worker of a job (now: the stand-in loop). */
#include <stdio.h>

#include "proto/job.h"
#include "worker/standin.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ts_job_node_args a;
    if (ts_job_node_args_parse(argc, argv, &a) != TS_OK) {
        fprintf(stderr, "tessera-worker: %s\n", ts_last_error());
        return 2;
    }
    if (a.job.parallel.strategy != TS_STRATEGY_STANDIN) {
        fprintf(stderr, "tessera-worker: %s: strategy \"%s\" is not available to "
                        "workers yet (only \"standin\")\n",
                a.job_path, ts_job_strategy_name(a.job.parallel.strategy));
        return 2;
    }
    return ts_worker_standin_run(a.scheduler, a.key_file, &a.job, a.rank);
}
