/* mpi.c - tessera-run --mpi: one node of the job per MPI process.
 *
 * Every process finds its role (by MPI rank, or --role for MPMD launches),
 * the roles are gathered so each process knows the layout, the scheduler's
 * process generates the job key, starts the scheduler in-process and
 * broadcasts its endpoint and the key file bytes; every process holds the
 * key in an anonymous memory file (memfd, 0600) that it names by its
 * /proc/self/fd path, so that no key lies on disk, not even after a rank
 * was killed. The node then runs in this
 * process (ts_sched_run, ts_ps_run or ts_worker_run) with MPI
 * initialised, so that its strategy can use MPI, and MPI is finalised after
 * it returns.
 */
#include "launch/launch.h"

#include <stdio.h>

#if TESSERA_WITH_MPI

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <mpi.h>
#include <stdbool.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "collective/mpi.h"
#include "kernels/io/atomic.h"
#include "ps/ps.h"
#include "proto/wire.h"
#include "proto/secure.h"
#include "scheduler/sched.h"
#include "worker/node.h"
#include "worker/trainer.h"

enum {
    KEY_FILE_MAX = 4096,
    TAG_ENDED = 7301,      /* a rank's node ended well: its message to the scheduler's rank */
    TAG_FINALIZE = 7302,   /* the scheduler's rank's answer: every rank ended well, finalise */
    DEAD_GRACE_MS = 3000,  /* how long the ranks that may be the declared dead ones still get */
};

/* The role of this process: --role, else by rank (0 scheduler, 1..S ps). */
static int local_role(const char *role, int rank, int servers, ts_proto_role *out) {
    if (role) {
        if (ts_proto_role_parse(role, out) != TS_OK) {
            fprintf(stderr, "tessera-run --mpi: --role %s: expected scheduler, ps "
                            "or worker\n", role);
            return -1;
        }
        return 0;
    }
    *out = rank == 0 ? TS_ROLE_SCHEDULER : rank <= servers ? TS_ROLE_PS : TS_ROLE_WORKER;
    return 0;
}

/* Whether nsched schedulers, nps ps and nworkers workers (the MPI layout,
 * which sets the job's world) can run job's strategy; if not, writes why
 * into why and the processes the job needs into np. */
static bool layout_fits(const ts_job *job, int nsched, int nps, int nworkers, char *why, size_t cap, int *np) {
    const ts_job_parallel *p = &job->parallel;
    bool pipeline = p->strategy == TS_STRATEGY_PIPELINE;
    int ps = ts_job_ps_processes(job), workers = pipeline ? p->stages * p->data_parallel : 1;
    *np = 1 + ps + workers;
    if (nsched != 1 || nworkers < 1)
        snprintf(why, cap, "a job needs one scheduler and at least one worker");
    else if (nps % p->ps_replicas)
        snprintf(why, cap, "a shard needs %d ps (parallel.ps_replicas)", p->ps_replicas);
    else if (p->strategy == TS_STRATEGY_PS && nps == 0)
        snprintf(why, cap, "strategy \"ps\" needs at least one shard");
    else if (pipeline && nworkers != workers)
        snprintf(why, cap, "a pipeline of %d stages x %d replicas (parallel.data_parallel) needs exactly %d workers",
                 p->stages, p->data_parallel, workers);
    else
        return true;
    return false;
}

/* Reads the whole key file into buf; returns its length or -1. */
static long read_key(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap, f);
    int bad = ferror(f) || n == cap;
    fclose(f);
    return bad ? -1 : (long)n;
}

/* Makes a new job key in a private temporary folder and reads its bytes
 * into buf, removing the file and the folder at once; returns the length
 * or -1 (errno, or ts_last_error, says why). */
static long new_key(char *buf, size_t cap) {
    char dir[] = "/tmp/tessera-mpi-XXXXXX", path[sizeof dir + 8];
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/job.key", dir);
    long n = ts_secure_keygen(path, NULL) == TS_OK ? read_key(path, buf, cap) : -1;
    int err = errno;
    unlink(path);
    rmdir(dir);
    errno = err;
    return n;
}

/* Puts the key bytes in an anonymous memory file of mode 0600 and writes
 * its name (/proc/self/fd/N) into path; it goes with the process, however
 * that ends. Returns the descriptor or -1. */
