/* status.h - error codes and the per-thread error message.
 *
 * Every fallible Tessera function returns a ts_status (or NULL for functions
 * that return a pointer) and, on failure, records a human-readable message
 * with ts_error(). The message names the op and the offending shapes, dtypes,
 * devices, fields or peers. The message is per thread and stays until the
 * next ts_error() or ts_clear_error() on that thread.
 */
#ifndef TS_STATUS_H
#define TS_STATUS_H

typedef enum {
    TS_OK = 0,
    TS_ERR_SHAPE,       /* shapes do not agree */
    TS_ERR_DTYPE,       /* unsupported or mismatched dtype */
    TS_ERR_DEVICE,      /* tensor on the wrong device */
    TS_ERR_VALUE,       /* bad argument value (out of range, NaN, ...) */
    TS_ERR_INDEX,       /* index out of range */
    TS_ERR_MEMORY,      /* allocation failed */
    TS_ERR_IO,          /* file or socket error */
    TS_ERR_FORMAT,      /* malformed file or message */
    TS_ERR_STATE,       /* call not valid in the current state */
    TS_ERR_UNSUPPORTED, /* feature not built or not implemented for this input */
    TS_ERR_TIMEOUT,     /* a peer or operation did not answer in time */
    TS_ERR_PEER,        /* a remote node failed or refused */
} ts_status;

/* Records a printf-style message for the calling thread and returns code.
 * The arguments may include ts_last_error(), to wrap the last message. */
ts_status ts_error(ts_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last message ("" when none). */
const char *ts_last_error(void);

/* The calling thread's last error code (TS_OK when none). */
ts_status ts_last_status(void);

/* Forgets the calling thread's last error. */
void ts_clear_error(void);

/* Short name of a status code, e.g. "shape". */
const char *ts_status_name(ts_status s);

#endif
