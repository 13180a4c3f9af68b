/* atomic.h - crash-safe file writing for checkpoints and weights files.
 *
 * ts_io_atomic_open creates a temp file next to the final path; the caller
 * writes through the FILE*, then ts_io_atomic_commit flushes, fsyncs,
 * renames the temp file onto the final name and fsyncs the folder, so a
 * reader sees either the old file or the complete new one, never a part.
 * ts_io_atomic_abort removes the temp file; ts_io_atomic_write_json does all
 * three for a JSON document. Helpers for fsyncing a folder,
 * removing a folder tree, opening a file to read only when it is a regular
 * file and taking a run folder for one process live here too.
 */
#ifndef TS_IO_ATOMIC_H
#define TS_IO_ATOMIC_H

#include <jansson.h>
#include <stdio.h>

#include "kernels/status.h"

typedef struct {
    FILE *f;
    char *path; /* final path */
    char *tmp;  /* temp path in the same folder */
} ts_io_atomic;

/* Opens a new temp file "<path>.tmp-XXXXXX" for writing, of mode 0666
 * less the umask (the final file's: not for secrets). */
ts_status ts_io_atomic_open(ts_io_atomic *a, const char *path);
/* Flushes, fsyncs, closes, renames onto the final path, fsyncs the folder.
 * On failure the temp file is removed. Frees a's fields either way. */
ts_status ts_io_atomic_commit(ts_io_atomic *a);
/* Closes and removes the temp file; frees a's fields. */
void ts_io_atomic_abort(ts_io_atomic *a);
/* Writes doc (json_dumpf flags, then a newline) to path through a temp
 * file: a failure leaves an earlier path as it was, and its error names
 * path and the reason ("write run/job.json: No space left on device"). */
ts_status ts_io_atomic_write_json(const char *path, const json_t *doc, size_t flags);

/* Flushes, fsyncs and closes f (a plain file written in place). */
ts_status ts_io_close_synced(FILE *f, const char *path);
/* fsyncs the folder dir (so renames and creations inside it are durable). */
ts_status ts_io_fsync_dir(const char *dir);
/* fsyncs the folder that contains path. */
ts_status ts_io_fsync_parent(const char *path);
/* Removes dir and everything under it (symlinks are removed, not followed). */
ts_status ts_io_remove_tree(const char *dir);

/* Opens path for reading (following symlinks) when it is a regular file:
 * the open does not block (a FIFO without a writer would), and a device,
 * FIFO, socket or folder is refused before anything is read ("<what> <path>
 * is not a regular file (a character device)"), so /dev/zero cannot make a
 * reader run forever. *fd is a blocking descriptor; an open failure is
 * TS_ERR_IO "<what> <path>: cannot open: <errno text>". */
ts_status ts_io_open_regular(const char *path, const char *what, int *fd);

/* Makes the run folder dir and its parents (mkdir -p, mode 0755); one that
 * exists is fine when it is a folder. Errors name the folder. */
ts_status ts_io_make_run_dir(const char *dir);

/* Takes the run folder dir (it exists) for this process alone: an
 * exclusive flock of dir/.lock, which holds the pid. *fd keeps the lock
 * until it is closed or the process ends (not inherited by programs it
 * executes). A folder another process holds is TS_ERR_STATE "run folder
 * <dir> is in use by process <pid>". */
ts_status ts_io_lock_run_dir(const char *dir, int *fd);

#endif
