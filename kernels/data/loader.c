/* loader.c - sampler arithmetic, batch assembly and the prefetch thread. */
#include "kernels/data/loader.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ts_batch b;
    ts_status status;
    char msg[512];
} slot;

struct ts_loader {
    const ts_dataset *ds;
    ts_loader_config cfg;
    int64_t n;
    ts_key key;
    ts_loader_pos pos; /* consumer position */
    ts_loader_pos cur; /* producer position (the thread's, or pos without one) */
    int64_t *perm;     /* order of epoch perm_epoch */
    int64_t perm_epoch;
    /* prefetch */
    pthread_t thread;
    bool running, stop;
    pthread_mutex_t mu;
    pthread_cond_t nonempty, nonfull;
    slot *q;
    int head, count;
};

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Samples per rank of `left` samples over world ranks: with drop_last the
 * tail that does not reach every rank is dropped, else it is padded. */
static int64_t per_rank(const ts_loader *l, int64_t left, int world) {
    if (left <= 0) return 0;
    return l->cfg.drop_last ? left / world : ceil_div(left, world);
}

/* Samples per rank left after offset under the current world. */
static int64_t per_rank_left(const ts_loader *l, int64_t offset) {
    return per_rank(l, l->n - offset, l->cfg.world);
}

static int64_t batches_in(const ts_loader *l, int64_t c) {
    return l->cfg.drop_last ? c / l->cfg.batch_size : ceil_div(c, l->cfg.batch_size);
}

static ts_status check_shard(const ts_loader *l, int rank, int world) {
    if (world < 1 || rank < 0 || rank >= world)
        return ts_error(TS_ERR_VALUE, "loader %s: rank %d is not in [0, world %d)", l->ds->name, rank, world);
    int64_t c = per_rank(l, l->n, world);
    if (l->cfg.drop_last && c < l->cfg.batch_size)
        return ts_error(TS_ERR_VALUE,
                        "loader %s: %lld samples over %d ranks give %lld per rank, fewer than batch %lld with drop_last",
                        l->ds->name, (long long)l->n, world, (long long)c, (long long)l->cfg.batch_size);
    return TS_OK;
}

/* Fisher-Yates driven by the epoch's key: the same order on every rank. */
static void epoch_order(ts_loader *l, int64_t epoch) {
    if (l->perm_epoch == epoch) return;
    for (int64_t i = 0; i < l->n; i++) l->perm[i] = i;
    if (l->cfg.shuffle) {
        ts_key k = ts_key_fold_in(l->key, (uint64_t)epoch);
        for (int64_t i = l->n - 1; i > 0; i--) {
            int64_t j = (int64_t)ts_rng_below(k, (uint64_t)i, (uint64_t)i + 1);
            int64_t t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->perm_epoch = epoch;
}

/* Builds the batch at position *cur and advances *cur past it. */
static ts_status make_batch(ts_loader *l, ts_loader_pos *cur, ts_batch *b) {
    memset(b, 0, sizeof *b);
    int64_t c = per_rank_left(l, cur->offset);
    if (batches_in(l, c) == 0) { /* epoch exhausted at this position */
        cur->epoch++;
        cur->offset = 0;
        c = per_rank_left(l, 0);
    }
    epoch_order(l, cur->epoch);
    const ts_dataset *ds = l->ds;
    int64_t B = l->cfg.batch_size, W = l->cfg.world, bs = c < B ? c : B;
    int64_t xs[TS_MAX_DIMS], ys[TS_MAX_DIMS];
    xs[0] = ys[0] = bs;
    memcpy(xs + 1, ds->x_shape, sizeof(int64_t) * (size_t)ds->x_ndim);
    memcpy(ys + 1, ds->y_shape, sizeof(int64_t) * (size_t)ds->y_ndim);
    b->x = ts_tensor_empty(ds->x_dtype, ds->x_ndim + 1, xs);
    b->y = ts_tensor_empty(ds->y_dtype, ds->y_ndim + 1, ys);
    if (!b->x || !b->y) {
        ts_batch_release(b);
        return ts_last_status();
    }
    size_t xb = ts_dataset_x_bytes(ds), yb = ts_dataset_y_bytes(ds);
    char *xd = ts_tensor_data(b->x), *yd = ts_tensor_data(b->y);
    for (int64_t k = 0; k < bs; k++) {
        int64_t g = cur->offset + k * W + l->cfg.rank;
        ts_status s = ds->get(ds, l->perm[g % l->n], xd + (size_t)k * xb, yd + (size_t)k * yb);
        if (s) {
            ts_batch_release(b);
            return s;
        }
    }
    b->size = bs;
    b->start = *cur;
    int64_t left = c - bs;
    b->last_in_epoch = left == 0 || (l->cfg.drop_last && left < B);
    if (b->last_in_epoch) {
        cur->epoch++;
        cur->offset = 0;
    } else {
        cur->offset += bs * W;
    }
    b->next = *cur;
    return TS_OK;
}

void ts_batch_release(ts_batch *b) {
    ts_tensor_release(b->x);
    ts_tensor_release(b->y);
    b->x = b->y = NULL;
}

/* ---- prefetch thread ---- */

static void *producer(void *arg) {
    ts_loader *l = arg;
    int depth = l->cfg.prefetch;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->count == depth) pthread_cond_wait(&l->nonfull, &l->mu);
        if (l->stop) break;
        pthread_mutex_unlock(&l->mu);
        slot sl;
        sl.status = make_batch(l, &l->cur, &sl.b);
        if (sl.status) snprintf(sl.msg, sizeof sl.msg, "%s", ts_last_error());
        pthread_mutex_lock(&l->mu);
        if (l->stop) {
            ts_batch_release(&sl.b);
            break;
        }
        l->q[(l->head + l->count) % depth] = sl;
        l->count++;
        pthread_cond_signal(&l->nonempty);
        if (sl.status) break; /* the consumer restarts us after reporting it */
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static ts_status start_thread(ts_loader *l) {
    l->cur = l->pos;
    l->stop = false;
    l->head = l->count = 0;
    if (pthread_create(&l->thread, NULL, producer, l) != 0)
        return ts_error(TS_ERR_STATE, "loader %s: cannot start the prefetch thread", l->ds->name);
    l->running = true;
    return TS_OK;
}

/* Stops the thread and drops whatever it queued. */
static void stop_thread(ts_loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->nonfull);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    for (int i = 0; i < l->count; i++) ts_batch_release(&l->q[(l->head + i) % l->cfg.prefetch].b);
    l->count = 0;
    l->running = false;
}

/* ---- public ---- */

ts_loader *ts_loader_create(const ts_dataset *ds, const ts_loader_config *cfg) {
    if (!ds || !cfg) {
        ts_error(TS_ERR_VALUE, "loader: NULL dataset or config");
        return NULL;
    }
    int64_t n = ds->length(ds);
    if (n <= 0 || cfg->batch_size <= 0 || cfg->prefetch < 0) {
        ts_error(TS_ERR_VALUE, "loader %s: needs samples (%lld), batch_size > 0 (%lld) and prefetch >= 0 (%d)",
                 ds->name, (long long)n, (long long)cfg->batch_size, cfg->prefetch);
        return NULL;
    }
    ts_loader *l = calloc(1, sizeof *l);
    if (!l) {
        ts_error(TS_ERR_MEMORY, "loader %s: out of memory", ds->name);
        return NULL;
    }
    l->ds = ds;
    l->cfg = *cfg;
    if (l->cfg.world == 0) l->cfg.world = 1;
    l->n = n;
    l->key = ts_key_from_seed(cfg->seed);
    l->perm_epoch = -1;
    l->perm = malloc(sizeof(int64_t) * (size_t)n);
    l->q = calloc(cfg->prefetch ? (size_t)cfg->prefetch : 1, sizeof(slot));
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->nonempty, NULL);
    pthread_cond_init(&l->nonfull, NULL);
    if (!l->perm || !l->q) {
        ts_error(TS_ERR_MEMORY, "loader %s: out of memory for %lld samples", ds->name, (long long)n);
        ts_loader_free(l);
        return NULL;
    }
    if (check_shard(l, l->cfg.rank, l->cfg.world)) {
        ts_loader_free(l);
        return NULL;
    }
    return l;
}

