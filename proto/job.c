/* job.c - job JSON: overrides, defaults and strict validation from one table.
 *
 * The schema is a tree of field descriptors. A section entry points at its
 * child table; a leaf says its JSON kind, where it lives in ts_job, its
 * default (JSON text, NULL = derived after parsing) and its bounds. Adding a
 * section for a later issue = adding a member to ts_job and a table here.
 */
#include "proto/job.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels/io/atomic.h"
#include "kernels/rng.h"
#include "proto/job_model.h"

typedef enum {
    FIELD_INT,     /* int, bounded by [min, max] */
    FIELD_INT64,   /* int64_t, bounded by [min, max] */
    FIELD_STRING,  /* char[size], optional allowed character set */
    FIELD_ENUM,    /* int index into choices (NULL-terminated) */
    FIELD_SECTION, /* JSON object described by children */
    FIELD_REAL,    /* double, finite, bounded by [min, max] */
    FIELD_BOOL,    /* int 0/1 from true/false */
    FIELD_INTS,    /* ts_job_ints: array of integers in [min, max] */
} field_kind;

typedef struct field {
    const char *key;
    field_kind kind;
    size_t offset;       /* offsetof(ts_job, ...) for leaves */
    size_t size;         /* FIELD_STRING: buffer size */
    const char *def;     /* default as JSON text; NULL = derived later */
    long long min, max;  /* FIELD_INT / FIELD_INT64 bounds;
                            FIELD_STRING: min = 1 when it must not be empty */
    const char *charset; /* FIELD_STRING: allowed characters, NULL = any */
    const char *const *choices;    /* FIELD_ENUM */
    const struct field *children;  /* FIELD_SECTION, {0}-terminated */
    double real_min, real_max;     /* FIELD_REAL bounds */
} field;

static const char *const strategy_names[] = {"local", "standin", "ps", "ddp", "pipeline", "fsdp", NULL};
static const char *const consistency_names[] = {"sync", "async", "bounded", NULL};
static const char *const wire_dtype_names[] = {"f32", "bf16", NULL};
static const char *const transport_names[] = {"tcp", "ipc", NULL};
static const char *const security_names[] = {"curve", "none", NULL};
static const char *const pipe_schedule_names[] = {"1f1b", "gpipe", NULL};
static const char *const fsdp_mode_names[] = {"full", "grad_op", "no_shard", NULL};
static const char *const fsdp_unit_names[] = {"block", "model", NULL};

