/* status.c - per-thread error messages. */
#include "kernels/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_message[1024];
static _Thread_local ts_status last_code = TS_OK;

ts_status ts_error(ts_status code, const char *fmt, ...) {
    char text[sizeof last_message]; /* the arguments may include ts_last_error() */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(last_message, text, sizeof text);
    last_code = code;
    return code;
}

const char *ts_last_error(void) { return last_message; }

ts_status ts_last_status(void) { return last_code; }

void ts_clear_error(void) {
    last_message[0] = '\0';
    last_code = TS_OK;
}

const char *ts_status_name(ts_status s) {
    static const char *names[] = {
        "ok", "shape", "dtype", "device", "value", "index", "memory", "io",
        "format", "state", "unsupported", "timeout", "peer",
    };
    if ((unsigned)s < sizeof names / sizeof names[0]) return names[s];
    return "unknown";
}
