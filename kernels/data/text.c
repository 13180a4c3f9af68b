/* text.c - corpus loading (file or folder tree) and byte windows. */
#include "kernels/data/text.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/io/atomic.h"

typedef struct {
    char **v;
    int n, cap;
} path_list;

static ts_status list_push(path_list *l, const char *p) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **v = realloc(l->v, sizeof(char *) * (size_t)cap);
        if (!v) return ts_error(TS_ERR_MEMORY, "text: out of memory listing files");
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(p))) return ts_error(TS_ERR_MEMORY, "text: out of memory listing files");
    l->n++;
    return TS_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Appends the text files under dir (recursively) to l. */
static ts_status walk(const char *dir, path_list *l, int depth) {
    if (depth > 32) return ts_error(TS_ERR_IO, "text %s: folders nested too deep", dir);
    DIR *d = opendir(dir);
    if (!d) return ts_error(TS_ERR_IO, "text %s: cannot open folder: %s", dir, strerror(errno));
    ts_status s = TS_OK;
    struct dirent *e;
    char path[4096];
    while (!s && (e = readdir(d))) {
        if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) continue; /* dangling link */
        if (S_ISDIR(sb.st_mode)) s = walk(path, l, depth + 1);
        else if (S_ISREG(sb.st_mode)) s = list_push(l, path);
    }
    closedir(d);
    return s;
}

static int path_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void list_free(path_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

/* The corpus's files into l: path itself, or the text files under the
 * folder path, in sorted order. Errors name path. */
static ts_status list_files(const char *path, path_list *l) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ts_error(TS_ERR_IO, "text %s: cannot open: %s%s", path, strerror(errno),
                        strcmp(path, TS_TEXT_DEFAULT_PATH) == 0 ? " (install the Debian package fortunes)" : "");
    ts_status s = S_ISDIR(sb.st_mode) ? walk(path, l, 0) : list_push(l, path);
    if (!s && l->n > 1) qsort(l->v, (size_t)l->n, sizeof(char *), path_cmp);
    return s;
}

ts_status ts_text_size(const char *path, int64_t *bytes) {
    if (!path) path = TS_TEXT_DEFAULT_PATH;
    path_list files = {0};
    ts_status s = list_files(path, &files);
    int64_t n = 0;
    struct stat sb;
    for (int i = 0; !s && i < files.n; i++)
        if (stat(files.v[i], &sb) == 0) n += sb.st_size;
    list_free(&files);
    if (!s) *bytes = n;
    return s;
}

static ts_status grow(uint8_t **buf, int64_t *cap, int64_t need) {
    if (need <= *cap) return TS_OK;
    int64_t c = *cap ? *cap : 1 << 16;
    while (c < need) c *= 2;
    uint8_t *p = realloc(*buf, (size_t)c);
    if (!p) return ts_error(TS_ERR_MEMORY, "text: out of memory for %lld bytes", (long long)need);
    *buf = p;
    *cap = c;
    return TS_OK;
}

/* Reads path and appends its head to train and its tail to val. */
static ts_status add_file(ts_text_corpus *c, const char *path, double frac, int64_t caps[2]) {
    int fd;
    ts_status s = ts_io_open_regular(path, "text", &fd);
    if (s) return s;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ts_error(TS_ERR_IO, "text %s: fdopen: %s", path, strerror(errno));
    }
    uint8_t *buf = NULL;
    int64_t n = 0, cap = 0;
    for (;;) {
        if ((s = grow(&buf, &cap, n + 65536))) break;
        size_t r = fread(buf + n, 1, 65536, f);
        n += (int64_t)r;
        if (r < 65536) {
            if (ferror(f)) s = ts_error(TS_ERR_IO, "text %s: read error", path);
            break;
        }
    }
    fclose(f);
    int64_t nv = (int64_t)floor((double)n * frac), nt = n - nv;
    if (!s) s = grow(&c->train, &caps[0], c->n_train + nt);
    if (!s) s = grow(&c->val, &caps[1], c->n_val + nv);
    if (!s) {
        if (nt) memcpy(c->train + c->n_train, buf, (size_t)nt);
        if (nv) memcpy(c->val + c->n_val, buf + nt, (size_t)nv);
        c->n_train += nt;
        c->n_val += nv;
        c->nfiles++;
    }
    free(buf);
    return s;
}