static const char name_charset[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";

#define INT_FIELD(k, member, d, lo, hi) \
    {.key = k, .kind = FIELD_INT, .offset = offsetof(ts_job, member), .def = d, .min = lo, .max = hi}
#define INT64_FIELD(k, member, d, lo, hi) \
    {.key = k, .kind = FIELD_INT64, .offset = offsetof(ts_job, member), .def = d, .min = lo, .max = hi}
#define STRING_FIELD(k, member, d, nonempty, cs)                                        \
    {.key = k, .kind = FIELD_STRING, .offset = offsetof(ts_job, member),                \
     .size = sizeof(((ts_job *)0)->member), .def = d, .min = nonempty, .charset = cs}
#define ENUM_FIELD(k, member, d, names) \
    {.key = k, .kind = FIELD_ENUM, .offset = offsetof(ts_job, member), .def = d, .choices = names}
#define SECTION(k, table) {.key = k, .kind = FIELD_SECTION, .children = table}
#define REAL_FIELD(k, member, d, lo, hi) \
    {.key = k, .kind = FIELD_REAL, .offset = offsetof(ts_job, member), .def = d, .real_min = lo, .real_max = hi}
#define BOOL_FIELD(k, member, d) \
    {.key = k, .kind = FIELD_BOOL, .offset = offsetof(ts_job, member), .def = d, .min = 0, .max = 1}
#define INTS_FIELD(k, member, d, lo, hi) \
    {.key = k, .kind = FIELD_INTS, .offset = offsetof(ts_job, member), .def = d, .min = lo, .max = hi}

static const field parallel_fields[] = {
    ENUM_FIELD("strategy", parallel.strategy, "\"local\"", strategy_names),
    INT_FIELD("workers", parallel.workers, "1", 1, 1024),
    INT_FIELD("servers", parallel.servers, "0", 0, 256),
    INT_FIELD("min_workers", parallel.min_workers, NULL, 1, 1024),
    INT_FIELD("max_workers", parallel.max_workers, NULL, 1, 1024),
    INT_FIELD("max_restarts", parallel.max_restarts, "0", 0, 1000),
    INT_FIELD("heartbeat_ms", parallel.heartbeat_ms, "500", 1, 60000),
    INT_FIELD("heartbeat_timeout_ms", parallel.heartbeat_timeout_ms, "3000", 2,
              600000),
    INT_FIELD("barrier_timeout_ms", parallel.barrier_timeout_ms, "30000", 1,
              86400000),
    INT_FIELD("join_timeout_ms", parallel.join_timeout_ms, "60000", 1, 86400000),
    ENUM_FIELD("consistency", parallel.consistency, "\"sync\"", consistency_names),
    INT_FIELD("staleness", parallel.staleness, "2", 0, 1000000),
    INT_FIELD("ps_replicas", parallel.ps_replicas, "1", 1, 2),
    ENUM_FIELD("wire_dtype", parallel.wire_dtype, "\"f32\"", wire_dtype_names),
    STRING_FIELD("bind", parallel.bind, "\"127.0.0.1\"", 1, NULL),
    STRING_FIELD("key_file", parallel.key_file, "\"\"", 0, NULL),
    INTS_FIELD("placement", parallel.placement, "[]", 0, 255),
    REAL_FIELD("bucket_mb", parallel.bucket_mb, "25", 0.0001, 4096),
    ENUM_FIELD("transport", parallel.transport, "\"tcp\"", transport_names),
    ENUM_FIELD("ring_security", parallel.ring_security, "\"curve\"", security_names),
    ENUM_FIELD("ps_security", parallel.ps_security, "\"curve\"", security_names),
    INT_FIELD("stages", parallel.stages, "2", 1, 1024),
    INTS_FIELD("pipeline_stages", parallel.pipeline_stages, "[]", 1, 1 << 20),
    INT_FIELD("micro_batches", parallel.micro_batches, "1", 1, 4096),
    INT_FIELD("chunks_per_stage", parallel.chunks_per_stage, "1", 1, 64),
    ENUM_FIELD("schedule", parallel.schedule, "\"1f1b\"", pipe_schedule_names),
    INT_FIELD("data_parallel", parallel.data_parallel, "1", 1, 1024),
    BOOL_FIELD("timeline", parallel.timeline, "false"),
    ENUM_FIELD("fsdp_mode", parallel.fsdp_mode, "\"full\"", fsdp_mode_names),
    ENUM_FIELD("fsdp_unit", parallel.fsdp_unit, "\"block\"", fsdp_unit_names),
    BOOL_FIELD("fsdp_neighbour_copy", parallel.fsdp_neighbour_copy, "false"),
    {0},
};

static const field standin_fields[] = {
    INT_FIELD("step_ms", standin.step_ms, "0", 0, 600000),
    {0},
};

static const char *const arch_names[] = {"mlp", "cnn", "gpt", NULL};
static const char *const data_names[] = {"fashion_mnist", "text", NULL};
static const char *const optim_names[] = {"sgd", "adam", "adamw", NULL};
static const char *const schedule_names[] = {"constant", "step", "cosine", NULL};
static const char *const precision_names[] = {"f32", "bf16", NULL};
static const char *const device_names[] = {"cpu", "cuda", NULL};

static const field model_fields[] = {
    ENUM_FIELD("arch", model.arch, "\"mlp\"", arch_names),
    INTS_FIELD("hidden", model.hidden, "[256, 128]", 1, 1 << 20),
    INT_FIELD("ch1", model.ch1, "16", 1, 4096),
    INT_FIELD("ch2", model.ch2, "32", 1, 4096),
    INT_FIELD("kernel", model.kernel, "5", 1, 15),
    INT_FIELD("n_layer", model.n_layer, "4", 1, 1024),
    INT_FIELD("n_head", model.n_head, "4", 1, 1024),
    INT_FIELD("n_embd", model.n_embd, "128", 1, 1 << 16),
    INT_FIELD("block_size", model.block_size, "64", 1, 1 << 16),
    REAL_FIELD("dropout", model.dropout, "0.0", 0, 1),
    BOOL_FIELD("checkpoint", model.checkpoint, "false"),
    STRING_FIELD("init_from", model.init_from, "\"\"", 0, NULL),
    STRING_FIELD("init_map", model.init_map, "\"\"", 0, NULL),
    {0},
};

static const field data_fields[] = {
    ENUM_FIELD("kind", data.kind, "\"fashion_mnist\"", data_names),
    STRING_FIELD("path", data.path, "\"\"", 0, NULL),
    REAL_FIELD("val_fraction", data.val_fraction, "0.1", 0, 1),
    BOOL_FIELD("shuffle", data.shuffle, "true"),
    INT_FIELD("prefetch", data.prefetch, "2", 0, 64),
    {0},
};

static const field optimizer_fields[] = {
    ENUM_FIELD("kind", optimizer.kind, "\"adamw\"", optim_names),
    REAL_FIELD("lr", optimizer.lr, "0.001", 0, 100),
    REAL_FIELD("weight_decay", optimizer.weight_decay, "0.0", 0, 100),
    REAL_FIELD("momentum", optimizer.momentum, "0.0", 0, 1),
    REAL_FIELD("beta1", optimizer.beta1, "0.9", 0, 1),
    REAL_FIELD("beta2", optimizer.beta2, "0.999", 0, 1),
    REAL_FIELD("eps", optimizer.eps, "1e-8", 0, 1),
    BOOL_FIELD("nesterov", optimizer.nesterov, "false"),
    REAL_FIELD("clip_norm", optimizer.clip_norm, "0.0", 0, 1000000),
    {0},
};

static const field schedule_fields[] = {
    ENUM_FIELD("kind", schedule.kind, "\"constant\"", schedule_names),
    INT64_FIELD("warmup_steps", schedule.warmup_steps, "0", 0, INT64_MAX),
    INT64_FIELD("step_size", schedule.step_size, "1000", 1, INT64_MAX),
    REAL_FIELD("gamma", schedule.gamma, "0.1", 0, 1000),
    REAL_FIELD("min_lr", schedule.min_lr, "0.0", 0, 100),
    {0},
};

static const field train_fields[] = {
    INT64_FIELD("batch_size", train.batch_size, "64", 1, 1 << 20),
    INT64_FIELD("epochs", train.epochs, "0", 0, 100000),
    INT64_FIELD("eval_every", train.eval_every, "0", 0, INT64_MAX),
    INT64_FIELD("eval_batches", train.eval_batches, "0", 0, INT64_MAX),
    INT64_FIELD("checkpoint_every", train.checkpoint_every, "0", 0, INT64_MAX),
    INT_FIELD("keep_checkpoints", train.keep_checkpoints, "3", 1, 1000),
    INT_FIELD("accum_steps", train.accum_steps, "1", 1, 1024),
    ENUM_FIELD("precision", train.bf16, "\"f32\"", precision_names),
    INT64_FIELD("log_every", train.log_every, "1", 1, INT64_MAX),
    STRING_FIELD("run_dir", train.run_dir, "\"\"", 0, NULL),
    {0},
};

static const field job_fields[] = {
    STRING_FIELD("name", name, "\"job\"", 1, name_charset),
    INT64_FIELD("seed", seed, "0", 0, INT64_MAX),
    INT64_FIELD("steps", steps, "10", 0, INT64_MAX),
    ENUM_FIELD("device", device, "\"cpu\"", device_names),
    SECTION("parallel", parallel_fields),
    SECTION("standin", standin_fields),
    SECTION("model", model_fields),
    SECTION("data", data_fields),
    SECTION("optimizer", optimizer_fields),
    SECTION("schedule", schedule_fields),
    SECTION("train", train_fields),
    {0},
};

/* Entry i of a NULL-terminated table of enum names, or "?". */
static const char *name_in(const char *const *names, int i) {
    for (int k = 0; i >= 0 && names[k]; k++)
        if (k == i) return names[k];
    return "?";
}

const char *ts_job_strategy_name(ts_job_strategy s) { return name_in(strategy_names, (int)s); }

const char *ts_job_consistency_name(ts_job_consistency c) { return name_in(consistency_names, (int)c); }

const char *ts_job_optimizer_name(ts_job_optim_kind k) { return name_in(optim_names, (int)k); }

int ts_job_ps_processes(const ts_job *job) { return job->parallel.servers * job->parallel.ps_replicas; }

/* JSON type name as a user would say it. */
static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* "a, b, c" of a table's keys or an enum's names, for error messages. */
static void list_keys(const field *table, const char *const *names, char *out,
                      size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; table ? table[i].key != NULL : names[i] != NULL; i++) {
        const char *k = table ? table[i].key : names[i];
        int w = snprintf(out + n, cap - n, "%s%s", i ? ", " : "", k);
        if (w < 0 || (size_t)w >= cap - n) break;
        n += (size_t)w;
    }
}

