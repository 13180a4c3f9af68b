/* tensor.c - storage, views, creation, element access, copies, printing. */
#include "kernels/tensor.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/threads.h"

static const size_t dtype_sizes[TS_NDTYPES] = {4, 8, 2, 4, 8, 1};
static const char *dtype_names[TS_NDTYPES] = {"f32", "f64", "bf16", "i32", "i64", "u8"};

size_t ts_dtype_size(ts_dtype dt) { return (unsigned)dt < TS_NDTYPES ? dtype_sizes[dt] : 0; }

const char *ts_dtype_name(ts_dtype dt) { return (unsigned)dt < TS_NDTYPES ? dtype_names[dt] : "?"; }

bool ts_dtype_is_float(ts_dtype dt) { return dt == TS_F32 || dt == TS_F64 || dt == TS_BF16; }

static const char *device_types[TS_NDEVICE_TYPES] = {"cpu", "cuda"};

const char *ts_device_name(ts_device d) {
    static _Thread_local char ring[8][32];
    static _Thread_local int next;
    if (d.type == TS_DEVICE_CPU) return "cpu";
    char *buf = ring[next++ % 8];
    snprintf(buf, sizeof ring[0], "%s:%d", (unsigned)d.type < TS_NDEVICE_TYPES ? device_types[d.type] : "?", d.index);
    return buf;
}

ts_status ts_device_parse(const char *text, ts_device *d) {
    if (text && !strcmp(text, "cpu")) {
        *d = TS_CPU;
        return TS_OK;
    }
    for (int t = 1; text && t < TS_NDEVICE_TYPES; t++) {
        size_t n = strlen(device_types[t]);
        if (strncmp(text, device_types[t], n)) continue;
        char *end = NULL;
        long index = text[n] == ':' ? strtol(text + n + 1, &end, 10) : 0;
        if (text[n] == '\0' || (text[n] == ':' && end != text + n + 1 && *end == '\0' && index >= 0 && index < 1024)) {
            *d = (ts_device){(ts_device_type)t, (int)index};
            return TS_OK;
        }
    }
    return ts_error(TS_ERR_VALUE, "device: '%s' is not a device (cpu, cuda or cuda:N)", text ? text : "(null)");
}

/* ---- storage ---- */

ts_storage *ts_storage_wrap_on(ts_device d, void *data, size_t nbytes, void (*release)(void *, size_t, void *),
                               void *ctx) {
    static _Atomic uint64_t ids;
    ts_storage *s = calloc(1, sizeof *s);
    if (!s) {
        ts_error(TS_ERR_MEMORY, "storage: out of memory");
        return NULL;
    }
    s->data = data;
    s->nbytes = nbytes;
    s->refcount = 1;
    s->device = d;
    s->release = release;
    s->release_ctx = ctx;
    s->id = ++ids;
    return s;
}

ts_storage *ts_storage_wrap(void *data, size_t nbytes, void (*release)(void *, size_t, void *), void *ctx) {
    return ts_storage_wrap_on(TS_CPU, data, nbytes, release, ctx);
}

/* Gives storage s's memory back to its device's backend (ctx is s). */
static void backend_release(void *data, size_t nbytes, void *ctx) {
    const ts_storage *s = ctx;
    const ts_backend *b = ts_backend_of("storage", s->device);
    if (b) b->memory->free(s->device.index, data, nbytes);
}

/* Storage of nbytes on device d from its backend. */
static ts_storage *storage_new(const char *op, ts_device d, size_t nbytes) {
    ts_threads_init();
    const ts_backend *b = ts_backend_of(op, d);
    void *data = b ? b->memory->alloc(d.index, nbytes) : NULL;
    if (!data) return NULL;
    ts_storage *s = ts_storage_wrap_on(d, data, nbytes, backend_release, NULL);
    if (!s) b->memory->free(d.index, data, nbytes);
    else s->release_ctx = s;
    return s;
}

void ts_storage_retain(ts_storage *s) { s->refcount++; }

void ts_storage_release(ts_storage *s) {
    if (!s || --s->refcount > 0) return;
    if (s->release) s->release(s->data, s->nbytes, s->release_ctx);
    free(s);
}

/* ---- views ---- */

void ts_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = st;
        st *= shape[d] > 0 ? shape[d] : 1;
    }
}

int ts_dim_index(int dim, int ndim) {
    if (dim < 0) dim += ndim;
    return dim >= 0 && dim < ndim ? dim : -1;
}

/* Checks ndim and sizes, and that the contiguous strides of the shape (sizes
 * 0 counted as 1) stay below INT64_MAX / 8, so element counts, strides and
 * byte sizes of every dtype never overflow. */
