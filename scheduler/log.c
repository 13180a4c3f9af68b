/* log.c - timestamped scheduler log lines. */
#include "scheduler/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

void ts_sched_log(ts_sched_level level, const char *fmt, ...)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *word = level == TS_SCHED_WARN ? "warning: " : level == TS_SCHED_ERROR ? "error: " : "";
    fprintf(stderr, "%s.%03ld scheduler: %s%s\n", stamp, ts.tv_nsec / 1000000, word, msg);
    fflush(stderr);
}
