/* internal.h - the shard's state, shared by shard.c (requests) and store.c
 * (checkpoints). Not a public header. */
#ifndef TS_PS_INTERNAL_H
#define TS_PS_INTERNAL_H

#include "kernels/data/loader.h"
#include "kernels/optim/optim.h"
#include "kernels/tensor.h"
#include "ps/shard.h"

/* A covered interval [lo, hi) of keys. */
typedef struct {
    int64_t lo, hi;
} shard_span;

/* What the shard knows of one worker. */
typedef struct {
    int32_t rank;
    bool live;                  /* in the current worker set */
    ts_proto_identity who;      /* where its last message came from */
    float *stage;               /* [len] its gradient of `step` (f32), NULL until its first push */
    shard_span *cover;          /* the ranges of `step` it pushed, sorted, disjoint */
    int ncover, capcover;
    int64_t covered;            /* keys in cover */
    int64_t step;               /* the staged step, -1 none */
    bool committed;             /* its COMMIT of `step` arrived */
    bool waiting;               /* that COMMIT awaits its reply (sync) */
    double values[TS_COMMIT_VALUES];
    int64_t done;               /* last step of its applied (async, bounded) */
    int64_t joined_at;          /* the step the shard was at (had decided, sync) when the worker
                                 * became live: it evaluates the steps after, not that one */
    uint64_t joined_gen;        /* ... and the generation it became live in */
    double *reduced;            /* its values of the open reduction, or NULL */
    bool reduce_waiting;
} shard_worker;

/* A pull waiting for its step. */
typedef struct {
    ts_proto_identity who;
    int32_t rank;
    int64_t want;
    ts_proto_range *ranges;
    size_t nranges;
} shard_pull;

struct ts_shard {
    ts_shard_config cfg;
    char *root;
    int64_t offset, len, numel;
    ts_optim_config optim;
    ts_optim_groups groups;
    ts_tensor *params, *state;       /* [len], [slots, len] or NULL */
    float *sum;                      /* [len]: the gradient stepped; swapped with a staging, not copied */
    int64_t step, updates;
    int64_t saved_step;              /* step of the last checkpoint written, -1 none */
    ts_loader_pos pos;               /* data position after `step` */
    ts_job_consistency mode;
    int staleness;
    double clip;
    bool replies, writer;
    uint64_t wset_gen;               /* generation of the current worker set */
    shard_worker *w;                 /* ascending ranks */
    int nw, capw;
    /* sync: the decided step */
    bool decided;
    int64_t decided_step;
    uint64_t decided_gen;
    double decided_values[TS_DECIDED_VALUES];
    double decided_lr;
    ts_loader_pos decided_pos;
    int64_t last_decided_step;       /* kept for commits repeated after the apply */
    double last_decided[TS_DECIDED_VALUES];
    int64_t applied_step;            /* the last step applied as a whole (sync) or finished by a commit (async), -1 none */
    double applied[TS_STEP_VALUES];  /* ... its loss, learning rate and norm, for its pulls */
    shard_pull *pulls;
    int npulls, cappulls;
    /* the open reduction (its values computed in generation red_gen) and
     * the last finished one (without sums: skipped); values computed before left_gen, the
     * generation in which a worker last left, scored the batches of a
     * world that is gone */
    bool reducing;
    uint64_t red_gen, left_gen;
    int64_t red_step, red_id;
    int red_n;
    int64_t last_red_step, last_red_id;
    double *last_red;
    int last_red_n;
    uint64_t refused;
};

/* Clears every worker's staging (steps, coverage, commits). */
void shard_clear_stagings(ts_shard *s);

#endif
