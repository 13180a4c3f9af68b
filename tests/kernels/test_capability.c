/* test_capability.c - the choice of CPU kernels: TESSERA_CPU_CAPABILITY
 * values accepted and refused, the capability in use, and the backend
 * variant behind the CPU device. Run under every capability (ctest). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/ops/backend.h"
#include "kernels/ops/cpu/capability.h"

static void test_parse(void **state) {
    (void)state;
    ts_cpu_capability c;
    assert_int_equal(ts_cpu_capability_parse("default", &c), TS_OK);
    assert_int_equal(c, TS_CPU_DEFAULT);
    assert_true(ts_cpu_capability_supported(TS_CPU_DEFAULT));
    assert_int_equal(ts_cpu_capability_parse("sse9", &c), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "TESSERA_CPU_CAPABILITY=sse9: unknown capability"));
    assert_non_null(strstr(ts_last_error(), "available here: default"));
    for (int i = 0; i < TS_NCPU_CAPS; i++) {
        const char *name = ts_cpu_capability_name((ts_cpu_capability)i);
        ts_status st = ts_cpu_capability_parse(name, &c);
        if (ts_cpu_capability_supported((ts_cpu_capability)i)) {
            assert_int_equal(st, TS_OK);
            assert_int_equal(c, i);
            assert_non_null(ts_cpu_capability_backend((ts_cpu_capability)i));
        } else {
            assert_int_equal(st, TS_ERR_UNSUPPORTED);
            print_message("refused here, as it should be: %s\n", ts_last_error());
            assert_true(strstr(ts_last_error(), "this CPU lacks") || strstr(ts_last_error(), "this build has no"));
        }
    }
}

static void test_the_capability_in_use(void **state) {
    (void)state;
    ts_cpu_capability c, want = TS_CPU_DEFAULT;
    assert_int_equal(ts_cpu_capability_get(&c), TS_OK);
    const char *env = getenv("TESSERA_CPU_CAPABILITY");
    if (env && env[0]) {
        assert_true(ts_cpu_capability_forced());
        assert_int_equal(ts_cpu_capability_parse(env, &want), TS_OK);
    } else {
        assert_false(ts_cpu_capability_forced());
        for (int i = 0; i < TS_NCPU_CAPS; i++)
            if (ts_cpu_capability_supported((ts_cpu_capability)i)) want = (ts_cpu_capability)i;
    }
    assert_int_equal(c, want);
    const ts_backend *cpu = ts_backend_cpu();
    assert_non_null(cpu);
    assert_ptr_equal(cpu, ts_cpu_capability_backend(c));
    assert_string_equal(cpu->name, "cpu");
    assert_string_equal(cpu->capability, ts_cpu_capability_name(c));
    print_message("CPU kernels in use: %s\n", cpu->capability);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_the_capability_in_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
