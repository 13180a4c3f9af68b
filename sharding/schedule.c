/* schedule.c - gpipe and 1f1b orders of a pipeline stage. */
#include "sharding/schedule.h"

ts_status ts_pipe_schedule(bool one_f_one_b, int stages, int stage, int micro, ts_pipe_op *ops) {
    if (stages < 1 || stage < 0 || stage >= stages || micro < 1)
        return ts_error(TS_ERR_VALUE, "pipeline schedule: stage %d of %d stages with %d micro-batches", stage,
                        stages, micro);
    int warm = one_f_one_b ? stages - stage - 1 : micro;
    if (warm > micro) warm = micro;
    int n = 0, fwd = 0, bwd = 0;
    while (fwd < warm) ops[n++] = (ts_pipe_op){TS_PIPE_FORWARD, fwd++};
    while (fwd < micro) { /* steady state: one forward, one backward */
        ops[n++] = (ts_pipe_op){TS_PIPE_FORWARD, fwd++};
        ops[n++] = (ts_pipe_op){TS_PIPE_BACKWARD, bwd++};
    }
    while (bwd < micro) ops[n++] = (ts_pipe_op){TS_PIPE_BACKWARD, bwd++};
    return TS_OK;
}

double ts_pipe_bubble(int stages, int micro) { return (double)(stages - 1) / (micro + stages - 1); }
