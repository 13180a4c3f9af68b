/* main.c - tessera-serve: command line, token and TLS files, signals. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/threads.h"
#include "serve/http.h"

enum { MAX_MODELS = 16, MAX_SECRET_FILE = 1 << 20 };

static const char usage[] =
    "usage: tessera-serve --model NAME=CHECKPOINT_DIR | --model NAME=WEIGHTS.safetensors:JOB.json\n"
    "           [--model ...] --token-file PATH [options]\n"
    "  --token-file PATH        the bearer token every endpoint but /healthz needs\n"
    "                           (first line of the file; never on the command line)\n"
    "  --bind ADDR              address to listen on (default 127.0.0.1)\n"
    "  --port N                 port (default 8080; 0: any free port, printed)\n"
    "  --max-batch N            samples per forward pass (default 32; 1: no batching)\n"
    "  --batch-timeout-ms MS    how long a request waits for others to batch with (default 2)\n"
    "  --max-body-bytes N       larger request bodies get 413 (default 16777216)\n"
    "  --request-timeout-s S    a connection silent this long is closed (default 10)\n"
    "  --max-connections N      open connections at most (default 256)\n"
    "  --max-tokens N           longest :generate (default 1024)\n"
    "  --tls-cert PEM --tls-key PEM   serve HTTPS only\n";

/* The contents of path (NUL-terminated, malloc'd), or NULL with a message. */
static char *read_file(const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    struct stat sb;
    char *buf = NULL;
    if (!f || fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode) || sb.st_size > MAX_SECRET_FILE ||
        !(buf = malloc((size_t)sb.st_size + 1)) || fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        fprintf(stderr, "tessera-serve: %s %s: cannot read it (a regular file of at most %d bytes)\n", what, path,
                MAX_SECRET_FILE);
        free(buf);
        buf = NULL;
    } else {
        buf[sb.st_size] = '\0';
    }
    if (f) fclose(f);
    return buf;
}

/* The token: the file's first line, without surrounding blanks. */
static char *read_token(const char *path) {
    char *t = read_file(path, "--token-file");
    if (!t) return NULL;
    t[strcspn(t, "\r\n")] = '\0';
    size_t len = strlen(t);
    while (len && (t[len - 1] == ' ' || t[len - 1] == '\t')) t[--len] = '\0';
    size_t lead = strspn(t, " \t");
    memmove(t, t + lead, len - lead + 1);
    if (strlen(t) < 8) {
        fprintf(stderr, "tessera-serve: --token-file %s: the token is empty or shorter than 8 characters\n", path);
        free(t);
        return NULL;
    }
    return t;
}

/* A positive integer flag value in [lo, hi], or -1 after a message. */
static long number(const char *flag, const char *v, long lo, long hi) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n < lo || n > hi) {
        fprintf(stderr, "tessera-serve: %s: \"%s\" is not an integer in [%ld, %ld]\n", flag, v, lo, hi);
        return -1;
    }
    return n;
}

typedef struct {
    const char *specs[MAX_MODELS];
    int n_models;
    const char *token_file, *cert_file, *key_file;
    ts_serve_config cfg;
    ts_serve_batching batching;
} options;

static int parse(int argc, char **argv, options *o) {
    o->cfg = (ts_serve_config){.bind = "127.0.0.1", .port = 8080, .max_body = 16u << 20, .request_timeout_s = 10,
                               .max_connections = 256, .max_tokens = 1024};
    o->batching = (ts_serve_batching){.max_batch = 32, .batch_timeout_ms = 2};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n = 0;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(usage, stdout);
            exit(0);
        }
        if (!strcmp(f, "--token")) {
            fprintf(stderr, "tessera-serve: a token goes in a file, never on the command line: --token-file PATH\n");
            return -1;
        }
        if (f[0] != '-' || !v) {
            fprintf(stderr, "tessera-serve: %s %s\n%s", f, f[0] == '-' ? "needs a value" : "is not an option", usage);
            return -1;
        }
        i++;
        if (!strcmp(f, "--model")) {
            if (o->n_models == MAX_MODELS) {
                fprintf(stderr, "tessera-serve: at most %d models\n", MAX_MODELS);
                return -1;
            }
            o->specs[o->n_models++] = v;
        } else if (!strcmp(f, "--token-file")) o->token_file = v;
        else if (!strcmp(f, "--tls-cert")) o->cert_file = v;
        else if (!strcmp(f, "--tls-key")) o->key_file = v;
        else if (!strcmp(f, "--bind")) o->cfg.bind = v;
        else if (!strcmp(f, "--port")) n = o->cfg.port = (int)number(f, v, 0, 65535);
        else if (!strcmp(f, "--max-batch")) n = o->batching.max_batch = (int)number(f, v, 1, 4096);
        else if (!strcmp(f, "--batch-timeout-ms")) n = o->batching.batch_timeout_ms = (int)number(f, v, 0, 10000);
        else if (!strcmp(f, "--max-body-bytes")) n = number(f, v, 1024, 1L << 32), o->cfg.max_body = (size_t)n;
        else if (!strcmp(f, "--request-timeout-s")) n = o->cfg.request_timeout_s = (int)number(f, v, 1, 3600);
        else if (!strcmp(f, "--max-connections")) n = o->cfg.max_connections = (int)number(f, v, 1, 4096);
        else if (!strcmp(f, "--max-tokens")) n = o->cfg.max_tokens = (int)number(f, v, 1, 1 << 20);
        else {
            fprintf(stderr, "tessera-serve: unknown option %s\n%s", f, usage);
            return -1;
        }
        if (n < 0) return -1;
    }
    if (!o->n_models || !o->token_file) {
        fprintf(stderr, "tessera-serve: %s\n%s", o->n_models ? "--token-file PATH is required" : "no --model given", usage);
        return -1;
    }
    if (!o->cert_file != !o->key_file) {
        fprintf(stderr, "tessera-serve: TLS needs both --tls-cert and --tls-key\n");
        return -1;
    }
    return 0;
}

