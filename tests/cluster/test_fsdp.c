/* test_fsdp.c - strategy "fsdp" with real processes: W = 2 and 4 workers
 * at batch b, modes full and grad_op (and no_shard, one unit for the whole
 * model, activation checkpointing), give the per-step losses of one
 * process at batch W*b within 1e-5 relative over 30 steps (a small GPT
 * whose head reuses the embedding, and a CNN, both with clipping); bf16
 * compute tracks the local bf16 run; a run saved at W = 4 resumes at W = 2,
 * W = 3 and in one process with the losses of a run that never stopped;
 * the sharded checkpoint consolidates into one safetensors file that
 * --eval reads, and exports to ONNX as that file does; a worker killed -9 mid-step is survived and the final
 * checkpoint evaluates; with neighbour copies no step is lost, also when
 * the death falls inside a step's sums (made certain by TESSERA_FAULT); a
 * fine-tuning run that kept no checkpoint starts again from its
 * model.init_from after a death, and a run resumed from a local run's
 * checkpoint reloads that one; a
 * worker that joins gets its shards from the others; Ctrl-C stops every
 * worker after the same step, saved; a save that fails leaves nothing; a
 * save abandoned when a worker died in it leaves nothing in the checkpoint
 * of that step saved again. Run one scenario by name:
 * cluster_test_fsdp test_<name>. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define STEPS 30

/* The "parallel" body of FSDP with w workers; extra is appended. */
static void fsdp_section(char *out, size_t cap, int w, const char *extra) {
    snprintf(out, cap, "\"strategy\": \"fsdp\", \"workers\": %d, \"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 1500%s",
             w, extra);
}

/* The losses of a local run of arch at batch. */
static void local_losses(const char *arch, int batch, double *loss) {
    char name[64];
    snprintf(name, sizeof name, "local-%s-%d", arch, batch);
    th_run_job(name, arch, STEPS, batch, 1, "\"strategy\": \"local\"", false, loss);
}

/* FSDP with w workers at per-worker batch b, each of the given extras
 * (modes, units), gives local's losses at w * b; local_arch is the arch
 * of the run it must equal (activation checkpointing changes nothing). */
static void equivalence(const char *arch, const char *local_arch, int w, int b, const char *const *extras, int n) {
    double want[STEPS + 1], got[STEPS + 1];
    local_losses(local_arch, w * b, want);
    for (int k = 0; k < n; k++) {
        char name[64], par[512];
        snprintf(name, sizeof name, "fsdp-%s-%d-%d", arch, w, k);
        fsdp_section(par, sizeof par, w, extras[k]);
        th_run_job(name, arch, STEPS, b, 1, par, false, got);
        char what[600];
        snprintf(what, sizeof what, "%s, %d workers, %s", arch, w, extras[k]);
        th_expect_same(got, want, 1, STEPS, what);
    }
    assert_int_equal(th_leftovers(), 0);
}

static const char *const full_and_grad_op[] = {"", ", \"fsdp_mode\": \"grad_op\""};

static void test_gpt_2(void **state) {
    (void)state;
    const char *extras[] = {"", ", \"fsdp_mode\": \"grad_op\"", ", \"fsdp_mode\": \"no_shard\"",
                            ", \"fsdp_unit\": \"model\", \"wire_dtype\": \"f32\""};
    equivalence("gpt", "gpt", 2, 4, extras, 4);
}
/* with W = 4 also grad_op with neighbour copies: they change no loss */
static void test_gpt_4(void **state) {
    (void)state;
    const char *extras[] = {"", ", \"fsdp_mode\": \"grad_op\", \"fsdp_neighbour_copy\": true"};
    equivalence("gpt", "gpt", 4, 2, extras, 2);
}
static void test_cnn_2(void **state) { (void)state; equivalence("cnn", "cnn", 2, 16, full_and_grad_op, 2); }
static void test_cnn_4(void **state) { (void)state; equivalence("cnn", "cnn", 4, 8, full_and_grad_op, 2); }
/* activation checkpointing of the blocks gathers again in recomputation */
static void test_gpt_checkpointing(void **state) {
    (void)state;
    const char *extras[] = {""};
    equivalence("gpt-ckpt", "gpt", 3, 2, extras, 1);
}

