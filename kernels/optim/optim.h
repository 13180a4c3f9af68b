/* optim.h - SGD, Adam and AdamW as step kernels over a flat range.
 *
 * A model keeps parameters, gradients and optimizer state in flat f32 buffers
 * with one layout (DESIGN.md, "the flat buffer"). An optimizer step is a kernel
 * over a range [offset, offset+len) of those buffers, so a full-model step, a
 * parameter-server shard and an FSDP rank run the same code on their slice and
 * get bit-identical updates for the elements they share.
 *
 * State: ts_optim_state_slots(cfg) floats per element (SGD without momentum 0,
 * SGD with momentum 1 = momentum buffer, Adam/AdamW 2 = m then v). Slot s of
 * element offset+i lives at state[s * stride + i]: a whole model uses one
 * buffer of k*N floats (stride N), a shard one of k*len (stride len).
 * State must be zero before step 1 (as PyTorch's lazily created state is).
 *
 * Updates follow torch.optim.SGD / Adam / AdamW (PyTorch 1.13, no amsgrad, no
 * maximize): SGD adds weight_decay*p to the gradient, starts the momentum
 * buffer with the first gradient (step t == 1), then buf = momentum*buf +
 * (1-dampening)*g, Nesterov uses g + momentum*buf; Adam adds L2 weight decay
 * to the gradient; AdamW decays decoupled (p *= 1 - lr*wd); both bias-correct
 * m and v with 1 - beta^t.
 *
 * Per-parameter options (no decay on biases and LayerNorm weights) are groups:
 * a sorted list of ranges covering [0, numel), each with a weight-decay and a
 * learning-rate multiplier. A step range may cut across any number of groups.
 * Step counts t start at 1 (the step being taken).
 */
#ifndef TS_OPTIM_OPTIM_H
#define TS_OPTIM_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/status.h"
#include "kernels/tensor.h"

typedef enum { TS_OPTIM_SGD, TS_OPTIM_ADAM, TS_OPTIM_ADAMW } ts_optim_kind;

typedef struct {
    ts_optim_kind kind;
    double weight_decay; /* SGD/Adam: L2 added to the grad; AdamW: decoupled */
    /* SGD */
    double momentum;     /* 0 = plain SGD (no state) */
    double dampening;    /* must be 0 with nesterov */
    bool nesterov;
    /* Adam / AdamW */
    double beta1, beta2, eps;
} ts_optim_config;

/* PyTorch's defaults for kind: SGD momentum 0, wd 0; Adam betas (0.9, 0.999),
 * eps 1e-8, wd 0; AdamW the same with wd 0.01. The learning rate is not part
 * of the config: it is passed to every step (see schedule.h). */
ts_optim_config ts_optim_defaults(ts_optim_kind kind);

/* Checks the config (betas in [0,1), eps >= 0, momentum/dampening/wd >= 0,
 * nesterov needs momentum > 0 and dampening 0); error names the field. */
ts_status ts_optim_check(const ts_optim_config *cfg);

/* State floats per parameter element: 0, 1 or 2 (see above). */
int ts_optim_state_slots(const ts_optim_config *cfg);

/* Name of the kind ("sgd", "adam", "adamw"), and the reverse (-1 if unknown). */
const char *ts_optim_kind_name(ts_optim_kind kind);
int ts_optim_kind_parse(const char *name);

/* ---- groups: per-parameter options in range form ---- */

typedef struct {
    int64_t offset, len;
    float wd_scale; /* multiplies cfg->weight_decay (1 decays, 0 does not) */
    float lr_scale; /* multiplies the step's lr (1 by default) */
} ts_optim_group;

typedef struct {
    ts_optim_group *ranges; /* sorted, contiguous, covering [0, numel) */
    int n;
    int64_t numel;
} ts_optim_groups;

/* One named parameter of a flat buffer (what a model lists). */
typedef struct {
    const char *name; /* PyTorch-style dotted name */
    int ndim;
    int64_t offset, numel;
} ts_optim_named;

/* Which parameters get weight decay: those with ndim >= min_ndim whose name
 * matches none of the no_decay glob patterns (fnmatch, '*' crosses dots),
 * e.g. min_ndim 2 and {"*.bias", "*ln*"}. min_ndim 0 and no patterns decays
 * everything. */
typedef struct {
    int min_ndim;
    const char *const *no_decay;
    int n_no_decay;
} ts_optim_decay_rule;

/* Builds the groups for a flat buffer of numel elements from its named
 * parameters (any order, no overlaps, inside [0, numel)). Elements no
 * parameter covers (padding) get a no-decay group. Adjacent ranges with equal
 * multipliers are merged. lr_scale is 1 everywhere (edit ranges to change).
 * Free with ts_optim_groups_free. */
ts_status ts_optim_groups_build(ts_optim_groups *out, int64_t numel, const ts_optim_named *params, int n_params,
                                const ts_optim_decay_rule *rule);

/* One group over [0, numel) with the given weight-decay multiplier. */
ts_status ts_optim_groups_uniform(ts_optim_groups *out, int64_t numel, float wd_scale);

/* Frees the ranges and zeroes *g (safe on a zeroed struct). */
void ts_optim_groups_free(ts_optim_groups *g);

/* Index of the range holding flat element i (binary search), or -1. */
int ts_optim_groups_find(const ts_optim_groups *g, int64_t i);

/* The weight-decay multiplier of flat element i (-1 if outside). */
float ts_optim_groups_wd_at(const ts_optim_groups *g, int64_t i);

/* ---- the step kernel ---- */

/* A slice of the flat buffers: params[i], grads[i] and state[s*stride + i]
 * are element offset+i of the model's flat layout, addresses on `device`
 * (zero-initialised: the CPU), whose backend's kernels step it. */
typedef struct {
    float *params;
    const float *grads;
    float *state;   /* NULL when ts_optim_state_slots(cfg) == 0 */
    int64_t stride; /* >= len when state is used */
    int64_t offset; /* position of params[0] in the flat buffer */
    int64_t len;
    ts_device device;
} ts_optim_slice;

/* Applies optimizer step t (>= 1) with learning rate lr to the slice, using
 * groups (NULL: every element decays, lr_scale 1) to find each element's
 * multipliers; groups must cover the slice. OpenMP over the range. The result
 * is the same whether [0, N) is stepped at once or in any split into
 * sub-slices. Errors name the bad field, range or step. */
ts_status ts_optim_step_range(const ts_optim_config *cfg, int64_t t, double lr, const ts_optim_groups *groups,
                              const ts_optim_slice *slice);

/* The sum of squares of the slice's gradients (in double), and scaling
 * them by factor (clipping), on the slice's device; errors name it. */
ts_status ts_optim_slice_sq_norm(const ts_optim_slice *slice, double *sum);
ts_status ts_optim_slice_scale(const ts_optim_slice *slice, float factor);

/* Convenience for a whole model whose flat buffers all start at element 0:
 * steps [offset, offset+len) of params/grads with state of k*numel floats. */
ts_status ts_optim_step_flat(const ts_optim_config *cfg, int64_t t, double lr, const ts_optim_groups *groups,
                             float *params, const float *grads, float *state, int64_t numel, int64_t offset,
                             int64_t len);

#endif
