/* test_env.c - tessera-run --env names the CPU kernels in use, a
 * TESSERA_CPU_CAPABILITY the machine cannot honour stops tessera-run with
 * the reason, and a program keeps its name when it re-executes itself with
 * the thread pools' wait policies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* The first cap bytes of /proc/pid/<what> in out, NULs kept; the length. */
static size_t proc_file(pid_t pid, const char *what, char *out, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, what);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    out[n] = '\0';
    return n;
}

/* Whether env[n] (NUL-separated) holds the entry want. */
static int has_entry(const char *env, size_t n, const char *want) {
    for (size_t i = 0; i < n; i += strlen(env + i) + 1)
        if (!strcmp(env + i, want)) return 1;
    return 0;
}

/* tessera-worker started without OMP_WAIT_POLICY re-executes itself with
 * it, and is still called tessera-worker (pgrep, top, killall), not after
 * the /proc/self/exe link it was once re-executed through ("exe"). */
static void test_reexec_keeps_the_name(void **state) {
    (void)state;
    const char *bin = getenv("TESSERA_BIN_DIR");
    char prog[1024], env[65536], comm[64] = "", dir[] = "/tmp/tessera-test-env-XXXXXX", rm[64];
    snprintf(prog, sizeof prog, "%s/tessera-worker", bin ? bin : "build/bin");
    assert_non_null(mkdtemp(dir));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        unsetenv("OMP_WAIT_POLICY"), unsetenv("GOMP_SPINCOUNT"), unsetenv("OPENBLAS_THREAD_TIMEOUT");
        freopen("/dev/null", "w", stdout), freopen("/dev/null", "w", stderr);
        execl(prog, prog, "examples/mlp_fashion.json", "--set", "steps=100000", "--run-dir", dir,
              (char *)NULL);
        _exit(127);
    }
    int reexecuted = 0;
    for (int i = 0; i < 3000 && !reexecuted; i++) { /* up to 30 s */
        size_t n = proc_file(pid, "environ", env, sizeof env);
        reexecuted = has_entry(env, n, "OMP_WAIT_POLICY=passive");
        if (reexecuted) proc_file(pid, "comm", comm, sizeof comm);
        else nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    assert_int_equal(system(rm), 0);
    assert_true(reexecuted);
    assert_string_equal(comm, "tessera-worker\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_names_the_cpu_kernels),
        cmocka_unit_test(test_refused_capability_stops_tessera_run),
        cmocka_unit_test(test_reexec_keeps_the_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