/* An integer field given as a real (1e3, or 1e20 from --set): a whole
 * number in range is stored, else "out of range" or "expected integer". */
static ts_status store_integral_real(const field *f, double x, const char *path, char *dst) {
    if (x != floor(x))
        return ts_error(TS_ERR_FORMAT, "%s: expected integer, got real %g", path, x);
    /* (double)max + 1 is exact where (double)max may round up (INT64_MAX) */
    if (x < (double)f->min || x >= (double)f->max + 1.0)
        return ts_error(TS_ERR_VALUE, "%s: %g out of range [%lld, %lld]", path, x, f->min,
                        f->max);
    if (f->kind == FIELD_INT)
        *(int *)dst = (int)x;
    else
        *(int64_t *)dst = (int64_t)x;
    return TS_OK;
}

/* Stores leaf value v (already known present) of field f into job. */
static ts_status store_leaf(const field *f, const json_t *v, const char *path,
                            ts_job *job) {
    char *dst = (char *)job + f->offset;
    switch (f->kind) {
    case FIELD_INT:
    case FIELD_INT64: {
        if (json_is_real(v)) return store_integral_real(f, json_real_value(v), path, dst);
        if (!json_is_integer(v))
            return ts_error(TS_ERR_FORMAT, "%s: expected integer, got %s", path,
                            type_name(v));
        json_int_t x = json_integer_value(v);
        if (x < f->min || x > f->max)
            return ts_error(TS_ERR_VALUE, "%s: %lld out of range [%lld, %lld]",
                            path, (long long)x, f->min, f->max);
        if (f->kind == FIELD_INT)
            *(int *)dst = (int)x;
        else
            *(int64_t *)dst = (int64_t)x;
        return TS_OK;
    }
    case FIELD_STRING: {
        if (!json_is_string(v))
            return ts_error(TS_ERR_FORMAT, "%s: expected string, got %s", path,
                            type_name(v));
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);
        if (len >= f->size)
            return ts_error(TS_ERR_VALUE, "%s: string of %zu bytes, limit %zu",
                            path, len, f->size - 1);
        if (f->min && len == 0)
            return ts_error(TS_ERR_VALUE, "%s: must not be empty", path);
        if (strlen(s) != len)
            return ts_error(TS_ERR_VALUE, "%s: contains a NUL byte", path);
        if (f->charset && strspn(s, f->charset) != len)
            return ts_error(TS_ERR_VALUE,
                            "%s: \"%s\" has a character outside [A-Za-z0-9._-]",
                            path, s);
        memcpy(dst, s, len + 1);
        return TS_OK;
    }
    case FIELD_ENUM: {
        if (!json_is_string(v))
            return ts_error(TS_ERR_FORMAT, "%s: expected string, got %s", path,
                            type_name(v));
        const char *s = json_string_value(v);
        for (int i = 0; f->choices[i]; i++) {
            if (strcmp(s, f->choices[i]) == 0) {
                *(int *)dst = i;
                return TS_OK;
            }
        }
        char known[256];
        list_keys(NULL, f->choices, known, sizeof known);
        return ts_error(TS_ERR_VALUE, "%s: \"%s\" is not one of: %s", path, s,
                        known);
    }
    case FIELD_REAL: {
        if (!json_is_number(v))
            return ts_error(TS_ERR_FORMAT, "%s: expected number, got %s", path,
                            type_name(v));
        double x = json_number_value(v);
        if (!(x >= f->real_min && x <= f->real_max))
            return ts_error(TS_ERR_VALUE, "%s: %g out of range [%g, %g]", path,
                            x, f->real_min, f->real_max);
        *(double *)dst = x;
        return TS_OK;
    }
    case FIELD_BOOL:
        if (!json_is_boolean(v))
            return ts_error(TS_ERR_FORMAT, "%s: expected boolean, got %s", path,
                            type_name(v));
        *(int *)dst = json_is_true(v);
        return TS_OK;
    case FIELD_INTS: {
        ts_job_ints *out = (ts_job_ints *)dst;
        size_t cap = sizeof out->v / sizeof out->v[0];
        if (!json_is_array(v))
            return ts_error(TS_ERR_FORMAT, "%s: expected array, got %s", path,
                            type_name(v));
        if (json_array_size(v) > cap)
            return ts_error(TS_ERR_VALUE, "%s: %zu entries, limit %zu", path,
                            json_array_size(v), cap);
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e))
                return ts_error(TS_ERR_FORMAT, "%s[%zu]: expected integer, got %s",
                                path, i, type_name(e));
            json_int_t x = json_integer_value(e);
            if (x < f->min || x > f->max)
                return ts_error(TS_ERR_VALUE, "%s[%zu]: %lld out of range [%lld, %lld]",
                                path, i, (long long)x, f->min, f->max);
            out->v[i] = (int64_t)x;
        }
        out->n = (int)json_array_size(v);
        return TS_OK;
    }
    case FIELD_SECTION: break;
    }
    return ts_error(TS_ERR_STATE, "%s: not a leaf field", path);
}