static ts_status check_shape(const char *op, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > TS_MAX_DIMS)
        return ts_error(TS_ERR_SHAPE, "%s: %d dims is outside 0..%d", op, ndim, TS_MAX_DIMS);
    int64_t span = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return ts_error(TS_ERR_SHAPE, "%s: shape %s has a negative size at dim %d", op,
                            ts_dims_str(ndim, shape), d);
        if (__builtin_mul_overflow(span, shape[d] > 0 ? shape[d] : 1, &span) || span > INT64_MAX / 8)
            return ts_error(TS_ERR_SHAPE, "%s: shape %s has too many elements (more than %lld)", op,
                            ts_dims_str(ndim, shape), (long long)(INT64_MAX / 8));
    }
    return TS_OK;
}

static int64_t shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

ts_tensor *ts_tensor_from_storage(ts_storage *s, ts_dtype dt, int64_t offset, int ndim,
                                  const int64_t *shape, const int64_t *strides) {
    if (check_shape("view", ndim, shape)) return NULL;
    if ((unsigned)dt >= TS_NDTYPES) {
        ts_error(TS_ERR_DTYPE, "view: unknown dtype %d", (int)dt);
        return NULL;
    }
    ts_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        ts_error(TS_ERR_MEMORY, "view: out of memory");
        return NULL;
    }
    t->ndim = ndim;
    if (ndim > 0) /* 0-dim tensors may pass shape NULL */
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    if (strides && ndim > 0)
        memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
    else
        ts_contiguous_strides(ndim, shape, t->strides);
    /* the view's extent must lie inside the storage (an extent that
     * overflows int64 does not) */
    int64_t lo = offset, hi = offset;
    bool empty = false, overflow = false;
    for (int d = 0; d < ndim && !overflow; d++) {
        if (shape[d] == 0) {
            empty = true;
            continue;
        }
        int64_t span = 0;
        overflow = __builtin_mul_overflow(shape[d] - 1, t->strides[d], &span) ||
                   (span < 0 ? __builtin_add_overflow(lo, span, &lo) : __builtin_add_overflow(hi, span, &hi));
    }
    size_t esz = ts_dtype_size(dt);
    if (!empty && (overflow || lo < 0 || (uint64_t)hi >= s->nbytes / esz)) {
        ts_error(TS_ERR_SHAPE, "view: shape %s at offset %lld does not fit storage of %zu bytes",
                 ts_dims_str(ndim, shape), (long long)offset, s->nbytes);
        free(t);
        return NULL;
    }
    t->storage = s;
    ts_storage_retain(s);
    t->offset = offset;
    t->dtype = dt;
    t->refcount = 1;
    return t;
}

ts_tensor *ts_tensor_empty_on(ts_device d, ts_dtype dt, int ndim, const int64_t *shape) {
    if (check_shape("empty", ndim, shape)) return NULL;
    if ((unsigned)dt >= TS_NDTYPES) {
        ts_error(TS_ERR_DTYPE, "empty: unknown dtype %d", (int)dt);
        return NULL;
    }
    ts_storage *s = storage_new("empty", d, (size_t)shape_numel(ndim, shape) * ts_dtype_size(dt));
    if (!s) return NULL;
    ts_tensor *t = ts_tensor_from_storage(s, dt, 0, ndim, shape, NULL);
    ts_storage_release(s);
    return t;
}

ts_tensor *ts_tensor_empty(ts_dtype dt, int ndim, const int64_t *shape) {
    return ts_tensor_empty_on(TS_CPU, dt, ndim, shape);
}

ts_tensor *ts_tensor_empty_like(const ts_tensor *t) {
    return ts_tensor_empty_on(ts_tensor_device(t), t->dtype, t->ndim, t->shape);
}

ts_tensor *ts_tensor_retain(ts_tensor *t) {
    if (t) t->refcount++;
    return t;
}

void ts_tensor_release(ts_tensor *t) {
    if (!t || --t->refcount > 0) return;
    ts_tensor_release(t->grad);
    ts_node_release(t->grad_fn);
    ts_storage_release(t->storage);
    free(t);
}

ts_tensor *ts_tensor_alias(const ts_tensor *t) {
    return ts_tensor_from_storage(t->storage, t->dtype, t->offset, t->ndim, t->shape, t->strides);
}

int64_t ts_tensor_numel(const ts_tensor *t) { return shape_numel(t->ndim, t->shape); }

size_t ts_tensor_nbytes(const ts_tensor *t) { return (size_t)ts_tensor_numel(t) * ts_dtype_size(t->dtype); }

