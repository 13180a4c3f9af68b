/* config.c - tessera-scheduler flag parsing and validation. */
#include "scheduler/config.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char USAGE[] =
    "usage: tessera-scheduler --key-file PATH [options]\n"
    "  --bind ENDPOINT            endpoint to bind (default tcp://127.0.0.1:0,\n"
    "                             port 0 picks a free port)\n"
    "  --job ID                   job id carried by every message (default tessera)\n"
    "  --key-file PATH            the job's CURVE key file (or TESSERA_KEY_FILE)\n"
    "  --min-workers N            workers the rendezvous waits for (default 1)\n"
    "  --max-workers N            elastic joins stop at N (default min-workers)\n"
    "  --expect-workers N         workers started with the job: once the minimum\n"
    "                             joined, the rest get one heartbeat timeout more\n"
    "                             to join the first generation (default min-workers)\n"
    "  --servers S                parameter servers to wait for (default 0)\n"
    "  --heartbeat-ms N           heartbeat interval told to nodes (default 1000)\n"
    "  --heartbeat-timeout-ms N   silent longer is dead (default 5000)\n"
    "  --barrier-timeout-ms N     barrier deadline (default 30000)\n"
    "  --rendezvous-timeout-ms N  deadline for the minimum to join (default 60000)\n"
    "  --steps N                  steps of the job, 0 = until SIGTERM (default 0)\n"
    "  --change-at-boundary 0|1   1: a join or death starts a generation only once\n"
    "                             every worker reported the same step (workers in\n"
    "                             lock step by barriers); 0: at once, for workers\n"
    "                             that resynchronise themselves (default 1)\n"
    "The first stdout line is \"listening ENDPOINT\" with the bound endpoint.\n";

const char *ts_sched_config_usage(void) { return USAGE; }

typedef enum { OPT_STR, OPT_INT, OPT_LL } opt_kind;

typedef struct {
    const char *name;
    opt_kind kind;
    size_t offset;
    long long min, max;
} opt_spec;

#define OFF(f) offsetof(ts_sched_config, f)
static const opt_spec OPTS[] = {
    {"--bind", OPT_STR, OFF(bind), 0, 0},
    {"--job", OPT_STR, OFF(job), 0, 0},
    {"--key-file", OPT_STR, OFF(key_file), 0, 0},
    {"--min-workers", OPT_INT, OFF(min_workers), 0, 100000},
    {"--max-workers", OPT_INT, OFF(max_workers), 0, 100000},
    {"--expect-workers", OPT_INT, OFF(expect_workers), 0, 100000},
    {"--servers", OPT_INT, OFF(servers), 0, 100000},
    {"--heartbeat-ms", OPT_INT, OFF(heartbeat_ms), 1, 3600000},
    {"--heartbeat-timeout-ms", OPT_INT, OFF(heartbeat_timeout_ms), 1, 3600000},
    {"--barrier-timeout-ms", OPT_INT, OFF(barrier_timeout_ms), 1, 86400000},
    {"--rendezvous-timeout-ms", OPT_INT, OFF(rendezvous_timeout_ms), 1, 86400000},
    {"--steps", OPT_LL, OFF(steps), 0, (long long)1 << 62},
    {"--change-at-boundary", OPT_INT, OFF(change_at_boundary), 0, 1},
};
#undef OFF

/* Stores the text value of one flag into its field after checking it. */
static ts_status set_opt(ts_sched_config *cfg, const opt_spec *o, const char *v)
{
    char *field = (char *)cfg + o->offset;
    if (o->kind == OPT_STR) {
        if (strlen(v) == 0 || strlen(v) >= TS_SCHED_STR_MAX)
            return ts_error(TS_ERR_VALUE, "tessera-scheduler: %s: value must be 1..%d characters",
                            o->name, TS_SCHED_STR_MAX - 1);
        memcpy(field, v, strlen(v) + 1);
        return TS_OK;
    }
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0')
        return ts_error(TS_ERR_VALUE, "tessera-scheduler: %s: expected an integer, got '%s'",
                        o->name, v);
    if (n < o->min || n > o->max)
        return ts_error(TS_ERR_VALUE, "tessera-scheduler: %s: %lld is outside [%lld, %lld]",
                        o->name, n, o->min, o->max);
    if (o->kind == OPT_INT)
        *(int *)field = (int)n;
    else
        *(long long *)field = n;
    return TS_OK;
}

/* Checks the relations between flags once all are read. */
static ts_status validate(ts_sched_config *cfg)
{
    if (cfg->key_file[0] == '\0')
        return ts_error(TS_ERR_VALUE, "tessera-scheduler: --key-file is required "
                        "(or set TESSERA_KEY_FILE)");
    if (cfg->max_workers < 0)
        cfg->max_workers = cfg->min_workers;
    if (cfg->max_workers < cfg->min_workers)
        return ts_error(TS_ERR_VALUE, "tessera-scheduler: --max-workers %d is below "
                        "--min-workers %d", cfg->max_workers, cfg->min_workers);
    if (cfg->expect_workers < cfg->min_workers)
        cfg->expect_workers = cfg->min_workers;
    if (cfg->expect_workers > cfg->max_workers)
        return ts_error(TS_ERR_VALUE, "tessera-scheduler: --expect-workers %d is above "
                        "--max-workers %d", cfg->expect_workers, cfg->max_workers);
    if (cfg->min_workers + cfg->servers == 0)
        return ts_error(TS_ERR_VALUE, "tessera-scheduler: --min-workers and --servers "
                        "are both 0: nothing to wait for");
    if (cfg->heartbeat_timeout_ms <= cfg->heartbeat_ms)
        return ts_error(TS_ERR_VALUE, "tessera-scheduler: --heartbeat-timeout-ms %d must "
                        "exceed --heartbeat-ms %d", cfg->heartbeat_timeout_ms,
                        cfg->heartbeat_ms);
    return TS_OK;
}

ts_status ts_sched_config_parse(int argc, char **argv, ts_sched_config *cfg, int *help)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->bind, "tcp://127.0.0.1:0");
    strcpy(cfg->job, "tessera");
    const char *env_key = getenv("TESSERA_KEY_FILE");
    if (env_key && strlen(env_key) < TS_SCHED_STR_MAX)
        strcpy(cfg->key_file, env_key);
    cfg->min_workers = 1;
    cfg->max_workers = -1;
    cfg->expect_workers = -1;
    cfg->heartbeat_ms = 1000;
    cfg->heartbeat_timeout_ms = 5000;
    cfg->barrier_timeout_ms = 30000;
    cfg->rendezvous_timeout_ms = 60000;
    cfg->change_at_boundary = 1;
    *help = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *help = 1;
            return TS_OK;
        }
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        const opt_spec *o = NULL;
        for (size_t k = 0; k < sizeof OPTS / sizeof OPTS[0]; k++)
            if (strlen(OPTS[k].name) == nlen && strncmp(OPTS[k].name, arg, nlen) == 0)
                o = &OPTS[k];
        if (!o)
            return ts_error(TS_ERR_VALUE, "tessera-scheduler: unknown flag '%s' (see --help)", arg);
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            if (i + 1 >= argc)
                return ts_error(TS_ERR_VALUE, "tessera-scheduler: %s needs a value", o->name);
            value = argv[++i];
        }
        ts_status st = set_opt(cfg, o, value);
        if (st != TS_OK)
            return st;
    }
    return validate(cfg);
}