/* Validates obj (an object, or NULL when the section is absent) against
 * table and fills job; prefix is the dotted path of obj ("" or "a."). */
static ts_status fill_section(const field *table, json_t *obj,
                              const char *prefix, ts_job *job) {
    const char *key;
    json_t *val;
    if (obj) {
        json_object_foreach(obj, key, val) {
            const field *f = table;
            while (f->key && strcmp(f->key, key) != 0) f++;
            if (!f->key) {
                char known[512];
                list_keys(table, NULL, known, sizeof known);
                return ts_error(TS_ERR_FORMAT, "%s%s: unknown field (known: %s)",
                                prefix, key, known);
            }
        }
    }
    for (const field *f = table; f->key; f++) {
        char path[256];
        snprintf(path, sizeof path, "%s%s", prefix, f->key);
        json_t *v = obj ? json_object_get(obj, f->key) : NULL;
        ts_status st;
        if (f->kind == FIELD_SECTION) {
            if (v && !json_is_object(v))
                return ts_error(TS_ERR_FORMAT, "%s: expected object, got %s",
                                path, type_name(v));
            char sub[sizeof path + 1];
            snprintf(sub, sizeof sub, "%s.", path);
            st = fill_section(f->children, v, sub, job);
        } else if (v) {
            st = store_leaf(f, v, path, job);
        } else if (f->def) {
            json_t *d = json_loads(f->def, JSON_DECODE_ANY, NULL);
            if (!d) return ts_error(TS_ERR_MEMORY, "%s: default unreadable", path);
            st = store_leaf(f, d, path, job);
            json_decref(d);
        } else {
            st = TS_OK; /* derived in finish_job */
        }
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

/* A pipeline's pieces (stages x chunks) against the model's units: at
 * least one unit each, and parallel.pipeline_stages, when given, holding
 * them all. */
static ts_status check_cut(const ts_job *job, int pieces) {
    const ts_job_parallel *p = &job->parallel;
    ts_model_spec spec;
    ts_status st = ts_job_model_spec(job, &spec);
    if (st) return st;
    int units = ts_model_units(&spec);
    if (units < pieces)
        return ts_error(TS_ERR_VALUE, "parallel.stages: %d stages x %d chunks (parallel.chunks_per_stage) are %d "
                        "pieces, but the model has %d units (one a piece at least)", p->stages, p->chunks_per_stage,
                        pieces, units);
    int64_t held = 0;
    for (int i = 0; i < p->pipeline_stages.n; i++) held += p->pipeline_stages.v[i];
    if (p->pipeline_stages.n && held != units)
        return ts_error(TS_ERR_VALUE, "parallel.pipeline_stages: the pieces hold %lld units but the model has %d",
                        (long long)held, units);
    return TS_OK;
}

/* Strategy "pipeline": P stages times D replicas are the job's workers
 * (parallel.workers may say so or be left at 1), none joins later, and the
 * batch splits into the micro-batches. */
static ts_status finish_pipeline(ts_job *job) {
    ts_job_parallel *p = &job->parallel;
    if (p->strategy != TS_STRATEGY_PIPELINE) return TS_OK;
    int w = p->stages * p->data_parallel;
    if (p->stages < 2)
        return ts_error(TS_ERR_VALUE, "parallel.stages: strategy \"pipeline\" needs at least 2 stages, got %d",
                        p->stages);
    int pieces = p->stages * p->chunks_per_stage;
    if (p->pipeline_stages.n && p->pipeline_stages.n != pieces)
        return ts_error(TS_ERR_VALUE, "parallel.pipeline_stages: %d pieces listed but parallel.stages %d x "
                        "parallel.chunks_per_stage %d is %d", p->pipeline_stages.n, p->stages, p->chunks_per_stage,
                        pieces);
    if (p->chunks_per_stage > 1 && p->micro_batches % p->stages)
        return ts_error(TS_ERR_VALUE, "parallel.micro_batches: %d; interleaving %d chunks per stage needs a "
                        "multiple of parallel.stages (%d)", p->micro_batches, p->chunks_per_stage, p->stages);
    if (p->workers != 1 && p->workers != w)
        return ts_error(TS_ERR_VALUE, "parallel.workers: %d, but a pipeline of %d stages x %d replicas "
                        "(parallel.data_parallel) has %d workers", p->workers, p->stages, p->data_parallel, w);
    if ((p->min_workers && p->min_workers != w) || (p->max_workers && p->max_workers != w))
        return ts_error(TS_ERR_VALUE, "parallel.min_workers/max_workers: a pipeline runs with exactly its %d "
                        "workers (%d stages x %d replicas)", w, p->stages, p->data_parallel);
    if (job->train.batch_size % p->micro_batches)
        return ts_error(TS_ERR_VALUE, "parallel.micro_batches: train.batch_size %lld does not split into %d "
                        "micro-batches", (long long)job->train.batch_size, p->micro_batches);
    if (job->train.accum_steps != 1)
        return ts_error(TS_ERR_VALUE, "train.accum_steps: %d; a pipeline accumulates its micro-batches "
                        "(parallel.micro_batches) instead", job->train.accum_steps);
    ts_status st = check_cut(job, pieces);
    if (st) return st;
    p->workers = p->min_workers = p->max_workers = w;
    return TS_OK;
}

/* A model on a GPU (device "cuda") where the strategy's buffers are in
 * host memory: fsdp's shards and a pipeline's stages, and the bf16
 * gradient copies of ddp's buckets, are refused by name. */
static ts_status check_device(const ts_job *job) {
    const ts_job_parallel *p = &job->parallel;
    if (job->device != TS_JOB_DEVICE_CUDA) return TS_OK;
    if (p->strategy == TS_STRATEGY_FSDP || p->strategy == TS_STRATEGY_PIPELINE)
        return ts_error(TS_ERR_VALUE, "device: \"cuda\" with parallel.strategy \"%s\" is not supported yet (its %s "
                        "are in host memory); use device \"cpu\"", ts_job_strategy_name(p->strategy),
                        p->strategy == TS_STRATEGY_FSDP ? "shards, gathers and gradients" : "activations and gradients");
    if (p->strategy == TS_STRATEGY_DDP && p->wire_dtype == TS_WIRE_BF16)
        return ts_error(TS_ERR_VALUE, "parallel.wire_dtype: \"bf16\" with device \"cuda\" under strategy \"ddp\" is "
                        "not supported (NCCL reduces the f32 gradients); use \"f32\"");
    return TS_OK;
}

/* Derived defaults and checks that involve more than one field. */
static ts_status finish_job(ts_job *job) {
    ts_job_parallel *p = &job->parallel;
    ts_status st = finish_pipeline(job);
    if (!st) st = check_device(job);
    if (st) return st;
    if (p->min_workers == 0) p->min_workers = p->workers;
    if (p->max_workers == 0)
        p->max_workers = p->workers > p->min_workers ? p->workers : p->min_workers;
    if (p->min_workers > p->workers)
        return ts_error(TS_ERR_VALUE,
                        "parallel.min_workers: %d exceeds parallel.workers (%d)",
                        p->min_workers, p->workers);
    if (p->max_workers < p->workers)
        return ts_error(TS_ERR_VALUE,
                        "parallel.max_workers: %d is below parallel.workers (%d)",
                        p->max_workers, p->workers);
    if (job->model.dropout >= 1)
        return ts_error(TS_ERR_VALUE, "model.dropout: %g must be below 1",
                        job->model.dropout);
    if (job->optimizer.beta1 >= 1 || job->optimizer.beta2 >= 1)
        return ts_error(TS_ERR_VALUE, "optimizer.beta%d: must be below 1",
                        job->optimizer.beta1 >= 1 ? 1 : 2);
    if (job->model.n_embd % job->model.n_head)
        return ts_error(TS_ERR_VALUE,
                        "model.n_embd: %d is not divisible by model.n_head (%d)",
                        job->model.n_embd, job->model.n_head);
    if (job->model.init_map[0] && !job->model.init_from[0])
        return ts_error(TS_ERR_VALUE, "model.init_map: \"%s\" is given without model.init_from",
                        job->model.init_map);
    if (job->data.val_fraction >= 1)
        return ts_error(TS_ERR_VALUE, "data.val_fraction: %g must be below 1",
                        job->data.val_fraction);
    const ts_job_schedule *sc = &job->schedule;
    if (sc->kind == TS_JOB_COSINE && job->train.epochs == 0 && job->steps > 0 &&
        sc->warmup_steps >= job->steps)
        return ts_error(TS_ERR_VALUE,
                        "schedule.warmup_steps: %lld must be below steps (%lld) for a cosine schedule",
                        (long long)sc->warmup_steps, (long long)job->steps);
    if (sc->kind == TS_JOB_COSINE && sc->min_lr > job->optimizer.lr)
        return ts_error(TS_ERR_VALUE, "schedule.min_lr: %g exceeds optimizer.lr (%g)", sc->min_lr,
                        job->optimizer.lr);
    /* no worker ahead of the slowest: the step's pushes summed, as sync */
    if (p->consistency == TS_CONSISTENCY_BOUNDED && p->staleness == 0) p->consistency = TS_CONSISTENCY_SYNC;
    if (p->strategy == TS_STRATEGY_PS && p->servers < 1)
        return ts_error(TS_ERR_VALUE, "parallel.servers: strategy \"ps\" needs at least one shard");
    /* a local run ignores parallel; the others would start servers nobody uses */
    bool no_servers = p->strategy == TS_STRATEGY_DDP || p->strategy == TS_STRATEGY_FSDP ||
                      p->strategy == TS_STRATEGY_PIPELINE;
    if (no_servers && p->servers > 0)
        return ts_error(TS_ERR_VALUE, "parallel.servers: %d, but strategy \"%s\" has no parameter servers (set it to 0)",
                        p->servers, ts_job_strategy_name(p->strategy));
    if (p->heartbeat_timeout_ms <= p->heartbeat_ms)
        return ts_error(TS_ERR_VALUE,
                        "parallel.heartbeat_timeout_ms: %d must exceed "
                        "parallel.heartbeat_ms (%d)",
                        p->heartbeat_timeout_ms, p->heartbeat_ms);
    return TS_OK;
}

/* True when text is written like a JSON number: sign, digits, fraction,
 * exponent and nothing else. */
static bool is_number_text(const char *text) {
    const char *p = text;
    if (*p == '-') p++;
    if (!isdigit((unsigned char)*p)) return false;
    while (isdigit((unsigned char)*p)) p++;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return false;
        while (isdigit((unsigned char)*p)) p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return false;
        while (isdigit((unsigned char)*p)) p++;
    }
    return *p == '\0';
}

ts_status ts_job_set(json_t *doc, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return ts_error(TS_ERR_VALUE, "--set %s: expected key.path=value",
                        assignment);
    char path[256];
    size_t plen = (size_t)(eq - assignment);
    if (plen >= sizeof path)
        return ts_error(TS_ERR_VALUE, "--set: key path of %zu bytes is too long",
                        plen);
    memcpy(path, assignment, plen);
    path[plen] = '\0';

    json_t *obj = doc;
    char *seg = path;
    for (;;) {
        char *dot = strchr(seg, '.');
        if (dot) *dot = '\0';
        if (*seg == '\0')
            return ts_error(TS_ERR_VALUE, "--set %.*s: empty path segment",
                            (int)plen, assignment);
        if (!dot) break;
        json_t *child = json_object_get(obj, seg);
        if (!child) {
            child = json_object();
            if (!child || json_object_set_new(obj, seg, child) != 0)
                return ts_error(TS_ERR_MEMORY, "--set: out of memory");
        } else if (!json_is_object(child)) {
            return ts_error(TS_ERR_VALUE, "--set %.*s: %s is not a section (got %s)",
                            (int)plen, assignment, seg, type_name(child));
        }
        obj = child;
        seg = dot + 1;
    }
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!value && is_number_text(eq + 1)) {
        /* a number JSON cannot hold: an integer beyond 64 bits is kept as a
         * real (the field judges its range), beyond a double is refused */
        errno = 0;
        double x = strtod(eq + 1, NULL);
        if (errno == ERANGE || !isfinite(x))
            return ts_error(TS_ERR_VALUE, "%.*s: %s out of range (beyond a double)", (int)plen,
                            assignment, eq + 1);
        value = json_real(x);
    }
    if (!value) value = json_string(eq + 1);
    if (!value || json_object_set_new(obj, seg, value) != 0)
        return ts_error(TS_ERR_VALUE, "--set %s: value is not valid UTF-8",
                        assignment);
    return TS_OK;
}

