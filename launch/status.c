/* status.c - tessera-run --status: one STATUS query, printed. */
#include "launch/launch.h"

#include <stdio.h>

#include "collective/member.h"

enum { STATUS_TIMEOUT_MS = 5000 };

int ts_launch_status(const char *address, const char *key_file) {
    ts_proto_msg reply;
    if (ts_member_status_query(address, key_file, STATUS_TIMEOUT_MS, &reply) != TS_OK) {
        fprintf(stderr, "tessera-run --status %s: %s\n", address, ts_last_error());
        return 1;
    }
    ts_member_status_print(&reply, stdout);
    ts_proto_msg_free(&reply);
    return 0;
}
