/* train.h - tessera-run's single-process modes: training a job in this
 * process (strategy "local"), evaluating a checkpoint, generating text from
 * a GPT checkpoint, exporting one to ONNX, plotting a run's metrics, and the environment report.
 */
#ifndef TS_LAUNCH_TRAIN_H
#define TS_LAUNCH_TRAIN_H

#include <stdbool.h>

#include "proto/job.h"

/* Trains job in this process with its run folder (run_dir NULL: the job's
 * train.run_dir, else runs/<name>), resuming from its newest checkpoint
 * when resume is set; force skips the memory check (worker/fit.h).
 * SIGINT/SIGTERM stop after the current step with a checkpoint. Returns the
 * exit status. */
int ts_launch_train(const ts_job *job, const char *run_dir, bool resume, bool force);

/* The weights an evaluation or generation runs: a checkpoint folder
 * (job_path NULL, no sets), or a bare safetensors file with the job that
 * describes its model (its model.init_from becomes path; sets override the
 * job, e.g. model.init_map). */
typedef struct {
    const char *path;
    const char *job_path;
    const char *const *sets;
    int nsets;
} ts_launch_source;

/* Evaluates the weights of src on its job's test split (or the validation
 * split when the data has no test split). */
int ts_launch_eval(const ts_launch_source *src);

/* Writes checkpoint ckpt - whole, or in parts (an FSDP run's shards, a
 * pipeline's stages) - as one whole checkpoint out/step-<k>, whose
 * model.safetensors holds every weight under its PyTorch-style name. */
int ts_launch_consolidate(const char *ckpt, const char *out);

/* Prints prompt + n bytes sampled from the GPT of src. */
int ts_launch_generate(const ts_launch_source *src, const char *prompt, int n, double temperature, int top_k,
                       uint64_t seed);

/* Writes the model of src as an ONNX file at out (kernels/io/onnx.h). */
int ts_launch_export_onnx(const ts_launch_source *src, const char *out);

/* Draws <run_dir>/metrics.png from <run_dir>/metrics.jsonl with gnuplot;
 * the PNG's path goes to png (cap bytes). */
int ts_launch_plot(const char *run_dir, char *png, size_t cap);

/* Prints version, build options, BLAS, threads, ZeroMQ/CURVE, MPI, CUDA. */
int ts_launch_env(void);

#endif