static int hold_key(const char *bytes, long n, char *path, size_t cap) {
    int fd = memfd_create("tessera-job-key", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (fchmod(fd, 0600) != 0 || write(fd, bytes, (size_t)n) != (ssize_t)n) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

/* Whether every rank can reach the scheduler of root, bound to job's
 * parallel.bind: a loopback address only from root's own host. When not,
 * root says so, naming the hosts. Collective. */
static bool scheduler_reachable(const ts_job *job, int rank, int root) {
    char host[MPI_MAX_PROCESSOR_NAME] = "", root_host[MPI_MAX_PROCESSOR_NAME] = "";
    int len, elsewhere, ranks = 0;
    MPI_Get_processor_name(host, &len);
    memcpy(root_host, host, sizeof host);
    MPI_Bcast(root_host, sizeof root_host, MPI_CHAR, root, MPI_COMM_WORLD);
    elsewhere = strcmp(host, root_host) != 0;
    MPI_Allreduce(&elsewhere, &ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const char *bind = job->parallel.bind;
    bool loopback = strncmp(bind, "127.", 4) == 0 || strcmp(bind, "localhost") == 0 || strcmp(bind, "::1") == 0;
    if (!loopback || ranks == 0) return true;
    if (rank == root)
        fprintf(stderr, "tessera-run --mpi: the scheduler on host %s binds %s (parallel.bind), which the %d ranks "
                        "on other hosts cannot reach: set parallel.bind to an address of %s, or 0.0.0.0\n",
                root_host, bind, ranks, root_host);
    return false;
}

/* SIGINT or SIGTERM on a ps or worker rank: the scheduler's rank stops the
 * job. mpirun, which passed the signal on, relays the rank's output no more
 * (or too slowly): it goes to /dev/null from now on, so that no write
 * blocks on a full pipe (or dies of SIGPIPE) before the rank saved and
 * mpirun's SIGKILL comes. */
static void quiet_on_signal(int sig) {
    (void)sig;
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
}

/* On the scheduler's rank, once the job completed: waits for every other
 * rank's word that its node ended well (the ones that failed aborted the
 * MPI job instead). The scheduler declared `dead` members dead: as many
 * ranks may never end (stopped by SIGSTOP, or hung), and MPI_Finalize and
 * mpirun would wait for them for ever. Once only that many are missing,
 * they get DEAD_GRACE_MS more (a declared dead member may be a process
 * mpirun did not start), then every rank is ended by MPI_Abort with
 * status 0 - the job's own work, its final checkpoint among it, is done -
 * naming the missing ranks. Returns when every rank ended well, having
 * told them to finalise: a rank waits for that before MPI_Finalize, whose
 * fence over a rank that never comes makes Open MPI's mpirun (4.1) hang or
 * crash at the MPI_Abort. */
static void end_declared_dead(int size, int root, const int *roles, int dead) {
    MPI_Request *req = malloc((size_t)size * sizeof *req);
    int *codes = malloc((size_t)size * sizeof *codes), missing = size - 1;
    if (!req || !codes) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < size; i++) {
        req[i] = MPI_REQUEST_NULL;
        if (i != root) MPI_Irecv(&codes[i], 1, MPI_INT, i, TAG_ENDED, MPI_COMM_WORLD, &req[i]);
    }
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (int waited_ms = 0; missing > 0 && (missing > dead || waited_ms < DEAD_GRACE_MS);) {
        int idx, done;
        MPI_Testany(size, req, &idx, &done, MPI_STATUS_IGNORE);
        if (done && idx != MPI_UNDEFINED) {
            missing--;
        } else {
            nanosleep(&tick, NULL);
            waited_ms += missing <= dead ? 10 : 0;
        }
    }
    free(codes);
    if (missing == 0) {
        for (int i = 0; i < size; i++)
            if (i != root) MPI_Send(&missing, 1, MPI_INT, i, TAG_FINALIZE, MPI_COMM_WORLD);
        free(req);
        return;
    }
    char names[512] = "";
    size_t len = 0;
    for (int i = 0; i < size && len < sizeof names; i++)
        if (req[i] != MPI_REQUEST_NULL)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%d (%s)", len ? ", " : "", i,
                                    ts_proto_role_name((ts_proto_role)roles[i]));
    fprintf(stderr, "tessera-run --mpi: the job completed, but MPI rank%s %s, which the scheduler declared dead, "
                    "did not end (stopped or hung): ending every rank with MPI_Abort, status 0\n",
            missing > 1 ? "s" : "", names);
    MPI_Abort(MPI_COMM_WORLD, 0);
}

int ts_launch_mpi(const ts_cluster_opts *o, const char *role, int argc,
                  char **argv) {
    if (o->job.parallel.strategy == TS_STRATEGY_LOCAL) {
        fprintf(stderr, "tessera-run --mpi: %s: strategy \"local\" trains in one process; "
                        "choose a parallel strategy (standin, ps, ddp)\n", o->job_path);
        return 2;
    }
    ts_comm_mpi_init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    ts_job job = o->job;
    ts_proto_role mine;
    int bad = local_role(role, rank, ts_job_ps_processes(&job), &mine);
    int *roles = calloc((size_t)size, sizeof *roles);
    int r = bad ? -1 : (int)mine;
    if (!roles) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Allgather(&r, 1, MPI_INT, roles, 1, MPI_INT, MPI_COMM_WORLD);
    int root = -1, nsched = 0, nps = 0, nworkers = 0, nbad = 0;
    for (int i = 0; i < size; i++) {
        if (roles[i] == TS_ROLE_SCHEDULER) {
            nsched++;
            root = i;
        }
        nps += roles[i] == TS_ROLE_PS;
        nworkers += roles[i] == TS_ROLE_WORKER;
        nbad += roles[i] < 0;
    }
    char why[256];
    int np;
    if (nbad || !layout_fits(&job, nsched, nps, nworkers, why, sizeof why, &np)) {
        if (rank == 0 && !nbad)
            fprintf(stderr, "tessera-run --mpi: %s: %d processes give %d schedulers, %d ps and %d workers; %s "
                            "(mpirun -np %d%s for parallel.strategy \"%s\", parallel.servers = %d)\n",
                    o->job_path, size, nsched, nps, nworkers, why, np,
                    job.parallel.strategy == TS_STRATEGY_PIPELINE ? "" : " or more",
                    ts_job_strategy_name(job.parallel.strategy), job.parallel.servers);
        free(roles);
        MPI_Finalize();
        return 2;
    }
    /* the MPI layout decides the world */
    job.parallel.servers = nps / job.parallel.ps_replicas;
    job.parallel.workers = nworkers;
    if (job.parallel.min_workers > nworkers) job.parallel.min_workers = nworkers;
    if (job.parallel.max_workers < nworkers) job.parallel.max_workers = nworkers;

    char key_path[PATH_MAX] = "";
    char *key = calloc(1, KEY_FILE_MAX);
    char endpoint[TS_PROTO_ADDR_MAX + 1] = "";
    ts_sched *sched = NULL;
    long key_len = -1;
    int key_fd = -1;
    if (!key) MPI_Abort(MPI_COMM_WORLD, 1);

    if (rank == root) {
        if (job.parallel.key_file[0]) {
            snprintf(key_path, sizeof key_path, "%s", job.parallel.key_file);
            key_len = read_key(key_path, key, KEY_FILE_MAX);
        } else {
            key_len = new_key(key, KEY_FILE_MAX);
            if (key_len >= 0 && (key_fd = hold_key(key, key_len, key_path, sizeof key_path)) < 0)
                key_len = -1;
        }
        /* the scheduler ends the job by its steps: the epochs' at this world */
        if (key_len >= 0 && ts_trainer_steps(&job, &job.steps) != TS_OK) {
            fprintf(stderr, "tessera-run --mpi: %s\n", ts_last_error());
            key_len = -1;
        } else if (key_len < 0) {
            fprintf(stderr, "tessera-run --mpi: job key %s: %s\n", key_path[0] ? key_path : "(a new one)",
                    ts_last_error()[0] ? ts_last_error() : strerror(errno));
        } else {
            ts_argv a = {0};
            char bind[TS_JOB_BIND_MAX + 16];
            snprintf(bind, sizeof bind, "tcp://%s:0", job.parallel.bind);
            ts_argv_push(&a, "tessera-scheduler");
            ts_cluster_scheduler_args(&a, &job, bind, key_path);
            ts_sched_config cfg;
            int help = 0;
            if (ts_argv_ok(&a) &&
                ts_sched_config_parse(a.n, a.v, &cfg, &help) == TS_OK)
                sched = ts_sched_create(&cfg);
            ts_argv_free(&a);
            if (sched) {
                ts_proto_public_endpoint(ts_sched_endpoint(sched), endpoint, sizeof endpoint);
                printf("listening %s\n", endpoint);
                fflush(stdout);
            } else {
                fprintf(stderr, "tessera-run --mpi: scheduler: %s\n", ts_last_error());
                key_len = -1;
            }
        }
    }
    MPI_Bcast(&key_len, 1, MPI_LONG, root, MPI_COMM_WORLD);
    if (key_len < 0) { /* the scheduler could not start: everyone stops */
        MPI_Finalize();
        free(roles);
        free(key);
        return 1;
    }
    MPI_Bcast(key, (int)key_len, MPI_CHAR, root, MPI_COMM_WORLD);
    MPI_Bcast(endpoint, sizeof endpoint, MPI_CHAR, root, MPI_COMM_WORLD);
    if (!scheduler_reachable(&job, rank, root)) { /* nobody could join: everyone stops */
        ts_sched_destroy(sched);
        if (key_fd >= 0) close(key_fd);
        free(key);
        free(roles);
        MPI_Finalize();
        return 2;
    }
    int wrote = 1;
    if (rank != root) {
        key_fd = hold_key(key, key_len, key_path, sizeof key_path);
        wrote = key_fd >= 0;
        if (!wrote)
            fprintf(stderr, "tessera-run --mpi: rank %d: cannot hold the job key in a memory file: %s\n", rank,
                    strerror(errno));
    }
    free(key);
    /* each role's processes in a communicator of their own (the workers'
     * all-reduces, for strategies that use MPI) */
    MPI_Comm group;
    MPI_Comm_split(MPI_COMM_WORLD, (int)mine, rank, &group);

    char run_dir[TS_JOB_PATH_MAX + 16]; /* --run-dir, else the job's */
    ts_worker_run_dir(&job, o->run_dir, run_dir, sizeof run_dir);
    /* the scheduler's host's run folder records the job as its ranks make it */
    if (rank == root && (ts_io_make_run_dir(run_dir) || ts_cluster_write_job(run_dir, &job)))
        fprintf(stderr, "tessera-run --mpi: warning: %s\n", ts_last_error());
    int code = 1, declared_dead = 0;
    /* mpirun passes a Ctrl-C on to every rank as SIGTERM: the scheduler's
     * rank stops the job at a step the workers agree on, which they save
     * (a rank that stopped by itself would end the MPI job unsaved) */
    struct sigaction quiet = {.sa_handler = quiet_on_signal, .sa_flags = SA_RESTART};
    if (rank != root) sigaction(SIGINT, &quiet, NULL), sigaction(SIGTERM, &quiet, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (rank == root) {
        code = ts_sched_run(sched);
        declared_dead = ts_sched_declared_dead(sched);
        ts_sched_destroy(sched);
    } else if (wrote && mine == TS_ROLE_PS) {
        ts_ps_options po = {.job = &job, .scheduler = endpoint, .key_file = key_path, .rank = -1, .run_dir = run_dir,
                            .resume = o->resume};
        code = ts_ps_run(&po);
    } else if (wrote) {
        ts_worker_options wo = {.job = &job, .scheduler = endpoint, .key_file = key_path, .rank = -1,
                                .run_dir = run_dir, .resume = o->resume, .force = o->force,
                                .prog = "tessera-run --mpi", .mpi_comm = &group};
        code = ts_worker_run(&wo);
    }
    if (key_fd >= 0) close(key_fd);
    if (code != 0) {
        /* the job cannot go on without this node, and a collective it gave
         * up on may still be in flight (MPI cannot cancel one): end every
         * rank now rather than finalise around it */
        fprintf(stderr, "tessera-run --mpi: rank %d failed (exit %d): aborting the MPI job\n", rank, code);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    if (rank != root) {
        MPI_Send(&code, 1, MPI_INT, root, TAG_ENDED, MPI_COMM_WORLD);
        MPI_Recv(&code, 1, MPI_INT, root, TAG_FINALIZE, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else
        end_declared_dead(size, root, roles, declared_dead);
    free(roles);
    MPI_Comm_free(&group);
    MPI_Finalize();
    return code;
}

#else

int ts_launch_mpi(const ts_cluster_opts *o, const char *role, int argc,
                  char **argv) {
    (void)o, (void)role, (void)argc, (void)argv;
    fprintf(stderr, "tessera-run --mpi: this build has no MPI support "
                    "(configure with TESSERA_WITH_MPI=ON and Open MPI installed)\n");
    return 2;
}

#endif
