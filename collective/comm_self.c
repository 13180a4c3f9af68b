/* comm_self.c - backend "self": a communicator of one rank.
 *
 * Every collective of one rank leaves the data as it is: an out-of-place
 * operation copies send to recv, an average divides by one. There is no
 * peer to send to (the generic checks refuse it). Used by local runs and as
 * the yardstick of the interface tests.
 */
#include <string.h>

#include "collective/comm.h"

static ts_status self_open(ts_comm *c) {
    if (ts_comm_size(c) != 1)
        return ts_error(TS_ERR_VALUE, "communicator self: a world of %d ranks (self has one)", ts_comm_size(c));
    return TS_OK;
}

static ts_status self_run(ts_comm *c, const ts_comm_op *op) {
    (void)c;
    size_t bytes = (size_t)op->count * ts_dtype_size(op->dtype);
    switch (op->kind) {
    case TS_COMM_ALLREDUCE:
    case TS_COMM_REDUCE_SCATTER:
    case TS_COMM_ALLGATHER:
        if (bytes && op->send != op->recv) memmove(op->recv, op->send, bytes);
        return TS_OK;
    case TS_COMM_BROADCAST:
    case TS_COMM_BARRIER:
        return TS_OK;
    default:
        return ts_error(TS_ERR_STATE, "a communicator of one rank has no peer");
    }
}

static void self_close(ts_comm *c) { (void)c; }

const ts_comm_backend ts_comm_self_backend = {
    .name = "self",
    .open = self_open,
    .run = self_run,
    .close = self_close,
};
