/* job.h - the job configuration every Tessera process reads.
 *
 * A job is a JSON file. ts_job_load() reads it with jansson, applies
 * "--set key.path=value" overrides to the document (value parsed as JSON when
 * it parses; a number JSON cannot hold is out of range when beyond a double,
 * else kept as a real; anything else is a string), fills defaults for missing
 * fields and validates strictly against one schema table: an unknown field,
 * an ill-typed field or a value out of range is an error naming the dotted
 * field path, e.g. "parallel.workers: expected integer, got string".
 * Sections are table entries (job.c); later sections (model, data,
 * optimizer, ...) are added there. Unknown top-level sections are errors.
 *
 * A ts_job owns no heap memory: copy it, drop it, no free needed.
 */
#ifndef TS_JOB_H
#define TS_JOB_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/status.h"

/* How a job runs; keep in the order of the names in job.c. */
typedef enum {
    TS_STRATEGY_LOCAL = 0, /* training in one process (issue 4) */
    TS_STRATEGY_STANDIN,   /* replicas in lock step: step-done + barrier */
    TS_STRATEGY_PS,        /* parameter servers: workers push and pull (issue 13) */
    TS_STRATEGY_DDP,       /* all-reduce data parallelism (issue 14) */
    TS_STRATEGY_PIPELINE,  /* the model cut by layers into stages (issue 16) */
    TS_STRATEGY_FSDP,      /* fully-sharded data parallelism (issue 15) */
} ts_job_strategy;

/* When a parameter server applies pushed gradients (parallel.consistency). */
typedef enum {
    TS_CONSISTENCY_SYNC = 0, /* the sum of every live worker's push, once per step */
    TS_CONSISTENCY_ASYNC,    /* each worker's push as it arrives */
    TS_CONSISTENCY_BOUNDED,  /* as async, no worker more than staleness (>= 1) steps ahead;
                                staleness 0 reads as sync */
} ts_job_consistency;

/* What gradients travel as (parallel.wire_dtype). */
typedef enum { TS_WIRE_F32, TS_WIRE_BF16 } ts_job_wire_dtype;

/* The order of a pipeline stage's micro-batches (parallel.schedule). */
typedef enum { TS_PIPE_1F1B, TS_PIPE_GPIPE } ts_job_pipe_schedule;
/* What FSDP shards (parallel.fsdp_mode): parameters, gradients and
 * optimizer state (ZeRO-3); gradients and optimizer state (ZeRO-2); nothing
 * (gradients all-reduced, as DDP). */
typedef enum { TS_FSDP_FULL, TS_FSDP_GRAD_OP, TS_FSDP_NO_SHARD } ts_job_fsdp_mode;

/* FSDP units (parallel.fsdp_unit): each unit of the model (a GPT block, the
 * embedding, the head; an MLP or CNN layer) alone, or the whole model as one. */
typedef enum { TS_FSDP_UNIT_BLOCK, TS_FSDP_UNIT_MODEL } ts_job_fsdp_unit;

/* How workers of one host reach each other (parallel.transport). */
typedef enum { TS_TRANSPORT_TCP, TS_TRANSPORT_IPC } ts_job_transport;

/* What protects a data path (parallel.ring_security: the workers'
 * collectives; parallel.ps_security: workers to parameter servers and a
 * primary to its backup): CURVE like every other socket, or nothing - for
 * a trusted network only, where the encryption would cost most of the
 * link's speed. The scheduler's connections are always CURVE. */
typedef enum { TS_SECURITY_CURVE, TS_SECURITY_NONE } ts_job_security;

enum { TS_JOB_NAME_MAX = 64, TS_JOB_BIND_MAX = 256, TS_JOB_PATH_MAX = 1024 };

/* A list of up to 8 integers (e.g. MLP hidden widths). */
typedef struct {
    int n;
    int64_t v[8];
} ts_job_ints;

