/* config.h - tessera-scheduler command line.
 *
 * ts_sched_config_parse() reads the flags documented in scheduler/README.md
 * into a ts_sched_config, fills defaults and checks ranges; an unknown flag,
 * a missing value or a value out of range is an error naming the flag.
 * The key file may also come from the environment (TESSERA_KEY_FILE).
 */
#ifndef TS_SCHED_CONFIG_H
#define TS_SCHED_CONFIG_H

#include "kernels/status.h"

enum { TS_SCHED_STR_MAX = 1024 };

typedef struct {
    char bind[TS_SCHED_STR_MAX];     /* endpoint to bind, port 0 = pick */
    char job[TS_SCHED_STR_MAX];      /* job id every message must carry */
    char key_file[TS_SCHED_STR_MAX]; /* the job's CURVE key file */
    int min_workers;                 /* rendezvous waits for this many */
    int max_workers;                 /* elastic joins stop here */
    int expect_workers;              /* workers started with the job: the
                                        rendezvous gives those beyond the
                                        minimum a last call */
    int servers;                     /* parameter servers to wait for */
    int heartbeat_ms;                /* interval nodes are told to use */
    int heartbeat_timeout_ms;        /* silent longer -> dead */
    int barrier_timeout_ms;          /* barrier not reached -> error */
    int rendezvous_timeout_ms;       /* minimum not joined -> job fails */
    long long steps;                 /* steps of the job, 0 = until SIGTERM */
    int change_at_boundary;          /* 1: generations start at step boundaries only */
} ts_sched_config;

/* Parses argv[1..argc-1] into *cfg. Sets *help when --help was given (cfg is
 * then not validated). */
ts_status ts_sched_config_parse(int argc, char **argv, ts_sched_config *cfg,
                                int *help);

/* The usage text printed by --help. */
const char *ts_sched_config_usage(void);

#endif
