/* test_env.c - tessera-run --env names the CPU kernels in use, and a
 * TESSERA_CPU_CAPABILITY the machine cannot honour stops tessera-run with
 * the reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kernels/ops/cpu/capability.h"

/* Runs "VAR=value tessera-run ARGS 2>&1" and returns its exit status, its
 * output in out[cap]. */
static int run(const char *capability, const char *args, char *out, size_t cap) {
    const char *bin = getenv("TESSERA_BIN_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "TESSERA_CPU_CAPABILITY=%s timeout 60 %s/tessera-run %s 2>&1", capability,
             bin ? bin : "build/bin", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void test_env_names_the_cpu_kernels(void **state) {
    (void)state;
    char out[8192];
    assert_int_equal(run("", "--env", out, sizeof out), 0);
    assert_non_null(strstr(out, "CPU kernels: "));
    assert_non_null(strstr(out, "(the best this CPU offers; this CPU offers default"));
    assert_int_equal(run("default", "--env", out, sizeof out), 0);
    assert_non_null(strstr(out, "CPU kernels: default (set by TESSERA_CPU_CAPABILITY;"));
}

static void test_refused_capability_stops_tessera_run(void **state) {
    (void)state;
    char out[8192];
    assert_int_equal(run("sse9", "--env", out, sizeof out), 1);
    assert_non_null(strstr(out, "CPU kernels: refused: TESSERA_CPU_CAPABILITY=sse9: unknown capability"));
    assert_int_equal(run("sse9", "examples/mlp_fashion.json --set steps=1", out, sizeof out), 2);
    assert_non_null(strstr(out, "tessera-run: TESSERA_CPU_CAPABILITY=sse9: unknown capability"));
    if (!ts_cpu_capability_supported(TS_CPU_AVX512)) {
        assert_int_equal(run("avx512", "examples/mlp_fashion.json --set steps=1", out, sizeof out), 2);
        assert_non_null(strstr(out, "this CPU lacks AVX-512"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_names_the_cpu_kernels),
        cmocka_unit_test(test_refused_capability_stops_tessera_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
