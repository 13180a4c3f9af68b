/* strategy.h - how one process takes part in training: the seam between the
 * training loop and the ways of splitting the work.
 *
 * The trainer (trainer.c) owns the loop, evaluation, checkpoints and
 * metrics and never asks which strategy runs. Where parallel training
 * differs it calls the strategy, always in this order:
 *
 *   once, before the model is built
 *     units        which units of the model this process builds (runs)
 *   once, after the trainer made its model, optimizer groups and loader
 *   (and loaded a checkpoint when resuming), and the process joined its job
 *     attach       start communicators, fetch or send parameters
 *   every step
 *     begin_step   take a new membership (the trainer re-shards its loader
 *                  when the data shard changed), pull parameters (PS)
 *     grads        the step's gradients into the model's flat gradient
 *                  buffer and the step's loss averaged over every sample of
 *                  the step in the whole job; most strategies run
 *                  ts_trainer_grads (the micro-batch loop), during which
 *     grads_ready  says, on the step's last micro-batch only, that the
 *                  gradients of the flat range [offset, offset + len) are
 *                  final (DDP starts a bucket's all-reduce, PS pushes)
 *     slices       the ranges of parameters, gradients and optimizer state
 *                  this process updates (none when the shards step, PS)
 *     reduce_sq_norm  the squared L2 norm of the job's whole gradient (the
 *                  sum over this process's slices where every process
 *                  holds the whole reduced gradient: ts_strategy_sq_norm_here);
 *                  the trainer clips every slice by it and steps the
 *                  optimizer on them
 *     end_step     after the optimizer step (PS: wait for the shards)
 *   where the step's sums are added over the group (grads, or end_step)
 *     each rank adds ts_strategy_stop_vote, and a non-zero sum sets
 *     stop_agreed: every rank of the step takes it as its last, and the
 *     trainer saves a checkpoint there and ends (the scheduler's STOP)
 *   when asked
 *     reduce_sums  sums n numbers over the data-parallel group, in place
 *                  (evaluation: each rank scores every world-th batch)
 *     forward      (optional; NULL: the model's own forward) the logits of
 *                  an evaluation batch where this process has them, or NULL
 *                  where it has not (a pipeline stage before the last)
 *     save, load   what this process holds, in a checkpoint folder
 *     recover      (optional; NULL: none) after reduce_sums or forward
 *                  failed during an evaluation (the test pass when test):
 *                  when the world changed (a peer died or joined) waits
 *                  for the next generation and takes part in it; *again
 *                  says whether this pass runs again (every rank of the new
 *                  generation was in it, or, after the last step, no rank
 *                  was in a later pass) or the group went on without it (a
 *                  rank was still in, or already past, the step; or in the
 *                  final test pass while this rank validated). Else returns
 *                  the failure. The job's step may move back (a lost shard
 *                  reloaded from a checkpoint).
 *   once, after the last step, its checkpoint and evaluations
 *     finish       (optional; NULL: none) the leader tells the others that
 *                  the run's end is written; another rank waits for that,
 *                  and when the leader left first and this rank took the
 *                  lead, sets *again: the trainer then writes the end again
 *                  (the lines of the steps it kept that have none, the
 *                  checkpoint, the evaluations, scored by this rank alone)
 *                  and calls finish once more.
 *
 * A strategy that acts around each unit's forward and backward (FSDP
 * gathers a unit's parameters before it runs) hooks the units, the
 * children of t->model->root, with module hooks (kernels/nn/module.h) in
 * attach. When those hooks communicate it sets shared_forward: then every
 * rank of the group runs the same forwards, so the trainer's evaluation
 * gives each rank as many forwards (a rank past the last batch runs one it
 * does not score) and no forward runs on one rank alone (the leader's
 * model summary is left out).
 *
 * A strategy fills every hook; the local ones (strategy_local.c) are the
 * building blocks the others reuse. Hooks return ts_status with a message
 * naming the peer, step or range that failed.
 */
#ifndef TS_WORKER_STRATEGY_H
#define TS_WORKER_STRATEGY_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/io/checkpoint.h"
#include "kernels/nn/models.h"
#include "kernels/optim/optim.h"
#include "membership/member.h"
#include "proto/job.h"

