/* ps.c - bench_ps: push + pull of a whole model through S parameter-server
 * shards, against raw ZeroMQ moving the same bytes in the same messages.
 *
 * For each S: the raw run starts S echo processes (a CURVE ROUTER each,
 * like a shard's) and times rounds in which one DEALER per echo sends it
 * its 1/S of the model's bytes and gets as many back, in 1 MiB frames as
 * the ps client sends ranges; the ps run starts a
 * real tessera-scheduler and S tessera-ps processes on a job whose model
 * has about --numel floats (an MLP, SGD without momentum), joins as the
 * job's one worker and times rounds of the worker's step conversation
 * (ps_client.h): push every gradient, commit, apply, pull every parameter.
 * Useful value bytes per round: the model's gradients and parameters, 2 x
 * numel x 4. Each figure is the median of --reps rounds after 2 warm-up
 * rounds; raw and ps rounds interleave so load hits both alike. Output: a
 * table per S (ms per round, GB/s of values, raw time / ps time) on stdout.
 *
 * With --netsim NAME (run it on node n0 of that virtual cluster: tessera-
 * netsim --name NAME exec n0 build/bin/bench_ps --netsim NAME) the
 * scheduler and this worker stay on n0 and echo k and shard k run on node
 * 1 + k mod (N - 1), each bound to its node's address, so every byte
 * crosses n0's link; the table then also gives the bound that link sets.
 *
 * The right half repeats both without CURVE: the raw rounds on plain TCP
 * and the shards with parallel.ps_security "none", to show what
 * encryption costs (every byte is sealed by its sender and opened by its
 * receiver) and what the shards add to plain ZeroMQ. Rounds of the four
 * runs interleave.
 *
 * usage: bench_ps [--numel N] [--shards 1,2,4] [--reps R] [--netsim NAME]
 *        bench_ps --echo KEY_FILE ADDRESS [plain]   (one echo server; used by the above)
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "kernels/nn/models.h"
#include "kernels/threads.h"
#include "launch/netsim.h"
#include "membership/member.h"
#include "proto/job_model.h"
#include "proto/secure.h"
#include "worker/ps_client.h"

enum { MAX_SHARDS = 16 };
/* The frame size of both runs: the ps client's (ps_client.c, PS_FRAME_KEYS). */
#define FRAME_BYTES ((size_t)1 << 20)

static char bin_dir[PATH_MAX], tmp_dir[64], key_path[PATH_MAX];
static ts_netsim *netsim; /* the virtual cluster, or NULL: this machine */

/* ---- processes ---- */

/* The address processes of node `node` bind: its own on the virtual
 * cluster, else loopback. */
static const char *node_addr(int node) { return netsim ? netsim->addr[node] : "127.0.0.1"; }

/* Starts bin_dir/prog with args (NULL-terminated) on node (through
 * tessera-netsim exec on the virtual cluster); its stdout comes back
 * through *out when out is not NULL. Returns the pid. */
static pid_t spawn(int node, const char *prog, char *const *args, FILE **out) {
    int fd[2] = {-1, -1};
    if (out && pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(out ? fd[1] : null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        if (out) close(fd[0]), close(fd[1]);
        char path[PATH_MAX + 64], ns[PATH_MAX + 64], where[16];
        snprintf(path, sizeof path, "%s/%s", bin_dir, prog);
        if (!netsim) {
            execv(path, args);
            _exit(127);
        }
        char *argv[64] = {"tessera-netsim", "--name", netsim->name, "exec", where, path};
        snprintf(ns, sizeof ns, "%s/tessera-netsim", bin_dir);
        snprintf(where, sizeof where, "n%d", node);
        for (int i = 1; args[i - 1] && i < 58; i++) argv[5 + i] = args[i];
        execv(ns, argv);
        _exit(127);
    }
    if (out) {
        close(fd[1]);
        *out = fdopen(fd[0], "r");
    }
    return pid;
}

static void stop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* ---- raw ZeroMQ ---- */

static void no_free(void *data, void *hint) { (void)data, (void)hint; }

/* bench_ps --echo KEY ADDRESS [plain]: a CURVE ROUTER (plain: without
 * CURVE) bound at ADDRESS that answers every message with as many bytes in
 * the same frames; prints its endpoint, then serves until killed. */
static int echo_main(const char *key, const char *address, bool plain) {
    ts_secure_keys keys;
    void *ctx = zmq_ctx_new();
    if (ts_secure_load(key, &keys) || !ts_secure_zap_start(ctx, &keys)) return 1;
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[256], bind[300];
    size_t len = sizeof ep;
    snprintf(bind, sizeof bind, "tcp://%s:0", address);
    if ((!plain && ts_secure_server(s, &keys)) || zmq_bind(s, bind) || zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len))
        return 1;
    printf("listening %s\n", ep);
    fflush(stdout);
    unsigned char *reply = NULL;
    size_t reply_size = 0, sizes[4096];
    for (;;) {
        zmq_msg_t id, part;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, s, 0) < 0) return 1;
        size_t n = 0, total = 0;
        for (int more = 1; more && n < 4096; n++) { /* the frames of one message */
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, s, 0) < 0) return 1;
            sizes[n] = zmq_msg_size(&part);
            total += sizes[n];
            more = zmq_msg_more(&part);
            zmq_msg_close(&part);
        }
        if (total > reply_size && !(reply = realloc(reply, reply_size = total))) return 1;
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        for (size_t i = 0, at = 0; i < n; at += sizes[i++]) { /* as many bytes back, in the same frames */
            zmq_msg_t out;
            zmq_msg_init_data(&out, reply + at, sizes[i], no_free, NULL);
            zmq_msg_send(&out, s, i + 1 < n ? ZMQ_SNDMORE : 0);
        }
    }
}

