/* netsim.c - what the links of a virtual cluster (launch/tessera-netsim)
 * carry: TCP throughput, TCP round trip, and Open MPI's MPI_Allreduce.
 *
 *   bench_netsim serve [--port P]
 *       accepts connections on 0.0.0.0:P (default 5201) until killed; prints
 *       "serving on port P" once listening. Each connection is a stream
 *       (the client sends until it shuts down its side; the server answers
 *       with the byte count) or a ping-pong (1-byte echo).
 *   bench_netsim stream HOST [--port P] [--seconds S]
 *       sends to HOST's server for S seconds (default 3) and prints
 *       "stream HOST: R MB/s (G Gbit/s) ...": the bytes the server received
 *       over the time from the first byte sent to the server's answer.
 *   bench_netsim rr HOST [--port P] [--count N]
 *       N 1-byte round trips (default 20000, TCP_NODELAY, 1000 more first as
 *       warm-up); prints the median and p99 in microseconds.
 *   mpirun ... bench_netsim allreduce [--mib M] [--iters K]
 *       MPI_Allreduce (sum, float) of M MiB (default 64) on every rank, K
 *       timed rounds (default 10) after 2 warm-up rounds; each round's time
 *       is the slowest rank's. Prints the ranks' hosts, the median time and
 *       the bus bandwidth 2(N-1)/N * bytes / time (nccl-tests' busbw: what
 *       each rank's link carries for a ring allreduce), also its min and max.
 *       Checks the sum. Needs a build with TESSERA_WITH_MPI.
 *
 * Run on the nodes with "tessera-netsim exec NODE bench_netsim ..." and
 * "tessera-netsim mpirun -np N bench_netsim allreduce"; bench/netsim.sh
 * runs the whole table of bench/RESULTS.md.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#if TESSERA_WITH_MPI
#include <mpi.h>
#endif

#include "bench_util.h"

enum { DEFAULT_PORT = 5201, CHUNK = 1 << 20, RR_WARMUP = 1000 };

static const char usage[] =
    "usage: bench_netsim serve [--port P]\n"
    "       bench_netsim stream HOST [--port P] [--seconds S]\n"
    "       bench_netsim rr HOST [--port P] [--count N]\n"
    "       mpirun ... bench_netsim allreduce [--mib M] [--iters K]\n";

/* Options of every mode; each mode reads the ones it knows. */
typedef struct {
    const char *host;
    int port;
    double seconds;
    long count;
    long mib;
    int iters;
} opts;

/* Parses argv[2..] into *o; returns 0, or -1 after saying what is wrong. */
static int parse_opts(int argc, char **argv, opts *o) {
    *o = (opts){NULL, DEFAULT_PORT, 3.0, 20000, 64, 10};
    for (int i = 2; i < argc; i++) {
        const char *flag = argv[i];
        if (flag[0] != '-') {
            if (o->host) {
                fprintf(stderr, "bench_netsim: unexpected argument %s\n%s", flag, usage);
                return -1;
            }
            o->host = flag;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_netsim: %s needs a value\n", flag);
            return -1;
        }
        char *end;
        double v = strtod(argv[++i], &end);
        if (*end != '\0' || !(v > 0) || v > 1e9) {
            fprintf(stderr, "bench_netsim: %s %s: expected a positive number\n", flag,
                    argv[i]);
            return -1;
        }
        if (strcmp(flag, "--port") == 0 && v < 65536) o->port = (int)v;
        else if (strcmp(flag, "--seconds") == 0) o->seconds = v;
        else if (strcmp(flag, "--count") == 0) o->count = (long)v;
        else if (strcmp(flag, "--mib") == 0 && v <= 2048) o->mib = (long)v;
        else if (strcmp(flag, "--iters") == 0 && v <= 100000) o->iters = (int)v;
        else {
            fprintf(stderr, "bench_netsim: unknown or out-of-range option %s %s\n%s",
                    flag, argv[i], usage);
            return -1;
        }
    }
    return 0;
}