typedef struct ts_trainer ts_trainer;
typedef struct ts_strategy ts_strategy;

/* Where this process stands in the job: the data-parallel rank and world
 * size its loader is sharded by, the generation they belong to, and
 * whether it is the process that writes the run's log, metrics and shared
 * checkpoint files. A local run is rank 0 of 1 in generation 0, leader. */
typedef struct {
    int rank, world;
    uint64_t generation;
    bool leader;
} ts_group;

/* Where a step's communication time went, in ms (0: none measured). The
 * strategy fills it by end_step; the trainer reports it with the step. */
typedef struct {
    double push_ms; /* sending gradients */
    double pull_ms; /* waiting for parameters */
    double wait_ms; /* waiting for the other workers */
    uint64_t sent_bytes; /* payload this process sent to its peers */
} ts_comm_times;

typedef struct {
    ts_status (*units)(ts_strategy *s, const ts_model_spec *spec, ts_unit_runs *runs);
    ts_status (*attach)(ts_strategy *s);
    ts_status (*begin_step)(ts_strategy *s, int64_t step);
    ts_status (*grads)(ts_strategy *s, double *loss, int64_t *samples);
    ts_status (*grads_ready)(ts_strategy *s, int64_t offset, int64_t len);
    void (*slices)(ts_strategy *s, const ts_optim_slice **slices, int *n);
    ts_status (*reduce_sq_norm)(ts_strategy *s, double *global);
    ts_status (*reduce_sums)(ts_strategy *s, double *v, int n);
    ts_status (*forward)(ts_strategy *s, ts_tensor *x, ts_tensor **out);
    ts_status (*end_step)(ts_strategy *s, int64_t step);
    ts_status (*save)(ts_strategy *s, char *path, size_t cap);
    ts_status (*load)(ts_strategy *s, const char *dir);
    ts_status (*recover)(ts_strategy *s, ts_status failed, bool test, bool *again);
    ts_status (*finish)(ts_strategy *s, bool *again);
    void (*free)(ts_strategy *s);
} ts_strategy_ops;

/* The state every strategy has; a strategy's own struct starts with it. */
struct ts_strategy {
    const ts_strategy_ops *ops;
    ts_group group;      /* the trainer reads it after begin_step */
    bool finished;       /* the job ended for this process (the scheduler shut
                          * it down): the loop stops without a step */
    bool in_job;         /* the process is one node of a job's cluster */
    bool join_first;     /* joins the job before the model is built (its
                          * units depend on its rank: a pipeline stage) */
    char address[TS_PROTO_ADDR_MAX + 1]; /* where peers reach this process,
                          * announced when it joins ("" none) */
    ts_member *member;   /* the job's scheduler client (set after the join,
                          * before ts_trainer_attach); NULL in a local run */
    ts_trainer *trainer; /* set by ts_trainer_create before any hook */
    ts_comm_times times; /* the step's, zeroed by the trainer before begin_step */
    bool shared_forward; /* the model's forward communicates: the group's
                          * ranks run forwards together (see above) */
    bool stop_agreed;    /* the group agreed that this step is the last
                          * (a STOP): the loop saves and ends */
    bool save_abandoned; /* the last save was given up, nothing written
                          * (the world changed in it); set by save */
    bool no_optim_state; /* the optimizer steps elsewhere (a ps job's
                          * shards): the model keeps no optimizer state,
                          * and its whole checkpoints hold none */
};

/* What a node needs to make its strategy. */
typedef struct {
    const ts_job *job;     /* parallel.strategy, bind host, transport, ... */
    bool in_job;           /* the process joins a job's scheduler */
    const char *key_file;  /* the job key (in a job) */
    void *mpi_comm;        /* the workers' MPI_Comm * under mpirun, else NULL */
} ts_strategy_options;

/* Makes the job's strategy (parallel.strategy); one that runs in a job's
 * cluster refuses a process that does not join one and the other way
 * round. Free with ts_strategy_free. */
ts_strategy *ts_strategy_create(const ts_strategy_options *o);

/* Calls s->ops->free; NULL is fine. */
void ts_strategy_free(ts_strategy *s);