void ts_loader_free(ts_loader *l) {
    if (!l) return;
    stop_thread(l);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->nonempty);
    pthread_cond_destroy(&l->nonfull);
    free(l->perm);
    free(l->q);
    free(l);
}

ts_status ts_loader_next(ts_loader *l, ts_batch *b) {
    if (l->cfg.prefetch == 0) {
        l->cur = l->pos;
        ts_status s = make_batch(l, &l->cur, b);
        if (!s) l->pos = b->next;
        return s;
    }
    if (!l->running) {
        ts_status s = start_thread(l);
        if (s) return s;
    }
    pthread_mutex_lock(&l->mu);
    while (l->count == 0) pthread_cond_wait(&l->nonempty, &l->mu);
    slot sl = l->q[l->head];
    l->head = (l->head + 1) % l->cfg.prefetch;
    l->count--;
    pthread_cond_signal(&l->nonfull);
    pthread_mutex_unlock(&l->mu);
    if (sl.status) {
        stop_thread(l);
        return ts_error(sl.status, "%s", sl.msg);
    }
    *b = sl.b;
    l->pos = b->next;
    return TS_OK;
}

ts_loader_pos ts_loader_position(const ts_loader *l) { return l->pos; }

ts_status ts_loader_set_position(ts_loader *l, ts_loader_pos pos) {
    if (pos.epoch < 0 || pos.offset < 0 || pos.offset > l->n)
        return ts_error(TS_ERR_VALUE, "loader %s: position (epoch %lld, offset %lld) outside [0, %lld]", l->ds->name,
                        (long long)pos.epoch, (long long)pos.offset, (long long)l->n);
    stop_thread(l);
    l->pos = pos;
    return TS_OK;
}

ts_status ts_loader_reshard(ts_loader *l, int rank, int world) {
    ts_status s = check_shard(l, rank, world);
    if (s) return s;
    stop_thread(l);
    l->cfg.rank = rank;
    l->cfg.world = world;
    return TS_OK;
}

int64_t ts_loader_batches_per_epoch(const ts_loader *l) { return batches_in(l, per_rank_left(l, 0)); }

int64_t ts_loader_batches_left(const ts_loader *l) {
    int64_t left = batches_in(l, per_rank_left(l, l->pos.offset));
    return left ? left : ts_loader_batches_per_epoch(l);
}

int64_t ts_loader_length(const ts_loader *l) { return l->n; }
