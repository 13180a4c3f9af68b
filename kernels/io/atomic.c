/* atomic.c - temp file + fsync + rename, folder fsync, tree removal,
 * opening regular files only. */
#include "kernels/io/atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void atomic_free(ts_io_atomic *a) {
    free(a->path);
    free(a->tmp);
    a->path = a->tmp = NULL;
    a->f = NULL;
}

/* Creates a new temp file next to path as a->tmp ("<path>.tmp-XXXXXX",
 * the Xs from the pid, the clock and a counter), with mode 0666 less the
 * umask as any file the user makes (mkstemp's 0600 would keep exported
 * models and checkpoints from every other account). Returns its fd. */
static int create_temp(ts_io_atomic *a, size_t cap) {
    static _Atomic unsigned counter;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    unsigned mix = (unsigned)getpid() * 2654435761u ^ (unsigned)now.tv_nsec;
    for (int tries = 0; tries < 64; tries++) {
        unsigned tag = (mix + counter++ * 40503u) & 0xffffffu;
        snprintf(a->tmp, cap, "%s.tmp-%06x", a->path, tag);
        int fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

ts_status ts_io_atomic_open(ts_io_atomic *a, const char *path) {
    memset(a, 0, sizeof *a);
    size_t n = strlen(path);
    a->path = strdup(path);
    a->tmp = malloc(n + 12);
    if (!a->path || !a->tmp) {
        atomic_free(a);
        return ts_error(TS_ERR_MEMORY, "atomic write %s: out of memory", path);
    }
    int fd = create_temp(a, n + 12);
    if (fd < 0) {
        ts_status s = ts_error(TS_ERR_IO, "atomic write %s: cannot create temp file: %s", path, strerror(errno));
        atomic_free(a);
        return s;
    }
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        ts_status s = ts_error(TS_ERR_IO, "atomic write %s: fdopen: %s", path, strerror(errno));
        close(fd);
        unlink(a->tmp);
        atomic_free(a);
        return s;
    }
    return TS_OK;
}

ts_status ts_io_close_synced(FILE *f, const char *path) {
    int err = 0;
    if (fflush(f) != 0 || ferror(f)) err = errno ? errno : EIO;
    if (!err && fsync(fileno(f)) != 0) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    if (err) return ts_error(TS_ERR_IO, "write %s: %s", path, strerror(err));
    return TS_OK;
}

ts_status ts_io_atomic_commit(ts_io_atomic *a) {
    ts_status s = ts_io_close_synced(a->f, a->path); /* the file people know, not its temp name */
    a->f = NULL;
    if (!s && rename(a->tmp, a->path) != 0)
        s = ts_error(TS_ERR_IO, "atomic write %s: rename from %s: %s", a->path, a->tmp, strerror(errno));
    if (s) unlink(a->tmp);
    else s = ts_io_fsync_parent(a->path);
    atomic_free(a);
    return s;
}

void ts_io_atomic_abort(ts_io_atomic *a) {
    if (a->f) fclose(a->f);
    if (a->tmp) unlink(a->tmp);
    atomic_free(a);
}

ts_status ts_io_atomic_write_json(const char *path, const json_t *doc, size_t flags) {
    ts_io_atomic a;
    ts_status s = ts_io_atomic_open(&a, path);
    if (s) return s;
    errno = 0;
    if (json_dumpf(doc, a.f, flags) != 0 || fputc('\n', a.f) == EOF) {
        int err = errno ? errno : EIO;
        ts_io_atomic_abort(&a);
        return ts_error(TS_ERR_IO, "write %s: %s", path, strerror(err));
    }
    return ts_io_atomic_commit(&a);
}

ts_status ts_io_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ts_error(TS_ERR_IO, "fsync folder %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) return ts_error(TS_ERR_IO, "fsync folder %s: %s", dir, strerror(err));
    return TS_OK;
}

ts_status ts_io_fsync_parent(const char *path) {
    char *copy = strdup(path);
    if (!copy) return ts_error(TS_ERR_MEMORY, "fsync parent of %s: out of memory", path);
    ts_status s = ts_io_fsync_dir(dirname(copy));
    free(copy);
    return s;
}

static int remove_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

ts_status ts_io_remove_tree(const char *dir) {
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return ts_error(TS_ERR_IO, "remove folder %s: %s", dir, strerror(errno));
    return TS_OK;
}

/* "a character device", ... for a file mode that is not a regular file. */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a folder";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

ts_status ts_io_open_regular(const char *path, const char *what, int *fd) {
    *fd = -1;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return ts_error(TS_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(errno));
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        ts_status s = ts_error(TS_ERR_IO, "%s %s: fstat: %s", what, path, strerror(errno));
        close(f);
        return s;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return ts_error(TS_ERR_IO, "%s %s is not a regular file (%s)", what, path, file_kind(sb.st_mode));
    }
    int flags = fcntl(f, F_GETFL);
    if (flags < 0 || fcntl(f, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        ts_status s = ts_error(TS_ERR_IO, "%s %s: fcntl: %s", what, path, strerror(errno));
        close(f);
        return s;
    }
    *fd = f;
    return TS_OK;
}

ts_status ts_io_make_run_dir(const char *dir) {
    char buf[4200];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return ts_error(TS_ERR_VALUE, "run folder %.64s...: the path is too long", dir);
    for (char *p = buf + 1;; p++) {
        bool end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0755) && errno != EEXIST)
                return ts_error(TS_ERR_IO, "run folder %s: cannot create %s: %s", dir, buf, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ts_error(TS_ERR_IO, "run folder %s: exists and is not a folder", dir);
    return TS_OK;
}

ts_status ts_io_lock_run_dir(const char *dir, int *fd) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.lock", dir);
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return ts_error(TS_ERR_IO, "run folder %s: cannot open its .lock: %s", dir, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char pid[32] = "";
        ssize_t n = pread(*fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(*fd);
        *fd = -1;
        if (err == EWOULDBLOCK)
            return ts_error(TS_ERR_STATE, "run folder %s is in use by process %s (give another --run-dir)", dir,
                            pid[0] ? pid : "(unknown)");
        return ts_error(TS_ERR_IO, "run folder %s: cannot lock its .lock: %s", dir, strerror(err));
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, pid, (size_t)n, 0) != n) {
        int err = errno;
        close(*fd);
        *fd = -1;
        return ts_error(TS_ERR_IO, "run folder %s: cannot write its .lock: %s", dir, strerror(err));
    }
    return TS_OK;
}
