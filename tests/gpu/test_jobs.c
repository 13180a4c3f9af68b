/* test_jobs.c - GPT jobs run by the real tessera-run with "device":
 * "cuda" track the same jobs on the CPU, step by step: a local job in f32
 * and with bf16 compute, and a parameter-server job (one shard) with one
 * GPU worker. The GPU run's logged losses must stay within a relative
 * tolerance of the CPU run's (f32 GPU kernels sum in another order, so
 * the runs drift apart slowly; bf16 compute rounds in other places). Also
 * --eval of the GPU run's checkpoint. Skips with one line where there is
 * no CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_testing.h"

#define STEPS 30
#define COMMON                                                                                                 \
    "--set steps=30 --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=64 --set model.block_size=64 " \
    "--set train.batch_size=8 --set train.log_every=1 --set train.eval_every=0 --set train.eval_batches=2 "  \
    "--set train.checkpoint_every=0 --set schedule.warmup_steps=5"

static int failures;

static const char *bin_dir(void) {
    const char *b = getenv("TESSERA_BIN_DIR");
    return b ? b : "build/bin";
}

/* Runs tessera-run on job with extra settings in run dir dir; the loss of
 * each logged step 1..STEPS into loss[]. Returns how many were found. */
static int run_job(const char *job, const char *extra, const char *dir, double *loss) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf %s; %s/tessera-run %s --run-dir %s " COMMON " %s 2>&1", dir, bin_dir(), job, dir,
             extra);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, p)) {
        long long step, total;
        double l;
        if (sscanf(line, "step %lld/%lld | loss %lf", &step, &total, &l) == 3 && step >= 1 && step <= STEPS) {
            loss[step - 1] = l;
            found++;
        } else if (strstr(line, "rror")) {
            printf("   %s", line);
        }
    }
    int rc = pclose(p);
    return rc == 0 ? found : -1;
}

/* The CPU and GPU runs of job with extra settings; losses within tol. */
static void compare(const char *what, const char *job, const char *extra, double tol) {
    double cpu[STEPS] = {0}, gpu[STEPS] = {0};
    char dir[256], settings[512];
    snprintf(dir, sizeof dir, "/tmp/tessera_gpu_jobs_%d", (int)getpid());
    snprintf(settings, sizeof settings, "%s --set device=cpu", extra);
    int nc = run_job(job, settings, dir, cpu);
    snprintf(settings, sizeof settings, "%s --set device=cuda", extra);
    int ng = run_job(job, settings, dir, gpu);
    double worst = 0;
    int at = 0;
    for (int i = 0; i < STEPS; i++) {
        double d = fabs(gpu[i] - cpu[i]) / (1e-3 + fabs(cpu[i]));
        if (!(d <= worst)) worst = d, at = i + 1;
    }
    bool ok = nc == STEPS && ng == STEPS && worst <= tol;
    printf("%s %-44s cpu %.4f -> %.4f, cuda %.4f -> %.4f, worst rel diff %.2e at step %d (tol %.0e)%s\n",
           ok ? "ok  " : "FAIL", what, cpu[0], cpu[STEPS - 1], gpu[0], gpu[STEPS - 1], worst, at, tol,
           nc == STEPS && ng == STEPS ? "" : " - a run did not log every step");
    failures += !ok;
    if (ok && strstr(job, "ps") == NULL && !*extra) {
        /* the GPU run's checkpoint evaluates (on the device the job names) */
        char cmd[1024], out[4096];
        snprintf(cmd, sizeof cmd, "%s/tessera-run --eval %s/checkpoints/step-%d 2>&1", bin_dir(), dir, STEPS);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = '\0';
        bool eval_ok = p && pclose(p) == 0 && strstr(out, "validation loss ");
        printf("%s %-44s %s", eval_ok ? "ok  " : "FAIL", "--eval of the GPU run's checkpoint",
               eval_ok ? strstr(out, "validation loss ") : out);
        if (!eval_ok) printf("\n");
        failures += !eval_ok;
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("   could not remove %s\n", dir);
}

int main(void) {
    gpu_require_device();
    compare("local GPT, f32", "examples/gpt_fortunes.json", "", 1e-2);
    compare("local GPT, bf16 compute", "examples/gpt_fortunes.json", "--set train.precision=bf16", 3e-2);
    compare("PS GPT, one GPU worker, one shard", "examples/gpt_fortunes_ps.json",
            "--set parallel.workers=1 --set parallel.servers=1 --set parallel.ps_replicas=1", 1e-2);
    printf("%s: %d job checks failed\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
