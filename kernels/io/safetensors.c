/* safetensors.c - write (atomic) and validated read of safetensors files. */
#include "kernels/io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/io/atomic.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define MAX_HEADER (100u << 20) /* the format's own limit on the JSON header */

static const char *const dtype_strs[TS_SAFETENSORS_NDTYPES] = {
    [TS_F32] = "F32", [TS_F64] = "F64", [TS_BF16] = "BF16", [TS_I32] = "I32",
    [TS_I64] = "I64", [TS_U8] = "U8",   [TS_SAFETENSORS_F16] = "F16",
};

const char *ts_safetensors_dtype_str(int dt) { return (unsigned)dt < TS_SAFETENSORS_NDTYPES ? dtype_strs[dt] : NULL; }

static int dtype_from_str(const char *s) {
    for (int i = 0; i < TS_SAFETENSORS_NDTYPES; i++)
        if (strcmp(s, dtype_strs[i]) == 0) return i;
    return -1;
}

/* Bytes per element of an entry's dtype. */
static size_t entry_dtype_size(int dt) { return dt == TS_SAFETENSORS_F16 ? 2 : ts_dtype_size((ts_dtype)dt); }

/* IEEE half to float, exactly: a normal half is rebiased (15 to 127), a
 * subnormal one (m * 2^-24) becomes a normal float, infinities stay and a
 * NaN keeps its sign and payload. */
static float f32_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal */
        float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    uint32_t u = sign | (exp == 0x1f ? 0xffu : exp + 112) << 23 | man << 13;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i of the F16 data at p. */
static float f16_at(const uint8_t *p, int64_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return f32_from_f16(h);
}

/* ---- writing ---- */

static ts_status check_write_args(const char *path, int n, const char *const *names, ts_tensor *const *tensors,
                                  int nmeta, const char *const *keys, const char *const *values) {
    if (n < 0 || nmeta < 0 || (n > 0 && (!names || !tensors)) || (nmeta > 0 && (!keys || !values)))
        return ts_error(TS_ERR_VALUE, "safetensors write %s: bad counts n=%d nmeta=%d or NULL arrays", path, n, nmeta);
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0] || strcmp(names[i], "__metadata__") == 0)
            return ts_error(TS_ERR_VALUE, "safetensors write %s: tensor %d has an invalid name '%s'", path, i,
                            names[i] ? names[i] : "(null)");
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return ts_error(TS_ERR_VALUE, "safetensors write %s: name '%s' given twice", path, names[i]);
        if (!tensors[i]) return ts_error(TS_ERR_VALUE, "safetensors write %s: tensor '%s' is NULL", path, names[i]);
        ts_status s = ts_check_arg("safetensors write", names[i], tensors[i], TS_ANY_DTYPE);
        if (s) return s;
    }
    for (int i = 0; i < nmeta; i++)
        if (!keys[i] || !values[i])
            return ts_error(TS_ERR_VALUE, "safetensors write %s: metadata pair %d has a NULL key or value", path, i);
    return TS_OK;
}

/* The JSON header text, padded with spaces to a multiple of 8 (*len). */
static char *build_header(const char *path, int n, const char *const *names, ts_tensor *const *tensors, int nmeta,
                          const char *const *keys, const char *const *values, size_t *len) {
    json_t *root = json_object();
    if (nmeta > 0) {
        json_t *meta = json_object();
        for (int i = 0; i < nmeta; i++)
            if (json_object_set_new(meta, keys[i], json_string(values[i])) != 0) {
                ts_error(TS_ERR_VALUE, "safetensors write %s: metadata '%s' is not valid UTF-8 text", path, keys[i]);
                json_decref(meta);
                json_decref(root);
                return NULL;
            }
        json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const ts_tensor *t = tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t end = off + ts_tensor_nbytes(t);
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtype_strs[t->dtype], "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)end);
        if (!e || json_object_set_new(root, names[i], e) != 0) {
            ts_error(TS_ERR_VALUE, "safetensors write %s: tensor name '%s' is not valid UTF-8", path, names[i]);
            json_decref(root);
            return NULL;
        }
        off = end;
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) {
        ts_error(TS_ERR_MEMORY, "safetensors write %s: cannot build the JSON header", path);
        return NULL;
    }
    size_t raw = strlen(text), padded = (raw + 7) & ~(size_t)7;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        ts_error(TS_ERR_MEMORY, "safetensors write %s: out of memory", path);
        return NULL;
    }
    memset(out + raw, ' ', padded - raw);
    out[padded] = 0;
    *len = padded;
    return out;
}

