/* dp_group.h - the data-parallel group of the all-reduce strategies (ddp,
 * fsdp): one communicator per generation of the job's workers.
 *
 * The communicator is the ring over each worker's port (collective/ring.h;
 * its endpoint is the address the worker joins with), or MPI's under
 * mpirun (one generation). When the scheduler announces a new generation
 * (a join, a death, a departure) the strategy abandons what is in flight,
 * starts the pending generation's communicator and brings its ranks to one
 * state (its own business: DDP broadcasts the state of the rank furthest on,
 * FSDP moves shards). A
 * wait on the communicator looks for a new generation while it waits and
 * abandons the operation when one came, so no rank sits out a timeout in a
 * generation the others left.
 *
 * A model on a GPU (job device "cuda") gets NCCL communicators
 * (collective/nccl.h), bootstrapped over the same ring port, over its
 * device buffers; the few host values of a collective (a regroup's header
 * and vote, a step's loss and samples, an evaluation's sums) go through a
 * small device buffer of the group's (ts_dp_group_run_host,
 * ts_dp_group_broadcast), as NCCL reads device memory only.
 * Under mpirun a model on a GPU is refused (there is no ring port to
 * bootstrap NCCL over).
 */
#ifndef TS_WORKER_DP_GROUP_H
#define TS_WORKER_DP_GROUP_H

#include "collective/comm.h"
#include "collective/ring.h"
#include "kernels/data/loader.h"
#include "worker/strategy.h"

/* What the strategy does at the group's turns (its ctx is the strategy). */
typedef struct {
    /* waits for (and forgets) its own requests once the communicator was
     * aborted, before the communicator goes */
    void (*drop)(ts_strategy *s);
    /* brings the ranks of a new generation to one state: parameters,
     * optimizer state, step (the trainer's) and data position
     * (ts_dp_group.step_start) */
    ts_status (*agree)(ts_strategy *s);
    /* one try at the step's gradients, the loss and samples of the step
     * summed over the group */
    ts_status (*try_step)(ts_strategy *s, double *loss, int64_t *samples);
} ts_dp_group_hooks;

typedef struct {
    ts_strategy *s;          /* the strategy it serves: member, group, trainer */
    ts_dp_group_hooks hooks;
    const char *what;        /* its name in messages ("ddp") */
    ts_ring_port *port;      /* ring backend: this worker's port */
    void *mpi_comm;          /* MPI backend: the workers' MPI_Comm * */
    const ts_comm_backend *backend; /* the ring's generations: "ring", or "nccl" for a model on a GPU */
    ts_comm *comm;           /* this generation's communicator, or NULL */
    ts_tensor *stage;        /* nccl: device memory for host values, or NULL */
    /* the next generation, when the scheduler announced one */
    bool pending;
    uint64_t next_generation;
    ts_proto_member *next_roster;
    size_t next_n;
    /* the step in flight: where its data started */
    bool in_step;
    ts_loader_pos step_start;
    uint64_t sent_at_start; /* the communicator's sent bytes when the step began */
    /* a regroup's vote: the evaluation pass this rank was in (0: none, 1:
     * validation, 2: test), and the least and the most of the new
     * generation's ranks */
    int pass, least_pass, most_pass;
    int64_t split_at, exit_at, save_exit_at; /* TESSERA_FAULT's steps (ts_dp_group_fault), or -1 */
} ts_dp_group;

/* Opens the port of o's job (ts_ring_port_for_job, tagged what) and puts
 * its endpoint in s->address; under mpirun (o->mpi_comm)
 * nothing is opened. s->group is set to rank 0 of the job's workers until
 * the first generation. */
ts_status ts_dp_group_open(ts_dp_group *g, ts_strategy *s, const char *what, const ts_strategy_options *o,
                           const ts_dp_group_hooks *hooks);

/* Drops the communicator; frees the port, the staging buffer and the
 * pending roster. */
void ts_dp_group_close(ts_dp_group *g);

/* Notes a generation the scheduler announced since the last look. */
void ts_dp_group_look(ts_dp_group *g);

/* Waits (up to the time the scheduler needs to declare a silent worker
 * dead, and more) for the generation after the current one; when none came
 * once a dead peer would have been declared, asks the scheduler for one
 * (ts_member_ask_regroup: a peer paused and went on). Sets s->finished
 * instead when the scheduler ends the job. */
ts_status ts_dp_group_await(ts_dp_group *g);

/* Waits for req, looking for a new generation while it waits: one
 * abandons the operation (the others have moved on, or will). */
ts_status ts_dp_group_finish(ts_dp_group *g, ts_comm_req *req);

