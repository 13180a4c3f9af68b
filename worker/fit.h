/* fit.h - does a job's model fit in this machine's memory, before it is built.
 *
 * ts_fit_check() estimates what training the job takes in one process
 * (ts_model_estimate: parameters, gradients, optimizer state, a rough
 * activation figure at the job's batch) and its data set in memory (the
 * Fashion-MNIST images as f32, sized from the files' headers; a text
 * corpus's bytes, from the files' sizes) and compares
 * it with the memory available to this process: the room left under the
 * cgroup memory limit of this process's cgroup and its ancestors (v2
 * memory.max, v1 memory.limit_in_bytes), or MemAvailable of /proc/meminfo,
 * whichever is smaller (for a pipeline, what one stage holds: about 1/P of
 * the model and its micro-batches in flight, and the data set). A model
 * that does not fit is refused with the numbers, instead of being found
 * out by the OOM killer; callers offer --force to try anyway.
 */
#ifndef TS_WORKER_FIT_H
#define TS_WORKER_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/job.h"

/* Bytes this process may still allocate, and where the figure comes from
 * ("cgroup limit /sys/fs/cgroup/...", "MemAvailable"). */
ts_status ts_fit_available(uint64_t *bytes, char *source, size_t cap);

/* TS_OK when training job's model and data, in each of `workers`
 * processes that share the memory (1: one process), fit in available
 * bytes, else TS_ERR_MEMORY: "model: cnn of 3.78e+09 parameters needs
 * about 60.56 GiB to train (parameters 14.08 GiB, gradients 14.08 GiB,
 * optimizer state 28.16 GiB, activations 4.00 GiB at train.batch_size 128,
 * data set 262.0 MiB) but 21.50 GiB are available (MemAvailable); ..."
 * (with workers > 1: "... to train in each of its 4 workers on this
 * machine, 242.2 GiB in all (..."). */
ts_status ts_fit_check(const ts_job *job, int workers, uint64_t available, const char *source);

/* ts_fit_check against ts_fit_available(). */
ts_status ts_fit_check_here(const ts_job *job, int workers);

#endif
