/* argv.c - argument vectors for child processes. */
#include "launch/argv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Takes ownership of s (NULL = allocation failed). */
static void push_owned(ts_argv *a, char *s) {
    if (!s || a->failed) {
        free(s);
        a->failed = 1;
        return;
    }
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            free(s);
            a->failed = 1;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

void ts_argv_push(ts_argv *a, const char *s) { push_owned(a, strdup(s)); }

void ts_argv_pushf(ts_argv *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    push_owned(a, s);
}

int ts_argv_ok(const ts_argv *a) { return !a->failed && a->v != NULL; }

void ts_argv_free(ts_argv *a) {
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
    memset(a, 0, sizeof *a);
}
