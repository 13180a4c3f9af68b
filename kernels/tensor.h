/* tensor.h - the tensor: dtype, device, shape/strides/offset over
 * refcounted storage.
 *
 * A ts_tensor is a view: `ndim` sizes and element strides at an element
 * `offset` into a ts_storage that many views may share. Tensors and storages
 * are reference counted: every function that returns a ts_tensor* returns a
 * new reference the caller must ts_tensor_release(); functions taking a
 * tensor borrow it. NULL means failure, with the reason in ts_last_error().
 *
 * The differentiable view ops (reshape, permute, narrow, expand, ...) live in
 * ops/view.h; this file holds construction, raw access, copies and printing.
 * bf16 is a storage type: math on it is done in f32.
 *
 * Every storage lives on one device ("cpu", "cuda:0", ...). Storage of a
 * device is allocated, freed, filled and copied by that device's backend
 * (ops/backend.h); copies between devices go through the host. Element
 * access (ts_tensor_get/set, ts_tensor_data as a host pointer, printing) is
 * for CPU tensors; ts_tensor_item works on any device.
 */
#ifndef TS_TENSOR_H
#define TS_TENSOR_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/rng.h"
#include "kernels/status.h"

#define TS_MAX_DIMS 8

typedef enum { TS_F32, TS_F64, TS_BF16, TS_I32, TS_I64, TS_U8, TS_NDTYPES } ts_dtype;

typedef enum { TS_DEVICE_CPU, TS_DEVICE_CUDA, TS_NDEVICE_TYPES } ts_device_type;

/* A device: its type and index (cuda:1 is {TS_DEVICE_CUDA, 1}; the CPU is
 * always index 0). */
typedef struct {
    ts_device_type type;
    int index;
} ts_device;

#define TS_CPU ((ts_device){TS_DEVICE_CPU, 0})
static inline ts_device ts_cuda(int index) { return (ts_device){TS_DEVICE_CUDA, index}; }
static inline bool ts_device_equal(ts_device a, ts_device b) { return a.type == b.type && a.index == b.index; }

typedef struct ts_storage {
    void *data; /* an address on the storage's device */
    size_t nbytes;
    _Atomic int refcount;
    ts_device device;
    void (*release)(void *data, size_t nbytes, void *ctx); /* NULL: never freed */
    void *release_ctx;
    bool no_pack; /* never packed to bf16 for backward (see ts_autograd_set_pack_bf16) */
    uint64_t id;  /* unique per storage in the process (never reused) */
    /* counts the in-place writes through ts_tensor_copy_, _add_, _fill_
     * and _set (of any view): autograd refuses a backward that would read
     * a tensor written after its op saved it */
    _Atomic unsigned version;
} ts_storage;

typedef struct ts_node ts_node; /* autograd node, see autograd.h */

typedef struct ts_tensor {
    ts_storage *storage;
    int64_t offset; /* in elements */
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t strides[TS_MAX_DIMS]; /* in elements */
    ts_dtype dtype;
    _Atomic int refcount;
    /* autograd */
    bool requires_grad;
    struct ts_tensor *grad; /* accumulated gradient of a leaf, or NULL */
    ts_node *grad_fn;       /* node that produced this tensor, or NULL */
    bool packed; /* a bf16 copy of an f32 tensor kept by a node (autograd.c) */
    /* called once per backward pass, when the pass has added the last of
     * its gradients into this leaf's grad (a data-parallel strategy may
     * send it from then on); a failure (an error recorded with ts_error)
     * stops the pass, which returns the hook's status */
    ts_status (*grad_hook)(struct ts_tensor *t, void *ctx);
    void *grad_hook_ctx;
    unsigned hook_pass; /* the pass that counted hook_due (autograd.c) */
    int hook_due;       /* that pass's gradients still to come into grad */
} ts_tensor;

/* dtype facts */
size_t ts_dtype_size(ts_dtype dt);
const char *ts_dtype_name(ts_dtype dt);
bool ts_dtype_is_float(ts_dtype dt); /* f32, f64, bf16 */

/* "cpu", "cuda:0": from a small ring of per-thread buffers, like
 * ts_dims_str. */
const char *ts_device_name(ts_device d);
/* Parses "cpu", "cuda" (= cuda:0) or "cuda:N" into *d; else an error
 * naming the text. */
