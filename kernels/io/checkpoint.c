/* checkpoint.c - step folders: temp folder + fsync + rename, validated open. */
#include "kernels/io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kernels/io/atomic.h"

#define FORMAT "tessera-checkpoint"
#define VERSION 1
#define PATH_CAP 4096

static const char *const weight_files[2] = {"model.safetensors", "optim.safetensors"};

/* out = dir/name (PATH_CAP bytes); an error when the path is too long. */
static ts_status join(char *out, const char *dir, const char *name) {
    if (snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return ts_error(TS_ERR_VALUE, "checkpoint: path %s/%s is too long", dir, name);
    return TS_OK;
}

/* Opens one of a checkpoint's files for reading: missing, or not a regular
 * file (a symlink to /dev/zero, a FIFO), is refused before anything is read. */
static ts_status open_part(const char *path, int *fd) {
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "checkpoint: %s is missing: %s", path, strerror(errno));
    return ts_io_open_regular(path, "checkpoint:", fd);
}

/* Size and CRC-32 of a file's contents. */
static ts_status file_crc(const char *path, uint64_t *bytes, uint32_t *crc) {
    int fd;
    ts_status s = open_part(path, &fd);
    if (s) return s;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ts_error(TS_ERR_IO, "checkpoint: %s: fdopen: %s", path, strerror(errno));
    }
    static _Thread_local unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t n = 0;
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
        c = crc32(c, buf, (uInt)r);
        n += r;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return ts_error(TS_ERR_IO, "checkpoint: read error in %s", path);
    *bytes = n;
    *crc = (uint32_t)c;
    return TS_OK;
}

