/* job_model.c - the job's model spec, optimizer config and decay groups. */
#include "proto/job_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/data/text.h"
#include "kernels/io/checkpoint.h"
#include "kernels/io/weights.h"

ts_status ts_job_model_spec(const ts_job *job, ts_model_spec *spec) {
    const ts_job_model *m = &job->model;
    memset(spec, 0, sizeof *spec);
    switch (m->arch) {
    case TS_JOB_MLP:
        if (job->data.kind != TS_JOB_FASHION_MNIST)
            return ts_error(TS_ERR_VALUE, "model.arch: mlp needs data.kind fashion_mnist");
        spec->arch = TS_ARCH_MLP;
        spec->widths[spec->n_widths++] = 28 * 28;
        for (int i = 0; i < m->hidden.n; i++) spec->widths[spec->n_widths++] = m->hidden.v[i];
        spec->widths[spec->n_widths++] = 10;
        break;
    case TS_JOB_CNN:
        if (job->data.kind != TS_JOB_FASHION_MNIST)
            return ts_error(TS_ERR_VALUE, "model.arch: cnn needs data.kind fashion_mnist");
        spec->arch = TS_ARCH_CNN;
        spec->in_ch = 1;
        spec->img = 28;
        spec->ch1 = m->ch1;
        spec->ch2 = m->ch2;
        spec->kernel = m->kernel;
        spec->classes = 10;
        break;
    case TS_JOB_GPT:
        if (job->data.kind != TS_JOB_TEXT) return ts_error(TS_ERR_VALUE, "model.arch: gpt needs data.kind text");
        spec->arch = TS_ARCH_GPT;
        spec->gpt = (ts_gpt_config){TS_TEXT_VOCAB, m->block_size, m->n_layer, m->n_head, m->n_embd, m->dropout};
        spec->checkpoint = m->checkpoint;
        break;
    }
    return ts_model_units(spec) < 0 ? ts_last_status() : TS_OK;
}

/* Checks that every tensor of the job's model.init_from names a parameter
 * of the whole model of spec, whose units are built one at a time for
 * their names (a part of it loaded the file non-strictly). */
static ts_status init_names_known(const ts_job *job, const ts_model_spec *spec) {
    int units = ts_model_units(spec), n = 0, cap = 0;
    char **names = NULL;
    ts_status st = units < 0 ? ts_last_status() : TS_OK;
    for (int u = 0; !st && u < units; u++) {
        ts_model *part = ts_model_build(spec, u, u + 1, ts_key_from_seed(0), TS_F32);
        if (!part) st = ts_last_status();
        for (int i = 0; !st && i < part->n_params; i++) {
            if (n == cap) {
                char **more = realloc(names, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *names);
                if (!more) st = ts_error(TS_ERR_MEMORY, "init_from: out of memory for the model's names");
                else names = more;
            }
            if (!st && !(names[n++] = strdup(part->params[i].name)))
                st = ts_error(TS_ERR_MEMORY, "init_from: out of memory for the model's names");
        }
        ts_model_free(part);
    }
    if (!st) st = ts_weights_check_names(job->model.init_from, job->model.init_map, names, n);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

ts_model *ts_job_model_build(const ts_job *job, const ts_model_spec *spec, const ts_unit_runs *runs) {
    ts_key key = ts_key_from_seed((uint64_t)job->seed);
    ts_model *m = runs ? ts_model_build_runs(spec, runs, key, TS_F32) : ts_model_build(spec, 0, -1, key, TS_F32);
    if (!m || !job->model.init_from[0]) return m;
    bool whole = !runs || ts_unit_runs_all(runs, spec);
    if (ts_weights_load(m, job->model.init_from, job->model.init_map, whole) ||
        (!whole && init_names_known(job, spec))) {
        ts_model_free(m);
        return NULL;
    }
    return m;
}

void ts_job_forget_init(ts_job *job) {
    job->model.init_from[0] = '\0';
    job->model.init_map[0] = '\0';
}

/* The job saved in the checkpoint folder dir. */
static ts_status checkpoint_job(const char *dir, ts_job *job) {
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    if (!ck) return ts_last_status();
    ts_status st = ck->config ? ts_job_parse(ck->config, NULL, 0, job)
                              : ts_error(TS_ERR_FORMAT, "%s: the checkpoint holds no job config", dir);
    ts_checkpoint_close(ck);
    return st;
}

/* The job file at job_path with model.init_from = path, then the sets. */
static ts_status weights_job(const char *path, const char *job_path, const char *const *sets, int nsets, ts_job *job) {
    json_t *quoted = json_string(path);
    char *value = quoted ? json_dumps(quoted, JSON_ENCODE_ANY) : NULL;
    json_decref(quoted);
    const char **all = calloc((size_t)nsets + 1, sizeof *all);
    size_t len = value ? strlen(value) + 32 : 0;
    char *init = value && all ? malloc(len) : NULL;
    ts_status st = init ? TS_OK : ts_error(TS_ERR_MEMORY, "%s: out of memory", path);
    if (!st) {
        snprintf(init, len, "model.init_from=%s", value);
        all[0] = init;
        for (int i = 0; i < nsets; i++) all[i + 1] = sets[i];
        st = ts_job_load(job_path, all, nsets + 1, job);
    }
    free(value);
    free(init);
    free(all);
    return st;
}

ts_status ts_job_for_weights(const char *path, const char *job_path, const char *const *sets, int nsets, ts_job *job,
                             bool *is_checkpoint) {
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: no such checkpoint folder or weights file", path);
    *is_checkpoint = S_ISDIR(sb.st_mode);
    if (*is_checkpoint && (job_path || nsets))
        return ts_error(TS_ERR_VALUE, "%s is a checkpoint folder: it brings its own job (no job file or --set)", path);
    if (*is_checkpoint) return checkpoint_job(path, job);
    if (!job_path) return ts_error(TS_ERR_VALUE, "%s is a weights file: give the job that describes its model (JOB.json)", path);
    return weights_job(path, job_path, sets, nsets, job);
}

ts_status ts_job_optim_config(const ts_job *job, ts_optim_config *cfg) {
    const ts_job_optimizer *o = &job->optimizer;
    static const ts_optim_kind kinds[] = {TS_OPTIM_SGD, TS_OPTIM_ADAM, TS_OPTIM_ADAMW};
    *cfg = ts_optim_defaults(kinds[o->kind]);
    cfg->weight_decay = o->weight_decay;
    cfg->momentum = o->momentum;
    cfg->nesterov = o->nesterov;
    cfg->beta1 = o->beta1;
    cfg->beta2 = o->beta2;
    cfg->eps = o->eps;
    return ts_optim_check(cfg);
}

ts_status ts_job_optim_groups(const ts_model *m, ts_optim_groups *out) {
    ts_optim_named *named = calloc((size_t)m->n_params, sizeof *named);
    if (!named) return ts_error(TS_ERR_MEMORY, "optimizer groups: out of memory for %d parameters", m->n_params);
    for (int i = 0; i < m->n_params; i++)
        named[i] = (ts_optim_named){m->params[i].name, m->params[i].ndim, m->params[i].offset, m->params[i].numel};
    static const char *const no_decay[] = {"*.bias", "*ln*"};
    ts_optim_decay_rule rule = {2, no_decay, 2};
    ts_status st = ts_optim_groups_build(out, m->numel, named, m->n_params, &rule);
    free(named);
    return st;
}
