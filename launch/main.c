/* main.c - tessera-run: command line and dispatch to the run modes. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/ops/cpu/capability.h"
#include "kernels/threads.h"
#include "launch/argv.h"
#include "launch/cluster.h"
#include "launch/launch.h"
#include "launch/supervise.h"
#include "launch/train.h"
#include "worker/fit.h"
#include "worker/trainer.h"

static const char usage[] =
    "usage:\n"
    "  tessera-run JOB.json [--set key.path=value]... [--run-dir DIR]\n"
    "      run the job: a local cluster of 1 scheduler, parallel.servers ps\n"
    "      (times parallel.ps_replicas) and parallel.workers workers (strategies\n"
    "      \"ps\" and \"standin\"); with --resume --run-dir DIR it continues there\n"
    "  tessera-run --join ADDRESS --key-file PATH JOB.json [--set ...] [--rank N]\n"
    "      [--run-dir DIR]\n"
    "      start one more worker against the running job at ADDRESS\n"
    "  tessera-run --status ADDRESS --key-file PATH\n"
    "      print the roster, generation and last heartbeats of a running job\n"
    "  tessera-run --mpi [--role scheduler|ps|worker] JOB.json [--set ...] [--resume]\n"
    "      under mpirun: MPI rank 0 is the scheduler, the next parallel.servers\n"
    "      ranks are ps, the rest workers (--role sets it for MPMD launches)\n"
    "  tessera-run JOB.json --resume [--run-dir DIR]\n"
    "      strategy \"local\": train in this process, resuming from the newest\n"
    "      checkpoint of the run folder (a cluster job needs --run-dir)\n"
    "      (--force, here, with a cluster, --join or --mpi: its workers train\n"
    "      even when the model's memory estimate exceeds the memory available)\n"
    "  tessera-run --eval CHECKPOINT_DIR | --eval WEIGHTS.safetensors JOB.json [--set ...]\n"
    "      test loss and accuracy (or bits per byte) of a checkpoint, or of\n"
    "      weights trained elsewhere for the job's model (--set model.init_map=MAP\n"
    "      for foreign names, e.g. examples/maps/gpt2_hf.json)\n"
    "  tessera-run --consolidate CHECKPOINT_DIR [--out DIR]\n"
    "      one whole checkpoint DIR/step-K (default: CHECKPOINT_DIR's folder's\n"
    "      consolidated/) from the shards of an fsdp run or a pipeline's stages\n"
    "  tessera-run --generate CHECKPOINT_DIR | WEIGHTS JOB.json --prompt TEXT\n"
    "      [--tokens N] [--temperature T] [--top-k K] [--seed S]   sample text from a GPT\n"
    "  tessera-run --export-onnx CHECKPOINT_DIR | WEIGHTS JOB.json -o MODEL.onnx\n"
    "      the MLP, CNN or GPT as an ONNX model (opset 17, dynamic batch)\n"
    "  tessera-run --plot RUN_DIR      draw RUN_DIR/metrics.png\n"
    "  tessera-run --env               version, build options, CPU kernels, BLAS,\n"
    "      threads, ZeroMQ/CURVE, MPI, CUDA\n"
    "  tessera-run --help\n";

/* The longest --generate (as tessera-serve's --max-tokens at most). */
enum { MAX_TOKENS = 1 << 20 };

/* Parsed command line. */
typedef struct {
    enum { MODE_RUN, MODE_JOIN, MODE_STATUS, MODE_MPI, MODE_EVAL, MODE_CONSOLIDATE, MODE_GENERATE, MODE_EXPORT, MODE_PLOT, MODE_ENV } mode;
    const char *checkpoint; /* --eval / --consolidate / --generate / --export-onnx */
    const char *out;        /* --consolidate --out */
    const char *output;     /* --export-onnx -o */
    const char *prompt;
    int tokens, top_k;
    double temperature;
    unsigned long long seed;
    bool resume, force;
    const char *address;  /* --join / --status */
    const char *key_file;
    const char *job_path;
    const char *run_dir;
    const char *role;     /* --mpi --role */
    int rank;             /* --join --rank, -1 none */
    char **sets;
    int nsets;
} cli;

/* Value of flag argv[*i] given as "--flag=value" or "--flag value". */
static const char *flag_value(int argc, char **argv, int *i, const char *flag) {
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tessera-run: %s needs a value\n%s", flag, usage);
        exit(2);
    }
    return argv[++*i];
}

/* Integer value v of flag in [lo, hi]; anything else exits 2 naming both. */
static long long int_flag(const char *flag, const char *v, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno || n < lo || n > hi) {
        fprintf(stderr, "tessera-run: %s: \"%s\" is not an integer in [%lld, %lld]\n", flag, v, lo, hi);
        exit(2);
    }
    return n;
}

/* Positive finite value v of flag; anything else exits 2 naming both. */
static double positive_flag(const char *flag, const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !isfinite(x) || !(x > 0)) {
        fprintf(stderr, "tessera-run: %s: \"%s\" is not a positive number\n", flag, v);
        exit(2);
    }
    return x;
}

