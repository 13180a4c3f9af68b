/* checkpoint_parts.h - checkpoints of a model held in parts (the stages of
 * a pipeline), and loading them into a model cut any other way.
 *
 * Each part saves an ordinary checkpoint (kernels/io/checkpoint.h) of what
 * it holds under <run>/checkpoints/stages/stage-<s>/step-<k>: its parameters
 * by name in model.safetensors, its optimizer state per parameter in
 * optim.safetensors (one [slots, numel] tensor under the parameter's name),
 * so that the state follows its parameter into another cut, and its stage
 * in state.json's extra, {"stage": s}. Once every part
 * is saved, the leader writes the index <run>/checkpoints/step-<k>: an
 * ordinary checkpoint without tensors (step, loader position, job) whose
 * extra state lists the parts, {"parts": ["stages/stage-0/step-k", ...]}
 * (paths relative to <run>/checkpoints). ts_checkpoint_latest sees a step
 * only once its index is written, so only when every part is there; parts
 * keep one checkpoint more than the index, so that the parts of the newest
 * index outlive the save of the next step. The folders of stages that a
 * run resumed with fewer stages no longer has are pruned as the index is:
 * a part there goes once no index kept lists it.
 *
 * Loading (ts_parts_read_model) fills every parameter of a model - the whole
 * model of a local run, or any stage of any cut - by name from the part
 * that holds it, and its optimizer state likewise; a parameter no part
 * holds is an error naming it. The other way round, a part (a stage)
 * takes its parameters and their state from a checkpoint of the whole
 * model (of a local, ddp or fsdp run) through a whole model read from it
 * (ts_parts_copy_model).
 */
#ifndef TS_WORKER_CHECKPOINT_PARTS_H
#define TS_WORKER_CHECKPOINT_PARTS_H

#include <stdbool.h>

#include "kernels/io/checkpoint.h"
#include "worker/trainer.h"

/* Saves what t's model holds as part `part` of step t->step. */
ts_status ts_parts_save_part(ts_trainer *t, int part);

/* Writes the index of step t->step over parts 0..parts-1 (each saved
 * already); its folder goes to path (cap bytes). */
ts_status ts_parts_save_index(ts_trainer *t, int parts, char *path, size_t cap);

/* Whether checkpoint ck is an index of parts. */
bool ts_parts_is_index(const ts_checkpoint *ck);

/* An error when ck is one stage's part of a pipeline checkpoint (that
 * stage's parameters only), naming the index to give instead; TS_OK for
 * any other checkpoint. */
ts_status ts_parts_refuse_part(const ts_checkpoint *ck);

/* Loads m's parameters and, when m holds optimizer state, that state from
 * the parts the index ck lists. */
ts_status ts_parts_read_model(const ts_checkpoint *ck, ts_model *m);

/* Copies each parameter of dst, and its optimizer state when dst holds
 * state, from the parameter of that name in src (a model holding it; with
 * state when dst has state). */
ts_status ts_parts_copy_model(ts_model *dst, ts_model *src);

#endif
