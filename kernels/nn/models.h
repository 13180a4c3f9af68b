/* models.h - whole models (MLP, CNN, GPT) from a spec, and splitting a
 * model at unit boundaries.
 *
 * A model's root is a Sequential of units: MLP = fc0, relu0, fc1, ...;
 * CNN = conv1, relu1, pool1, conv2, relu2, pool2, flatten, fc;
 * GPT = embedding, blocks.0 .. blocks.<L-1>, head. ts_model_build() builds
 * the units [first, end) only, with the same names as in the whole model, so
 * a pipeline stage or any other part holds exactly its slice of the
 * parameters in its own flat buffers; ts_model_build_runs() builds several
 * runs of units into one model (an interleaved pipeline stage's chunks).
 */
#ifndef TS_NN_MODELS_H
#define TS_NN_MODELS_H

#include "kernels/nn/model.h"
#include "kernels/nn/transformer.h"

typedef enum { TS_ARCH_MLP, TS_ARCH_CNN, TS_ARCH_GPT } ts_arch;

typedef struct {
    ts_arch arch;
    /* MLP: widths[0] inputs, widths[n-1] outputs */
    int n_widths;
    int64_t widths[16];
    /* CNN: in_ch x img x img images, two conv stages, classes outputs */
    int64_t in_ch, img, ch1, ch2, kernel, classes;
    /* GPT */
    ts_gpt_config gpt;
    bool checkpoint; /* activation checkpointing of GPT blocks */
} ts_model_spec;

/* Checks the spec and returns its number of units (or -1). */
int ts_model_units(const ts_model_spec *s);

/* Builds units [first, end) (end = -1: all) and finalizes with key; each
 * parameter gets the value it has in the whole model built with key. */
ts_model *ts_model_build(const ts_model_spec *s, int first, int end, ts_key key, ts_dtype dtype);

/* Runs of units one model holds: [first[i], end[i]) for i < n, increasing
 * and disjoint; the root's children are their units one after the other. */
#define TS_MAX_UNIT_RUNS 64
typedef struct {
    int n;
    int first[TS_MAX_UNIT_RUNS], end[TS_MAX_UNIT_RUNS];
} ts_unit_runs;

/* Whether runs hold every unit of s (one run [0, units)). */
bool ts_unit_runs_all(const ts_unit_runs *runs, const ts_model_spec *s);

/* ts_model_build of the units of runs. */
ts_model *ts_model_build_runs(const ts_model_spec *s, const ts_unit_runs *runs, ts_key key, ts_dtype dtype);

/* Splits whole into n parts at the given unit boundaries (n - 1 increasing
 * unit indices strictly inside (0, units)); each part gets its own flat
 * buffers holding whole's values. */
ts_status ts_model_split(const ts_model *whole, const ts_model_spec *s, int n, const int *boundaries,
                         ts_model **parts);

/* What training a model takes in one process, in bytes (estimate). */
typedef struct {
    double parameters;  /* count */
    double param_bytes; /* f32 weights, plus the bf16 compute copy */
    double grad_bytes;  /* f32 gradients */
    double optim_bytes; /* optimizer state, optim_slots f32 per parameter */
    double activation_bytes; /* rough: every unit's output kept for backward
                                (with checkpointing: a block's input only, plus
                                one block), a conv's im2col columns for one
                                image, twice over for the gradients flowing back */
    double total_bytes;
} ts_model_memory;

/* Estimates the memory of training spec at batch b (per process) with
 * optim_slots state floats per parameter (ts_optim_state_slots) and, when
 * bf16, a bf16 compute copy of the weights. Pure: builds and allocates
 * nothing, so it can judge a model far too big to build. Counts in double,
 * so absurd sizes do not overflow; the parameter count is exact. */
ts_status ts_model_estimate(const ts_model_spec *s, int64_t b, int optim_slots, bool bf16, ts_model_memory *out);

/* The model's input shape for one batch of b samples (T tokens for GPT). */
int ts_model_input_shape(const ts_model_spec *s, int64_t b, int64_t *shape, ts_dtype *dtype);

#endif
