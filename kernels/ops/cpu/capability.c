/* capability.c - the CPU's vector capabilities, TESSERA_CPU_CAPABILITY,
 * and the CPU backend variant they select. Built once, for the baseline. */
#include "kernels/ops/cpu/capability.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The variants this build compiled (CMake defines TS_CPU_X86_VARIANTS
 * when the avx2 and avx512 ones exist). */
extern const ts_backend ts_cpu_backend_default;
#if TS_CPU_X86_VARIANTS
extern const ts_backend ts_cpu_backend_avx2, ts_cpu_backend_avx512;
#endif

static const char *const names[TS_NCPU_CAPS] = {"default", "avx2", "avx512"};

/* What each capability needs of the CPU, as feature names for
 * __builtin_cpu_supports and for messages. */
static const char *const needs[TS_NCPU_CAPS] = {"", "avx2 fma bmi bmi2", "avx512f avx512bw avx512dq avx512vl avx512cd"};

const char *ts_cpu_capability_name(ts_cpu_capability c) { return (unsigned)c < TS_NCPU_CAPS ? names[c] : "?"; }

const ts_backend *ts_cpu_capability_backend(ts_cpu_capability c) {
    switch (c) {
    case TS_CPU_DEFAULT: return &ts_cpu_backend_default;
#if TS_CPU_X86_VARIANTS
    case TS_CPU_AVX2: return &ts_cpu_backend_avx2;
    case TS_CPU_AVX512: return &ts_cpu_backend_avx512;
#endif
    default: return NULL;
    }
}

/* Whether the CPU (and the OS, which must save the wider registers) has
 * feature f; __builtin_cpu_supports checks both. */
static bool cpu_has(const char *f) {
#if defined(__x86_64__) || defined(__i386__)
    if (!strcmp(f, "avx2")) return __builtin_cpu_supports("avx2");
    if (!strcmp(f, "fma")) return __builtin_cpu_supports("fma");
    if (!strcmp(f, "bmi")) return __builtin_cpu_supports("bmi");
    if (!strcmp(f, "bmi2")) return __builtin_cpu_supports("bmi2");
    if (!strcmp(f, "avx512f")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(f, "avx512bw")) return __builtin_cpu_supports("avx512bw");
    if (!strcmp(f, "avx512dq")) return __builtin_cpu_supports("avx512dq");
    if (!strcmp(f, "avx512vl")) return __builtin_cpu_supports("avx512vl");
    if (!strcmp(f, "avx512cd")) return __builtin_cpu_supports("avx512cd");
#endif
    (void)f;
    return false;
}

/* The features of needs[c] this CPU lacks, space-separated, into buf
 * ("" when none). */
static void missing(ts_cpu_capability c, char *buf, size_t cap) {
    char list[128];
    snprintf(list, sizeof list, "%s", needs[c]);
    buf[0] = '\0';
    for (char *save = NULL, *f = strtok_r(list, " ", &save); f; f = strtok_r(NULL, " ", &save))
        if (!cpu_has(f)) snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", buf[0] ? " " : "", f);
}

bool ts_cpu_capability_supported(ts_cpu_capability c) {
    if (!ts_cpu_capability_backend(c)) return false;
    char lack[128];
    missing(c, lack, sizeof lack);
    return lack[0] == '\0';
}

/* "default, avx2": the capabilities this machine offers. */
static void offered(char *buf, size_t cap) {
    buf[0] = '\0';
    for (int c = 0; c < TS_NCPU_CAPS; c++)
        if (ts_cpu_capability_supported((ts_cpu_capability)c))
            snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", buf[0] ? ", " : "", names[c]);
}

ts_status ts_cpu_capability_parse(const char *value, ts_cpu_capability *c) {
    char here[64];
    offered(here, sizeof here);
    for (int i = 0; value && i < TS_NCPU_CAPS; i++) {
        if (strcmp(value, names[i])) continue;
        if (!ts_cpu_capability_backend((ts_cpu_capability)i))
            return ts_error(TS_ERR_UNSUPPORTED,
                            "TESSERA_CPU_CAPABILITY=%s: this build has no %s kernels (not an x86-64 build); "
                            "available here: %s",
                            value, value, here);
        char lack[128];
        missing((ts_cpu_capability)i, lack, sizeof lack);
        if (lack[0])
            return ts_error(TS_ERR_UNSUPPORTED, "TESSERA_CPU_CAPABILITY=%s: this CPU lacks %s (no %s); available here: %s",
                            value, i == TS_CPU_AVX512 ? "AVX-512" : "AVX2", lack, here);
        *c = (ts_cpu_capability)i;
        return TS_OK;
    }
    return ts_error(TS_ERR_VALUE, "TESSERA_CPU_CAPABILITY=%s: unknown capability (default, avx2 or avx512); "
                    "available here: %s", value ? value : "(null)", here);
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static ts_cpu_capability chosen;
static bool forced;
static ts_status refused;    /* the parse status when the variable was refused */
static char refusal[512];    /* and its message */

static void choose(void) {
    const char *env = getenv("TESSERA_CPU_CAPABILITY");
    if (env && env[0]) {
        forced = true;
        refused = ts_cpu_capability_parse(env, &chosen);
        if (refused) snprintf(refusal, sizeof refusal, "%s", ts_last_error());
        return;
    }
    chosen = TS_CPU_DEFAULT;
    for (int c = TS_NCPU_CAPS - 1; c > TS_CPU_DEFAULT; c--)
        if (ts_cpu_capability_supported((ts_cpu_capability)c)) {
            chosen = (ts_cpu_capability)c;
            break;
        }
}

ts_status ts_cpu_capability_get(ts_cpu_capability *c) {
    pthread_once(&once, choose);
    if (refused) return ts_error(refused, "%s", refusal);
    *c = chosen;
    return TS_OK;
}

bool ts_cpu_capability_forced(void) {
    pthread_once(&once, choose);
    return forced;
}