/* bf16 compute: gathers carry bf16, gradients reduce in f32 or bf16 (also
 * with neighbour copies); the losses track the local bf16 run's (bf16
 * rounds each rank's gradients). Each parameter's gradient is folded into
 * f32 and its unit reduce-scattered as soon as backward has finished it,
 * so that mode full peaks about as high in bf16 as in f32 (a GPT whose
 * gradients outweigh its activations). */
static void test_bf16(void **state) {
    (void)state;
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("gpt-bf16", 8, want);
    const char *wires[] = {"", ", \"wire_dtype\": \"bf16\"",
                           ", \"wire_dtype\": \"bf16\", \"fsdp_neighbour_copy\": true"};
    for (int k = 0; k < 3; k++) {
        char name[64], par[512];
        snprintf(name, sizeof name, "fsdp-bf16-%d", k);
        fsdp_section(par, sizeof par, 2, wires[k]);
        th_run_job(name, "gpt-bf16", STEPS, 4, 1, par, false, got);
        for (int s = 1; s <= STEPS; s++)
            if (!(fabs(got[s] - want[s]) <= 2e-2 * fabs(want[s])))
                fail_msg("bf16%s: step %d loss %.5f, local bf16 %.5f", wires[k], s, got[s], want[s]);
    }
    char par[512];
    fsdp_section(par, sizeof par, 2, "");
    th_run_job("fsdp-wide-f32", "gpt-wide", 3, 2, 1, par, false, got);
    th_run_job("fsdp-wide-bf16", "gpt-wide-bf16", 3, 2, 1, par, false, got);
    double f32 = th_peak_mib(th_path("fsdp-wide-f32")), bf16 = th_peak_mib(th_path("fsdp-wide-bf16"));
    print_message("full, allocator peak: f32 %.2f MiB, bf16 %.2f MiB\n", f32, bf16);
    /* the peak moves a little with how soon each reduce-scatter ends; a
     * bf16 run that held every unit's gradients peaked 35 % above f32 */
    if (!(f32 > 0 && bf16 <= 1.1 * f32)) fail_msg("bf16 peaks at %.2f MiB, f32 at %.2f MiB", bf16, f32);
    assert_int_equal(th_leftovers(), 0);
}

/* Saved at W = 4 after 20 steps (batch 3 each), the run resumes at W = 2
 * (batch 6), W = 3 (batch 4) and in one process (batch 12) with the
 * losses of an uninterrupted local run; the checkpoint consolidates into a
 * whole one that --eval reads. */
static void test_reshard(void **state) {
    (void)state;
    double want[STEPS + 1], got[STEPS + 1];
    local_losses("gpt", 12, want);
    char par[512];
    fsdp_section(par, sizeof par, 4, "");
    th_run_job("fsdp-r4", "gpt", 20, 3, 1, par, false, got);
    th_expect_same(got, want, 1, 20, "4 workers, first 20 steps");
    const char *dir4 = th_path("fsdp-r4");
    const int worlds[] = {2, 3};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "fsdp-r%d", worlds[k]);
        th_copy_run(dir4, th_path(name));
        fsdp_section(par, sizeof par, worlds[k], "");
        th_run_job(name, "gpt", STEPS, 12 / worlds[k], 1, par, true, got);
        th_expect_same(got, want, 21, STEPS, name);
    }
    th_copy_run(dir4, th_path("fsdp-r1"));
    th_run_job("fsdp-r1", "gpt", STEPS, 12, 1, "\"strategy\": \"local\"", true, got);
    th_expect_same(got, want, 21, STEPS, "local run resumed from 4 workers");

    /* one safetensors file with the model's names, which --eval reads */
    char ckpt[4300], out[4300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-20", dir4);
    snprintf(out, sizeof out, "%s/whole", th_path("fsdp-r4"));
    const char *cargv[] = {"tessera-run", "--consolidate", ckpt, "--out", out, NULL};
    free(th_run_tool("fsdp-consolidate", cargv));
    char whole_ckpt[4400];
    snprintf(whole_ckpt, sizeof whole_ckpt, "%s/step-20", out);
    const char *eargv[] = {"tessera-run", "--eval", whole_ckpt, NULL};
    char *whole = th_run_tool("fsdp-eval-whole", eargv);
    const char *eargv2[] = {"tessera-run", "--eval", ckpt, NULL};
    char *sharded = th_run_tool("fsdp-eval-sharded", eargv2);
    const char *a = strstr(whole, "bits/byte"), *b = strstr(sharded, "bits/byte");
    if (!a || !b) fail_msg("no bits/byte in --eval's output:\n%s\n%s", whole, sharded);
    /* the line up to its figure is the same from both */
    const char *la = strstr(whole, "loss "), *lb = strstr(sharded, "loss ");
    if (!la || !lb || atof(la + 5) != atof(lb + 5)) fail_msg("--eval differs:\n%s\n%s", whole, sharded);
    free(whole);
    free(sharded);
    /* PyTorch reads the file by the format's spec (where it is installed) */
    if (system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0) {
        char cmd[9000];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c 'import json,struct,sys,torch\n"
                 "b=open(sys.argv[1],\"rb\").read(); n=struct.unpack(\"<Q\",b[:8])[0]; h=json.loads(b[8:8+n])\n"
                 "for k in (\"wte.weight\",\"blocks.1.attn.qkv.weight\",\"ln_f.bias\"):\n"
                 " e=h[k]; s,t=e[\"data_offsets\"]; x=torch.frombuffer(bytearray(b[8+n+s:8+n+t]),dtype=torch.float32)"
                 ".reshape(e[\"shape\"]); assert torch.isfinite(x).all()\n"
                 "assert h[\"wte.weight\"][\"shape\"]==[256,32]' '%s/model.safetensors'",
                 whole_ckpt);
        if (system(cmd) != 0) fail_msg("PyTorch could not read %s/model.safetensors", whole_ckpt);
    }
    th_expect_export_whole("fsdp-export", ckpt);
    assert_int_equal(th_leftovers(), 0);
}

