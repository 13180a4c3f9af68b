/* main.c - tessera-scheduler: parses the flags, binds, prints the endpoint
 * as the first stdout line and runs the job's scheduler loop. */
#include <signal.h>
#include <stdio.h>

#include "scheduler/log.h"
#include "scheduler/sched.h"

int main(int argc, char **argv)
{
    ts_sched_config cfg;
    int help = 0;
    if (ts_sched_config_parse(argc, argv, &cfg, &help) != TS_OK) {
        fprintf(stderr, "%s\n%s", ts_last_error(), ts_sched_config_usage());
        return 2;
    }
    if (help) {
        fputs(ts_sched_config_usage(), stdout);
        return 0;
    }
    ts_sched *s = ts_sched_create(&cfg);
    if (!s) {
        ts_sched_log(TS_SCHED_ERROR, "%s", ts_last_error());
        return 1;
    }
    /* stdout's reader may go after the first line: the later lines ("dead
     * ps 1") are then lost, not the scheduler */
    signal(SIGPIPE, SIG_IGN);
    printf("listening %s\n", ts_sched_endpoint(s));
    fflush(stdout);
    int code = ts_sched_run(s);
    ts_sched_destroy(s);
    return code;
}