static ts_status write_tensor_data(FILE *f, const char *path, const char *name, const ts_tensor *t) {
    ts_tensor *c = ts_tensor_to(t, TS_CPU); /* contiguous, in host memory */
    if (!c) return ts_last_status();
    size_t nb = ts_tensor_nbytes(c);
    ts_status s = TS_OK;
    if (nb && fwrite(ts_tensor_data(c), 1, nb, f) != nb)
        s = ts_error(TS_ERR_IO, "safetensors write %s: writing tensor '%s': %s", path, name, strerror(errno));
    ts_tensor_release(c);
    return s;
}

ts_status ts_safetensors_write(const char *path, int n, const char *const *names, ts_tensor *const *tensors,
                               int nmeta, const char *const *meta_keys, const char *const *meta_values) {
    ts_status s = check_write_args(path, n, names, tensors, nmeta, meta_keys, meta_values);
    if (s) return s;
    size_t hlen = 0;
    char *header = build_header(path, n, names, tensors, nmeta, meta_keys, meta_values, &hlen);
    if (!header) return ts_last_status();
    ts_io_atomic a;
    s = ts_io_atomic_open(&a, path);
    if (s) {
        free(header);
        return s;
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if (fwrite(lenbuf, 1, 8, a.f) != 8 || fwrite(header, 1, hlen, a.f) != hlen)
        s = ts_error(TS_ERR_IO, "safetensors write %s: writing the header: %s", path, strerror(errno));
    free(header);
    for (int i = 0; !s && i < n; i++) s = write_tensor_data(a.f, path, names[i], tensors[i]);
    if (s) {
        ts_io_atomic_abort(&a);
        return s;
    }
    return ts_io_atomic_commit(&a);
}

/* ---- reading ---- */

void ts_safetensors_close(ts_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->entries[i].name);
    for (int i = 0; i < st->nmeta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->entries);
    free(st->meta_keys);
    free(st->meta_values);
    if (st->map) munmap(st->map, st->map_len);
    free(st->path);
    free(st);
}

static ts_status parse_metadata(ts_safetensors *st, json_t *meta) {
    if (!json_is_object(meta))
        return ts_error(TS_ERR_FORMAT, "safetensors %s: __metadata__ is not an object", st->path);
    size_t m = json_object_size(meta);
    st->meta_keys = calloc(m ? m : 1, sizeof(char *));
    st->meta_values = calloc(m ? m : 1, sizeof(char *));
    if (!st->meta_keys || !st->meta_values) return ts_error(TS_ERR_MEMORY, "safetensors %s: out of memory", st->path);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return ts_error(TS_ERR_FORMAT, "safetensors %s: metadata '%s' is not a string", st->path, k);
        st->meta_keys[st->nmeta] = strdup(k);
        st->meta_values[st->nmeta] = strdup(json_string_value(v));
        st->nmeta++;
    }
    return TS_OK;
}

static ts_status parse_entry(ts_safetensors *st, const char *name, json_t *obj, ts_safetensors_entry *e) {
    const char *p = st->path;
    if (!json_is_object(obj)) return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' is not an object", p, name);
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' has an unknown field '%s'", p, name, k);
    }
    json_t *dt = json_object_get(obj, "dtype"), *shape = json_object_get(obj, "shape"),
           *offs = json_object_get(obj, "data_offsets");
    if (!json_is_string(dt)) return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' has no dtype string", p, name);
    int d = dtype_from_str(json_string_value(dt));
    if (d < 0)
        return ts_error(TS_ERR_DTYPE, "safetensors %s: tensor '%s' has unsupported dtype '%s'", p, name,
                        json_string_value(dt));
    if (!json_is_array(shape) || json_array_size(shape) > TS_MAX_DIMS)
        return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' has no shape array of at most %d dims", p, name,
                        TS_MAX_DIMS);
    e->dtype = d;
    e->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int i = 0; i < e->ndim; i++) {
        json_t *s = json_array_get(shape, i);
        if (!json_is_integer(s) || json_integer_value(s) < 0)
            return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' shape dim %d is not a size", p, name, i);
        e->shape[i] = json_integer_value(s);
        if (e->shape[i] && numel > (UINT64_MAX >> 4) / (uint64_t)e->shape[i])
            return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' shape %s is too large", p, name,
                            ts_dims_str(e->ndim, e->shape));
        numel *= (uint64_t)e->shape[i];
    }
    json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(b) || !json_is_integer(en) ||
        json_integer_value(b) < 0 || json_integer_value(en) < json_integer_value(b))
        return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' data_offsets is not [begin, end] with begin <= end",
                        p, name);
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(en);
    uint64_t want = numel * entry_dtype_size(e->dtype);
    if (e->end - e->begin != want)
        return ts_error(TS_ERR_FORMAT,
                        "safetensors %s: tensor '%s' (%s %s) needs %llu bytes but data_offsets [%llu, %llu) hold %llu",
                        p, name, json_string_value(dt), ts_dims_str(e->ndim, e->shape), (unsigned long long)want,
                        (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)(e->end - e->begin));
    if (e->end > st->data_len)
        return ts_error(TS_ERR_FORMAT,
                        "safetensors %s: tensor '%s' data [%llu, %llu) lies past the end of the data section "
                        "(%llu bytes; file truncated?)",
                        p, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)st->data_len);
    e->name = strdup(name);
    if (!e->name) return ts_error(TS_ERR_MEMORY, "safetensors %s: out of memory", p);
    return TS_OK;
}