/* Whether override "a.b=value" assigns key (a whole path) or a section
 * that holds it. */
static bool sets_key(const char *assignment, const char *key) {
    size_t n = strcspn(assignment, "=");
    return !strncmp(assignment, key, n) && (key[n] == '\0' || key[n] == '.');
}

/* Overrides, defaults and validation of a parsed document (borrowed). An
 * override of steps on a job of train.epochs trains those steps: the
 * document's epochs are dropped unless an override sets them too. */
static ts_status job_from_doc(json_t *doc, const char *const *sets, int nsets,
                              ts_job *job) {
    if (!json_is_object(doc))
        return ts_error(TS_ERR_FORMAT, "job: expected a JSON object, got %s",
                        type_name(doc));
    bool steps = false, epochs = false;
    for (int i = 0; i < nsets; i++) {
        ts_status st = ts_job_set(doc, sets[i]);
        if (st != TS_OK) return st;
        steps |= sets_key(sets[i], "steps");
        epochs |= sets_key(sets[i], "train.epochs");
    }
    json_t *train = json_object_get(doc, "train");
    if (steps && !epochs && json_is_object(train)) json_object_del(train, "epochs");
    memset(job, 0, sizeof *job);
    ts_status st = fill_section(job_fields, doc, "", job);
    return st != TS_OK ? st : finish_job(job);
}