/* Writes all n bytes of buf; 0, or -1 with errno set. */
static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads exactly n bytes into buf; 0, or -1 (end of stream or error). */
static int read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Serves one connection: its first byte says stream ('S') or ping-pong ('R'). */
static void serve_one(int fd) {
    char kind;
    if (read_all(fd, &kind, 1) != 0) return;
    if (kind == 'S') {
        char *buf = malloc(CHUNK);
        if (!buf) return;
        uint64_t total = 0;
        ssize_t r;
        while ((r = read(fd, buf, CHUNK)) > 0 || (r < 0 && errno == EINTR))
            if (r > 0) total += (uint64_t)r;
        free(buf);
        write_all(fd, &total, sizeof total);
    } else if (kind == 'R') {
        char b;
        while (read_all(fd, &b, 1) == 0 && write_all(fd, &b, 1) == 0) {}
    }
}

/* serve: one forked child per connection, until killed. */
static int run_serve(const opts *o) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 64) != 0) {
        fprintf(stderr, "bench_netsim serve: cannot listen on port %d: %s\n", o->port,
                strerror(errno));
        return 1;
    }
    signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
    printf("serving on port %d\n", o->port);
    fflush(stdout);
    for (;;) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            fprintf(stderr, "bench_netsim serve: accept: %s\n", strerror(errno));
            return 1;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(ls);
            serve_one(fd);
            _exit(0);
        }
        close(fd);
    }
}

/* Connects to host:port; the socket, or -1 after saying why. */
static int dial(const char *host, int port) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "bench_netsim: %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    int fd = socket(res->ai_family, res->ai_socktype, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        fprintf(stderr, "bench_netsim: cannot connect to %s:%d: %s\n", host, port,
                strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* stream: sends for o->seconds, then reads the server's byte count. */
static int run_stream(const opts *o) {
    int fd = dial(o->host, o->port);
    char *buf = calloc(1, CHUNK);
    if (fd < 0 || !buf) {
        free(buf);
        return 1;
    }
    double t0 = bench_now_ms(), deadline = t0 + o->seconds * 1e3;
    int bad = write_all(fd, "S", 1) != 0;
    while (!bad && bench_now_ms() < deadline) bad = write_all(fd, buf, CHUNK) != 0;
    uint64_t received = 0;
    bad = bad || shutdown(fd, SHUT_WR) != 0 || read_all(fd, &received, sizeof received) != 0;
    double ms = bench_now_ms() - t0;
    close(fd);
    free(buf);
    if (bad) {
        fprintf(stderr, "bench_netsim stream %s: connection failed: %s\n", o->host,
                strerror(errno));
        return 1;
    }
    double mbps = (double)received / ms / 1e3; /* MB/s, 10^6 bytes */
    printf("stream %s: %.1f MB/s (%.3f Gbit/s) %.1f MB in %.2f s\n", o->host, mbps,
           mbps * 8 / 1e3, (double)received / 1e6, ms / 1e3);
    return 0;
}

