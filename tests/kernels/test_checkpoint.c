/* test_checkpoint.c - step folders: full round trip of weights, optimizer
 * state, RNG keys, loader position, config and extra state; keep-last-N;
 * leftovers of a crashed save are never listed and get pruned; damaged,
 * truncated or missing files are refused with the file named; the files'
 * modes follow the umask. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/io/atomic.h"
#include "kernels/io/checkpoint.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static char root[256];

static int setup(void **state) {
    (void)state;
    char base[64];
    snprintf(base, sizeof base, "/tmp/ts_ckpt_XXXXXX");
    if (!mkdtemp(base)) return -1;
    snprintf(root, sizeof root, "%s/run/checkpoints", base); /* created by save */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char base[256];
    snprintf(base, sizeof base, "%s", root);
    *strstr(base, "/run/") = 0;
    return ts_io_remove_tree(base) == TS_OK ? 0 : -1;
}

static const char *mnames[] = {"fc1.weight", "fc1.bias"};
static const char *onames[] = {"adam.m", "adam.v", "adam.step"};

/* Saves step with weights filled from value. */
static ts_status save(int64_t step, double value, int keep) {
    ts_tensor *w = ts_tensor_full(TS_F32, SHAPE(3, 4), value), *b = ts_tensor_full(TS_F32, SHAPE(3), -value);
    ts_tensor *m = ts_tensor_full(TS_F32, SHAPE(15), value / 2), *v = ts_tensor_full(TS_F32, SHAPE(15), value / 4);
    ts_tensor *st = ts_tensor_scalar(TS_I64, (double)step);
    ts_tensor *model[] = {w, b}, *optim[] = {m, v, st};
    const char *knames[] = {"init", "dropout"};
    ts_key keys[] = {ts_key_from_seed(1), ts_key_fold_in(ts_key_from_seed(2), (uint64_t)step)};
    ts_checkpoint_data d = {.step = step, .n_model = 2, .model_names = mnames, .model = model, .n_optim = 3,
                            .optim_names = onames, .optim = optim, .n_keys = 2, .key_names = knames, .keys = keys,
                            .loader = {.epoch = 2, .offset = 96 + step},
                            .config = "{\"model\": {\"kind\": \"mlp\"}}\n",
                            .extra = "{\"lr_scale\": 0.5, \"tokens\": 1234}"};
    char path[4096];
    ts_status s = ts_checkpoint_save(root, &d, keep, path, sizeof path);
    ts_tensor *all[] = {w, b, m, v, st};
    for (int i = 0; i < 5; i++) ts_tensor_release(all[i]);
    return s;
}

static void step_path(char *out, int64_t step) { snprintf(out, 4096, "%s/step-%lld", root, (long long)step); }

static void test_round_trip(void **state) {
    (void)state;
    assert_int_equal(save(10, 1.5, 0), TS_OK);
    char p[4096];
    step_path(p, 10);
    ts_checkpoint *ck = ts_checkpoint_open(p);
    assert_non_null(ck);
    assert_int_equal(ck->step, 10);
    assert_int_equal(ck->loader.epoch, 2);
    assert_int_equal(ck->loader.offset, 106);
    assert_string_equal(ck->config, "{\"model\": {\"kind\": \"mlp\"}}\n");
    assert_true(json_real_value(json_object_get(ck->extra, "lr_scale")) == 0.5);
    assert_int_equal(json_integer_value(json_object_get(ck->extra, "tokens")), 1234);
    ts_key k;
    assert_int_equal(ts_checkpoint_key(ck, "dropout", &k), TS_OK);
    ts_key want = ts_key_fold_in(ts_key_from_seed(2), 10);
    assert_memory_equal(&k, &want, sizeof k);
    assert_int_equal(ts_checkpoint_key(ck, "absent", &k), TS_ERR_VALUE);
    ts_tensor *w = ts_tensor_zeros(TS_F32, SHAPE(3, 4)), *b = ts_tensor_zeros(TS_F32, SHAPE(3));
    ts_tensor *model[] = {w, b};
    assert_int_equal(ts_safetensors_load_into(ck->model, 2, mnames, model, true), TS_OK);
    assert_true(ts_tensor_get(w, 11) == 1.5 && ts_tensor_get(b, 2) == -1.5);
    ts_tensor *st = ts_safetensors_get(ck->optim, "adam.step");
    assert_true(ts_tensor_item(st) == 10);
    assert_string_equal(ts_safetensors_meta(ck->model, "format"), "pt");
    ts_tensor_release(st);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_checkpoint_close(ck);
    /* bad extra state: refused, nothing left behind */
    ts_checkpoint_data bad = {.step = 11, .extra = "[1, 2"};
    assert_int_equal(ts_checkpoint_save(root, &bad, 0, NULL, 0), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "extra state is not a JSON object"));
    int64_t *steps;
    int n;
    assert_int_equal(ts_checkpoint_list(root, &steps, &n), TS_OK);
    assert_int_equal(n, 1);
    free(steps);
    DIR *d = opendir(root);
    struct dirent *e;
    int entries = 0;
    while ((e = readdir(d))) entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 1);
}