/* Loads "NAME=PATH[:JOB]". */
static ts_serve_model *load_model(const char *arg, const ts_serve_batching *b) {
    char spec[2 * PATH_MAX];
    char *eq = snprintf(spec, sizeof spec, "%s", arg) < (int)sizeof spec ? strchr(spec, '=') : NULL;
    if (!eq || eq == spec || !eq[1]) {
        fprintf(stderr, "tessera-serve: --model %s: expected NAME=CHECKPOINT_DIR or NAME=WEIGHTS:JOB.json\n", arg);
        return NULL;
    }
    *eq = '\0';
    char *path = eq + 1, *job = strrchr(path, ':');
    if (job) *job++ = '\0';
    ts_serve_model *m = ts_serve_model_load(spec, path, job, b);
    if (!m) fprintf(stderr, "tessera-serve: %s\n", ts_last_error());
    else
        printf("tessera-serve: model %s: %s, %lld parameters, from %s%s%s\n", m->name,
               m->spec.arch == TS_ARCH_MLP ? "MLP" : m->spec.arch == TS_ARCH_CNN ? "CNN" : "GPT",
               (long long)m->model->numel, path, job ? " with job " : "", job ? job : "");
    return m;
}

int main(int argc, char **argv) {
    ts_threads_passive(argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    options o = {0};
    if (parse(argc, argv, &o)) return 2;
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL); /* every thread inherits it; main waits for them */
    signal(SIGPIPE, SIG_IGN);

    int code = 1;
    ts_serve_model *models[MAX_MODELS] = {0};
    char *token = read_token(o.token_file), *cert = NULL, *key = NULL;
    ts_server *server = NULL;
    o.batching.metrics = o.cfg.metrics = ts_serve_metrics_new();
    bool ok = token && o.cfg.metrics;
    if (ok && o.cert_file) ok = (cert = read_file(o.cert_file, "--tls-cert")) && (key = read_file(o.key_file, "--tls-key"));
    for (int i = 0; ok && i < o.n_models; i++) {
        for (int j = 0; j < i && ok; j++)
            if (!strncmp(o.specs[j], o.specs[i], strcspn(o.specs[i], "=") + 1)) {
                fprintf(stderr, "tessera-serve: --model %s: the name is given twice\n", o.specs[i]);
                ok = false;
            }
        ok = ok && (models[i] = load_model(o.specs[i], &o.batching));
    }
    if (ok) {
        o.cfg.token = token;
        o.cfg.tls_cert = cert;
        o.cfg.tls_key = key;
        o.cfg.models = models;
        o.cfg.n_models = o.n_models;
        server = ts_server_start(&o.cfg);
        if (!server) fprintf(stderr, "tessera-serve: %s\n", ts_last_error());
    }
    if (server) {
        printf("tessera-serve: listening on %s://%s:%d (max batch %d, batch timeout %d ms)\n", cert ? "https" : "http",
               o.cfg.bind, ts_server_port(server), o.batching.max_batch, o.batching.batch_timeout_ms);
        int sig = 0;
        sigwait(&stop, &sig);
        printf("tessera-serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        ts_server_stop(server);
        code = 0;
    }
    for (int i = 0; i < o.n_models; i++) ts_serve_model_free(models[i]);
    ts_serve_metrics_free(o.cfg.metrics);
    free(token);
    free(cert);
    free(key);
    return code;
}
