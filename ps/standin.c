/* standin.c - the stand-in ps: member of the job until SHUTDOWN. */
#include "ps/standin.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "membership/member.h"

/* Logs a new generation's world size, if one was announced. */
static void note_membership(ts_member *m) {
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (!ts_member_poll_membership(m, &g, &r, &n)) return;
    int workers = 0, servers = 0;
    for (size_t i = 0; i < n; i++) {
        workers += r[i].alive && r[i].role == TS_ROLE_WORKER;
        servers += r[i].alive && r[i].role == TS_ROLE_PS;
    }
    printf("generation %llu: %d workers, %d ps\n", (unsigned long long)g, workers,
           servers);
    free(r);
}

int ts_ps_standin_run(const char *address, const char *key_file,
                      const ts_job *job, int rank) {
    ts_member_options opt = {
        .scheduler = address, .job = job->name, .key_file = key_file,
        .role = TS_ROLE_PS, .caps = "standin", .prev_rank = rank,
        .timeout_ms = job->parallel.join_timeout_ms};
    ts_member *m = NULL;
    if (ts_member_join(&opt, &m) != TS_OK) {
        fprintf(stderr, "join failed: %s\n", ts_last_error());
        return 1;
    }
    ts_member_info info;
    ts_member_info_get(m, &info);
    printf("joined rank=%d generation=%llu\n", info.rank,
           (unsigned long long)info.generation);
    ts_member_poll_membership(m, NULL, NULL, NULL); /* the join's own generation */
    int code = 0;
    char reason[TS_PROTO_REASON_MAX + 1];
    const struct timespec tick = {0, 5 * 1000 * 1000};
    while (!ts_member_shutdown_requested(m, &code, reason, sizeof reason)) {
        note_membership(m);
        nanosleep(&tick, NULL);
    }
    printf("shutdown (code %d): %s\n", code, reason);
    ts_member_close(m);
    return code;
}