static void test_keep_last_and_crash_leftovers(void **state) {
    (void)state;
    for (int64_t s = 20; s <= 40; s += 10) assert_int_equal(save(s, (double)s, 2), TS_OK);
    int64_t *steps;
    int n;
    assert_int_equal(ts_checkpoint_list(root, &steps, &n), TS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(steps[0], 30);
    assert_int_equal(steps[1], 40);
    free(steps);
    /* what a save killed midway leaves: a temp folder of a dead process with
     * some of the files, and a step folder made by hand without state.json */
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    char p[4096], q[4096];
    snprintf(p, sizeof p, "%s/.tmp-step-50-%ld", root, (long)child);
    assert_int_equal(mkdir(p, 0777), 0);
    step_path(q, 40);
    snprintf(q + strlen(q), sizeof q - strlen(q), "/model.safetensors");
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", q, p);
    assert_int_equal(system(cmd), 0);
    step_path(q, 60);
    assert_int_equal(mkdir(q, 0777), 0);
    int64_t latest;
    char lp[4096];
    assert_int_equal(ts_checkpoint_latest(root, lp, sizeof lp, &latest), TS_OK);
    assert_int_equal(latest, 40);
    step_path(q, 40);
    assert_string_equal(lp, q);
    assert_int_equal(ts_checkpoint_prune(root, 2), TS_OK);
    struct stat sb;
    assert_int_equal(stat(p, &sb), -1); /* stale temp folder removed */
    /* saving a step that already exists replaces it whole */
    assert_int_equal(save(40, 7.0, 0), TS_OK);
    ts_checkpoint *ck = ts_checkpoint_open(lp);
    assert_non_null(ck);
    ts_tensor *w = ts_safetensors_get(ck->model, "fc1.weight");
    assert_true(ts_tensor_get(w, 0) == 7.0);
    ts_tensor_release(w);
    ts_checkpoint_close(ck);
    /* ... and leaves neither the old folder nor the new one's temp behind */
    DIR *dir = opendir(root);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));)
        if (!strncmp(e->d_name, ".old-step-", 10) || !strncmp(e->d_name, ".tmp-step-", 10))
            fail_msg("left behind: %s", e->d_name);
    closedir(dir);
    /* no checkpoints at all */
    assert_int_equal(ts_checkpoint_latest("/nonexistent/ckpts", lp, sizeof lp, &latest), TS_OK);
    assert_int_equal(latest, -1);
    assert_string_equal(lp, "");
}

static void expect_open_error(int64_t step, const char *msg) {
    char p[4096];
    step_path(p, step);
    ts_checkpoint *ck = ts_checkpoint_open(p);
    if (ck || !strstr(ts_last_error(), msg)) fail_msg("expected '%s', got '%s'", msg, ck ? "(opened)" : ts_last_error());
}

/* The files of a step folder have mode 0666 less the umask, as any file
 * the user makes: an exported model or checkpoint is readable by the
 * accounts the umask lets read it. Before, every file was 0600. */
static void test_files_follow_umask(void **state) {
    (void)state;
    const char *files[] = {"model.safetensors", "optim.safetensors", "state.json"};
    mode_t masks[] = {022, 027};
    for (int k = 0; k < 2; k++) {
        mode_t was = umask(masks[k]);
        ts_status s = save(30 + k, 1.0, 0);
        umask(was);
        assert_int_equal(s, TS_OK);
        for (int i = 0; i < 3; i++) {
            char dir[4096], path[4200];
            struct stat sb;
            step_path(dir, 30 + k);
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            assert_int_equal(stat(path, &sb), 0);
            if ((sb.st_mode & 0777) != (0666 & ~masks[k]))
                fail_msg("%s: mode %03o under umask %03o, not %03o", path, (unsigned)(sb.st_mode & 0777),
                         (unsigned)masks[k], (unsigned)(0666 & ~masks[k]));
        }
    }
}

static void test_damaged_checkpoints_refused(void **state) {
    (void)state;
    for (int64_t s = 100; s <= 104; s++) assert_int_equal(save(s, 2.0, 0), TS_OK);
    char p[4096], f[4200];
    /* one flipped byte in the weights' data */
    step_path(p, 100);
    snprintf(f, sizeof f, "%s/model.safetensors", p);
    FILE *fp = fopen(f, "r+b");
    fseek(fp, -5, SEEK_END);
    int c = fgetc(fp);
    fseek(fp, -5, SEEK_END);
    fputc(c ^ 0x40, fp);
    fclose(fp);
    expect_open_error(100, "model.safetensors has CRC-32");
    /* truncated optimizer state */
    step_path(p, 101);
    snprintf(f, sizeof f, "%s/optim.safetensors", p);
    struct stat sb;
    stat(f, &sb);
    assert_int_equal(truncate(f, sb.st_size - 8), 0);
    expect_open_error(101, "optim.safetensors is ");
    /* a missing file */
    step_path(p, 102);
    snprintf(f, sizeof f, "%s/optim.safetensors", p);
    unlink(f);
    expect_open_error(102, "optim.safetensors is missing");
    /* state.json cut short */
    step_path(p, 103);
    snprintf(f, sizeof f, "%s/state.json", p);
    stat(f, &sb);
    assert_int_equal(truncate(f, sb.st_size / 2), 0);
    expect_open_error(103, "state.json: invalid JSON");
    /* the intact one still opens */
    step_path(p, 104);
    ts_checkpoint *ck = ts_checkpoint_open(p);
    assert_non_null(ck);
    ts_checkpoint_close(ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_keep_last_and_crash_leftovers),
        cmocka_unit_test(test_damaged_checkpoints_refused),
        cmocka_unit_test(test_files_follow_umask),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