static int entry_cmp(const void *a, const void *b) {
    const ts_safetensors_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Entries sorted by offset must tile the data section exactly. */
static ts_status check_layout(ts_safetensors *st) {
    qsort(st->entries, (size_t)st->n, sizeof *st->entries, entry_cmp);
    uint64_t pos = 0;
    for (int i = 0; i < st->n; i++) {
        const ts_safetensors_entry *e = &st->entries[i];
        if (e->begin < pos)
            return ts_error(TS_ERR_FORMAT, "safetensors %s: tensor '%s' data [%llu, %llu) overlaps tensor '%s'",
                            st->path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                            st->entries[i - 1].name);
        if (e->begin > pos)
            return ts_error(TS_ERR_FORMAT, "safetensors %s: unused bytes [%llu, %llu) before tensor '%s'", st->path,
                            (unsigned long long)pos, (unsigned long long)e->begin, e->name);
        pos = e->end;
    }
    if (pos != st->data_len)
        return ts_error(TS_ERR_FORMAT, "safetensors %s: data section has %llu bytes but the tensors cover %llu",
                        st->path, (unsigned long long)st->data_len, (unsigned long long)pos);
    return TS_OK;
}

static ts_status parse_header(ts_safetensors *st, const char *text, size_t len) {
    if (len == 0 || text[0] != '{')
        return ts_error(TS_ERR_FORMAT, "safetensors %s: header does not start with '{'", st->path);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ts_error(TS_ERR_FORMAT, "safetensors %s: JSON header invalid at line %d column %d: %s", st->path,
                        jerr.line, jerr.column, jerr.text);
    ts_status s = TS_OK;
    if (!json_is_object(root)) s = ts_error(TS_ERR_FORMAT, "safetensors %s: header is not a JSON object", st->path);
    size_t count = s ? 0 : json_object_size(root);
    st->entries = calloc(count ? count : 1, sizeof *st->entries);
    if (!s && !st->entries) s = ts_error(TS_ERR_MEMORY, "safetensors %s: out of memory", st->path);
    const char *k;
    json_t *v;
    if (!s) {
        json_object_foreach(root, k, v) {
            if (strcmp(k, "__metadata__") == 0) s = parse_metadata(st, v);
            else if ((s = parse_entry(st, k, v, &st->entries[st->n])) == TS_OK) st->n++;
            if (s) break;
        }
    }
    json_decref(root);
    return s ? s : check_layout(st);
}

ts_safetensors *ts_safetensors_open(const char *path) {
    int fd;
    if (ts_io_open_regular(path, "safetensors", &fd)) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        ts_error(TS_ERR_IO, "safetensors %s: fstat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    ts_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        close(fd);
        ts_error(TS_ERR_MEMORY, "safetensors %s: out of memory", path);
        return NULL;
    }
    uint64_t size = (uint64_t)sb.st_size;
    ts_status s = TS_OK;
    if (size < 8) {
        s = ts_error(TS_ERR_FORMAT, "safetensors %s: file is %llu bytes, shorter than the 8-byte header length", path,
                     (unsigned long long)size);
    } else {
        st->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (st->map == MAP_FAILED) {
            st->map = NULL;
            s = ts_error(TS_ERR_IO, "safetensors %s: mmap: %s", path, strerror(errno));
        } else {
            st->map_len = (size_t)size;
        }
    }
    close(fd);
    if (!s) {
        const uint8_t *m = st->map;
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++) hlen |= (uint64_t)m[i] << (8 * i);
        if (hlen > size - 8)
            s = ts_error(TS_ERR_FORMAT, "safetensors %s: header length %llu exceeds the %llu bytes after it (file truncated?)",
                         path, (unsigned long long)hlen, (unsigned long long)(size - 8));
        else if (hlen > MAX_HEADER)
            s = ts_error(TS_ERR_FORMAT, "safetensors %s: header length %llu is over the %u-byte limit", path,
                         (unsigned long long)hlen, MAX_HEADER);
        else {
            st->data = m + 8 + hlen;
            st->data_len = size - 8 - hlen;
            s = parse_header(st, (const char *)m + 8, (size_t)hlen);
        }
    }
    if (s) {
        ts_safetensors_close(st);
        return NULL;
    }
    return st;
}