void ts_text_free(ts_text_corpus *c) {
    if (!c) return;
    free(c->train);
    free(c->val);
    free(c);
}

ts_text_corpus *ts_text_load(const char *path, double val_fraction) {
    if (!path) path = TS_TEXT_DEFAULT_PATH;
    if (!(val_fraction >= 0 && val_fraction < 1)) {
        ts_error(TS_ERR_VALUE, "text %s: validation fraction %g is not in [0, 1)", path, val_fraction);
        return NULL;
    }
    path_list files = {0};
    ts_status s = list_files(path, &files);
    ts_text_corpus *c = calloc(1, sizeof *c);
    if (!s && !c) s = ts_error(TS_ERR_MEMORY, "text %s: out of memory", path);
    int64_t caps[2] = {0, 0};
    for (int i = 0; !s && i < files.n; i++) s = add_file(c, files.v[i], val_fraction, caps);
    list_free(&files);
    if (!s && c->n_train == 0) s = ts_error(TS_ERR_VALUE, "text %s: no text found (%d files)", path, c->nfiles);
    if (s) {
        ts_text_free(c);
        return NULL;
    }
    return c;
}

typedef struct {
    const uint8_t *bytes;
    int64_t n, T, stride;
} window_ctx;

static int64_t windows_length(const ts_dataset *d) {
    const window_ctx *w = d->ctx;
    return w->n < w->T + 1 ? 0 : (w->n - w->T - 1) / w->stride + 1;
}

static ts_status windows_get(const ts_dataset *d, int64_t i, void *x_row, void *y_row) {
    const window_ctx *w = d->ctx;
    if (i < 0 || i >= windows_length(d))
        return ts_error(TS_ERR_INDEX, "dataset %s: window %lld out of range [0, %lld)", d->name, (long long)i,
                        (long long)windows_length(d));
    const uint8_t *s = w->bytes + i * w->stride;
    int64_t *x = x_row, *y = y_row;
    for (int64_t t = 0; t < w->T; t++) {
        x[t] = s[t];
        y[t] = s[t + 1];
    }
    return TS_OK;
}

static void windows_destroy(ts_dataset *d) {
    free(d->ctx);
    free(d);
}

ts_dataset *ts_text_dataset(const ts_text_corpus *c, bool validation, int64_t T, int64_t stride) {
    const char *part = validation ? "validation" : "train";
    int64_t n = validation ? c->n_val : c->n_train;
    if (stride <= 0) stride = T;
    if (T < 1 || n < T + 1) {
        ts_error(TS_ERR_VALUE, "text dataset: the %s part has %lld bytes, too few for windows of T+1 = %lld (the "
                 "corpus has %lld bytes)", part, (long long)n, (long long)T + 1, (long long)(c->n_train + c->n_val));
        return NULL;
    }
    ts_dataset *d = calloc(1, sizeof *d);
    window_ctx *w = calloc(1, sizeof *w);
    if (!d || !w) {
        free(d);
        free(w);
        ts_error(TS_ERR_MEMORY, "text dataset: out of memory");
        return NULL;
    }
    *w = (window_ctx){validation ? c->val : c->train, n, T, stride};
    snprintf(d->name, sizeof d->name, "text-%s", part);
    d->length = windows_length;
    d->get = windows_get;
    d->destroy = windows_destroy;
    d->x_dtype = d->y_dtype = TS_I64;
    d->x_ndim = d->y_ndim = 1;
    d->x_shape[0] = d->y_shape[0] = T;
    d->ctx = w;
    return d;
}

double ts_text_bits_per_byte(double loss_nats) { return loss_nats / log(2.0); }
