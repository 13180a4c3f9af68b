/* oom.c - the kernel's OOM-kill count (contract in oom.h). */
#include "launch/oom.h"

#include <stdio.h>
#include <string.h>

/* The number after "key " on a line of the file path, -1 when absent. */
static int64_t read_key(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ' ' && sscanf(line + n, "%lld", &v) == 1) break;
    fclose(f);
    return v;
}

int64_t ts_oom_kills(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[1024], path[1200];
    int64_t n = -1;
    while (f && n < 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *dir = strrchr(line, ':');
        if (!dir) continue;
        *dir++ = '\0';
        if (strcmp(line, "0:") == 0) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.events", dir);
            n = read_key(path, "oom_kill");
        } else if (strstr(line, ":memory")) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.oom_control", dir);
            n = read_key(path, "oom_kill");
        }
    }
    if (f) fclose(f);
    return n >= 0 ? n : read_key("/proc/vmstat", "oom_kill");
}