/* The ways job's strategy shards the training set when its workers start
 * (each data-parallel copy takes every world-th sample): 1 for "local"
 * and "standin" (each stand-in trains its own replica on all of it),
 * parallel.data_parallel for "pipeline" (a replica's stages read the same
 * batches), parallel.workers otherwise. The loader's steps per epoch, and
 * so a job of train.epochs, follow from it. */
int ts_strategy_data_world(const ts_job *job);

/* Tells the scheduler this worker finished step. The job's last step is
 * not told here: the node tells it once the run, final evaluation and
 * checkpoint included, is over, and the scheduler then ends the job. */
ts_status ts_strategy_step_done(ts_strategy *s, int64_t step);

/* The constructors of ts_strategy_create's table (strategy_<name>.c). */
ts_strategy *ts_strategy_local_new(const ts_strategy_options *o);
ts_strategy *ts_strategy_standin_new(const ts_strategy_options *o);
ts_strategy *ts_strategy_ps_new(const ts_strategy_options *o);
ts_strategy *ts_strategy_ddp_new(const ts_strategy_options *o);
ts_strategy *ts_strategy_pipeline_new(const ts_strategy_options *o);
ts_strategy *ts_strategy_fsdp_new(const ts_strategy_options *o);

/* For cluster strategies: takes the generation the scheduler announced
 * since the last call (the first call: the join's) and returns whether
 * there was one; then *index is this node's place among the live workers
 * (ranks ascending, -1 if not among them) and *workers their number. A
 * change of *workers after the first call is logged as "generation G:
 * world size A -> B workers". */
bool ts_strategy_poll_workers(ts_strategy *s, int *index, int *workers);

/* This rank's vote to stop the job after the step it computes: 1 once the
 * scheduler sent STOP, else 0 (also without a scheduler). */
double ts_strategy_stop_vote(const ts_strategy *s);

/* ---- the local building blocks (strategy_local.c) ---- */

/* Every unit: one run [0, units). */
ts_status ts_strategy_all_units(ts_strategy *s, const ts_model_spec *spec, ts_unit_runs *runs);

/* grads_ready for a strategy with nothing to send during backward. */
ts_status ts_strategy_ready_nothing(ts_strategy *s, int64_t offset, int64_t len);

/* The squared L2 norm of the gradients of this process's slices. */
ts_status ts_strategy_slices_sq_norm(ts_strategy *s, double *sum);

/* reduce_sq_norm / reduce_sums where this process alone holds it all. */
ts_status ts_strategy_sq_norm_here(ts_strategy *s, double *global);
ts_status ts_strategy_sums_here(ts_strategy *s, double *v, int n);

/* One slice: the model's whole flat buffers (the trainer's `whole`). */
void ts_strategy_whole_model(ts_strategy *s, const ts_optim_slice **slices, int *n);

/* Saves / loads the whole model, optimizer state, loader position and job
 * as one checkpoint in the run folder (the trainer's files); load also
 * takes a pipeline's checkpoint of stages (checkpoint_parts.h) and an
 * FSDP checkpoint of shards written at any world size (fsdp_checkpoint.h),
 * and loads into a trainer whose model is a part (a pipeline stage). */
ts_status ts_strategy_save_whole(ts_strategy *s, char *path, size_t cap);

/* ts_strategy_save_whole into the checkpoints folder root (step-<k> in it),
 * keeping the newest keep (0: all). */
ts_status ts_strategy_save_whole_in(ts_strategy *s, const char *root, int keep, char *path, size_t cap);
ts_status ts_strategy_load_whole(ts_strategy *s, const char *dir);

/* Whether checkpoint ck is a whole one that holds no optimizer state
 * (written by a strategy with no_optim_state). */
bool ts_strategy_no_optim_state(const ts_checkpoint *ck);

/* The weights of checkpoint ck - whole, FSDP shards or a pipeline's parts,
 * whichever strategy wrote it - into m, and its optimizer state too when m
 * holds state; names and shapes must match. A whole checkpoint without
 * optimizer state (a ps job's) is refused when m holds state, naming why. */
ts_status ts_strategy_read_model(const ts_checkpoint *ck, ts_model *m);

#endif