bool ts_tensor_is_contiguous(const ts_tensor *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != st) return false;
        st *= t->shape[d];
    }
    return true;
}

bool ts_tensor_same_shape(const ts_tensor *a, const ts_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

void *ts_tensor_data(const ts_tensor *t) {
    return (char *)t->storage->data + (size_t)t->offset * ts_dtype_size(t->dtype);
}

int64_t ts_tensor_offset_of(const ts_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

double ts_tensor_get(const ts_tensor *t, int64_t i) {
    return ts_elem_get(t->storage->data, t->dtype, ts_tensor_offset_of(t, i));
}

/* Counts an in-place write into t's storage (see ts_storage.version). */
static void bump_version(ts_tensor *t) { atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed); }

void ts_tensor_set(ts_tensor *t, int64_t i, double v) {
    bump_version(t);
    ts_elem_set(t->storage->data, t->dtype, ts_tensor_offset_of(t, i), v);
}

double ts_tensor_item(const ts_tensor *t) {
    if (t->storage->device.type == TS_DEVICE_CPU) return ts_elem_get(t->storage->data, t->dtype, t->offset);
    char host[8];
    const ts_backend *b = ts_backend_of("item", ts_tensor_device(t));
    if (!b || b->memory->download(t->storage->device.index, host, ts_tensor_data(t), ts_dtype_size(t->dtype)))
        return NAN;
    return ts_elem_get(host, t->dtype, 0);
}

/* t as a kernel operand. */
static ts_operand operand(const ts_tensor *t) { return (ts_operand){ts_tensor_data(t), t->dtype, t->strides}; }

ts_status ts_tensor_fill_(ts_tensor *t, double v) {
    if (!t) return ts_error(TS_ERR_VALUE, "fill: tensor is NULL");
    const ts_backend *b = ts_backend_of("fill", ts_tensor_device(t));
    if (b) bump_version(t);
    return b ? b->memory->fill(t->ndim, t->shape, operand(t), v) : ts_last_status();
}

ts_tensor *ts_tensor_to(const ts_tensor *t, ts_device d) {
    ts_device from = ts_tensor_device(t);
    if (ts_device_equal(from, d)) return ts_tensor_dense(t);
    const ts_backend *bf = ts_backend_of("to", from), *bd = bf ? ts_backend_of("to", d) : NULL;
    ts_tensor *src = bd ? ts_tensor_dense(t) : NULL, *host = NULL;
    ts_tensor *out = src ? ts_tensor_empty_on(d, t->dtype, t->ndim, t->shape) : NULL;
    size_t n = src ? ts_tensor_nbytes(src) : 0;
    ts_status st = out ? TS_OK : ts_last_status();
    if (!st && from.type == TS_DEVICE_CPU) {
        st = bd->memory->upload(d.index, ts_tensor_data(out), ts_tensor_data(src), n);
    } else if (!st && d.type == TS_DEVICE_CPU) {
        st = bf->memory->download(from.index, ts_tensor_data(out), ts_tensor_data(src), n);
    } else if (!st) { /* between two devices: through the host */
        host = ts_tensor_empty(t->dtype, t->ndim, t->shape);
        st = host ? bf->memory->download(from.index, ts_tensor_data(host), ts_tensor_data(src), n) : ts_last_status();
        if (!st) st = bd->memory->upload(d.index, ts_tensor_data(out), ts_tensor_data(host), n);
    }
    ts_tensor_release(host);
    ts_tensor_release(src);
    if (st) {
        ts_tensor_release(out);
        return NULL;
    }
    return out;
}

/* dst = src or dst += src, same shape; src is brought to dst's device
 * first when it is elsewhere. */
static ts_status copy_into(const char *op, ts_tensor *dst, const ts_tensor *src, bool accumulate) {
    if (!dst || !src) return ts_error(TS_ERR_VALUE, "%s: %s is NULL", op, dst ? "source" : "destination");
    if (!ts_tensor_same_shape(dst, src))
        return ts_error(TS_ERR_SHAPE, "%s: destination %s and source %s differ", op, ts_shape_str(dst),
                        ts_shape_str(src));
    const ts_backend *b = ts_backend_of(op, ts_tensor_device(dst));
    if (!b) return ts_last_status();
    bump_version(dst);
    if (ts_device_equal(ts_tensor_device(dst), ts_tensor_device(src)))
        return b->memory->copy(dst->ndim, dst->shape, operand(dst), operand(src), accumulate);
    ts_tensor *here = ts_tensor_to(src, ts_tensor_device(dst));
    if (!here) return ts_last_status();
    ts_status st = b->memory->copy(dst->ndim, dst->shape, operand(dst), operand(here), accumulate);
    ts_tensor_release(here);
    return st;
}

ts_status ts_tensor_copy_(ts_tensor *dst, const ts_tensor *src) { return copy_into("copy", dst, src, false); }

ts_status ts_tensor_add_(ts_tensor *dst, const ts_tensor *src) { return copy_into("add_", dst, src, true); }

ts_tensor *ts_tensor_copy_as(const ts_tensor *t, ts_dtype dt) {
    ts_tensor *out = ts_tensor_empty_on(ts_tensor_device(t), dt, t->ndim, t->shape);
    if (out && ts_tensor_copy_(out, t)) {
        ts_tensor_release(out);
        return NULL;
    }
    return out;
}

ts_tensor *ts_tensor_dense(const ts_tensor *t) {
    return ts_tensor_is_contiguous(t) ? ts_tensor_retain((ts_tensor *)t) : ts_tensor_copy_as(t, t->dtype);
}

/* ---- creation ---- */

ts_tensor *ts_tensor_full_on(ts_device d, ts_dtype dt, int ndim, const int64_t *shape, double value) {
    ts_tensor *t = ts_tensor_empty_on(d, dt, ndim, shape);
    if (t && ts_tensor_fill_(t, value)) {
        ts_tensor_release(t);
        return NULL;
    }
    return t;
}

ts_tensor *ts_tensor_zeros_on(ts_device d, ts_dtype dt, int ndim, const int64_t *shape) {
    return ts_tensor_full_on(d, dt, ndim, shape, 0.0);
}

ts_tensor *ts_tensor_full(ts_dtype dt, int ndim, const int64_t *shape, double value) {
    return ts_tensor_full_on(TS_CPU, dt, ndim, shape, value);
}

ts_tensor *ts_tensor_zeros(ts_dtype dt, int ndim, const int64_t *shape) { return ts_tensor_zeros_on(TS_CPU, dt, ndim, shape); }

ts_tensor *ts_tensor_ones(ts_dtype dt, int ndim, const int64_t *shape) { return ts_tensor_full(dt, ndim, shape, 1.0); }

ts_tensor *ts_tensor_scalar(ts_dtype dt, double value) { return ts_tensor_full(dt, 0, NULL, value); }

ts_tensor *ts_tensor_arange(ts_dtype dt, double start, double end, double step) {
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        ts_error(TS_ERR_VALUE, "arange: start %g, end %g, step %g do not make a range", start, end, step);
        return NULL;
    }
    double count = ceil((end - start) / step);
    int64_t n = count > 0 ? (int64_t)count : 0;
    ts_tensor *t = ts_tensor_empty(dt, 1, &n);
    if (!t) return NULL;
    for (int64_t i = 0; i < n; i++) ts_tensor_set(t, i, start + (double)i * step);
    return t;
}