int ts_safetensors_find(const ts_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->entries[i].name, name) == 0) return i;
    return -1;
}

const char *ts_safetensors_meta(const ts_safetensors *st, const char *key) {
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

ts_tensor *ts_safetensors_get(const ts_safetensors *st, const char *name) {
    int i = ts_safetensors_find(st, name);
    if (i < 0) {
        ts_error(TS_ERR_VALUE, "safetensors %s: no tensor named '%s'", st->path, name);
        return NULL;
    }
    const ts_safetensors_entry *e = &st->entries[i];
    if (e->dtype == TS_SAFETENSORS_F16) return ts_safetensors_tensor(st, i);
    return ts_tensor_from_data(e->dtype, e->ndim, e->shape, st->data + e->begin);
}

/* Elements of entry e. */
static int64_t entry_numel(const ts_safetensors_entry *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    return n;
}

ts_tensor *ts_safetensors_tensor(const ts_safetensors *st, int k) {
    const ts_safetensors_entry *e = &st->entries[k];
    const uint8_t *p = st->data + e->begin;
    if (e->dtype == TS_SAFETENSORS_F16) {
        ts_tensor *t = ts_tensor_empty(TS_F32, e->ndim, e->shape);
        if (!t) return NULL;
        float *out = ts_f32(t);
        for (int64_t i = 0, n = entry_numel(e); i < n; i++) out[i] = f16_at(p, i);
        return t;
    }
    ts_storage *s = ts_storage_wrap((void *)p, e->end - e->begin, NULL, NULL);
    if (!s) return NULL;
    ts_tensor *t = ts_tensor_from_storage(s, e->dtype, 0, e->ndim, e->shape, NULL);
    ts_storage_release(s);
    return t;
}

int64_t ts_safetensors_nonfinite(const ts_safetensors *st, int k, double *value) {
    const ts_safetensors_entry *e = &st->entries[k];
    const uint8_t *p = st->data + e->begin;
    for (int64_t i = 0, n = entry_numel(e); i < n; i++) {
        double v = e->dtype == TS_SAFETENSORS_F16 ? f16_at(p, i) : ts_elem_get(p, e->dtype, i);
        if (!isfinite((float)v)) {
            *value = v;
            return i;
        }
    }
    return -1;
}

ts_status ts_safetensors_load_into(const ts_safetensors *st, int n, const char *const *names,
                                   ts_tensor *const *tensors, bool strict) {
    for (int i = 0; i < n; i++) {
        int k = ts_safetensors_find(st, names[i]);
        if (k < 0) return ts_error(TS_ERR_VALUE, "safetensors %s: no tensor named '%s'", st->path, names[i]);
        const ts_safetensors_entry *e = &st->entries[k];
        const ts_tensor *t = tensors[i];
        ts_status s = ts_check_arg("safetensors load", names[i], t, TS_ANY_DTYPE);
        if (s) return s;
        if (e->ndim != t->ndim || memcmp(e->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
            return ts_error(TS_ERR_SHAPE, "safetensors %s: tensor '%s' has shape %s in the file but %s in the model",
                            st->path, names[i], ts_dims_str(e->ndim, e->shape), ts_shape_str(t));
        if (e->dtype != (int)t->dtype)
            return ts_error(TS_ERR_DTYPE, "safetensors %s: tensor '%s' has dtype %s in the file but %s in the model",
                            st->path, names[i], dtype_strs[e->dtype], dtype_strs[t->dtype]);
    }
    if (strict && st->n != n) {
        for (int k = 0; k < st->n; k++) {
            int used = 0;
            for (int i = 0; i < n && !used; i++) used = strcmp(st->entries[k].name, names[i]) == 0;
            if (!used)
                return ts_error(TS_ERR_VALUE, "safetensors %s: tensor '%s' in the file is not in the model", st->path,
                                st->entries[k].name);
        }
        return ts_error(TS_ERR_VALUE, "safetensors %s: %d names asked for %d entries (a name given twice?)", st->path,
                        n, st->n);
    }
    for (int i = 0; i < n; i++) {
        ts_tensor *src = ts_safetensors_tensor(st, ts_safetensors_find(st, names[i]));
        if (!src) return ts_last_status();
        ts_status st2 = ts_tensor_copy_(tensors[i], src);
        ts_tensor_release(src);
        if (st2) return st2;
    }
    return TS_OK;
}