typedef struct {
    pid_t pid[MAX_SHARDS];
    void *ctx, *sock[MAX_SHARDS];
    int n;
    size_t bytes; /* per echo and direction */
    void *buf;
} raw_run;

static int raw_start(raw_run *r, int n, size_t bytes, bool plain) {
    ts_secure_keys keys;
    memset(r, 0, sizeof *r);
    r->n = n;
    r->bytes = bytes;
    r->ctx = zmq_ctx_new();
    zmq_ctx_set(r->ctx, ZMQ_IO_THREADS, n < 4 ? n : 4); /* as the ps client does */
    r->buf = calloc(1, bytes);
    if (ts_secure_load(key_path, &keys) || !r->buf) return 1;
    for (int i = 0; i < n; i++) {
        int node = netsim ? 1 + i % (netsim->n - 1) : 0;
        char *args[] = {"bench_ps", "--echo", key_path, (char *)node_addr(node), plain ? "plain" : NULL, NULL};
        FILE *out = NULL;
        r->pid[i] = spawn(node, "bench_ps", args, &out);
        char line[300], ep[256] = "";
        while (out && fgets(line, sizeof line, out))
            if (sscanf(line, "listening %255s", ep) == 1) break;
        if (out) fclose(out);
        if (!ep[0]) return 1;
        r->sock[i] = zmq_socket(r->ctx, ZMQ_DEALER);
        if ((!plain && ts_secure_client(r->sock[i], &keys)) || zmq_connect(r->sock[i], ep)) return 1;
    }
    return 0;
}

/* One round: bytes to every echo and back, in frames of FRAME_BYTES as
 * the ps client cuts its ranges; ms. */
