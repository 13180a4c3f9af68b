/* checkpoint.h - training checkpoints: weights, optimizer state, run state.
 *
 * A checkpoint is a folder <root>/step-<k>/ holding model.safetensors (the
 * weights under their PyTorch-style names), optim.safetensors (optimizer
 * state) and state.json: {"format": "tessera-checkpoint", "version": 1,
 * "step": k, "rng": {name: [k0, k1]}, "loader": {"epoch": e, "offset": o},
 * "config": "<job config text>", "extra": {...}, "files": {"model.safetensors":
 * {"bytes": n, "crc32": c}, ...}}.
 *
 * Sharded checkpoints list more files (one per writer) in "files".
 *
 * Saving writes everything into a hidden temp folder, fsyncs it, and renames
 * it to step-<k> last (fsyncing <root>), so a crash mid-save leaves either no
 * step-<k> or a complete one. Opening checks every file is present, that
 * sizes and CRC-32s match state.json and that both weights files validate,
 * so a damaged checkpoint is refused with a message naming the file.
 */
#ifndef TS_IO_CHECKPOINT_H
#define TS_IO_CHECKPOINT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/data/loader.h"
#include "kernels/io/safetensors.h"

typedef struct {
    int64_t step;
    int n_model;
    const char *const *model_names;
    ts_tensor *const *model;
    int n_optim; /* may be 0 */
    const char *const *optim_names;
    ts_tensor *const *optim;
    int n_keys; /* named RNG keys, may be 0 */
    const char *const *key_names;
    const ts_key *keys;
    ts_loader_pos loader;
    const char *config; /* job config text, or NULL */
    const char *extra;  /* a JSON object's text with more state, or NULL */
    int n_parts;        /* more files, written by other processes into the */
    const char *const *parts; /* step's temp folder (ts_checkpoint_temp_dir) */
} ts_checkpoint_data;

typedef struct {
    char *path; /* the step folder */
    int64_t step;
    ts_safetensors *model, *optim;
    ts_loader_pos loader;
    const char *config; /* NULL when none was saved */
    json_t *extra;      /* borrowed from state; NULL when none */
    json_t *state;      /* the whole state.json */
} ts_checkpoint;

/* Saves d as <root>/step-<d->step> (creating root; replacing an existing
 * folder of that step), then, when keep_last > 0, prunes to the newest
 * keep_last. The folder's path goes to path (cap bytes) unless NULL. */
ts_status ts_checkpoint_save(const char *root, const ts_checkpoint_data *d, int keep_last, char *path, size_t cap);

/* Checkpoints written by several processes (sharded): each writes its
 * files into the temp folder of step (made when missing) named for owner,
 * the pid of the process that will commit it with ts_checkpoint_save
 * (d->parts naming the others' files, which are then listed in state.json
 * with their sizes and CRCs and checked on opening). Its path goes to out. */
ts_status ts_checkpoint_temp_dir(const char *root, int64_t step, long owner, char *out, size_t cap);

/* Opens and validates a step folder. */
ts_checkpoint *ts_checkpoint_open(const char *step_dir);
void ts_checkpoint_close(ts_checkpoint *ck);

/* The saved RNG key called name. */
ts_status ts_checkpoint_key(const ts_checkpoint *ck, const char *name, ts_key *key);

/* Steps of the complete checkpoints (step-<k> folders with a state.json)
 * under root, ascending; *steps is malloc'd (free it). A missing root is
 * an empty list. */
ts_status ts_checkpoint_list(const char *root, int64_t **steps, int *n);

/* Path of the newest checkpoint under root and its step; *step = -1 and
 * path "" when there is none. */
ts_status ts_checkpoint_latest(const char *root, char *path, size_t cap, int64_t *step);

/* Removes all but the newest keep_last checkpoints, and temp folders left
 * by saves of processes that no longer run. */
ts_status ts_checkpoint_prune(const char *root, int keep_last);

#endif
