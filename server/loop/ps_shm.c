/* ps_shm: a shard's shared-memory segments (see ps_shm.h). */
#include "server/loop/ps_shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "proto/shm.h"
#include "proto/wire.h"

struct dp_ps_shm {
    dp_shard_t *s;
    dp_shm_t params;                    /* DP_SHM_PARAM_SLOTS slots of s->n floats */
    dp_snap_t *slot[DP_SHM_PARAM_SLOTS]; /* a buffer per slot (our reference each) */
    dp_shm_t *grad;                     /* per worker; .base NULL until granted */
    unsigned char *granted;             /* per worker: its last HELLO got grad[w] */
    int n_workers;
};

/* The shard's take_buffer: the least recent slot nobody holds, about to be
 * written (seq odd), with a reference for the shard; NULL: none free. */
static dp_snap_t *s_take(void *arg)
{
    dp_ps_shm_t *x = arg;
    dp_snap_t *best = NULL;
    for (int k = 0; k < DP_SHM_PARAM_SLOTS; k++) {
        dp_snap_t *b = x->slot[k];
        if (b == x->s->snap || atomic_load(&b->refs) != 1) continue;
        if (!best || b->version < best->version) best = b;
    }
    if (!best) return NULL;
    dp_shm_write_begin(&x->params, best->slot);
    atomic_fetch_add(&best->refs, 1);
    return best;
}

/* The shard's on_step: the slot written holds its version now. */
static void s_stepped(void *arg, dp_snap_t *b)
{
    dp_ps_shm_t *x = arg;
    if (b->slot >= 0) dp_shm_write_end(&x->params, b->slot);
}

int dp_ps_shm_new(dp_ps_shm_t **out, dp_shard_t *s, int n_workers, char *err)
{
    dp_ps_shm_t *x = dp_calloc(1, sizeof *x);
    x->s = s;
    x->n_workers = n_workers;
    x->grad = dp_calloc((size_t)n_workers, sizeof *x->grad);
    x->granted = dp_calloc((size_t)n_workers, 1);
    *out = x;
    if (dp_shm_create(&x->params, s->index, "params", s->n, DP_SHM_PARAM_SLOTS, DP_SHM_READ_ONLY,
                      err) != 0) {
        dp_ps_shm_destroy(out);
        return -1;
    }
    for (int k = 0; k < DP_SHM_PARAM_SLOTS; k++) {
        dp_snap_t *b = dp_calloc(1, sizeof *b);
        atomic_init(&b->refs, 1);
        b->n = s->n;
        b->data = dp_shm_slot(&x->params, k);
        b->slot = k;
        x->slot[k] = b;
    }
    /* slot 0 takes over as the live buffer */
    dp_snap_t *b = x->slot[0];
    dp_shm_write_begin(&x->params, 0);
    memcpy(b->data, s->w, s->n * sizeof(float));
    dp_shm_write_end(&x->params, 0);
    b->version = s->version;
    atomic_fetch_add(&b->refs, 1);
    dp_snap_unref(NULL, s->snap);
    s->snap = b;
    s->w = b->data;
    s->take_buffer = s_take;
    s->take_buffer_arg = x;
    s->on_step = s_stepped;
    s->on_step_arg = x;
    return 0;
}

void dp_ps_shm_destroy(dp_ps_shm_t **x_p)
{
    if (!x_p || !*x_p) return;
    dp_ps_shm_t *x = *x_p;
    dp_shard_t *s = x->s;
    if (s->take_buffer_arg == x) {
        s->take_buffer = NULL;
        s->on_step = NULL;
        if (s->spare && s->spare->slot >= 0) {
            dp_snap_unref(NULL, s->spare);
            s->spare = NULL;
        }
        if (s->snap && s->snap->slot >= 0) { /* back to the heap before the unmap */
            dp_snap_t *h = dp_snap_new(s->n);
            memcpy(h->data, s->w, s->n * sizeof(float));
            h->version = s->snap->version;
            dp_snap_unref(NULL, s->snap);
            s->snap = h;
            s->w = h->data;
        }
    }
    for (int k = 0; k < DP_SHM_PARAM_SLOTS; k++)
        if (x->slot[k]) dp_snap_unref(NULL, x->slot[k]);
    for (int w = 0; w < x->n_workers; w++) dp_shm_close(&x->grad[w]);
    dp_shm_close(&x->params);
    free(x->grad);
    free(x->granted);
    free(x);
    *x_p = NULL;
}

int dp_ps_shm_grant(dp_ps_shm_t *x, int worker, const char **params_name, const char **grad_name,
                    char *err)
{
    if (worker < 0 || worker >= x->n_workers) return dp_err(err, "worker id %d out of range", worker);
    dp_shm_t *g = &x->grad[worker];
    if (!g->base) {
        char what[32];
        snprintf(what, sizeof what, "grad-%d", worker);
        if (dp_shm_create(g, x->s->index, what, x->s->n, 1, DP_SHM_WRITABLE, err) != 0) return -1;
    }
    *params_name = x->params.name;
    *grad_name = g->name;
    x->granted[worker] = 1;
    return 0;
}

void dp_ps_shm_revoke(dp_ps_shm_t *x, int worker)
{
    if (x && worker >= 0 && worker < x->n_workers) x->granted[worker] = 0;
}

int dp_ps_shm_params(dp_ps_shm_t *x, uint32_t *slot, uint64_t *seq)
{
    const dp_snap_t *b = x->s->snap;
    if (b->slot < 0) return 0;
    *slot = (uint32_t)b->slot;
    *seq = dp_shm_seq(&x->params, b->slot);
    return 1;
}

const float *dp_ps_shm_grad_floats(dp_ps_shm_t *x, int worker)
{
    if (!x || worker < 0 || worker >= x->n_workers || !x->granted[worker]) return NULL;
    return dp_shm_slot(&x->grad[worker], 0);
}

int dp_ps_shm_gradient(dp_ps_shm_t *x, int worker, const Downpour__Envelope *env,
                       dp_grad_slice_t *g, int *rejected, char *err)
{
    dp_shard_t *s = x->s;
    *rejected = 0;
    if (worker < 0 || worker >= x->n_workers || !x->granted[worker])
        return dp_err(err, "malformed: PUSH through shared memory, but worker %d has no segment "
                           "here (say HELLO with shm)",
                      worker);
    const float *src = dp_shm_slot(&x->grad[worker], 0);
    for (size_t i = 0; i < env->n_tensors; i++) {
        const Downpour__TensorDesc *d = env->tensors[i];
        size_t off = (size_t)(d->offset - s->lo), cnt = (size_t)(d->byte_length / 4);
        /* dp_wire_check_range put [off, off + cnt) inside [0, n) */
        if (dp_shard_copy_grad(s, src, off, cnt, err) != 0) {
            *rejected = 1;
            return -1;
        }
    }
    *g = (dp_grad_slice_t){s->scratch, s->n * sizeof(float), s->lo};
    return 0;
}
