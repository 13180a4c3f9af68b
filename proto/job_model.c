/* job_model.c - the job's model spec, optimizer config and decay groups. */
#include "proto/job_model.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/data/text.h"

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
