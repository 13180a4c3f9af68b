/* argv.h - a growing, NULL-terminated argument vector for child processes.
 *
 * Strings are copied in; ts_argv_free releases them. After any push fails
 * (out of memory) the vector remembers it and ts_argv_ok() is false.
 */
#ifndef TS_ARGV_H
#define TS_ARGV_H

typedef struct {
    char **v;  /* v[n] == NULL */
    int n, cap;
    int failed;
} ts_argv;

/* Appends a copy of s. */
void ts_argv_push(ts_argv *a, const char *s);

/* Appends a printf-formatted string. */
void ts_argv_pushf(ts_argv *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* True when every push so far succeeded. */
int ts_argv_ok(const ts_argv *a);

/* Frees the strings and the vector; a becomes empty. */
void ts_argv_free(ts_argv *a);

#endif
