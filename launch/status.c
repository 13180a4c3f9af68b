/* status.c - tessera-run --status: one STATUS query, printed. */
#include "launch/launch.h"

#include <stdio.h>

#include "membership/member.h"

enum { STATUS_TIMEOUT_MS = 5000 };

/* The STATUS_REPLY as text: phase, generation, step, then one line per
 * node (rank, role, alive, step, last barrier, heartbeat age, address). */
static void print_status(const ts_proto_msg *r, FILE *out) {
    fprintf(out, "job %s: phase %s, generation %llu, step %lld of %lld, workers %u..%u\n",
            r->job, r->phase, (unsigned long long)r->generation, (long long)r->step,
            (long long)r->steps, r->min_workers, r->max_workers);
    fprintf(out, "%5s %-7s %-5s %8s %8s %12s %5s  %s\n", "rank", "role", "alive", "step",
            "barrier", "heartbeat_ms", "gen", "address");
    for (size_t i = 0; i < r->nroster; i++) {
        const ts_proto_member *e = &r->roster[i];
        fprintf(out, "%5d %-7s %-5s %8lld %8lld %12lld %5llu  %s\n", e->rank,
                ts_proto_role_name(e->role), e->alive ? "yes" : "no", (long long)e->last_step,
                (long long)e->last_barrier, (long long)e->heartbeat_age_ms,
                (unsigned long long)e->joined_generation, e->address[0] ? e->address : "-");
    }
}

int ts_launch_status(const char *address, const char *key_file) {
    ts_proto_msg reply;
    if (ts_member_status_query(address, key_file, STATUS_TIMEOUT_MS, &reply) != TS_OK) {
        fprintf(stderr, "tessera-run --status %s: %s\n", address, ts_last_error());
        return 1;
    }
    print_status(&reply, stdout);
    ts_proto_msg_free(&reply);
    return 0;
}