static int parse_cli(int argc, char **argv, cli *c) {
    memset(c, 0, sizeof *c);
    c->rank = -1;
    c->tokens = 200;
    c->top_k = 0;
    c->temperature = 0.8;
    c->sets = calloc((size_t)argc, sizeof *c->sets);
    if (!c->sets) return -1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        } else if ((v = flag_value(argc, argv, &i, "--set"))) {
            c->sets[c->nsets++] = (char *)v;
        } else if ((v = flag_value(argc, argv, &i, "--join"))) {
            c->mode = MODE_JOIN;
            c->address = v;
        } else if ((v = flag_value(argc, argv, &i, "--status"))) {
            c->mode = MODE_STATUS;
            c->address = v;
        } else if (strcmp(argv[i], "--mpi") == 0) {
            c->mode = MODE_MPI;
        } else if (strcmp(argv[i], "--env") == 0) {
            c->mode = MODE_ENV;
        } else if (strcmp(argv[i], "--resume") == 0) {
            c->resume = true;
        } else if (strcmp(argv[i], "--force") == 0) {
            c->force = true;
        } else if ((v = flag_value(argc, argv, &i, "--eval"))) {
            c->mode = MODE_EVAL;
            c->checkpoint = v;
        } else if ((v = flag_value(argc, argv, &i, "--consolidate"))) {
            c->mode = MODE_CONSOLIDATE;
            c->checkpoint = v;
        } else if ((v = flag_value(argc, argv, &i, "--out"))) {
            c->out = v;
        } else if ((v = flag_value(argc, argv, &i, "--generate"))) {
            c->mode = MODE_GENERATE;
            c->checkpoint = v;
        } else if ((v = flag_value(argc, argv, &i, "--export-onnx"))) {
            c->mode = MODE_EXPORT;
            c->checkpoint = v;
        } else if ((v = flag_value(argc, argv, &i, "-o"))) {
            c->output = v;
        } else if ((v = flag_value(argc, argv, &i, "--plot"))) {
            c->mode = MODE_PLOT;
            c->run_dir = v;
        } else if ((v = flag_value(argc, argv, &i, "--prompt"))) {
            c->prompt = v;
        } else if ((v = flag_value(argc, argv, &i, "--tokens"))) {
            c->tokens = (int)int_flag("--tokens", v, 0, MAX_TOKENS);
        } else if ((v = flag_value(argc, argv, &i, "--top-k"))) {
            c->top_k = (int)int_flag("--top-k", v, 0, INT_MAX);
        } else if ((v = flag_value(argc, argv, &i, "--temperature"))) {
            c->temperature = positive_flag("--temperature", v);
        } else if ((v = flag_value(argc, argv, &i, "--seed"))) {
            c->seed = (unsigned long long)int_flag("--seed", v, 0, LLONG_MAX);
        } else if ((v = flag_value(argc, argv, &i, "--key-file"))) {
            c->key_file = v;
        } else if ((v = flag_value(argc, argv, &i, "--run-dir"))) {
            c->run_dir = v;
        } else if ((v = flag_value(argc, argv, &i, "--role"))) {
            c->role = v;
        } else if ((v = flag_value(argc, argv, &i, "--rank"))) {
            char *end;
            long r = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || r < 0 || r > INT_MAX) {
                fprintf(stderr, "tessera-run: --rank: \"%s\" is not a rank\n", v);
                return -1;
            }
            c->rank = (int)r;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "tessera-run: unknown option %s\n%s", argv[i], usage);
            return -1;
        } else if (!c->job_path) {
            c->job_path = argv[i];
        } else {
            fprintf(stderr, "tessera-run: unexpected argument %s (one job file)\n",
                    argv[i]);
            return -1;
        }
    }
    if (c->mode >= MODE_EVAL) {
        if (c->job_path && c->mode != MODE_EVAL && c->mode != MODE_GENERATE && c->mode != MODE_EXPORT) {
            fprintf(stderr, "tessera-run: this mode takes no job file (%s)\n", c->job_path);
            return -1;
        }
        if (c->mode == MODE_EXPORT && !c->output) {
            fprintf(stderr, "tessera-run --export-onnx needs -o MODEL.onnx\n");
            return -1;
        }
        if (c->mode == MODE_GENERATE && !c->prompt) {
            fprintf(stderr, "tessera-run --generate needs --prompt TEXT\n");
            return -1;
        }
        return 0;
    }
    if (c->mode == MODE_STATUS && c->job_path) {
        fprintf(stderr, "tessera-run --status takes no job file (%s)\n", c->job_path);
        return -1;
    }
    if (c->mode != MODE_STATUS && !c->job_path) {
        fprintf(stderr, "tessera-run: no job file given\n%s", usage);
        return -1;
    }
    if ((c->mode == MODE_JOIN || c->mode == MODE_STATUS) && !c->key_file &&
        !getenv("TESSERA_KEY_FILE")) {
        fprintf(stderr, "tessera-run: %s needs --key-file PATH (or TESSERA_KEY_FILE)\n",
                c->mode == MODE_JOIN ? "--join" : "--status");
        return -1;
    }
    if (!c->key_file) c->key_file = getenv("TESSERA_KEY_FILE");
    if (c->role && c->mode != MODE_MPI) {
        fprintf(stderr, "tessera-run: --role is only for --mpi\n");
        return -1;
    }
    return 0;
}