static ts_status mkdir_p(const char *dir) {
    char p[PATH_CAP];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return ts_error(TS_ERR_IO, "checkpoint: cannot create folder %s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
        return ts_error(TS_ERR_IO, "checkpoint: cannot create folder %s: %s", p, strerror(errno));
    return TS_OK;
}

/* state.json for d, with the weights files' sizes and CRCs from dir. */
static ts_status write_state(const char *dir, const ts_checkpoint_data *d) {
    json_t *root = json_pack("{s:s, s:i, s:I}", "format", FORMAT, "version", VERSION, "step", (json_int_t)d->step);
    json_t *rng = json_object(), *files = json_object();
    for (int i = 0; i < d->n_keys; i++)
        json_object_set_new(rng, d->key_names[i], json_pack("[I,I]", (json_int_t)d->keys[i].k[0],
                                                            (json_int_t)d->keys[i].k[1]));
    json_object_set_new(root, "rng", rng);
    json_object_set_new(root, "loader", json_pack("{s:I, s:I}", "epoch", (json_int_t)d->loader.epoch, "offset",
                                                  (json_int_t)d->loader.offset));
    if (d->config) json_object_set_new(root, "config", json_string(d->config));
    ts_status s = TS_OK;
    if (d->extra) {
        json_error_t jerr;
        json_t *extra = json_loads(d->extra, 0, &jerr);
        if (!json_is_object(extra))
            s = ts_error(TS_ERR_VALUE, "checkpoint: extra state is not a JSON object (%s)", extra ? "" : jerr.text);
        if (extra) json_object_set_new(root, "extra", extra);
    }
    char path[PATH_CAP];
    for (int i = 0; !s && i < 2 + d->n_parts; i++) {
        uint64_t bytes;
        uint32_t crc;
        const char *name = i < 2 ? weight_files[i] : d->parts[i - 2];
        s = join(path, dir, name);
        if (!s) s = file_crc(path, &bytes, &crc);
        if (!s) json_object_set_new(files, name, json_pack("{s:I, s:I}", "bytes", (json_int_t)bytes, "crc32",
                                                           (json_int_t)crc));
    }
    json_object_set_new(root, "files", files);
    if (!s) s = join(path, dir, "state.json");
    if (!s) s = ts_io_atomic_write_json(path, root, JSON_INDENT(2));
    json_decref(root);
    return s;
}

static ts_status write_folder(const char *dir, const ts_checkpoint_data *d) {
    char path[PATH_CAP], step[32];
    snprintf(step, sizeof step, "%lld", (long long)d->step);
    const char *mk[2] = {"format", "step"}, *mv[2] = {"pt", step};
    ts_status s = join(path, dir, weight_files[0]);
    if (!s) s = ts_safetensors_write(path, d->n_model, d->model_names, d->model, 2, mk, mv);
    if (!s) s = join(path, dir, weight_files[1]);
    if (!s) s = ts_safetensors_write(path, d->n_optim, d->optim_names, d->optim, 2, mk, mv);
    if (!s) s = write_state(dir, d);
    if (!s) s = ts_io_fsync_dir(dir);
    return s;
}

ts_status ts_checkpoint_temp_dir(const char *root, int64_t step, long owner, char *out, size_t cap) {
    if (step < 0) return ts_error(TS_ERR_VALUE, "checkpoint: step %lld is negative", (long long)step);
    ts_status s = mkdir_p(root);
    char tmp[PATH_CAP], name[64];
    snprintf(name, sizeof name, ".tmp-step-%lld-%ld", (long long)step, owner);
    if (!s) s = join(tmp, root, name);
    if (!s && mkdir(tmp, 0777) != 0 && errno != EEXIST)
        s = ts_error(TS_ERR_IO, "checkpoint: cannot create folder %s: %s", tmp, strerror(errno));
    if (!s && snprintf(out, cap, "%s", tmp) >= (int)cap)
        s = ts_error(TS_ERR_VALUE, "checkpoint: path %s does not fit %zu bytes", tmp, cap);
    return s;
}

ts_status ts_checkpoint_save(const char *root, const ts_checkpoint_data *d, int keep_last, char *path, size_t cap) {
    if (d->step < 0) return ts_error(TS_ERR_VALUE, "checkpoint: step %lld is negative", (long long)d->step);
    ts_status s = mkdir_p(root);
    if (s) return s;
    char tmp[PATH_CAP], fin[PATH_CAP], old[PATH_CAP], name[64];
    long pid = (long)getpid();
    snprintf(name, sizeof name, "step-%lld", (long long)d->step);
    if ((s = join(fin, root, name))) return s;
    snprintf(name, sizeof name, ".old-step-%lld-%ld", (long long)d->step, pid);
    if ((s = join(old, root, name))) return s;
    struct stat sb;
    /* a folder of one writer starts empty; a sharded one holds the others' files */
    snprintf(name, sizeof name, ".tmp-step-%lld-%ld", (long long)d->step, pid);
    if (!d->n_parts && !(s = join(tmp, root, name)) && lstat(tmp, &sb) == 0) s = ts_io_remove_tree(tmp);
    if (!s) s = ts_checkpoint_temp_dir(root, d->step, pid, tmp, sizeof tmp);
    if (s) return s;
    s = write_folder(tmp, d);
    /* a checkpoint of this step exists (the step saved again): swap the two
     * folders in one step, so that no crash leaves the step without a
     * complete one (tmp then holds the old); a file system that cannot swap
     * (NFS) gets the old one moved aside first */
    bool swapped = false, replaced = false;
    if (!s && lstat(fin, &sb) == 0) {
        swapped = renameat2(AT_FDCWD, tmp, AT_FDCWD, fin, RENAME_EXCHANGE) == 0;
        if (!swapped && errno != EINVAL && errno != ENOSYS)
            s = ts_error(TS_ERR_IO, "checkpoint: cannot swap %s and %s: %s", tmp, fin, strerror(errno));
        else if (!swapped && rename(fin, old) != 0)
            s = ts_error(TS_ERR_IO, "checkpoint: cannot move %s aside: %s", fin, strerror(errno));
        replaced = !s && !swapped;
    }
    if (!s && !swapped && rename(tmp, fin) != 0)
        s = ts_error(TS_ERR_IO, "checkpoint: cannot rename %s to %s: %s", tmp, fin, strerror(errno));
    if (!s) s = ts_io_fsync_dir(root);
    if (s) {
        ts_io_remove_tree(tmp);
        return s;
    }
    if (swapped && (s = ts_io_remove_tree(tmp))) return s;
    if (replaced && (s = ts_io_remove_tree(old))) return s;
    if (path && snprintf(path, cap, "%s", fin) >= (int)cap)
        return ts_error(TS_ERR_VALUE, "checkpoint: path %s does not fit %zu bytes", fin, cap);
    return keep_last > 0 ? ts_checkpoint_prune(root, keep_last) : TS_OK;
}

/* ---- opening ---- */

void ts_checkpoint_close(ts_checkpoint *ck) {
    if (!ck) return;
    ts_safetensors_close(ck->model);
    ts_safetensors_close(ck->optim);
    json_decref(ck->state);
    free(ck->path);
    free(ck);
}

static bool get_int(json_t *obj, const char *key, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) return false;
    *out = json_integer_value(v);
    return true;
}