ts_tensor *ts_tensor_from_data(ts_dtype dt, int ndim, const int64_t *shape, const void *data) {
    if (!data) {
        if (check_shape("from_data", ndim, shape)) return NULL;
        if (shape_numel(ndim, shape) > 0) {
            ts_error(TS_ERR_VALUE, "from_data: data is NULL for shape %s", ts_dims_str(ndim, shape));
            return NULL;
        }
    }
    ts_tensor *t = ts_tensor_empty(dt, ndim, shape);
    if (t && data) memcpy(t->storage->data, data, ts_tensor_nbytes(t));
    return t;
}

/* A tensor of float dtype dt filled from the uniform (normal = false) or
 * normal stream of key, then scaled: x * scale + shift. */
static ts_tensor *random_tensor(const char *op, ts_key key, ts_dtype dt, int ndim, const int64_t *shape,
                                bool normal, double scale, double shift) {
    if (!ts_dtype_is_float(dt)) {
        ts_error(TS_ERR_DTYPE, "%s: dtype %s is not a float dtype", op, ts_dtype_name(dt));
        return NULL;
    }
    ts_tensor *t = ts_tensor_empty(dt, ndim, shape);
    if (!t) return NULL;
    int64_t n = ts_tensor_numel(t);
    if (dt == TS_F64) {
        double *p = ts_f64(t);
        if (normal) ts_rng_normal_f64(key, 0, n, p); else ts_rng_uniform_f64(key, 0, n, p);
        for (int64_t i = 0; i < n; i++) p[i] = p[i] * scale + shift;
        return t;
    }
    float *buf = dt == TS_F32 ? ts_f32(t) : malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!buf) {
        ts_tensor_release(t);
        ts_error(TS_ERR_MEMORY, "%s: out of memory", op);
        return NULL;
    }
    if (normal) ts_rng_normal_f32(key, 0, n, buf); else ts_rng_uniform_f32(key, 0, n, buf);
    for (int64_t i = 0; i < n; i++) buf[i] = (float)(buf[i] * scale + shift);
    if (dt == TS_BF16) {
        uint16_t *p = ts_tensor_data(t);
        for (int64_t i = 0; i < n; i++) p[i] = ts_bf16_from_f32(buf[i]);
        free(buf);
    }
    return t;
}