/* rr: 1-byte ping-pongs; median and p99 of the round trips. */
static int run_rr(const opts *o) {
    int fd = dial(o->host, o->port);
    double *us = malloc((size_t)o->count * sizeof *us);
    if (fd < 0 || !us) {
        free(us);
        if (fd >= 0) close(fd);
        return 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int bad = write_all(fd, "R", 1) != 0;
    char b = 'x';
    for (long i = -RR_WARMUP; i < o->count && !bad; i++) {
        double t = bench_now_ms();
        bad = write_all(fd, &b, 1) != 0 || read_all(fd, &b, 1) != 0;
        if (i >= 0) us[i] = (bench_now_ms() - t) * 1e3;
    }
    close(fd);
    if (bad) {
        fprintf(stderr, "bench_netsim rr %s: connection failed: %s\n", o->host,
                strerror(errno));
        free(us);
        return 1;
    }
    bench_sort(us, (size_t)o->count);
    printf("rr %s: median %.1f us, p99 %.1f us over %ld round trips\n", o->host,
           us[o->count / 2], us[o->count * 99 / 100], o->count);
    free(us);
    return 0;
}

#if TESSERA_WITH_MPI
/* allreduce: timed MPI_Allreduce rounds of o->mib MiB, checked. */
static int run_allreduce(int argc, char **argv, const opts *o) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t count = (size_t)o->mib * (1 << 20) / sizeof(float);
    float *send = malloc(count * sizeof *send), *recv = malloc(count * sizeof *recv);
    double *ms = malloc((size_t)o->iters * sizeof *ms);
    char host[MPI_MAX_PROCESSOR_NAME] = "", *hosts = malloc((size_t)n * sizeof host);
    int len, ok = send && recv && ms && hosts, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (rank == 0) fprintf(stderr, "bench_netsim allreduce: out of memory\n");
        MPI_Finalize();
        return 1;
    }
    MPI_Get_processor_name(host, &len);
    MPI_Gather(host, sizeof host, MPI_CHAR, hosts, sizeof host, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    for (size_t i = 0; i < count; i++) send[i] = (float)(rank + 1);

    int wrong = 0;
    for (int it = -2; it < o->iters; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = (MPI_Wtime() - t) * 1e3, slowest;
        MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (it >= 0) ms[it] = slowest;
        float want = (float)n * (float)(n + 1) / 2;
        wrong += recv[0] != want || recv[count / 2] != want || recv[count - 1] != want;
    }
    int all_wrong;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("allreduce %ld MiB over %d ranks on", o->mib, n);
        for (int r = 0; r < n; r++) printf("%s%s", r ? "," : " ", hosts + r * sizeof host);
        printf("\n");
        bench_sort(ms, (size_t)o->iters);
        double bytes = (double)count * sizeof(float), factor = 2.0 * (n - 1) / n;
        double med = ms[o->iters / 2], lo = ms[0], hi = ms[o->iters - 1];
        printf("allreduce time median %.1f ms (min %.1f, max %.1f) over %d rounds; "
               "busbw median %.1f MB/s (min %.1f, max %.1f)%s\n",
               med, lo, hi, o->iters, factor * bytes / med / 1e3,
               factor * bytes / hi / 1e3, factor * bytes / lo / 1e3,
               all_wrong ? "; WRONG SUMS" : "");
    }
    free(send);
    free(recv);
    free(ms);
    free(hosts);
    MPI_Bcast(&all_wrong, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return all_wrong ? 1 : 0;
}
#else
static int run_allreduce(int argc, char **argv, const opts *o) {
    (void)argc, (void)argv, (void)o;
    fprintf(stderr, "bench_netsim allreduce: this build has no MPI support\n");
    return 1;
}
#endif

int main(int argc, char **argv) {
    opts o;
    if (argc < 2 || parse_opts(argc, argv, &o) != 0) {
        if (argc < 2) fputs(usage, stderr);
        return 2;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "serve") != 0 && strcmp(mode, "stream") != 0 &&
        strcmp(mode, "rr") != 0 && strcmp(mode, "allreduce") != 0) {
        fprintf(stderr, "bench_netsim: unknown mode %s\n%s", mode, usage);
        return 2;
    }
    int needs_host = strcmp(mode, "stream") == 0 || strcmp(mode, "rr") == 0;
    if (needs_host != (o.host != NULL)) {
        fprintf(stderr, "bench_netsim %s: %s\n%s", mode,
                needs_host ? "HOST is missing" : "takes no HOST", usage);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(mode, "serve") == 0) return run_serve(&o);
    if (strcmp(mode, "stream") == 0) return run_stream(&o);
    if (strcmp(mode, "rr") == 0) return run_rr(&o);
    return run_allreduce(argc, argv, &o);
}