static double raw_round(raw_run *r) {
    double t0 = bench_now_ms();
    for (int i = 0; i < r->n; i++) {
        for (size_t at = 0; at < r->bytes; at += FRAME_BYTES) {
            size_t n = r->bytes - at < FRAME_BYTES ? r->bytes - at : FRAME_BYTES;
            zmq_msg_t m;
            zmq_msg_init_data(&m, (char *)r->buf + at, n, no_free, NULL);
            zmq_msg_send(&m, r->sock[i], at + n < r->bytes ? ZMQ_SNDMORE : 0);
        }
    }
    for (int i = 0; i < r->n; i++) {
        for (int more = 1; more;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            zmq_msg_recv(&m, r->sock[i], 0);
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
    }
    return bench_now_ms() - t0;
}

static void raw_stop(raw_run *r) {
    for (int i = 0; i < r->n; i++) {
        zmq_close(r->sock[i]);
        stop(r->pid[i]);
    }
    zmq_ctx_term(r->ctx);
    free(r->buf);
}

/* ---- the parameter servers ---- */

typedef struct {
    pid_t sched, ps[MAX_SHARDS];
    int n;
    ts_job job;
    ts_model *model;
    ts_member *member;
    ts_ps_client *c;
    int64_t step;
} ps_run;

/* Starts a scheduler and `shards` tessera-ps processes on the job and joins
 * as its worker; plain: with parallel.ps_security "none". */
static int ps_start(ps_run *r, int shards, int64_t hidden, const char *job_path, bool plain) {
    memset(r, 0, sizeof *r);
    r->n = shards;
    char text[1024], sets[3][64];
    snprintf(sets[0], sizeof sets[0], "parallel.servers=%d", shards);
    snprintf(sets[1], sizeof sets[1], "model.hidden=[%lld]", (long long)hidden);
    snprintf(sets[2], sizeof sets[2], "parallel.ps_security=\"%s\"", plain ? "none" : "curve");
    const char *const set_list[] = {sets[0], sets[1], sets[2]};
    if (ts_job_load(job_path, set_list, 3, &r->job)) return fprintf(stderr, "bench_ps: %s\n", ts_last_error()), 1;
    char servers[32];
    snprintf(servers, sizeof servers, "--servers=%d", shards);
    char bind[64];
    snprintf(bind, sizeof bind, "tcp://%s:0", node_addr(0));
    char *sargs[] = {"tessera-scheduler", "--bind", bind, "--job", r->job.name, "--key-file", key_path,
                     "--min-workers=1", servers, "--heartbeat-ms=200", "--heartbeat-timeout-ms=5000", NULL};
    FILE *out = NULL;
    r->sched = spawn(0, "tessera-scheduler", sargs, &out);
    char addr[256] = "";
    while (out && fgets(text, sizeof text, out))
        if (sscanf(text, "listening %255s", addr) == 1) break;
    if (!addr[0]) return fprintf(stderr, "bench_ps: the scheduler did not start\n"), 1;
    for (int i = 0; i < shards; i++) {
        int node = netsim ? 1 + i % (netsim->n - 1) : 0;
        char at[64];
        snprintf(at, sizeof at, "parallel.bind=%s", node_addr(node));
        char *pargs[] = {"tessera-ps", "--scheduler", addr, "--key-file", key_path, "--job", (char *)job_path,
                         "--set", sets[0], "--set", sets[1], "--set", sets[2], "--set", at, NULL};
        r->ps[i] = spawn(node, "tessera-ps", pargs, NULL);
    }
    ts_member_options opt = {.scheduler = addr, .job = r->job.name, .key_file = key_path, .role = TS_ROLE_WORKER,
                             .caps = "bench", .prev_rank = -1, .timeout_ms = 30000};
    ts_model_spec spec;
    if (ts_member_join(&opt, &r->member) || ts_job_model_spec(&r->job, &spec) ||
        !(r->model = ts_model_build(&spec, 0, -1, ts_key_from_seed(1), TS_F32)))
        return fprintf(stderr, "bench_ps: %s\n", ts_last_error()), 1;
    ts_model *m = r->model;
    ts_range *t = malloc((size_t)m->n_params * sizeof *t);
    for (int i = 0; t && i < m->n_params; i++) t[i] = (ts_range){m->params[i].offset, m->params[i].numel};
    ts_ps_client_config cfg = {.job = &r->job, .member = r->member, .key_file = key_path, .tensors = t,
                               .n_tensors = m->n_params, .numel = m->numel, .params = ts_f32(m->flat_params),
                               .grads = ts_f32(m->flat_grads)};
    r->c = t ? ts_ps_client_create(&cfg) : NULL;
    free(t);
    if (!r->c) return fprintf(stderr, "bench_ps: %s\n", ts_last_error()), 1;
    return 0;
}

/* One step's conversation: push all, commit, apply, pull all; ms. */
static double ps_round(ps_run *r) {
    double t0 = bench_now_ms();
    uint64_t g;
    int index, workers;
    ts_ps_client_workers(r->c, &g, &index, &workers);
    r->step++;
    ts_ps_client_begin(r->c, r->step, g);
    double v[TS_COMMIT_VALUES] = {1, 1, 0, 0, 0, 0}, out[TS_DECIDED_VALUES];
    ts_ps_pulled pulled;
    if (ts_ps_client_ready(r->c, 0, r->model->numel) || ts_ps_client_commit(r->c, v, true, out) ||
        ts_ps_client_apply(r->c, out[TS_DECIDED_SQ_NORM]) || ts_ps_client_pull(r->c, r->step) ||
        ts_ps_client_pull_wait(r->c, &pulled)) {
        fprintf(stderr, "bench_ps: step %lld: %s\n", (long long)r->step, ts_last_error());
        exit(1);
    }
    return bench_now_ms() - t0;
}

static void ps_stop(ps_run *r) {
    ts_ps_client_free(r->c);
    ts_member_leave(r->member, "benchmark done");
    stop(r->sched);
    for (int i = 0; i < r->n; i++) stop(r->ps[i]);
    ts_model_free(r->model);
}

int main(int argc, char **argv) {
    ts_threads_passive(argv);
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "--echo")) return echo_main(argv[2], argv[3], argc == 5);
    int64_t numel = 10000000;
    int reps = 9, shards[8] = {1, 2, 4}, nshards = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--numel") && i + 1 < argc) {
            numel = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--netsim") && i + 1 < argc) {
            static ts_netsim ns;
            ts_job_ints none = {0};
            if (ts_netsim_load(argv[++i], &none, &ns)) return fprintf(stderr, "bench_ps: %s\n", ts_last_error()), 1;
            if (ns.n < 2) return fprintf(stderr, "bench_ps: the virtual cluster needs 2 nodes or more\n"), 1;
            netsim = &ns;
        } else if (!strcmp(argv[i], "--shards") && i + 1 < argc) {
            nshards = 0;
            for (char *s = strtok(argv[++i], ","); s && nshards < 8; s = strtok(NULL, ",")) shards[nshards++] = atoi(s);
        } else {
            fprintf(stderr, "usage: bench_ps [--numel N] [--shards 1,2,4] [--reps R] [--netsim NAME]\n");
            return 2;
        }
    }
    if (bench_bin_dir(bin_dir, sizeof bin_dir)) return 1;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/bench-ps-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    snprintf(key_path, sizeof key_path, "%s/job.key", tmp_dir);
    if (ts_secure_keygen(key_path, NULL)) return fprintf(stderr, "bench_ps: %s\n", ts_last_error()), 1;
    /* an MLP 784-H-10 of about numel parameters: 795 H + 10 */
    int64_t hidden = (numel - 10) / 795;
    char job_path[PATH_MAX + 16];
    snprintf(job_path, sizeof job_path, "%s/job.json", tmp_dir);
    FILE *f = fopen(job_path, "w");
    if (!f) return 1;
    fprintf(f, "{\"name\": \"bench-ps\", \"model\": {\"arch\": \"mlp\", \"hidden\": [%lld]},\n"
               " \"optimizer\": {\"kind\": \"sgd\", \"lr\": 0.0},\n"
               " \"parallel\": {\"strategy\": \"ps\", \"workers\": 1, \"servers\": 1, \"heartbeat_ms\": 200, "
               "\"heartbeat_timeout_ms\": 5000}}\n", (long long)hidden);
    fclose(f);
    int64_t keys = 784 * hidden + hidden + hidden * 10 + 10;
    double gb = 2.0 * (double)keys * 4 / 1e9;
    if (netsim)
        printf("push + pull of %lld floats (%.1f MB each way) from n0 to shards on %d other nodes of virtual cluster "
               "%s; median of %d rounds\n", (long long)keys, (double)keys * 4 / 1e6, netsim->n - 1,
               netsim->name, reps);
    else
        printf("push + pull of %lld floats (%.1f MB each way) over loopback; median of %d rounds\n",
               (long long)keys, (double)keys * 4 / 1e6, reps);
    printf("%6s  %9s %9s  %9s %9s  %6s  |  %9s %9s  %6s\n", "", "raw", "ps", "raw", "ps", "ps/raw", "raw", "ps",
           "ps/raw");
    printf("%6s  %9s %9s  %9s %9s  %6s  |  %9s %9s  %6s\n", "shards", "ms", "ms", "GB/s", "GB/s", "CURVE", "GB/s",
           "GB/s", "plain");
    for (int k = 0; k < nshards; k++) {
        int s = shards[k];
        raw_run raw, plain;
        ps_run ps, ps_plain;
        size_t share = (size_t)keys * 4 / (size_t)s;
        if (s < 1 || s > MAX_SHARDS || raw_start(&raw, s, share, false) || raw_start(&plain, s, share, true) ||
            ps_start(&ps, s, hidden, job_path, false) || ps_start(&ps_plain, s, hidden, job_path, true))
            return fprintf(stderr, "bench_ps: cannot start %d shards\n", s), 1;
        double *t[4];
        for (int j = 0; j < 4; j++) t[j] = calloc((size_t)reps, sizeof *t[j]);
        for (int i = -2; i < reps; i++) {
            double a = raw_round(&raw), b = ps_round(&ps), c = raw_round(&plain), d = ps_round(&ps_plain);
            if (i >= 0) t[0][i] = a, t[1][i] = b, t[2][i] = c, t[3][i] = d;
        }
        double m[4];
        for (int j = 0; j < 4; j++) m[j] = bench_upper_median(t[j], (size_t)reps);
        printf("%6d  %9.1f %9.1f  %9.3f %9.3f  %6.2f  |  %9.3f %9.3f  %6.2f\n", s, m[0], m[1], gb / (m[0] / 1e3),
               gb / (m[1] / 1e3), m[0] / m[1], gb / (m[2] / 1e3), gb / (m[3] / 1e3), m[2] / m[3]);
        fflush(stdout);
        for (int j = 0; j < 4; j++) free(t[j]);
        raw_stop(&raw);
        raw_stop(&plain);
        ps_stop(&ps);
        ps_stop(&ps_plain);
    }
    unlink(key_path);
    unlink(job_path);
    rmdir(tmp_dir);
    return 0;
}
