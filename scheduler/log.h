/* log.h - scheduler log lines on stderr.
 *
 * Each line: local time with milliseconds, "scheduler:", the level word for
 * warnings and errors, then the message, e.g.
 *   2024-05-01 12:00:00.123 scheduler: warning: barrier 7 half-way to timeout
 */
#ifndef TS_SCHED_LOG_H
#define TS_SCHED_LOG_H

typedef enum { TS_SCHED_INFO, TS_SCHED_WARN, TS_SCHED_ERROR } ts_sched_level;

/* Writes one line (a newline is added) to stderr and flushes it. */
void ts_sched_log(ts_sched_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