typedef struct {
    ts_job_strategy strategy;
    int workers;              /* workers started by tessera-run */
    int servers;              /* parameter-server shards (each ps_replicas processes) */
    int min_workers;          /* job runs while at least this many are alive */
    int max_workers;          /* upper bound for elastic joins */
    int max_restarts;         /* restart budget for failed workers (whole job) */
    int heartbeat_ms;
    int heartbeat_timeout_ms; /* silent longer -> declared dead */
    int barrier_timeout_ms;   /* barrier not reached by all -> error */
    int join_timeout_ms;      /* a node waits this long to be admitted */
    ts_job_consistency consistency; /* strategy "ps" */
    int staleness;            /* bounded: steps a worker may run ahead */
    int ps_replicas;          /* processes per shard: 1, or 2 (primary + backup) */
    ts_job_wire_dtype wire_dtype; /* gradients on the wire (ps, ddp, fsdp) */
    char bind[TS_JOB_BIND_MAX];         /* host/interface to bind */
    char key_file[TS_JOB_PATH_MAX];     /* "" = tessera-run generates one */
    ts_job_ints placement;    /* virtual-cluster node of the scheduler, each ps,
                                 each worker (cycled); empty = round robin */
    double bucket_mb;                   /* ddp: gradient bucket size (MiB) */
    ts_job_transport transport;         /* tcp, or ipc for one-host jobs */
    ts_job_security ring_security; /* curve, or none (trusted network) */
    ts_job_security ps_security;   /* curve, or none (trusted network) */
    int stages;               /* pipeline: P stages */
    ts_job_ints pipeline_stages; /* pipeline: units of each of the P x V pieces;
                                    empty = cut by a profiling pass */
    int micro_batches;        /* pipeline: M micro-batches per batch */
    int chunks_per_stage;     /* pipeline: V model chunks per stage (V > 1:
                                 interleaved, the model cut into P x V pieces) */
    ts_job_pipe_schedule schedule; /* pipeline: 1f1b or gpipe */
    int data_parallel;        /* pipeline: D copies of the pipeline */
    int timeline;             /* pipeline: each stage writes its busy intervals */
    ts_job_fsdp_mode fsdp_mode;         /* fsdp: what is sharded */
    ts_job_fsdp_unit fsdp_unit;         /* fsdp: the units gathered at once */
    int fsdp_neighbour_copy;            /* fsdp: each rank keeps its ring neighbour's shards */
} ts_job_parallel;

/* Strategy "standin" (worker/strategy_standin.c): workers train their own
 * replicas in lock step, to exercise the cluster. */
typedef struct {
    int step_ms; /* shortest step: the worker sleeps the rest of it */
} ts_job_standin;

/* The model to train. */
typedef enum { TS_JOB_MLP, TS_JOB_CNN, TS_JOB_GPT } ts_job_arch;

typedef struct {
    ts_job_arch arch;
    ts_job_ints hidden;   /* mlp hidden widths */
    int ch1, ch2, kernel; /* cnn */
    int n_layer, n_head, n_embd, block_size; /* gpt */
    double dropout;
    int checkpoint;       /* activation checkpointing of GPT blocks */
    char init_from[TS_JOB_PATH_MAX]; /* safetensors file the weights start from; "" = the seed */
    char init_map[TS_JOB_PATH_MAX];  /* name map for init_from (kernels/io/weights.h); "" = none */
} ts_job_model;

/* Where the samples come from. */
typedef enum { TS_JOB_FASHION_MNIST, TS_JOB_TEXT } ts_job_data_kind;

typedef struct {
    ts_job_data_kind kind;
    char path[TS_JOB_PATH_MAX]; /* "" = the Debian package's location */
    double val_fraction;        /* held out of the training part */
    int shuffle;
    int prefetch;               /* batches prepared ahead by a thread */
} ts_job_data;

typedef enum { TS_JOB_SGD, TS_JOB_ADAM, TS_JOB_ADAMW } ts_job_optim_kind;

typedef struct {
    ts_job_optim_kind kind;
    double lr, weight_decay, momentum, beta1, beta2, eps;
    int nesterov;
    double clip_norm; /* 0 = no clipping */
} ts_job_optimizer;

typedef enum { TS_JOB_CONSTANT, TS_JOB_STEP, TS_JOB_COSINE } ts_job_schedule_kind;

typedef struct {
    ts_job_schedule_kind kind;
    int64_t warmup_steps, step_size;
    double gamma, min_lr;
} ts_job_schedule;