/* Fault injection for the tests, from TESSERA_FAULT (read when the group
 * opens), for deaths a kill -9 hits only by chance:
 *   sums_split@K   in a group of three or more, rank 0 drops its sums of
 *                  step K as if a peer had died inside them, and the
 *                  group's last rank exits as soon as it took step K (when
 *                  step K + 1 begins): the survivors stand a step apart;
 *   leader_exit@K  rank 0 exits once it took step K, before it logs it
 *                  (at end_step): the others took step K too;
 *   save_exit@K    in a group of three or more, the last rank exits once
 *                  it wrote its part of step K's checkpoint, before the
 *                  others agree on it (ts_dp_group_save_fault).
 * Called where a step's sums succeeded: rank 0's error for sums_split. */
ts_status ts_dp_group_fault(ts_dp_group *g);

/* Exits for save_exit@K (see ts_dp_group_fault): called where a rank has
 * written its part of the checkpoint of the step it took last. */
void ts_dp_group_save_fault(ts_dp_group *g);

/* Starts op and finishes it (ts_dp_group_finish). */
ts_status ts_dp_group_run(ts_dp_group *g, ts_comm_op *op);

/* ts_dp_group_run over host values in place (op->recv, op->count of
 * op->dtype; op->send is set): with a model on a GPU they go through the
 * group's staging buffer. */
ts_status ts_dp_group_run_host(ts_dp_group *g, ts_comm_op *op);

/* reduce_sums: sums n numbers over the group in place
 * (ts_dp_group_run_host). */
ts_status ts_dp_group_sums(ts_dp_group *g, double *v, int n);

/* A collective of a regroup: kind over count elements of buf (root 0 for a
 * broadcast). Peers meet here after a membership change, some still
 * finishing a step or just started: they get the job's barrier timeout to
 * arrive, not the heartbeat timeout of a step. */
ts_status ts_dp_group_meet(ts_dp_group *g, ts_comm_kind kind, const void *send, void *recv, int64_t count,
                           ts_dtype dt);

/* The group rank a new generation takes its state from: the one whose
 * trainer is furthest on (the most steps), the lowest of those. A
 * restarted or new process may hold a low rank (its previous one) but has
 * trained nothing yet. */
ts_status ts_dp_group_furthest(ts_dp_group *g, int *root);

/* A regroup's broadcast of count elements of buf from group rank root,
 * in place: host values staged as in ts_dp_group_run_host when host,
 * else as ts_dp_group_meet. */
ts_status ts_dp_group_broadcast(ts_dp_group *g, int root, void *buf, int64_t count, ts_dtype dt, bool host);

/* The data position a new generation starts from: the step in flight's
 * start, or the loader's. */
ts_loader_pos ts_dp_group_position(const ts_dp_group *g);

/* Leaves the current generation and starts the pending one: drops the
 * communicator (hooks.drop), makes the new one, sets s->group (the rank
 * among the live workers, ranks ascending; the leader is rank 0), lets the
 * ranks agree (hooks.agree) and re-shards the trainer's loader. A failure
 * on the way waits for the generation after and tries again (under mpirun
 * it is returned). */
ts_status ts_dp_group_regroup(ts_dp_group *g);

/* The first generation (attach): the communicator's backend for the
 * model's device, the join's roster, then regroup. */
ts_status ts_dp_group_attach(ts_dp_group *g);

/* begin_step: notes the scheduler's shutdown (s->finished) or a new
 * generation (regroup), then marks the step's start. */
ts_status ts_dp_group_begin_step(ts_dp_group *g);

/* grads: tries the step (hooks.try_step) until it succeeds, regrouping
 * after each failure in a changed world; a failure that is no peer's
 * (shape, dtype, memory) is returned. */
ts_status ts_dp_group_grads(ts_dp_group *g, double *loss, int64_t *samples);

/* recover: after an evaluation's collective failed with `failed` (in the
 * test pass when test): unless the failure is no peer's (shape, dtype,
 * memory) or the job runs under mpirun, waits for the next generation and
 * regroups; *again says whether this pass runs again: when every rank of
 * it was in the same pass, or after the last step when no rank was in a
 * later pass (a rank still in the step evaluates next). Else the group
 * goes on (with the next step, or with the test pass that a rank reached)
 * and this pass is skipped. */
ts_status ts_dp_group_recover(ts_dp_group *g, ts_status failed, bool test, bool *again);

/* end_step: the step is done (the scheduler is told); the payload sent
 * during it goes to s->times.sent_bytes. */
ts_status ts_dp_group_end_step(ts_dp_group *g, int64_t step);

/* Aborts and frees the communicator (after hooks.drop). */
void ts_dp_group_drop(ts_dp_group *g);

#endif