/* Starts FSDP job name (th_job_file's model arch, steps, batch) with w
 * workers and extra parallel fields in its run folder (*dir). */
static th_proc start_job(const char *name, const char *arch, int steps, int batch, int w, const char *extra,
                         const char **dir) {
    char par[512];
    fsdp_section(par, sizeof par, w, extra);
    const char *job = th_job_file(name, arch, steps, batch, 1, par);
    *dir = th_path(name);
    const char *argv[] = {"tessera-run", job, "--run-dir", *dir, NULL};
    return th_start(name, argv);
}

/* kill -9 of one of 4 workers mid-training, once the four hold their
 * shards and checkpointed them (12 steps after the generation of 4
 * formed): the survivors go
 * on at 3 from the last checkpoint, resharded, and finish, the steps they
 * took again logged once in metrics.jsonl; the final checkpoint evaluates. */
static void test_kill_worker(void **state) {
    (void)state;
    const char *dir;
    th_proc run = start_job("fsdp-kill", "mlp", 300, 32, 4, ", \"min_workers\": 2", &dir);
    if (th_wait_count(&run, "joined rank=", 4, 60000) != 0) th_dump(&run, "not 4 workers joined");
    if (th_wait_for(&run, "0 servers, 4 workers [", 60000) != 0) th_dump(&run, "no generation of 4");
    /* 12 steps at 4 workers (the scheduler's line for their generation,
     * the first or, for a late worker, a later one): one of them wrote a
     * checkpoint (every 10 steps) to go back to */
    if (th_wait_count(&run, "/300 |", th_count(&run, "/300 |") + 12, 60000) != 0)
        th_dump(&run, "no 12 steps at 4 workers");
    pid_t victim = -1;
    int rank = th_joined_worker(&run, 2, &victim);
    assert_true(rank >= 0);
    kill(victim, SIGKILL);
    if (th_wait_for(&run, "world size 4 -> 3 workers", 15000) != 0) th_dump(&run, "no new generation of 3");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after losing a worker");
    if (th_count(&run, "reloads checkpoint") < 1) th_dump(&run, "the survivors did not reload the last checkpoint");
    th_expect_steps_once(dir, 300);
    char ckpt[4300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-300", dir);
    const char *eargv[] = {"tessera-run", "--eval", ckpt, NULL};
    char *text = th_run_tool("fsdp-kill-eval", eargv);
    const char *a = strstr(text, "accuracy ");
    double acc = a ? atof(a + 9) : 0;
    if (acc < 75) fail_msg("the final checkpoint evaluates at %.2f%% (below 75%%):\n%s", acc, text);
    free(text);
    assert_int_equal(th_leftovers(), 0);
}

/* The loss of the first "step 1/" line after the first occurrence of
 * after in p's output, or -1. */
static double step_1_loss_after(const th_proc *p, const char *after) {
    char *text = th_output(p);
    const char *a = strstr(text, after), *s = a ? strstr(a, "step 1/") : NULL, *l = s ? strstr(s, "| loss ") : NULL;
    double loss = l ? atof(l + 7) : -1;
    free(text);
    return loss;
}

/* Runs tessera-run with args (after the job file; NULL-terminated) for
 * an MLP job of 4 workers (down to 2) that keeps no checkpoint of its own,
 * kills one 3 steps after the generation of 4 formed, and waits for the
 * line `after` and for tessera-run to exit 0. */
static th_proc kill_early(const char *name, const char *after, const char *const *args) {
    char par[512];
    fsdp_section(par, sizeof par, 4, ", \"min_workers\": 2");
    const char *argv[16] = {"tessera-run", th_job_file(name, "mlp", 400, 32, 1, par), "--run-dir", th_path(name),
                            "--set", "train.checkpoint_every=0"};
    int n = 6;
    while (*args && n < 15) argv[n++] = *args++;
    argv[n] = NULL;
    th_proc run = th_start(name, argv);
    if (th_wait_for(&run, "0 servers, 4 workers [", 60000) != 0) th_dump(&run, "no generation of 4");
    if (th_wait_count(&run, "/400 |", th_count(&run, "/400 |") + 3, 60000) != 0) th_dump(&run, "no 3 steps at 4");
    pid_t victim = -1;
    assert_true(th_joined_worker(&run, 2, &victim) >= 0);
    kill(victim, SIGKILL);
    if (th_wait_for(&run, after, 15000) != 0) th_dump(&run, "the survivors did not start again");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after losing a worker");
    return run;
}

/* A fine-tuning job (model.init_from: a local run's weights after 40
 * steps) that keeps no checkpoint loses one of 4 workers: the survivors
 * start again from the weights the job started from, not from the seed's
 * model (whose first loss is that of an untrained classifier, ln 10). */
static void test_kill_fine_tune(void **state) {
    (void)state;
    double pre[41];
    th_run_job("fsdp-pre", "mlp", 40, 32, 1, "\"strategy\": \"local\"", false, pre);
    char init[4300];
    snprintf(init, sizeof init, "model.init_from=%s/checkpoints/step-40/model.safetensors", th_path("fsdp-pre"));
    const char *again = "no checkpoint was kept: starting again from the job's first model";
    const char *args[] = {"--set", init, NULL};
    th_proc run = kill_early("fsdp-ft", again, args);
    double first = step_1_loss_after(&run, "0 servers, 4 workers ["), redone = step_1_loss_after(&run, again);
    if (!(first > 0 && first < 1.5 && redone > 0 && redone < 1.5))
        th_dump(&run, "step 1 did not start from the fine-tuned weights (loss near ln 10 = 2.30 is the seed's)");
    assert_int_equal(th_leftovers(), 0);
}

/* A job resumed from a local run's checkpoint (whole, not sharded) loses
 * one of 4 workers before it keeps one of its own: the survivors reload
 * that checkpoint, resharded, and finish. */
static void test_kill_after_local(void **state) {
    (void)state;
    double pre[21];
    th_run_job("fsdp-after-local", "mlp", 20, 32, 1, "\"strategy\": \"local\"", false, pre);
    const char *args[] = {"--resume", NULL};
    th_proc run = kill_early("fsdp-after-local", "every rank reloads checkpoint", args);
    th_expect_output(&run, "checkpoints/step-20 (step 20)", 0);
    assert_int_equal(th_leftovers(), 0);
}

enum { STEPS_K = 160 };

/* Starts the job of the neighbour-copy tests, name: the small GPT at 4
 * workers with copies, STEPS_K steps, every checkpoint kept; waits for 25
 * steps of the generation of 4. */
static th_proc start_copy_run(const char *name) {
    const char *copy = ", \"min_workers\": 2, \"fsdp_neighbour_copy\": true";
    char par[512];
    fsdp_section(par, sizeof par, 4, copy);
    char *text = NULL;
    size_t len = 0;
    FILE *in = fopen(th_job_file(name, "gpt", STEPS_K, 4, 1, par), "r");
    assert_non_null(in);
    assert_int_equal(getdelim(&text, &len, '\0', in) > 0, 1);
    fclose(in);
    char job_text[8192], file[80];
    const char *at = strstr(text, "\"checkpoint_every\": 10");
    assert_non_null(at);
    snprintf(job_text, sizeof job_text, "%.*s\"keep_checkpoints\": 100, %s", (int)(at - text), text, at);
    free(text);
    snprintf(file, sizeof file, "%s.json", name);
    const char *job = th_write(file, job_text);
    const char *argv[] = {"tessera-run", job, "--run-dir", th_path(name), NULL};
    th_proc run = th_start(name, argv);
    if (th_wait_for(&run, "0 servers, 4 workers [", 60000) != 0) th_dump(&run, "no generation of 4");
    if (th_wait_count(&run, "/160 |", th_count(&run, "/160 |") + 25, 60000) != 0)
        th_dump(&run, "no 25 steps at 4 workers");
    return run;
}

/* Waits for a copy run that lost a worker to end, and checks that no step
 * was lost: a shard was rebuilt from a copy at the step S the survivors
 * reached, no checkpoint was reloaded, and the losses equal those of a run
 * without copies that went from the last checkpoint C before S to S at 4
 * workers and on from S at 3 (C + 1 .. S: the copies change nothing; after
 * S: the rebuilt shards are the lost ones); the final checkpoint
 * evaluates. Returns S. */
static long expect_no_step_lost(th_proc *run, const char *name) {
    const char *dir = th_path(name);
    if (th_wait(run, 240000) != 0) th_dump(run, "tessera-run did not exit 0 after losing a worker");
    if (th_count(run, "a shard was lost") > 0) th_dump(run, "a checkpoint was reloaded although a copy was kept");
    char *out = th_output(run);
    const char *rebuilt = strstr(out, "rebuilt from this rank's copy at step ");
    long s = rebuilt ? atol(rebuilt + strlen("rebuilt from this rank's copy at step ")) : -1;
    free(out);
    if (s < 0) th_dump(run, "no shard rebuilt from a copy mid-run");
    if (s < 10 || s >= STEPS_K) fail_msg("the shard was rebuilt at step %ld, not mid-run", s);
    double got[STEPS_K + 1], to_s[STEPS_K + 1], on[STEPS_K + 1];
    assert_int_equal(th_losses(dir, got, STEPS_K), STEPS_K);

    long c = s / 10 * 10;
    char path[4400], cmd[9000], to[128], go_on[128], par[512];
    for (; c > 0; c -= 10) {
        snprintf(path, sizeof path, "%s/checkpoints/step-%ld", dir, c);
        if (access(path, F_OK) == 0) break;
    }
    assert_true(c > 0);
    snprintf(to, sizeof to, "%s-to-s", name);
    snprintf(go_on, sizeof go_on, "%s-on", name);
    th_copy_run(dir, th_path(to));
    snprintf(cmd, sizeof cmd,
             "cd '%s/checkpoints' && for d in step-*; do [ \"${d#step-}\" -le %ld ] || rm -rf \"$d\"; done",
             th_path(to), c);
    assert_int_equal(system(cmd), 0);
    fsdp_section(par, sizeof par, 4, "");
    th_run_job(to, "gpt", (int)s, 4, 1, par, true, to_s);
    th_expect_same(got, to_s, (int)c + 1, (int)s, "the steps before the loss, against a run without copies");
    th_copy_run(th_path(to), th_path(go_on));
    fsdp_section(par, sizeof par, 3, "");
    th_run_job(go_on, "gpt", STEPS_K, 4, 1, par, true, on);
    th_expect_same(got, on, (int)s + 1, STEPS_K, "the steps after the rebuild, against a run that lost no worker");

    char ckpt[4300], tag[128];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-%d", dir, STEPS_K);
    snprintf(tag, sizeof tag, "%s-eval", name);
    const char *eargv[] = {"tessera-run", "--eval", ckpt, NULL};
    char *evaluated = th_run_tool(tag, eargv);
    const char *a = strstr(evaluated, "loss ");
    if (!a || !(atof(a + 5) < 0.8 * got[1]))
        fail_msg("the final checkpoint evaluates no better than 0.8 x the first step's loss %.4f:\n%s", got[1],
                 evaluated);
    free(evaluated);
    assert_int_equal(th_leftovers(), 0);
    return s;
}

/* With parallel.fsdp_neighbour_copy, kill -9 of one of 4 workers mid-step
 * loses no step: the survivors rebuild its shards from the copy its ring
 * neighbour kept (no checkpoint is reloaded) and go on at 3 from the step
 * they reached. The small GPT: tied weights, and clipping, which scales
 * the copy's gradients by the global norm as its holder did. */
static void test_kill_worker_copy(void **state) {
    (void)state;
    th_proc run = start_copy_run("fsdp-copy");
    pid_t victim = -1;
    assert_true(th_joined_worker(&run, 2, &victim) >= 0);
    kill(victim, SIGKILL);
    if (th_wait_for(&run, "world size 4 -> 3 workers", 15000) != 0) th_dump(&run, "no new generation of 3");
    expect_no_step_lost(&run, "fsdp-copy");
}

/* A death inside a step's sums, made certain (TESSERA_FAULT): rank 0's
 * sums of step 45 fail while ranks 1 and 2 take the step, and rank 3
 * exits. Rank 0, behind, takes step 45 from the gradients it held (and
 * logs it: it leads), the shards of rank 3 come from rank 2's copy, and no
 * step is lost. */
static void test_sums_split(void **state) {
    (void)state;
    setenv("TESSERA_FAULT", "sums_split@45", 1);
    th_proc run = start_copy_run("fsdp-split");
    unsetenv("TESSERA_FAULT");
    long s = expect_no_step_lost(&run, "fsdp-split");
    assert_int_equal(s, 45);
    if (th_count(&run, "fsdp: step 45 taken from the reduced gradients this rank held") != 1)
        th_dump(&run, "rank 0 did not take step 45 from the gradients it held");
}

/* The leader exits once the group took step 15, before logging it; its
 * shard comes from rank 3's copy and the next leader, which took the step
 * too, logs it. Before, the step's line was missing from metrics.jsonl. */
static void test_leader_exit(void **state) {
    (void)state;
    th_fault_logs_every_step("fsdp-leader-exit", 30,
                             "\"strategy\": \"fsdp\", \"workers\": 4, \"fsdp_neighbour_copy\": true",
                             "leader_exit@15", 15, "rebuilt from this rank's copy at step 15");
}

/* The same once the group took its last step: the next leader logs step
 * 30 and the evaluations and writes the final checkpoint. */
static void test_leader_exit_last(void **state) {
    (void)state;
    th_fault_logs_every_step("fsdp-leader-exit-last", 30,
                             "\"strategy\": \"fsdp\", \"workers\": 4, \"fsdp_neighbour_copy\": true",
                             "leader_exit@30", 30, "exits after step 30");
    th_expect_end_written(th_path("fsdp-leader-exit-last"), 30);
    assert_int_equal(th_leftovers(), 0);
}

/* A second worker joins while the shards move to the first joined one: a
 * worker of the move is stopped (SIGSTOP) until the second has been
 * admitted, so that the new generation arrives mid-move. Every rank keeps
 * its shards, they move again to the four, and none is lost. */
static void test_join_during_move(void **state) {
    (void)state;
    const char *text =
        "{\"name\": \"fsdp-join2\", \"seed\": 3, \"steps\": 400,\n"
        " \"model\": {\"arch\": \"mlp\", \"hidden\": [256, 256]}, \"data\": {\"kind\": \"fashion_mnist\"},\n"
        " \"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.001}, \"schedule\": {\"kind\": \"constant\"},\n"
        " \"train\": {\"batch_size\": 32, \"log_every\": 10, \"eval_every\": 0, \"eval_batches\": 4, "
        "\"checkpoint_every\": 0},\n"
        " \"parallel\": {\"strategy\": \"fsdp\", \"workers\": 2, \"max_workers\": 4, \"heartbeat_ms\": 100, "
        "\"heartbeat_timeout_ms\": 20000}}\n";
    const char *job = th_write("fsdp-join2.json", text), *dir = th_path("fsdp-join2");
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    th_proc run = th_start("fsdp-join2", argv);
    if (th_wait_for(&run, "step 10/400", 60000) != 0) th_dump(&run, "no step 10");
    pid_t held = -1;
    if (th_joined_worker(&run, 1, &held) < 0) th_dump(&run, "no second worker's pid");
    th_proc first = th_start_joiner("fsdp-join2-a", job, dir, (const char *[]){"--run-dir", dir, NULL});
    if (th_wait_for(&run, "world size 2 -> 3 workers", 60000) != 0) th_dump(&run, "no generation of 3");
    kill(held, SIGSTOP);
    th_proc second = th_start_joiner("fsdp-join2-b", job, dir, (const char *[]){"--run-dir", dir, NULL});
    int admitted = th_wait_for(&run, "worker rank 3 admitted", 60000);
    usleep(300 * 1000);
    kill(held, SIGCONT);
    if (admitted != 0) th_dump(&run, "the second worker was not admitted");
    if (th_wait(&first, 240000) != 0) th_dump(&first, "the first joined worker did not exit 0");
    if (th_wait(&second, 240000) != 0) th_dump(&second, "the second joined worker did not exit 0");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 with two joined workers");
    if (th_count(&run, "-> 4 workers") < 1) th_dump(&run, "no generation of 4");
    if (th_count(&run, "a shard was lost") + th_count(&first, "a shard was lost") > 0)
        th_dump(&run, "a shard was lost to a join during a move");
    assert_int_equal(th_leftovers(), 0);
}

/* kill -9 of a worker while the others evaluate (their forwards gather
 * its shards): they reload the last checkpoint at 3 workers, train on from
 * there and finish. */
static void test_kill_in_eval(void **state) {
    (void)state;
    th_kill_in_eval("fsdp-eval-kill", "fsdp", ", \"fsdp_mode\": \"full\"");
    assert_int_equal(th_leftovers(), 0);
}

/* Ctrl-C of tessera-run: the workers stop after the same step and save
 * their shards of it together; resumed, the job logs the losses of a run
 * never stopped. */
static void test_interrupt(void **state) {
    (void)state;
    th_interrupt_resume("fsdp-interrupt", 600, 16, "\"strategy\": \"fsdp\", \"workers\": 2", 30);
    assert_int_equal(th_leftovers(), 0);
}

/* A worker joined mid-run gets its shards from the others at the next
 * step boundary (no checkpoint reloaded) and trains in step; the
 * neighbour copies are laid out again for the three. It joins the README's
 * way, without --run-dir, and writes its shards of each checkpoint into
 * the job's run folder (the key file's). One given another run folder is
 * refused before it joins: the leader could not have committed a
 * checkpoint, and the job failed. */
static void test_join(void **state) {
    (void)state;
    const char *dir;
    th_proc run = start_job("fsdp-join", "gpt", 600, 4, 2, ", \"max_workers\": 3, \"fsdp_neighbour_copy\": true", &dir);
    const char *job = th_path("fsdp-join.json");
    if (th_wait_for(&run, "step 10/600", 60000) != 0) th_dump(&run, "no step 10");
    th_proc stray = th_start_joiner("fsdp-stray", job, dir, (const char *[]){"--run-dir", th_path("fsdp-stray"), NULL});
    if (th_wait(&stray, 30000) != 2) th_dump(&stray, "a joiner with another run folder was not refused");
    th_expect_output(&stray, "is not the job's run folder", 0);
    th_proc joiner = th_start_joiner("fsdp-joiner", job, dir, NULL);
    if (th_wait_for(&run, "world size 2 -> 3 workers", 60000) != 0) th_dump(&run, "no generation of 3");
    if (th_wait(&joiner, 240000) != 0) th_dump(&joiner, "the joined worker did not exit 0");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 with a joined worker");
    if (th_count(&run, "all workers completed 600 steps") < 1) th_dump(&run, "not every worker completed the steps");
    if (th_count(&run, "reloads checkpoint") + th_count(&joiner, "reloads checkpoint") > 0)
        th_dump(&run, "a checkpoint was reloaded although no shard was lost");
    th_expect_steps_once(dir, 600);
    assert_int_equal(th_leftovers(), 0);
}

/* The shards of the final checkpoint do not fit the disk (the run's
 * checkpoints folder is a 128 KiB tmpfs in a mount namespace of its own;
 * a shard of the MLP with its AdamW state is 330 KB): the job fails, and
 * the step's temp folder with the halves of the shards is gone - it
 * stayed, keeping the disk full, while the leader that named it lived. */
static void test_save_fails(void **state) {
    (void)state;
    if (geteuid() != 0) {
        printf("skipped: a tmpfs of its own needs root\n");
        skip();
    }
    const char *job = th_job_file("fsdp-save-fails", "mlp", 5, 16, 1, "\"strategy\": \"fsdp\", \"workers\": 2");
    const char *dir = th_path("fsdp-save-fails");
    char run[4200], ckpts[4300];
    snprintf(run, sizeof run, "%s/tessera-run", getenv("TESSERA_BIN_DIR"));
    snprintf(ckpts, sizeof ckpts, "%s/checkpoints", dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(mkdir(ckpts, 0755), 0);
    const char *script = "mount -t tmpfs -o size=128k tmpfs \"$1/checkpoints\" || exit 99; "
                         "\"$0\" \"$2\" --run-dir \"$1\"; rc=$?; echo \"left in checkpoints: [$(ls -A \"$1/checkpoints\")]\"; "
                         "exit $rc";
    const char *argv[] = {"unshare", "--mount", "sh", "-c", script, run, dir, job, NULL};
    th_proc p = th_start("fsdp-save-fails", argv);
    if (th_wait(&p, 120000) != 1) th_dump(&p, "tessera-run did not exit 1 when the shards did not fit");
    if (th_count(&p, "No space left on device") < 1) th_dump(&p, "no rank said why it could not write");
    if (th_count(&p, "left in checkpoints: []") != 1) th_dump(&p, "the failed save left files behind");
    assert_int_equal(th_leftovers(), 0);
}

/* The last of 3 workers exits once it wrote its shard of step 20's
 * checkpoint (TESSERA_FAULT save_exit@20): the other two abandon that
 * save, go back to step 10 and save step 20 again in the same temp folder.
 * That checkpoint holds their two shards and nothing else: before, the
 * abandoned save's shard-2 (of the world of 3) was committed beside them. */
static void test_save_abandoned(void **state) {
    (void)state;
    char par[512];
    fsdp_section(par, sizeof par, 3, ", \"min_workers\": 2");
    const char *job = th_job_file("fsdp-save-abandoned", "mlp", 30, 16, 1, par);
    const char *dir = th_path("fsdp-save-abandoned");
    const char *argv[] = {"tessera-run", job, "--run-dir", dir, NULL};
    setenv("TESSERA_FAULT", "save_exit@20", 1);
    th_proc run = th_start("fsdp-save-abandoned", argv);
    unsetenv("TESSERA_FAULT");
    if (th_wait(&run, 240000) != 0) th_dump(&run, "tessera-run did not exit 0 after losing a worker in a save");
    if (th_count(&run, "checkpoint of step 20 abandoned") < 1) th_dump(&run, "the save of step 20 was not abandoned");
    char ckpt[4300], files[1024] = "";
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-20", dir);
    struct dirent **e;
    int n = scandir(ckpt, &e, NULL, alphasort);
    assert_true(n >= 0);
    for (int i = 0; i < n; i++) {
        if (e[i]->d_name[0] != '.') snprintf(files + strlen(files), sizeof files - strlen(files), " %s", e[i]->d_name);
        free(e[i]);
    }
    free(e);
    if (strcmp(files, " model.safetensors optim.safetensors shard-0.safetensors shard-1.safetensors state.json") != 0)
        fail_msg("step 20, saved again by 2 workers, holds:%s", files);
    assert_int_equal(th_leftovers(), 0);
}

int main(int argc, char **argv) {
    th_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_2),  cmocka_unit_test(test_gpt_4),      cmocka_unit_test(test_cnn_2),
        cmocka_unit_test(test_cnn_4),  cmocka_unit_test(test_gpt_checkpointing), cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_reshard), cmocka_unit_test(test_kill_worker), cmocka_unit_test(test_kill_worker_copy),
        cmocka_unit_test(test_sums_split), cmocka_unit_test(test_leader_exit), cmocka_unit_test(test_leader_exit_last), cmocka_unit_test(test_kill_fine_tune),
        cmocka_unit_test(test_kill_after_local),
        cmocka_unit_test(test_kill_in_eval),
        cmocka_unit_test(test_interrupt),
        cmocka_unit_test(test_join_during_move),
        cmocka_unit_test(test_join),
        cmocka_unit_test(test_save_fails),
        cmocka_unit_test(test_save_abandoned),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    th_finish(failed);
    return failed;
}
