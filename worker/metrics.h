/* metrics.h - what a training run reports: a line per step on stdout, a
 * progress bar on stderr when it is a terminal, and the same numbers as
 * JSON lines in <run_dir>/metrics.jsonl for plotting (tessera-run --plot).
 */
#ifndef TS_WORKER_METRICS_H
#define TS_WORKER_METRICS_H

#include <stdio.h>

#include "worker/trainer.h"

/* Opens <run_dir>/metrics.jsonl for a run that goes on after
 * resumed_step: 0 starts the file afresh; k > 0 (resumed from step k's
 * checkpoint) keeps the lines of steps up to k and appends, dropping the
 * lines of later steps a stopped run wrote (they are run again) and a last
 * line cut short (a write that failed: a full disk). *last (may be NULL)
 * gets the last step a line kept names, 0 when none does. */
FILE *ts_metrics_open(const char *run_dir, int64_t resumed_step, int64_t *last);

/* ts_metrics_open's rule for any file of JSON lines of steps at path
 * (each line's first "step": says its step), such as a pipeline stage's
 * timeline. */
FILE *ts_metrics_open_lines(const char *path, int64_t resumed_step, int64_t *last);

/* The run's header: job, model summary (not with a shared forward), data,
 * steps. */
void ts_metrics_banner(const ts_trainer *t);

/* One step: the INFO line, the progress bar, the JSON line into jsonl
 * (may be NULL), <run_dir>/metrics.jsonl. A JSON line that cannot be
 * written (a full disk) is TS_ERR_IO naming the file: the run's record of
 * its steps is not lost without a word. */
ts_status ts_metrics_step(FILE *jsonl, const char *run_dir, const ts_step_stats *s, int64_t total_steps);

/* An evaluation on split ("val" or "test"); its JSON line as
 * ts_metrics_step's. */
ts_status ts_metrics_eval(FILE *jsonl, const char *run_dir, int64_t step, const char *split, const ts_eval_stats *e);

/* Ends the progress bar line, if one is shown. */
void ts_metrics_end_progress(void);

#endif