/* Fields of state.json (everything but the files). */
static ts_status read_state(ts_checkpoint *ck, const char *sp) {
    json_t *st = ck->state;
    const char *fmt = json_string_value(json_object_get(st, "format"));
    int64_t version = 0;
    if (!fmt || strcmp(fmt, FORMAT) != 0 || !get_int(st, "version", &version))
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: not a %s file (no format/version)", sp, FORMAT);
    if (version != VERSION)
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: version %lld, this build reads %d", sp, (long long)version,
                        VERSION);
    json_t *loader = json_object_get(st, "loader");
    if (!get_int(st, "step", &ck->step) || ck->step < 0)
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: field 'step' is missing or not a step", sp);
    if (!get_int(loader, "epoch", &ck->loader.epoch) || !get_int(loader, "offset", &ck->loader.offset))
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: field 'loader' needs integers 'epoch' and 'offset'", sp);
    json_t *cfg = json_object_get(st, "config");
    if (cfg && !json_is_string(cfg)) return ts_error(TS_ERR_FORMAT, "checkpoint %s: field 'config' is not text", sp);
    ck->config = cfg ? json_string_value(cfg) : NULL;
    ck->extra = json_object_get(st, "extra");
    if (ck->extra && !json_is_object(ck->extra))
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: field 'extra' is not an object", sp);
    json_t *rng = json_object_get(st, "rng");
    if (rng && !json_is_object(rng)) return ts_error(TS_ERR_FORMAT, "checkpoint %s: field 'rng' is not an object", sp);
    const char *name;
    json_t *v;
    json_object_foreach(rng, name, v) {
        json_t *a = json_array_get(v, 0), *b = json_array_get(v, 1);
        if (json_array_size(v) != 2 || !json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(a) > UINT32_MAX || json_integer_value(b) < 0 || json_integer_value(b) > UINT32_MAX)
            return ts_error(TS_ERR_FORMAT, "checkpoint %s: rng key '%s' is not two 32-bit words", sp, name);
    }
    return TS_OK;
}

/* Checks the file called name against its size and CRC in state.json;
 * its path into path. */
static ts_status check_file(ts_checkpoint *ck, const char *name, const char *sp, char *path) {
    ts_status s = join(path, ck->path, name);
    if (s) return s;
    json_t *f = json_object_get(json_object_get(ck->state, "files"), name);
    int64_t want_bytes, want_crc;
    if (!get_int(f, "bytes", &want_bytes) || !get_int(f, "crc32", &want_crc))
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: no size/crc32 recorded for %s", sp, name);
    uint64_t bytes;
    uint32_t crc;
    if ((s = file_crc(path, &bytes, &crc))) return s;
    if ((int64_t)bytes != want_bytes)
        return ts_error(TS_ERR_FORMAT, "checkpoint: %s is %llu bytes, state.json says %lld", path,
                        (unsigned long long)bytes, (long long)want_bytes);
    if ((int64_t)crc != want_crc)
        return ts_error(TS_ERR_FORMAT, "checkpoint: %s has CRC-32 %08x, state.json says %08llx (file damaged)", path,
                        crc, (unsigned long long)want_crc);
    return TS_OK;
}

/* Checks every file state.json lists beyond the two weights files. */
static ts_status check_parts(ts_checkpoint *ck, const char *sp) {
    const char *name;
    json_t *v;
    char path[PATH_CAP];
    json_object_foreach(json_object_get(ck->state, "files"), name, v) {
        if (!strcmp(name, weight_files[0]) || !strcmp(name, weight_files[1])) continue;
        if (strchr(name, '/') || name[0] == '.')
            return ts_error(TS_ERR_FORMAT, "checkpoint %s: file name '%s' leaves the folder", sp, name);
        ts_status s = check_file(ck, name, sp, path);
        if (s) return s;
    }
    return TS_OK;
}

/* Checks a weights file against its size and CRC in state.json, opens it. */
static ts_status open_weights(ts_checkpoint *ck, int i, const char *sp, ts_safetensors **out) {
    char path[PATH_CAP];
    ts_status s = check_file(ck, weight_files[i], sp, path);
    if (s) return s;
    if (!(*out = ts_safetensors_open(path))) return ts_last_status();
    const char *step = ts_safetensors_meta(*out, "step");
    if (!step || strtoll(step, NULL, 10) != ck->step)
        return ts_error(TS_ERR_FORMAT, "checkpoint: %s is of step %s, state.json of step %lld", path,
                        step ? step : "(none)", (long long)ck->step);
    return TS_OK;
}