ts_status ts_job_parse(const char *text, const char *const *sets, int nsets,
                       ts_job *job) {
    json_error_t err;
    json_t *doc = json_loads(text, 0, &err);
    if (!doc)
        return ts_error(TS_ERR_FORMAT, "job: JSON error at line %d column %d: %s",
                        err.line, err.column, err.text);
    ts_status st = job_from_doc(doc, sets, nsets, job);
    json_decref(doc);
    return st;
}

ts_status ts_job_load(const char *path, const char *const *sets, int nsets,
                      ts_job *job) {
    int fd;
    ts_status st = ts_io_open_regular(path, "job file", &fd);
    if (st != TS_OK) return st;
    json_error_t err;
    json_t *doc = json_loadfd(fd, 0, &err);
    close(fd);
    if (!doc)
        return ts_error(TS_ERR_FORMAT, "job file %s: line %d column %d: %s", path,
                        err.line, err.column, err.text);
    st = job_from_doc(doc, sets, nsets, job);
    json_decref(doc);
    if (st != TS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        ts_error(st, "%s: %s", path, msg);
    }
    return st;
}

/* JSON object of table's fields read back from job. */
static json_t *section_to_json(const field *table, const ts_job *job) {
    json_t *obj = json_object();
    for (const field *f = table; obj && f->key; f++) {
        const char *src = (const char *)job + f->offset;
        json_t *v = NULL;
        switch (f->kind) {
        case FIELD_INT: v = json_integer(*(const int *)src); break;
        case FIELD_INT64: v = json_integer(*(const int64_t *)src); break;
        case FIELD_STRING: v = json_string(src); break;
        case FIELD_ENUM: v = json_string(f->choices[*(const int *)src]); break;
        case FIELD_SECTION: v = section_to_json(f->children, job); break;
        case FIELD_REAL: v = json_real(*(const double *)src); break;
        case FIELD_BOOL: v = json_boolean(*(const int *)src); break;
        case FIELD_INTS: {
            const ts_job_ints *l = (const ts_job_ints *)src;
            v = json_array();
            for (int i = 0; v && i < l->n; i++)
                json_array_append_new(v, json_integer(l->v[i]));
            break;
        }
        }
        if (!v || json_object_set_new(obj, f->key, v) != 0) {
            json_decref(obj);
            obj = NULL;
        }
    }
    return obj;
}

