/* safetensors.h - named tensors in the safetensors format.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {"key": "value"}} padded with spaces to a multiple of 8,
 * then the raw little-endian row-major data; offsets are relative to the
 * start of the data. Supported dtypes: F32, F64, BF16, I32, I64, U8, and,
 * for reading only, F16 (IEEE half, as files from elsewhere hold it): no
 * tensor has that dtype, so an F16 entry reads as f32 (exactly: subnormals,
 * infinities and NaN included).
 *
 * Writing is atomic (temp file, fsync, rename, fsync of the folder).
 * Opening validates everything before anything is used: header length vs
 * file size, JSON, each entry's dtype, shape and offsets (size = numel *
 * dtype size, inside the data section, no overlaps or holes), unique names;
 * errors name the file and what is wrong. An opened file is memory-mapped
 * read-only until ts_safetensors_close().
 */
#ifndef TS_IO_SAFETENSORS_H
#define TS_IO_SAFETENSORS_H

#include <stdint.h>

#include "kernels/tensor.h"

/* The dtype of a file's entry: a ts_dtype, or F16, which only files have. */
enum { TS_SAFETENSORS_F16 = TS_NDTYPES, TS_SAFETENSORS_NDTYPES };

typedef struct {
    char *name;
    int dtype; /* a ts_dtype or TS_SAFETENSORS_F16 */
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    uint64_t begin, end; /* byte offsets into the data section */
} ts_safetensors_entry;

typedef struct {
    char *path;
    int n;                          /* entries, in data order */
    ts_safetensors_entry *entries;
    int nmeta;
    char **meta_keys, **meta_values;
    const uint8_t *data;            /* start of the data section */
    uint64_t data_len;
    void *map;                      /* the mapping (whole file) */
    size_t map_len;
} ts_safetensors;

/* Writes n tensors (any strides; CPU) under names (unique, non-empty, not
 * "__metadata__") plus nmeta string pairs of metadata (nmeta may be 0 and
 * the arrays NULL). Data is laid out in the given order. */
ts_status ts_safetensors_write(const char *path, int n, const char *const *names, ts_tensor *const *tensors,
                               int nmeta, const char *const *meta_keys, const char *const *meta_values);

/* Opens and validates path; NULL with a message naming the file on error. */
ts_safetensors *ts_safetensors_open(const char *path);
void ts_safetensors_close(ts_safetensors *st);

/* Index of the entry called name, or -1. */
int ts_safetensors_find(const ts_safetensors *st, const char *name);
/* Value of metadata key, or NULL. */
const char *ts_safetensors_meta(const ts_safetensors *st, const char *key);
/* A new contiguous tensor holding a copy of the named entry's data (F16:
 * converted to f32). */
ts_tensor *ts_safetensors_get(const ts_safetensors *st, const char *name);
/* Entry k as a host tensor: for a tensor dtype, a view of the mapped data
 * (read-only, valid until ts_safetensors_close()); for F16, a new f32
 * tensor of its values. */
ts_tensor *ts_safetensors_tensor(const ts_safetensors *st, int k);
/* Row-major index of the first element of entry k that is not a finite f32
 * (infinite, NaN, or an F64 past f32's range), its value in *value; -1 when
 * there is none. */
int64_t ts_safetensors_nonfinite(const ts_safetensors *st, int k, double *value);

/* Copies the named entries into existing tensors (any strides): each name
 * must exist with the same shape and dtype (so never F16), else an error
 * names the tensor and both shapes/dtypes. With strict, the file must hold
 * no other entries. Nothing is written unless every check passes. */
ts_status ts_safetensors_load_into(const ts_safetensors *st, int n, const char *const *names,
                                   ts_tensor *const *tensors, bool strict);

/* Safetensors dtype string for dt, a ts_dtype or TS_SAFETENSORS_F16
 * ("F32"...), or NULL if unsupported. */
const char *ts_safetensors_dtype_str(int dt);

#endif
