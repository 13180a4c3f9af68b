/* idx.c - IDX reading through zlib, normalisation, Fashion-MNIST paths, split. */
#include "kernels/data/idx.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "kernels/ops/view.h"

#define CHUNK (1u << 24)

/* Reads up to n bytes; returns the count, or -1 with an error recorded. */
static int64_t read_all(gzFile g, const char *path, void *buf, int64_t n) {
    int64_t got = 0;
    while (got < n) {
        unsigned want = (unsigned)(n - got < CHUNK ? n - got : CHUNK);
        int r = gzread(g, (char *)buf + got, want);
        if (r < 0) {
            int code;
            const char *msg = gzerror(g, &code);
            ts_error(TS_ERR_FORMAT, "idx %s: cannot decompress: %s", path, msg);
            return -1;
        }
        if (r == 0) break;
        got += r;
    }
    return got;
}

/* Bytes left in the stream after the data (for the over-long check). */
static int64_t count_rest(gzFile g) {
    char buf[4096];
    int64_t n = 0;
    int r;
    while ((r = gzread(g, buf, sizeof buf)) > 0) n += r;
    return n;
}

/* Reads and checks the header at g's start: the magic and the *ndim dims
 * (into dims), their product into *numel. */
static ts_status read_header(gzFile g, const char *path, int64_t *dims, int *ndim, int64_t *numel) {
    unsigned char magic[4];
    int64_t got = read_all(g, path, magic, 4);
    if (got < 0) return ts_last_status();
    if (got < 4)
        return ts_error(TS_ERR_FORMAT, "idx %s: truncated: %lld bytes, shorter than the 4-byte magic", path,
                        (long long)got);
    if (magic[0] != 0 || magic[1] != 0 || magic[3] == 0 || magic[3] > TS_MAX_DIMS)
        return ts_error(TS_ERR_FORMAT, "idx %s: wrong magic number 0x%02x%02x%02x%02x (want 0x0000TTNN, 1 <= NN <= %d)",
                        path, magic[0], magic[1], magic[2], magic[3], TS_MAX_DIMS);
    if (magic[2] != 0x08)
        return ts_error(TS_ERR_UNSUPPORTED, "idx %s: element type 0x%02x is not unsigned byte (0x08)", path, magic[2]);
    *ndim = magic[3];
    unsigned char raw[4 * TS_MAX_DIMS];
    got = read_all(g, path, raw, 4 * *ndim);
    if (got < 0) return ts_last_status();
    if (got < 4 * *ndim)
        return ts_error(TS_ERR_FORMAT, "idx %s: truncated in the header: %d dims need %d bytes, file has %lld", path,
                        *ndim, 4 + 4 * *ndim, (long long)(4 + got));
    *numel = 1;
    for (int i = 0; i < *ndim; i++) {
        dims[i] = (int64_t)raw[4 * i] << 24 | raw[4 * i + 1] << 16 | raw[4 * i + 2] << 8 | raw[4 * i + 3];
        if (dims[i] && *numel > (INT64_MAX >> 2) / dims[i])
            return ts_error(TS_ERR_FORMAT, "idx %s: dims %s are too large", path, ts_dims_str(i + 1, dims));
        *numel *= dims[i];
    }
    return TS_OK;
}

static ts_tensor *read_open(gzFile g, const char *path, int64_t file_size) {
    int64_t dims[TS_MAX_DIMS], numel, got;
    int ndim;
    if (read_header(g, path, dims, &ndim, &numel)) return NULL;
    int64_t head = 4 + 4 * (int64_t)ndim;
    if (gzdirect(g) && file_size < head + numel) { /* plain file: refuse before allocating */
        ts_error(TS_ERR_FORMAT, "idx %s: truncated: dims %s need %lld bytes, the file has %lld", path,
                 ts_dims_str(ndim, dims), (long long)(head + numel), (long long)file_size);
        return NULL;
    }
    ts_tensor *t = ts_tensor_empty(TS_U8, ndim, dims);
    if (!t) return NULL;
    got = read_all(g, path, ts_tensor_data(t), numel);
    if (got >= 0 && got < numel) {
        ts_error(TS_ERR_FORMAT, "idx %s: truncated: dims %s need %lld bytes (uncompressed), the file has %lld", path,
                 ts_dims_str(ndim, dims), (long long)(head + numel), (long long)(head + got));
        got = -1;
    }
    if (got >= 0) {
        int64_t extra = count_rest(g);
        if (extra > 0) {
            ts_error(TS_ERR_FORMAT, "idx %s: dims %s need %lld bytes (uncompressed), the file has %lld", path,
                     ts_dims_str(ndim, dims), (long long)(head + numel), (long long)(head + numel + extra));
            got = -1;
        }
    }
    if (got < 0) {
        ts_tensor_release(t);
        return NULL;
    }
    return t;
}