ts_status ts_device_parse(const char *text, ts_device *d);
/* The device t's storage is on. */
static inline ts_device ts_tensor_device(const ts_tensor *t) { return t->storage->device; }

/* bf16 <-> f32, round to nearest even (NaN stays NaN). */
/* Inline and branch-free, so loops of them vectorise. */
static inline uint16_t ts_bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40) : rounded; /* NaN stays quiet NaN */
}
static inline float ts_f32_from_bf16(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i of an array of dtype dt at base, as double, and the reverse
 * (converting; bf16 rounds to nearest even). Host memory. */
static inline double ts_elem_get(const void *base, ts_dtype dt, int64_t i) {
    switch (dt) {
    case TS_F32: return ((const float *)base)[i];
    case TS_F64: return ((const double *)base)[i];
    case TS_BF16: return ts_f32_from_bf16(((const uint16_t *)base)[i]);
    case TS_I32: return ((const int32_t *)base)[i];
    case TS_I64: return (double)((const int64_t *)base)[i];
    case TS_U8: return ((const uint8_t *)base)[i];
    default: return NAN;
    }
}
static inline void ts_elem_set(void *base, ts_dtype dt, int64_t i, double v) {
    switch (dt) {
    case TS_F32: ((float *)base)[i] = (float)v; break;
    case TS_F64: ((double *)base)[i] = v; break;
    case TS_BF16: ((uint16_t *)base)[i] = ts_bf16_from_f32((float)v); break;
    case TS_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case TS_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case TS_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    default: break;
    }
}

/* Creation on a device: contiguous, uninitialised (empty), 0 or value.
 * Shapes are checked (0 <= ndim <= 8, sizes >= 0, fewer than 2^60
 * elements, sizes 0 counted as 1); a device without a backend in this
 * build is an error. */
ts_tensor *ts_tensor_empty_on(ts_device d, ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_tensor_zeros_on(ts_device d, ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_tensor_full_on(ts_device d, ts_dtype dt, int ndim, const int64_t *shape, double value);
/* A new contiguous tensor with t's device, dtype and shape (uninitialised). */
ts_tensor *ts_tensor_empty_like(const ts_tensor *t);

/* Creation on the CPU (the same as the _on forms with TS_CPU). */
ts_tensor *ts_tensor_empty(ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_tensor_zeros(ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_tensor_ones(ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_tensor_full(ts_dtype dt, int ndim, const int64_t *shape, double value);
ts_tensor *ts_tensor_scalar(ts_dtype dt, double value); /* 0-dim */
/* 1-d tensor start, start+step, ... < end (or > end for negative step). */
ts_tensor *ts_tensor_arange(ts_dtype dt, double start, double end, double step);
/* Copies numel elements of dtype dt from data (host, row-major). */
ts_tensor *ts_tensor_from_data(ts_dtype dt, int ndim, const int64_t *shape, const void *data);
/* Random tensors: element i depends only on (key, i). Float dtypes only. */
ts_tensor *ts_tensor_rand(ts_key key, ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_tensor_uniform(ts_key key, ts_dtype dt, int ndim, const int64_t *shape, double lo, double hi);
ts_tensor *ts_tensor_randn(ts_key key, ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_tensor_normal(ts_key key, ts_dtype dt, int ndim, const int64_t *shape, double mean, double std);

/* Storage that wraps host memory owned elsewhere; release(data, nbytes,
 * ctx) is called when the last view goes (release may be NULL: never
 * freed). */
ts_storage *ts_storage_wrap(void *data, size_t nbytes, void (*release)(void *, size_t, void *), void *ctx);
/* The same for memory of device d (an address the device's backend
 * understands). */
ts_storage *ts_storage_wrap_on(ts_device d, void *data, size_t nbytes, void (*release)(void *, size_t, void *),
                               void *ctx);
/* A view over storage (retained): dtype, element offset, shape, strides
 * (strides NULL: row-major contiguous). Checks the view fits the storage. */
ts_tensor *ts_tensor_from_storage(ts_storage *s, ts_dtype dt, int64_t offset, int ndim,
                                  const int64_t *shape, const int64_t *strides);
void ts_storage_retain(ts_storage *s);
void ts_storage_release(ts_storage *s);

/* Reference counting. release(NULL) is a no-op. */
ts_tensor *ts_tensor_retain(ts_tensor *t);
void ts_tensor_release(ts_tensor *t);

/* A new tensor sharing t's storage and view, with no autograd history. */
ts_tensor *ts_tensor_alias(const ts_tensor *t);

/* Facts about a view. */
int64_t ts_tensor_numel(const ts_tensor *t);
size_t ts_tensor_nbytes(const ts_tensor *t); /* numel * element size */
bool ts_tensor_is_contiguous(const ts_tensor *t);
bool ts_tensor_same_shape(const ts_tensor *a, const ts_tensor *b);
/* Row-major contiguous strides for a shape. */
void ts_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Normalises a possibly negative dim against ndim; -1 if out of range. */
int ts_dim_index(int dim, int ndim);

/* Pointer to the element at the view's offset (first logical element), an
 * address on the tensor's device. */
void *ts_tensor_data(const ts_tensor *t);
/* The same, typed; the dtype must match (checked by the caller). */
static inline float *ts_f32(const ts_tensor *t) { return (float *)ts_tensor_data(t); }
static inline double *ts_f64(const ts_tensor *t) { return (double *)ts_tensor_data(t); }

/* Element at logical row-major index i (any strides), as double; CPU
 * tensors only. */
double ts_tensor_get(const ts_tensor *t, int64_t i);
void ts_tensor_set(ts_tensor *t, int64_t i, double v);
/* Value of the first element (of a one-element tensor), on any device;
 * NaN with an error if it cannot be read. */
double ts_tensor_item(const ts_tensor *t);
/* Storage offset (elements) of logical row-major index i. */
int64_t ts_tensor_offset_of(const ts_tensor *t, int64_t i);

/* Copies src into dst elementwise: same shape, any strides and dtypes
 * (converting), any devices (through the host when they differ). Not
 * differentiable. This and the other in-place writes below (and
 * ts_tensor_set) count as a new version of dst's storage. */
ts_status ts_tensor_copy_(ts_tensor *dst, const ts_tensor *src);
/* dst += src elementwise: same shape and device, any strides and dtypes.
 * Not differentiable. */
ts_status ts_tensor_add_(ts_tensor *dst, const ts_tensor *src);
/* Sets every element of t to v. Not differentiable. */
ts_status ts_tensor_fill_(ts_tensor *t, double v);
/* A contiguous copy of t with dtype dt, on t's device (no autograd). */
ts_tensor *ts_tensor_copy_as(const ts_tensor *t, ts_dtype dt);
/* A contiguous copy of t on device d (t itself, retained, when it is
 * already there and contiguous); no autograd (ts_to_device records). */
ts_tensor *ts_tensor_to(const ts_tensor *t, ts_device d);
/* t itself (retained) when contiguous, else a contiguous copy of the same
 * dtype without history. */
ts_tensor *ts_tensor_dense(const ts_tensor *t);

/* "[4,8]" for error messages; from a small ring of per-thread buffers, so a
 * few may be used in one printf. */
const char *ts_shape_str(const ts_tensor *t);
const char *ts_dims_str(int ndim, const int64_t *shape);

/* Prints dtype, shape, device and values (summarised past 64 elements). */
void ts_tensor_print(FILE *f, const ts_tensor *t, const char *name);

/* Checks t is not NULL and has one of the dtypes allowed (bit mask of
 * 1u << dtype), on any device (ops then check their tensors share one:
 * ts_backend_for in ops/backend.h); else records "op: ... " and returns
 * the error. */
ts_status ts_check_arg(const char *op, const char *arg, const ts_tensor *t, unsigned dtype_mask);
/* ts_check_arg, and t is on the CPU (for code that reads its elements on
 * the host: datasets, files, gradcheck). */
ts_status ts_check_tensor(const char *op, const char *arg, const ts_tensor *t, unsigned dtype_mask);
#define TS_MASK(dt) (1u << (dt))
#define TS_FLOATS (TS_MASK(TS_F32) | TS_MASK(TS_F64))
#define TS_INTS (TS_MASK(TS_I32) | TS_MASK(TS_I64))
#define TS_ANY_DTYPE ((1u << TS_NDTYPES) - 1)

#endif