/* The training loop. */
typedef struct {
    int64_t batch_size;       /* per worker */
    int64_t epochs;           /* > 0: overrides steps with epochs' worth; a --set of steps drops them */
    int64_t eval_every;       /* steps between validation passes; 0 = at the end */
    int64_t eval_batches;     /* validation batches per pass and data-parallel rank; 0 = all */
    int64_t checkpoint_every; /* steps between checkpoints; 0 = at the end */
    int keep_checkpoints;
    int accum_steps;          /* micro-batches per optimizer step */
    int bf16;                 /* precision "bf16": bf16 compute copy of the parameters */
    int64_t log_every;
    char run_dir[TS_JOB_PATH_MAX]; /* "" = runs/<name> */
} ts_job_train;

/* Where a worker's model computes (device): the CPU, or the GPU of the
 * worker's local rank. */
typedef enum { TS_JOB_DEVICE_CPU, TS_JOB_DEVICE_CUDA } ts_job_device;

typedef struct {
    char name[TS_JOB_NAME_MAX]; /* job id on the wire; [A-Za-z0-9._-] */
    int64_t seed;
    int64_t steps;
    ts_job_device device;
    ts_job_parallel parallel;
    ts_job_standin standin;
    ts_job_model model;
    ts_job_data data;
    ts_job_optimizer optimizer;
    ts_job_schedule schedule;
    ts_job_train train;
} ts_job;

/* Reads the job file at path, applies the nsets overrides ("a.b=value") in
 * order, fills defaults and validates into *job. On failure *job is
 * unspecified and the message names the file and the field; a path that
 * is missing or not a regular file is refused as such before parsing. */
ts_status ts_job_load(const char *path, const char *const *sets, int nsets,
                      ts_job *job);

/* Same as ts_job_load for a JSON document already in memory (text). */
ts_status ts_job_parse(const char *text, const char *const *sets, int nsets,
                       ts_job *job);

/* Applies one "a.b.c=value" override to doc (an object), creating missing
 * intermediate objects. Does not validate the field name. An integer field
 * takes a whole real (1e3); a real outside its range is "out of range". */
ts_status ts_job_set(json_t *doc, const char *assignment);

/* The job as a complete JSON object (every field, defaults included), new
 * reference; NULL on allocation failure. */
json_t *ts_job_to_json(const ts_job *job);

/* Command line of a node process of the job (tessera-ps, tessera-worker):
 *   [JOB.json | --job JOB.json] [--scheduler ADDR --key-file PATH]
 *   [--set k=v]... [--rank N] [--run-dir DIR] [--resume] [--force]
 * (flags also as --flag=value; the key file may come from TESSERA_KEY_FILE).
 * Without --scheduler the node trains alone (strategy "local"). */
typedef struct {
    char scheduler[TS_JOB_BIND_MAX]; /* scheduler endpoint, "" = none */
    char key_file[TS_JOB_PATH_MAX];
    char job_path[TS_JOB_PATH_MAX];
    char run_dir[TS_JOB_PATH_MAX];   /* "" = the job's train.run_dir or runs/<name> */
    int rank;                        /* rank asked for, -1 = any */
    bool resume;                     /* continue from the newest checkpoint */
    bool force;                      /* train even if the model seems not to fit */
    ts_job job;                      /* job file with the overrides applied */
} ts_job_node_args;

/* Parses argv[1..argc-1] into *a and loads the job; an unknown flag, a
 * missing value or a missing required flag (--scheduler when
 * need_scheduler) is an error naming it. */
ts_status ts_job_node_args_parse(int argc, char **argv, bool need_scheduler, ts_job_node_args *a);

/* The capabilities a worker of the job joins with (at most cap - 1
 * bytes): its strategy and a fingerprint (FNV-1a, ts_hash_text) of the sections every
 * worker of a job must share - the model (except the weights it starts from),
 * the optimizer and the schedule - e.g. "ddp job=8f14e45fceea167a". The
 * scheduler refuses a worker whose capabilities are not the job's. */
ts_status ts_job_caps(const ts_job *job, char *out, size_t cap);

/* Name of a strategy ("standin"). */
const char *ts_job_strategy_name(ts_job_strategy s);

/* Name of a consistency ("sync", "async", "bounded"). */
const char *ts_job_consistency_name(ts_job_consistency c);

/* The optimizer.kind text of k ("sgd", "adam", "adamw"). */
const char *ts_job_optimizer_name(ts_job_optim_kind k);

/* The parameter-server processes of the job: servers * ps_replicas. */
int ts_job_ps_processes(const ts_job *job);

#endif