json_t *ts_job_to_json(const ts_job *job) {
    return section_to_json(job_fields, job);
}

ts_status ts_job_caps(const ts_job *job, char *out, size_t cap) {
    json_t *all = ts_job_to_json(job);
    json_t *shared = all ? json_pack("{s:O, s:O, s:O}", "model", json_object_get(all, "model"), "optimizer",
                                     json_object_get(all, "optimizer"), "schedule", json_object_get(all, "schedule"))
                         : NULL;
    json_t *model = json_object_get(shared, "model");
    json_object_del(model, "init_from");
    json_object_del(model, "init_map");
    char *text = shared ? json_dumps(shared, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(shared);
    json_decref(all);
    if (!text) return ts_error(TS_ERR_MEMORY, "job %s: capabilities: out of memory", job->name);
    uint64_t h = ts_hash_text(text);
    free(text);
    int n = snprintf(out, cap, "%s job=%016llx", ts_job_strategy_name(job->parallel.strategy), (unsigned long long)h);
    if (n < 0 || (size_t)n >= cap)
        return ts_error(TS_ERR_VALUE, "job %s: capabilities longer than %zu bytes", job->name, cap - 1);
    return TS_OK;
}

/* Copies value into dst (cap bytes) for flag; error when too long. */
static ts_status copy_flag(char *dst, size_t cap, const char *flag,
                           const char *value) {
    if (strlen(value) >= cap)
        return ts_error(TS_ERR_VALUE, "%s: value of %zu bytes, limit %zu", flag,
                        strlen(value), cap - 1);
    memcpy(dst, value, strlen(value) + 1);
    return TS_OK;
}

ts_status ts_job_node_args_parse(int argc, char **argv, bool need_scheduler, ts_job_node_args *a) {
    static const char *const flags[] = {"--scheduler", "--key-file", "--job", "--set", "--rank", "--run-dir", NULL};
    static const char usage[] = "[JOB.json | --job JOB.json] [--scheduler ADDR --key-file PATH] [--set k=v]... "
                                "[--rank N] [--run-dir DIR] [--resume] [--force]";
    memset(a, 0, sizeof *a);
    a->rank = -1;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) return ts_error(TS_ERR_MEMORY, "command line: out of memory");
    int nsets = 0;
    ts_status st = TS_OK;
    for (int i = 1; i < argc && st == TS_OK; i++) {
        if (strcmp(argv[i], "--resume") == 0) {
            a->resume = true;
            continue;
        }
        if (strcmp(argv[i], "--force") == 0) {
            a->force = true;
            continue;
        }
        if (argv[i][0] != '-' && !a->job_path[0]) {
            st = copy_flag(a->job_path, sizeof a->job_path, "job file", argv[i]);
            continue;
        }
        int f = 0;
        size_t n = 0;
        for (; flags[f]; f++) {
            n = strlen(flags[f]);
            if (strncmp(argv[i], flags[f], n) == 0 &&
                (argv[i][n] == '\0' || argv[i][n] == '='))
                break;
        }
        if (!flags[f]) {
            st = ts_error(TS_ERR_VALUE, "unknown argument %s (expected %s)", argv[i], usage);
            break;
        }
        const char *v = argv[i][n] == '=' ? argv[i] + n + 1
                        : i + 1 < argc    ? argv[++i]
                                          : NULL;
        if (!v) {
            st = ts_error(TS_ERR_VALUE, "%s needs a value", flags[f]);
        } else if (f == 0) {
            st = copy_flag(a->scheduler, sizeof a->scheduler, flags[f], v);
        } else if (f == 1) {
            st = copy_flag(a->key_file, sizeof a->key_file, flags[f], v);
        } else if (f == 2) {
            st = copy_flag(a->job_path, sizeof a->job_path, flags[f], v);
        } else if (f == 3) {
            sets[nsets++] = v;
        } else if (f == 5) {
            st = copy_flag(a->run_dir, sizeof a->run_dir, flags[f], v);
        } else {
            char *end;
            long r = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || r < 0 || r > INT_MAX)
                st = ts_error(TS_ERR_VALUE, "--rank: \"%s\" is not a rank", v);
            else
                a->rank = (int)r;
        }
    }
    if (st == TS_OK && a->scheduler[0] && !a->key_file[0] && getenv("TESSERA_KEY_FILE"))
        st = copy_flag(a->key_file, sizeof a->key_file, "TESSERA_KEY_FILE",
                       getenv("TESSERA_KEY_FILE"));
    if (st == TS_OK && need_scheduler && !a->scheduler[0])
        st = ts_error(TS_ERR_VALUE, "--scheduler ADDR is required");
    if (st == TS_OK && a->scheduler[0] && !a->key_file[0])
        st = ts_error(TS_ERR_VALUE, "--key-file PATH (or TESSERA_KEY_FILE) is required with --scheduler");
    if (st == TS_OK && !a->job_path[0])
        st = ts_error(TS_ERR_VALUE, "no job file given (%s)", usage);
    if (st == TS_OK) st = ts_job_load(a->job_path, sets, nsets, &a->job);
    free(sets);
    return st;
}
