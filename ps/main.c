/* main.c - tessera-ps: one parameter-server shard (now: the stand-in). */
#include <stdio.h>

#include "proto/job.h"
#include "ps/standin.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ts_job_node_args a;
    if (ts_job_node_args_parse(argc, argv, true, &a) != TS_OK) {
        fprintf(stderr, "tessera-ps: %s\n", ts_last_error());
        return 2;
    }
    return ts_ps_standin_run(a.scheduler, a.key_file, &a.job, a.rank);
}