ts_tensor *ts_tensor_rand(ts_key key, ts_dtype dt, int ndim, const int64_t *shape) {
    return random_tensor("rand", key, dt, ndim, shape, false, 1.0, 0.0);
}

ts_tensor *ts_tensor_uniform(ts_key key, ts_dtype dt, int ndim, const int64_t *shape, double lo, double hi) {
    return random_tensor("uniform", key, dt, ndim, shape, false, hi - lo, lo);
}

ts_tensor *ts_tensor_randn(ts_key key, ts_dtype dt, int ndim, const int64_t *shape) {
    return random_tensor("randn", key, dt, ndim, shape, true, 1.0, 0.0);
}

ts_tensor *ts_tensor_normal(ts_key key, ts_dtype dt, int ndim, const int64_t *shape, double mean, double std) {
    return random_tensor("normal", key, dt, ndim, shape, true, std, mean);
}

/* ---- strings, printing, checks ---- */

const char *ts_dims_str(int ndim, const int64_t *shape) {
    static _Thread_local char ring[8][128];
    static _Thread_local int next;
    char *buf = ring[next++ % 8];
    int len = snprintf(buf, 128, "[");
    for (int d = 0; d < ndim && len < 120; d++)
        len += snprintf(buf + len, (size_t)(128 - len), d ? ",%lld" : "%lld", (long long)shape[d]);
    snprintf(buf + len, (size_t)(128 - len), "]");
    return buf;
}

const char *ts_shape_str(const ts_tensor *t) { return ts_dims_str(t->ndim, t->shape); }

void ts_tensor_print(FILE *f, const ts_tensor *t0, const char *name) {
    fprintf(f, "%s%stensor(dtype=%s, shape=%s, device=%s%s)\n", name ? name : "", name ? " = " : "",
            ts_dtype_name(t0->dtype), ts_shape_str(t0), ts_device_name(t0->storage->device),
            t0->requires_grad ? ", requires_grad" : "");
    ts_tensor *t = ts_tensor_to(t0, TS_CPU); /* the values, on the host */
    if (!t) {
        fprintf(f, "  (values not readable: %s)\n", ts_last_error());
        return;
    }
    int64_t n = ts_tensor_numel(t);
    int64_t last = t->ndim ? t->shape[t->ndim - 1] : 1;
    bool summarise = n > 64;
    fprintf(f, "  [");
    for (int64_t i = 0; i < n; i++) {
        if (summarise && i == 3) {
            fprintf(f, " ...");
            i = n - 4;
            continue;
        }
        if (i && last && i % last == 0 && !summarise) fprintf(f, "\n   ");
        double v = ts_tensor_get(t, i);
        if (ts_dtype_is_float(t->dtype)) fprintf(f, " %.6g", v); else fprintf(f, " %lld", (long long)v);
    }
    fprintf(f, " ]\n");
    ts_tensor_release(t);
}

ts_status ts_check_tensor(const char *op, const char *arg, const ts_tensor *t, unsigned dtype_mask) {
    if (t && t->storage->device.type != TS_DEVICE_CPU)
        return ts_error(TS_ERR_DEVICE, "%s: %s is on device %s, expected cpu", op, arg,
                        ts_device_name(t->storage->device));
    return ts_check_arg(op, arg, t, dtype_mask);
}

ts_status ts_check_arg(const char *op, const char *arg, const ts_tensor *t, unsigned dtype_mask) {
    if (!t) return ts_error(TS_ERR_VALUE, "%s: %s is NULL", op, arg);
    if (!(dtype_mask & TS_MASK(t->dtype))) {
        char allowed[64] = "";
        for (int d = 0; d < TS_NDTYPES; d++)
            if (dtype_mask & TS_MASK(d)) {
                if (allowed[0]) strcat(allowed, "/");
                strcat(allowed, dtype_names[d]);
            }
        return ts_error(TS_ERR_DTYPE, "%s: %s has dtype %s (shape %s), expected %s", op, arg,
                        ts_dtype_name(t->dtype), ts_shape_str(t), allowed);
    }
    return TS_OK;
}