/* --consolidate's default output: consolidated/ in the folder that holds
 * checkpoint folder ckpt (trailing slashes ignored), into out[cap]. */
static void consolidated_beside(const char *ckpt, char *out, size_t cap) {
    size_t n = strlen(ckpt);
    while (n > 1 && ckpt[n - 1] == '/') n--;
    snprintf(out, cap, "%.*s", (int)n, ckpt);
    char *slash = strrchr(out, '/');
    if (slash) snprintf(slash + 1, cap - (size_t)(slash + 1 - out), "consolidated");
    else snprintf(out, cap, "consolidated");
}

int main(int argc, char **argv) {
    ts_threads_passive(argv);
    if (argc >= 2 && strcmp(argv[1], "--exec-child") == 0)
        return ts_super_exec_child(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);

    cli c;
    if (parse_cli(argc, argv, &c) != 0) return 2;
    ts_cpu_capability cap; /* a refused TESSERA_CPU_CAPABILITY stops everything but --env and --status */
    if (c.mode != MODE_ENV && c.mode != MODE_STATUS && ts_cpu_capability_get(&cap)) {
        fprintf(stderr, "tessera-run: %s\n", ts_last_error());
        return 2;
    }
    int code;
    char png[1200];
    if (c.mode == MODE_STATUS) {
        code = ts_launch_status(c.address, c.key_file);
    } else if (c.mode == MODE_ENV) {
        code = ts_launch_env();
    } else if (c.mode == MODE_EVAL) {
        code = ts_launch_eval(&(ts_launch_source){c.checkpoint, c.job_path, (const char *const *)c.sets, c.nsets});
    } else if (c.mode == MODE_CONSOLIDATE) {
        char out[4200];
        if (c.out) snprintf(out, sizeof out, "%s", c.out);
        else consolidated_beside(c.checkpoint, out, sizeof out);
        code = ts_launch_consolidate(c.checkpoint, out);
    } else if (c.mode == MODE_GENERATE) {
        code = ts_launch_generate(&(ts_launch_source){c.checkpoint, c.job_path, (const char *const *)c.sets, c.nsets},
                                  c.prompt, c.tokens, c.temperature, c.top_k, c.seed);
    } else if (c.mode == MODE_EXPORT) {
        code = ts_launch_export_onnx(&(ts_launch_source){c.checkpoint, c.job_path, (const char *const *)c.sets, c.nsets},
                                     c.output);
    } else if (c.mode == MODE_PLOT) {
        code = ts_launch_plot(c.run_dir, png, sizeof png);
        if (!code) printf("chart: %s\n", png);
    } else {
        ts_cluster_opts o = {.job_path = c.job_path, .sets = c.sets,
                             .nsets = c.nsets, .run_dir = c.run_dir, .resume = c.resume, .force = c.force};
        if (ts_job_load(c.job_path, (const char *const *)c.sets, c.nsets, &o.job) !=
            TS_OK) {
            fprintf(stderr, "tessera-run: %s\n", ts_last_error());
            free(c.sets);
            return 2;
        }
        /* a cluster's run folder: --run-dir, else the job's train.run_dir */
        if (!o.run_dir && o.job.train.run_dir[0]) o.run_dir = o.job.train.run_dir;
        if (c.resume && o.job.parallel.strategy != TS_STRATEGY_LOCAL && c.mode == MODE_RUN &&
            !o.run_dir) {
            fprintf(stderr, "tessera-run --resume: a cluster job continues in its run folder: "
                            "give it with --run-dir DIR or train.run_dir\n");
            free(c.sets);
            return 2;
        }
        if (o.job.parallel.strategy == TS_STRATEGY_LOCAL && c.mode == MODE_RUN) {
            code = ts_launch_train(&o.job, c.run_dir, c.resume, c.force);
        } else if (c.mode == MODE_JOIN) {
            code = ts_launch_join(&(ts_launch_join_opts){.address = c.address, .key_file = c.key_file,
                                                         .job_path = c.job_path, .sets = c.sets, .nsets = c.nsets,
                                                         .rank = c.rank, .run_dir = o.run_dir, .job = &o.job,
                                                         .force = c.force});
        } else if (c.mode == MODE_MPI) {
            code = ts_launch_mpi(&o, c.role, argc, argv);
        } else if (ts_trainer_steps(&o.job, &o.job.steps) != TS_OK ||
                   (!c.force && ts_fit_check_here(&o.job, o.job.parallel.workers) != TS_OK)) {
            /* the scheduler ends a cluster job by its steps: the epochs'
             * counted; its workers on this machine share its memory, each
             * of them checks its own share only */
            fprintf(stderr, "tessera-run: %s\n", ts_last_error());
            code = 2;
        } else {
            code = ts_cluster_run(&o);
        }
    }
    free(c.sets);
    return code;
}