/* Opens path (gzip or plain) for reading; its size on disk into *size.
 * NULL after an error naming it. */
static gzFile open_idx(const char *path, int64_t *size) {
    struct stat sb;
    gzFile g = stat(path, &sb) == 0 ? gzopen(path, "rb") : NULL;
    if (!g) {
        ts_error(TS_ERR_IO, "idx %s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    gzbuffer(g, 1u << 17);
    *size = (int64_t)sb.st_size;
    return g;
}

ts_tensor *ts_idx_read(const char *path) {
    int64_t size;
    gzFile g = open_idx(path, &size);
    if (!g) return NULL;
    ts_tensor *t = read_open(g, path, size);
    gzclose(g);
    return t;
}

ts_status ts_idx_numel(const char *path, int64_t *numel) {
    int64_t size, dims[TS_MAX_DIMS];
    int ndim;
    gzFile g = open_idx(path, &size);
    if (!g) return ts_last_status();
    ts_status st = read_header(g, path, dims, &ndim, numel);
    gzclose(g);
    return st;
}

ts_tensor *ts_idx_images(const ts_tensor *u8, float mean, float std) {
    if (ts_check_tensor("idx images", "images", u8, TS_MASK(TS_U8))) return NULL;
    if (!(std > 0) || !isfinite(mean) || u8->ndim < 1) {
        ts_error(TS_ERR_VALUE, "idx images: need std > 0 (got %g), finite mean (%g), ndim >= 1 (%d)", std, mean,
                 u8->ndim);
        return NULL;
    }
    int64_t shape[TS_MAX_DIMS];
    int ndim = u8->ndim;
    memcpy(shape, u8->shape, sizeof(int64_t) * (size_t)ndim);
    if (ndim == 3) { /* [N, R, C] -> [N, 1, R, C] */
        shape[3] = shape[2];
        shape[2] = shape[1];
        shape[1] = 1;
        ndim = 4;
    }
    ts_tensor *out = ts_tensor_empty(TS_F32, ndim, shape);
    ts_tensor *src = ts_tensor_is_contiguous(u8) ? ts_tensor_alias(u8) : ts_tensor_copy_as(u8, TS_U8);
    if (!out || !src) {
        ts_tensor_release(out);
        ts_tensor_release(src);
        return NULL;
    }
    float lut[256];
    for (int v = 0; v < 256; v++) lut[v] = ((float)v / 255.0f - mean) / std;
    const uint8_t *s = ts_tensor_data(src);
    float *d = ts_f32(out);
    int64_t n = ts_tensor_numel(out);
#pragma omp parallel for if (n > 1 << 16)
    for (int64_t i = 0; i < n; i++) d[i] = lut[s[i]];
    ts_tensor_release(src);
    return out;
}

ts_tensor *ts_idx_labels(const ts_tensor *u8, int64_t num_classes, const char *what) {
    if (ts_check_tensor("idx labels", "labels", u8, TS_MASK(TS_U8))) return NULL;
    if (u8->ndim != 1 || num_classes < 1) {
        ts_error(TS_ERR_SHAPE, "idx labels %s: need a 1-d label file (got %s) and num_classes >= 1 (%lld)", what,
                 ts_shape_str(u8), (long long)num_classes);
        return NULL;
    }
    ts_tensor *out = ts_tensor_empty(TS_I64, 1, u8->shape);
    if (!out) return NULL;
    int64_t *d = ts_tensor_data(out);
    for (int64_t i = 0; i < u8->shape[0]; i++) {
        int64_t v = (int64_t)ts_tensor_get(u8, i);
        if (v >= num_classes) {
            ts_error(TS_ERR_VALUE, "idx labels %s: label %lld at index %lld is out of range [0, %lld)", what,
                     (long long)v, (long long)i, (long long)num_classes);
            ts_tensor_release(out);
            return NULL;
        }
        d[i] = v;
    }
    return out;
}

ts_status ts_idx_load(const char *images_path, const char *labels_path, int64_t num_classes, float mean, float std,
                      ts_tensor **images, ts_tensor **labels) {
    *images = *labels = NULL;
    ts_tensor *iu = ts_idx_read(images_path);
    if (!iu) return ts_last_status();
    ts_tensor *lu = ts_idx_read(labels_path);
    if (!lu) {
        ts_tensor_release(iu);
        return ts_last_status();
    }
    ts_status s = TS_OK;
    if (lu->ndim != 1 || iu->ndim < 2 || iu->shape[0] != lu->shape[0])
        s = ts_error(TS_ERR_SHAPE, "idx: images %s have dims %s but labels %s have dims %s (want [N, ...] and [N])",
                     images_path, ts_shape_str(iu), labels_path, ts_shape_str(lu));
    if (!s && !(*images = ts_idx_images(iu, mean, std))) s = ts_last_status();
    if (!s && !(*labels = ts_idx_labels(lu, num_classes, labels_path))) s = ts_last_status();
    ts_tensor_release(iu);
    ts_tensor_release(lu);
    if (s) {
        ts_tensor_release(*images);
        *images = NULL;
    }
    return s;
}

static ts_status find_file(const char *dir, const char *base, char *out, size_t cap) {
    struct stat sb;
    snprintf(out, cap, "%s/%s.gz", dir, base);
    if (stat(out, &sb) == 0) return TS_OK;
    snprintf(out, cap, "%s/%s", dir, base);
    if (stat(out, &sb) == 0) return TS_OK;
    return ts_error(TS_ERR_IO,
                    "fashion-mnist: neither %s/%s.gz nor %s/%s exists (install the Debian package "
                    "dataset-fashion-mnist or configure the data folder)",
                    dir, base, dir, base);
}

ts_status ts_idx_fashion_mnist_paths(const char *dir, bool train, char *images, char *labels, size_t cap) {
    if (!dir) dir = TS_FASHION_MNIST_DIR;
    const char *split = train ? "train" : "t10k";
    char base[64];
    snprintf(base, sizeof base, "%s-images-idx3-ubyte", split);
    ts_status s = find_file(dir, base, images, cap);
    if (s) return s;
    snprintf(base, sizeof base, "%s-labels-idx1-ubyte", split);
    return find_file(dir, base, labels, cap);
}

ts_status ts_idx_load_fashion_mnist(const char *dir, bool train, ts_tensor **images, ts_tensor **labels) {
    char ip[4096], lp[4096];
    ts_status s = ts_idx_fashion_mnist_paths(dir, train, ip, lp, sizeof ip);
    if (s) return s;
    return ts_idx_load(ip, lp, 10, TS_FASHION_MNIST_MEAN, TS_FASHION_MNIST_STD, images, labels);
}

ts_status ts_idx_split(ts_tensor *x, ts_tensor *y, int64_t val_count, double val_fraction, ts_tensor **train_x,
                       ts_tensor **train_y, ts_tensor **val_x, ts_tensor **val_y) {
    *train_x = *train_y = *val_x = *val_y = NULL;
    if (x->ndim < 1 || y->ndim < 1 || x->shape[0] != y->shape[0])
        return ts_error(TS_ERR_SHAPE, "idx split: x %s and y %s must share dim 0", ts_shape_str(x), ts_shape_str(y));
    int64_t n = x->shape[0];
    if (val_count < 0) {
        if (!(val_fraction >= 0 && val_fraction <= 1))
            return ts_error(TS_ERR_VALUE, "idx split: validation fraction %g is not in [0, 1]", val_fraction);
        val_count = (int64_t)llround((double)n * val_fraction);
    }
    if (val_count > n)
        return ts_error(TS_ERR_VALUE, "idx split: %lld validation samples asked of %lld", (long long)val_count,
                        (long long)n);
    *train_x = ts_narrow(x, 0, 0, n - val_count);
    *train_y = ts_narrow(y, 0, 0, n - val_count);
    *val_x = ts_narrow(x, 0, n - val_count, val_count);
    *val_y = ts_narrow(y, 0, n - val_count, val_count);
    if (*train_x && *train_y && *val_x && *val_y) return TS_OK;
    ts_status s = ts_last_status();
    ts_tensor *all[4] = {*train_x, *train_y, *val_x, *val_y};
    for (int i = 0; i < 4; i++) ts_tensor_release(all[i]);
    *train_x = *train_y = *val_x = *val_y = NULL;
    return s;
}
