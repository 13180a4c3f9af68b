/* test_util.h - helpers shared by tests of every room: a fresh temporary
 * folder and its removal, reading back what was written to a FILE, and
 * running one of the repository's Python reference scripts with
 * /usr/bin/python3. Header only; include after <cmocka.h>. */
#ifndef TS_TESTS_TEST_UTIL_H
#define TS_TESTS_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "kernels/io/atomic.h"

/* Makes a new folder /tmp/<tag>_XXXXXX and writes its path into dir[cap].
 * Returns 0, or -1 when it could not be made (cmocka setup convention). */
static inline int tu_make_tmp_dir(char *dir, size_t cap, const char *tag) {
    snprintf(dir, cap, "/tmp/%s_XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

/* Removes the folder dir and all below it; 0, or -1 on failure. */
static inline int tu_remove_dir(const char *dir) { return ts_io_remove_tree(dir) == TS_OK ? 0 : -1; }

/* Rewinds f, reads up to cap - 1 bytes of it into buf (NUL-terminated)
 * and closes it. For checking what a printer wrote to a tmpfile(). */
static inline void tu_read_back(FILE *f, char *buf, size_t cap) {
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* Runs "/usr/bin/python3 $TESSERA_SOURCE_DIR/<script> <args>" and fails the
 * test unless it exits 0; exit status no_torch is reported as torch not
 * being importable. */
static inline void tu_run_python(const char *script, const char *args, int no_torch) {
    const char *src = getenv("TESSERA_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/%s %s", src ? src : ".", script, args);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
        fail_msg("'%s' failed (exit %d)%s", cmd, rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1,
                 rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == no_torch
                     ? ": torch is not importable from /usr/bin/python3"
                     : "");
}

#endif