ts_checkpoint *ts_checkpoint_open(const char *step_dir) {
    ts_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->path = strdup(step_dir))) {
        free(ck);
        ts_error(TS_ERR_MEMORY, "checkpoint %s: out of memory", step_dir);
        return NULL;
    }
    char sp[PATH_CAP];
    json_error_t jerr;
    ts_status s = join(sp, step_dir, "state.json");
    int fd = -1;
    if (!s) s = open_part(sp, &fd);
    if (!s && !(ck->state = json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr)))
        s = ts_error(TS_ERR_FORMAT, "checkpoint %s: invalid JSON at line %d: %s", sp, jerr.line, jerr.text);
    if (fd >= 0) close(fd);
    if (!s && !json_is_object(ck->state)) s = ts_error(TS_ERR_FORMAT, "checkpoint %s: not a JSON object", sp);
    if (!s) s = read_state(ck, sp);
    if (!s) s = open_weights(ck, 0, sp, &ck->model);
    if (!s) s = open_weights(ck, 1, sp, &ck->optim);
    if (!s) s = check_parts(ck, sp);
    if (s) {
        ts_checkpoint_close(ck);
        return NULL;
    }
    return ck;
}

ts_status ts_checkpoint_key(const ts_checkpoint *ck, const char *name, ts_key *key) {
    json_t *v = json_object_get(json_object_get(ck->state, "rng"), name);
    if (!v) return ts_error(TS_ERR_VALUE, "checkpoint %s: no rng key named '%s'", ck->path, name);
    key->k[0] = (uint32_t)json_integer_value(json_array_get(v, 0));
    key->k[1] = (uint32_t)json_integer_value(json_array_get(v, 1));
    return TS_OK;
}

/* ---- listing and pruning ---- */

/* k when name is "step-<k>" (digits only), else -1. */
static int64_t step_of(const char *name) {
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
    int64_t k = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || k > INT64_MAX / 10 - 10) return -1;
        k = k * 10 + (*p - '0');
    }
    return k;
}

static int step_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

ts_status ts_checkpoint_list(const char *root, int64_t **steps, int *n) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? TS_OK : ts_error(TS_ERR_IO, "checkpoint: cannot list %s: %s", root, strerror(errno));
    int cap = 0;
    struct dirent *e;
    char path[PATH_CAP];
    ts_status s = TS_OK;
    while (!s && (e = readdir(d))) {
        int64_t k = step_of(e->d_name);
        struct stat sb;
        if (k < 0 || snprintf(path, sizeof path, "%s/%s/state.json", root, e->d_name) >= (int)sizeof path ||
            stat(path, &sb) != 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *v = realloc(*steps, sizeof(int64_t) * (size_t)cap);
            if (!v) {
                s = ts_error(TS_ERR_MEMORY, "checkpoint: out of memory listing %s", root);
                break;
            }
            *steps = v;
        }
        (*steps)[(*n)++] = k;
    }
    closedir(d);
    if (s) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return s;
    }
    qsort(*steps, (size_t)*n, sizeof(int64_t), step_cmp);
    return TS_OK;
}

ts_status ts_checkpoint_latest(const char *root, char *path, size_t cap, int64_t *step) {
    int64_t *steps;
    int n;
    *step = -1;
    if (cap) path[0] = 0;
    ts_status s = ts_checkpoint_list(root, &steps, &n);
    if (s) return s;
    if (n > 0) {
        *step = steps[n - 1];
        if (snprintf(path, cap, "%s/step-%lld", root, (long long)*step) >= (int)cap)
            s = ts_error(TS_ERR_VALUE, "checkpoint: path of step %lld under %s does not fit %zu bytes",
                         (long long)*step, root, cap);
    }
    free(steps);
    return s;
}

/* True for ".tmp-step-<k>-<pid>" / ".old-step-<k>-<pid>" of a dead process. */
static bool stale_temp(const char *name) {
    if (strncmp(name, ".tmp-step-", 10) != 0 && strncmp(name, ".old-step-", 10) != 0) return false;
    const char *dash = strrchr(name, '-');
    char *end;
    long pid = strtol(dash + 1, &end, 10);
    if (*end || pid <= 0 || dash == name + 9) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

ts_status ts_checkpoint_prune(const char *root, int keep_last) {
    if (keep_last < 1) return ts_error(TS_ERR_VALUE, "checkpoint prune %s: keep_last %d < 1", root, keep_last);
    int64_t *steps;
    int n;
    ts_status s = ts_checkpoint_list(root, &steps, &n);
    if (s) return s;
    char path[PATH_CAP], name[64];
    for (int i = 0; !s && i < n - keep_last; i++) {
        snprintf(name, sizeof name, "step-%lld", (long long)steps[i]);
        if (!(s = join(path, root, name))) s = ts_io_remove_tree(path);
    }
    free(steps);
    DIR *d = opendir(root);
    struct dirent *e;
    while (!s && d && (e = readdir(d))) {
        if (stale_temp(e->d_name) && !(s = join(path, root, e->d_name))) s = ts_io_remove_tree(path);
    }
    if (d) closedir(d);
    return s ? s : ts_io_fsync_dir(root);
}
