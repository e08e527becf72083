/* ps_client: the requests a worker makes of its shards — pull, push,
 * stats, finish, shutdown (see ps_client.h). Each is a plan (what to ask
 * each shard, what to do with each reply) run by dp_ps_exchange, which owns
 * the sockets, the liveness rules and recovery (worker/ps_exchange.h). */
#include "worker/ps_client.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "worker/ps_exchange.h"

static void s_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- pull ------------------------------------------------------------- */

static void s_build_pull(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    (void)arg;
    dp_ps_shard_t *s = &c->sh[i];
    Downpour__Pull *p = &rq->body.pull;
    *p = (Downpour__Pull)DOWNPOUR__PULL__INIT;
    p->min_version = c->info.mode == DP_MODE_SYNC ? s->min_version : 0;
    p->no_checksum = !s->crc;
    p->n_cuts = s->pull_cuts;
    p->cuts = s->pull_cut;
    rq->env.pull = p;
    rq->env.shm = s->shm;
    if (c->bf16 && !s->shm) p->dtype = DOWNPOUR__DTYPE__BFLOAT16;
}

/* Where a pull's weights go: into params, or each tensor lent to a sink. */
typedef struct {
    float *params;               /* NULL: to the sink */
    dp_ps_params_sink_fn sink;
    void *sink_arg;
    int cut;                     /* a pull in parts: each reply cut where layers begin */
    size_t until;                /* ... and a wait ends once floats [0, until) are in */
} s_pull_dest_t;

/* The first bucket of a pull in parts: a cut where a layer begins once at
 * least a bucket lies below it in the shard's slice, the bucket doubling
 * after each cut. Small at first, since the forward needs the first
 * layers first and the later parts travel under it: the default model's
 * convolutions (200 KB) come in one part and its fc1 (6.4 MB) in the
 * next; a ResNet's 1 MB in parts of 16, 32, 64 ... KiB. */
#define S_PULL_BUCKET_FLOATS (DP_PS_PULL_BUCKET_BYTES / sizeof(float))

/* Shard i's cuts (Pull.cuts), walking the layers in forward order; none
 * for a whole pull. At most the wire's bound of parts (the rest in the
 * last). */
static void s_plan_cuts(dp_ps_client_t *c, int i, int cut)
{
    dp_ps_shard_t *s = &c->sh[i];
    s->pull_cuts = 0;
    uint64_t from = s->lo, bucket = S_PULL_BUCKET_FLOATS;
    for (int l = 0; cut && l < c->m->n_layers && s->pull_cuts + 1 < DP_WIRE_MAX_PULL_PARTS; l++) {
        size_t a, b;
        if (!dp_model_layer_span(c->m, l, &a, &b) || a <= from || a >= s->hi) continue;
        if (a - from >= bucket) {
            s->pull_cut[s->pull_cuts++] = from = a;
            bucket *= 2;
        }
    }
}

/* The exchange's "before" for a pull: shard i's reply starts from its
 * first part. again: the shard was said HELLO anew (its WELCOME may bring
 * another range, so the cuts are planned again), and if floats of it had
 * been handed to the caller already, what the caller read of them may be
 * of another version than the repeated reply: the pull is torn. */
static int s_pull_before(dp_ps_client_t *c, int i, int again, void *arg, char *err)
{
    (void)err;
    const s_pull_dest_t *to = arg;
    dp_ps_shard_t *s = &c->sh[i];
    if (again && c->pull_handed > s->lo) c->pull_torn = 1;
    s_plan_cuts(c, i, to->cut);
    s->pull_part = 0;
    s->pull_got = s->lo;
    return 0;
}

/* The floats [off, off + n) of the vector at src, to the pull's destination:
 * src is params itself, the client's landing buffer, or a received frame. */
static void s_deliver(const s_pull_dest_t *to, size_t off, const float *src, size_t n)
{
    if (to->params) {
        if (src != to->params + off) memcpy(to->params + off, src, n * sizeof(float));
    } else
        to->sink(to->sink_arg, off, src, n);
}

/* Shard i's tensors through shared memory (s->torn set, and the rest left,
 * when a step raced the copy). */
static void s_params_from_shm(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                              const s_pull_dest_t *to)
{
    dp_ps_shard_t *s = &c->sh[i];
    float *dst = to->params ? to->params : c->landing;
    for (size_t f = 0; f < env->n_tensors; f++) {
        const Downpour__TensorDesc *d = env->tensors[f];
        size_t n = d->byte_length / 4;
        if (!to->params) {
            /* A sink copies out of the slot itself, one copy instead of two
             * (slot -> landing -> sink); the seqlock is checked after it, and
             * a torn copy makes the pull go again, which gives the sink every
             * float again (dp_ps_client_pull_to's contract). */
            int slot = (int)env->params->shm_slot;
            uint64_t seq = env->params->shm_seq;
            if (seq & 1 || dp_shm_seq(&s->shm_params, slot) != seq) {
                s->torn = 1;
                return;
            }
            to->sink(to->sink_arg, d->offset, dp_shm_slot(&s->shm_params, slot) + (d->offset - s->lo), n);
            atomic_thread_fence(memory_order_acquire); /* the sink's copy before the second look */
            if (dp_shm_seq(&s->shm_params, slot) != seq) {
                s->torn = 1;
                return;
            }
            continue;
        }
        if (!dp_shm_read(&s->shm_params, (int)env->params->shm_slot, env->params->shm_seq,
                         (size_t)(d->offset - s->lo), dst + d->offset, n)) {
            s->torn = 1; /* the pull goes again */
            return;
        }
        s_deliver(to, d->offset, dst + d->offset, n);
    }
}

/* A frame's floats: lent in place when they are float32 at a float-aligned
 * address (ZeroMQ's receive buffer may start anywhere), else widened or
 * copied into params or the landing buffer first. */
static void s_params_from_frame(dp_ps_client_t *c, const Downpour__TensorDesc *d,
                                const dp_wire_frame_t *fr, const s_pull_dest_t *to)
{
    size_t n = (size_t)dp_wire_desc_count(d);
    if (d->dtype != DOWNPOUR__DTYPE__BFLOAT16 && ((uintptr_t)fr->data & 3) == 0) {
        s_deliver(to, d->offset, fr->data, n);
        return;
    }
    float *dst = (to->params ? to->params : c->landing) + d->offset;
    if (d->dtype == DOWNPOUR__DTYPE__BFLOAT16) dp_wire_from_bf16(dst, fr->data, n);
    else memcpy(dst, fr->data, fr->len);
    s_deliver(to, d->offset, dst, n);
}

/* A PARAMS in frames is the one due: whole, its tensors the shard's whole
 * range (an older shard ignores the cuts); or the part due next, holding
 * the run between its two cuts, of the version of the first part (one
 * snapshot). Sets how far the shard's floats are in. */
static int s_params_due(dp_ps_client_t *c, int i, const Downpour__Envelope *env, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    const Downpour__Params *p = env->params;
    uint32_t k = p->part, parts = dp_wire_params_parts(p);
    char e2[DP_ERR_LEN];
    if (parts > 1 && parts != s->pull_cuts + 1)
        return dp_err(err, "%s: bad PARAMS: in %u parts, %u asked for", s->endpoint, parts,
                      s->pull_cuts + 1);
    if (k != s->pull_part)
        return dp_err(err, "%s: bad PARAMS: part %u where part %u was due", s->endpoint, k,
                      s->pull_part);
    if (k > 0 && p->version != s->version)
        return dp_err(err, "%s: bad PARAMS: part %u is of version %llu, part 0 of %llu (a pull is one version)",
                      s->endpoint, k, (unsigned long long)p->version,
                      (unsigned long long)s->version);
    uint64_t a, b;
    if (dp_wire_check_run(env, s->lo, s->hi, &a, &b, e2) != 0)
        return dp_err(err, "%s: bad PARAMS: %s", s->endpoint, e2);
    uint64_t want_a = k ? s->pull_cut[k - 1] : s->lo;
    uint64_t want_b = parts > 1 && k < s->pull_cuts ? s->pull_cut[k] : s->hi;
    if (a != want_a || b != want_b)
        return dp_err(err, "%s: bad PARAMS: part %u of %u holds floats [%llu, %llu), not [%llu, %llu)",
                      s->endpoint, k, parts, (unsigned long long)a, (unsigned long long)b,
                      (unsigned long long)want_a, (unsigned long long)want_b);
    s->pull_got = b;
    return 0;
}

static int s_on_params(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                       const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    const s_pull_dest_t *to = arg;
    char e2[DP_ERR_LEN];
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    if (env->type != DOWNPOUR__MSG_TYPE__PARAMS)
        return dp_err(err, "%s: answered PULL with %s", s->endpoint, dp_wire_type_name(env->type));
    if (env->shm) {
        if (dp_wire_check_range(env, s->lo, s->hi, e2) != 0)
            return dp_err(err, "%s: bad PARAMS: %s", s->endpoint, e2);
        if (!s->shm || env->params->shm_slot >= DP_SHM_PARAM_SLOTS)
            return dp_err(err, "%s: PARAMS through shared memory we do not have (slot %u)",
                          s->endpoint, env->params->shm_slot);
        s_params_from_shm(c, i, env, to);
        if (s->torn) return 0;
        s->pull_got = s->hi;
    } else if (s_params_due(c, i, env, err) != 0)
        return -1;
    for (int f = 0; f < nf; f++) s_params_from_frame(c, env->tensors[f], &frames[f], to);
    s->version = env->params->version;
    dp_ps_seen(s, s->version);
    s->pulled = 1;
    c->pulls_parts++;
    if (!env->shm && ++s->pull_part < dp_wire_params_parts(env->params))
        s->done = 0; /* the next part follows */
    return 0;
}

/* The enough of a pull in parts: every shard's floats below to->until are in. */
static int s_pulled_until(const dp_ps_client_t *c, void *arg)
{
    const s_pull_dest_t *to = arg;
    for (int i = 0; i < c->n; i++) {
        const dp_ps_shard_t *s = &c->sh[i];
        if (s->lo < to->until && s->pull_got < (to->until < s->hi ? to->until : s->hi)) return 0;
    }
    return 1;
}

static dp_ps_plan_t s_pull_plan(dp_ps_client_t *c, s_pull_dest_t *to)
{
    return (dp_ps_plan_t){.type = DOWNPOUR__MSG_TYPE__PULL, .n_shards = c->n,
                          .before = s_pull_before, .build = s_build_pull, .on_reply = s_on_params,
                          .enough = to->cut ? s_pulled_until : NULL, .arg = to};
}

/* A shared-memory copy is torn only when two steps land during it; a few
 * tries, then it is an error rather than a livelock. */
#define S_TORN_TRIES 16

static int s_pull(dp_ps_client_t *c, s_pull_dest_t *to, char *err)
{
    dp_ps_plan_t pull = s_pull_plan(c, to);
    c->pulls_parts = 0;
    for (int t = 0; t < S_TORN_TRIES; t++) {
        int torn = 0;
        for (int i = 0; i < c->n; i++) c->sh[i].torn = 0;
        if (dp_ps_exchange(c, &pull, err) != 0) return -1;
        for (int i = 0; i < c->n; i++) torn |= c->sh[i].torn;
        if (!torn) return 0;
    }
    c->code = DP_PS_ERR_OTHER;
    return dp_err(err, "shared memory: %d pulls in a row raced the servers' steps", S_TORN_TRIES);
}

int dp_ps_client_pull(dp_ps_client_t *c, float *params, char *err)
{
    c->pull_params = NULL; /* a pull in parts left unfinished is abandoned */
    s_pull_dest_t to = {.params = params};
    return s_pull(c, &to, err);
}

int dp_ps_client_pull_to(dp_ps_client_t *c, dp_ps_params_sink_fn sink, void *arg, char *err)
{
    c->pull_params = NULL;
    if (!c->landing) c->landing = dp_aligned_alloc(c->m->n_floats * sizeof(float));
    s_pull_dest_t to = {.sink = sink, .sink_arg = arg};
    return s_pull(c, &to, err);
}

int dp_ps_client_pull_begin(dp_ps_client_t *c, float *params, char *err)
{
    c->pull_params = NULL;
    c->pull_handed = 0;
    c->pull_torn = 0;
    if (dp_ps_client_shm_shards(c) > 0) return dp_ps_client_pull(c, params, err); /* whole, now */
    s_pull_dest_t to = {.params = params, .cut = 1};
    dp_ps_plan_t pull = s_pull_plan(c, &to);
    c->pulls_parts = 0;
    if (dp_ps_exchange_send(c, &pull, err) != 0) return -1;
    c->pull_params = params;
    return 0;
}

/* The pull in parts waited out until floats [0, until) are in (all of
 * them: the pull is over); a torn one is first waited out whole. */
dp_pull_status_t dp_ps_client_pull_until(dp_ps_client_t *c, size_t until, char *err)
{
    if (!c->pull_params) return DP_PULL_OK; /* pulled whole at pull_begin, or none in progress */
    s_pull_dest_t to = {.params = c->pull_params, .cut = 1, .until = until};
    dp_ps_plan_t pull = s_pull_plan(c, &to);
    int rc = dp_ps_exchange_wait(c, &pull, err);
    if (rc == 0 && c->pull_torn) {
        pull.enough = NULL;
        rc = dp_ps_exchange_wait(c, &pull, err);
        if (rc == 0) {
            dp_log_warn("pull in parts: a shard was asked again after the forward read part of its "
                        "reply; the forward starts again on the repeated reply");
            c->pull_torn = 0;
            c->pull_handed = 0;
            return DP_PULL_TORN;
        }
    }
    if (rc != 0 || until >= c->m->n_floats) {
        c->pull_params = NULL;
        return rc != 0 ? DP_PULL_FAILED : DP_PULL_OK;
    }
    if (until > c->pull_handed) c->pull_handed = until;
    return DP_PULL_OK;
}

uint32_t dp_ps_client_pull_parts(const dp_ps_client_t *c)
{
    return c->pulls_parts;
}

/* ---- push ------------------------------------------------------------- */

/* One push: what goes out, and the ACKs summed as they come back. */
typedef struct {
    const dp_ps_push_t *p;
    dp_push_result_t *res;
    double staleness_sum;
} s_push_t;

/* The version shard i's slice is stamped with: the push's stamp, but never
 * above the shard's own version — one lowered by its restart (the WELCOME
 * of a rejoin) wins, so a repeated push carries the restored version. */
static uint64_t s_stamp_of(const dp_ps_client_t *c, const dp_ps_push_t *p, int i)
{
    uint64_t v = c->sh[i].version;
    return p->stamp && p->stamp->v[i] < v ? p->stamp->v[i] : v;
}

static void s_push_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub((atomic_int *)hint, 1);
}

/* The frames of a compressed slice (proto/downpour.proto, Compression):
 * indices and values, or the sign bits and Push.scale; from the
 * compressor's buffers, which stay put until push returns. */
static void s_build_compressed(dp_ps_client_t *c, const dp_ps_shard_t *s, dp_ps_req_t *rq)
{
    const dp_compressor_t *z = s->z;
    Downpour__Push *p = &rq->body.push;
    int nd = 0;
    if (z->kind == DP_COMPRESS_TOPK) {
        p->compression = DOWNPOUR__COMPRESSION__TOPK;
        dp_wire_desc_fill(&rq->desc[0], &rq->shape[0], "indices", NULL, z->k, s->lo, 1, 0);
        rq->desc[0].dtype = DOWNPOUR__DTYPE__UINT32;
        rq->desc[0].crc32 = s->crc ? dp_wire_crc32(z->idx, z->k * 4) : 0;
        dp_wire_desc_fill(&rq->desc[1], &rq->shape[1], "values", z->val, z->k, s->lo, !s->crc, 0);
        rq->payload[0] = (dp_wire_payload_t){z->idx, z->k * 4, s_push_release, &c->inflight};
        rq->payload[1] = (dp_wire_payload_t){z->val, z->k * 4, s_push_release, &c->inflight};
        nd = 2;
    } else {
        p->compression = DOWNPOUR__COMPRESSION__SIGN;
        p->scale = z->scale;
        size_t nb = (z->n + 7) / 8;
        dp_wire_desc_fill(&rq->desc[0], &rq->shape[0], "signs", NULL, z->n, s->lo, 1, 0);
        rq->desc[0].dtype = DOWNPOUR__DTYPE__BIT;
        rq->desc[0].byte_length = nb;
        rq->desc[0].crc32 = s->crc ? dp_wire_crc32(z->bits, nb) : 0;
        rq->payload[0] = (dp_wire_payload_t){z->bits, nb, s_push_release, &c->inflight};
        nd = 1;
    }
    for (int d = 0; d < nd; d++) {
        if (!s->crc) dp_wire_desc_no_checksum(&rq->desc[d]);
        rq->descs[d] = &rq->desc[d];
        atomic_fetch_add(&c->inflight, 1); /* dp_wire_send releases each, sent or not */
    }
    rq->env.n_tensors = (size_t)nd;
    rq->n_payloads = nd;
}

/* Part k of shard i's slice of the gradient (the whole slice when the push
 * to it is one part), handed to ZeroMQ without a copy. */
static void s_build_part(dp_ps_client_t *c, int i, uint32_t k, dp_ps_req_t *rq,
                         const dp_ps_push_t *pp)
{
    const dp_ps_shard_t *s = &c->sh[i];
    const float *grads = pp->grads;
    Downpour__Push *p = &rq->body.push;
    *p = (Downpour__Push)DOWNPOUR__PUSH__INIT;
    p->version = s_stamp_of(c, pp, i);
    p->loss = pp->loss;
    p->batch = pp->batch;
    p->step = pp->step;
    if (s->parts > 1) {
        p->part = k;
        p->parts = s->parts;
    }
    rq->env.push = p;
    rq->env.tensors = rq->descs;
    if (s->z && s->z->kind != DP_COMPRESS_NONE) {
        s_build_compressed(c, s, rq);
        return;
    }
    uint64_t a = s->part_at[k + 1]; /* the plan of push_begin: [lo, hi) when whole */
    size_t cnt = (size_t)(s->part_at[k] - a);
    /* the slice as sent: the caller's, or with error feedback the client's
     * (a slice too small for top-k goes dense, its residual added) */
    const float *slice = (s->z ? s->z->v : grads + s->lo) + (a - s->lo);
    dp_wire_desc_fill(&rq->desc[0], rq->shape, "params", slice, cnt, a,
                      !s->crc || s->shm || c->bf16, 0); /* bf16: its own CRC below */
    if (!s->crc) dp_wire_desc_no_checksum(&rq->desc[0]);
    rq->descs[0] = &rq->desc[0];
    rq->env.n_tensors = 1;
    if (s->shm) { /* our slot, where the floats lie: the shard copies them out first */
        memcpy(dp_shm_slot(&s->shm_grad, 0) + (a - s->lo), slice, cnt * sizeof(float));
        dp_wire_desc_no_checksum(&rq->desc[0]);
        rq->env.shm = 1;
        return;
    }
    atomic_fetch_add(&c->inflight, 1); /* dp_wire_send releases it, sent or not */
    if (c->bf16) { /* half the bytes: the part rounded into our own buffer */
        dp_ps_shard_t *sw = &c->sh[i];
        size_t all = (size_t)(s->hi - s->lo);
        if (!sw->push16) sw->push16 = dp_malloc(all * sizeof *sw->push16 + 2);
        uint16_t *h = sw->push16 + (a - s->lo);
        dp_wire_to_bf16(h, slice, cnt);
        dp_wire_desc_bf16(&rq->desc[0], h, s->crc);
        rq->payload[0] = (dp_wire_payload_t){h, cnt * 2, s_push_release, &c->inflight};
    } else
        rq->payload[0] = (dp_wire_payload_t){slice, cnt * sizeof(float), s_push_release,
                                             &c->inflight};
    rq->n_payloads = 1;
}

/* The request the push's exchange awaits from shard i: its last part. */
static void s_build_push(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    const s_push_t *push = arg;
    s_build_part(c, i, c->sh[i].parts - 1, rq, push->p);
}

/* Part k of the push in progress to shard i, sent without awaiting its
 * reply (RECEIVED, which proves the shard alive and nothing more). */
static int s_send_part(dp_ps_client_t *c, int i, uint32_t k, char *err)
{
    dp_ps_req_t rq;
    memset(&rq, 0, sizeof rq);
    dp_wire_env_init(&rq.env, DOWNPOUR__MSG_TYPE__PUSH, 0, c->worker_id, c->m->fingerprint);
    s_build_part(c, i, k, &rq, c->push);
    if (dp_ps_send_only(c, i, &rq, err) != 0) return -1;
    if (k + 1 == c->sh[i].parts) c->sh[i].early_req = rq.env.request_id; /* the one awaited */
    return 0;
}

static void s_plan_parts(dp_ps_client_t *c, int i, int stream);

/* The exchange's "before" for shard i: the parts before the last that
 * have not gone yet, or all of them again after a new HELLO (the shard
 * dropped what it had of this push: server/shard_parts.h). The last is
 * the exchange's own request (or went already: early_req). */
static int s_send_parts(dp_ps_client_t *c, int i, int again, void *arg, char *err)
{
    (void)arg;
    dp_ps_shard_t *s = &c->sh[i];
    if (again) s_plan_parts(c, i, s->stream); /* its WELCOME may bring another range */
    for (; s->parts_sent + 1 < s->parts; s->parts_sent++)
        if (s_send_part(c, i, s->parts_sent, err) != 0) return -1;
    return 0;
}

/* Bucket: a part leaves once at least this many bytes of a shard's slice
 * are final and unsent, cut where a layer begins. 256 KiB is a few
 * hundred microseconds of the shard's copy and check, so a part is worth
 * its message; the default model's fc1 (6.4 MB, 97 % of its bytes) then
 * leaves in one part as soon as its backward is done, while the
 * convolutions' backward still runs, and the small layers go together. */
#define S_BUCKET_FLOATS (DP_PS_PUSH_BUCKET_BYTES / sizeof(float))

/* Shard i's parts for a push in parts: walking the layers as the backward
 * finishes them (the last first), a cut where a layer begins once a
 * bucket is pending above it; at most the shard's bound of parts (the
 * rest in the last). One part when the shard takes none (an older one),
 * when the push is compressed (this version streams dense pushes only), or
 * when nothing is streamed. */
static void s_plan_parts(dp_ps_client_t *c, int i, int stream)
{
    dp_ps_shard_t *s = &c->sh[i];
    s->parts = 1;
    s->parts_sent = 0;
    s->early_req = 0;
    s->part_at[0] = s->hi;
    s->part_at[1] = s->lo;
    /* a compressed push is encoded whole at push_end */
    s->stream = stream && c->compress.kind == DP_COMPRESS_NONE;
    uint32_t max = s->push_parts < DP_WIRE_MAX_PUSH_PARTS ? s->push_parts : DP_WIRE_MAX_PUSH_PARTS;
    if (!s->stream || max < 2) return; /* whole, but still as soon as the slice is final */
    uint32_t k = 0;
    uint64_t top = s->hi;
    for (int l = c->m->n_layers - 1; l >= 0 && k + 2 <= max; l--) {
        size_t a, b;
        if (!dp_model_layer_span(c->m, l, &a, &b) || b <= s->lo || a >= top) continue;
        if (a > s->lo && top - a >= S_BUCKET_FLOATS) s->part_at[++k] = top = a;
    }
    s->part_at[++k] = s->lo;
    s->parts = k;
}

/* Each shard's slice encoded once per push, before the exchange (a repeat
 * sends the same bytes; the residual moves once). Returns the push's bytes:
 * what the frames (or the shared slot) carry. */
static uint64_t s_encode(dp_ps_client_t *c, const float *grads)
{
    uint64_t bytes = 0;
    for (int i = 0; i < c->n; i++) {
        dp_ps_shard_t *s = &c->sh[i];
        size_t cnt = (size_t)(s->hi - s->lo);
        if (c->compress.kind == DP_COMPRESS_NONE) {
            bytes += cnt * (c->bf16 && !s->shm ? 2 : sizeof(float));
            continue;
        }
        if (s->z && s->z->n != cnt) { /* a restarted shard with another range */
            dp_compressor_fini(s->z);
            free(s->z);
            s->z = NULL;
        }
        if (!s->z) {
            s->z = dp_malloc(sizeof *s->z);
            dp_compressor_init(s->z, &c->compress, cnt);
        }
        bytes += dp_compressor_encode(s->z, grads + s->lo);
    }
    return bytes;
}

static void s_set_reason(dp_push_result_t *r, const char *endpoint, const char *why)
{
    /* Truncation is fine: the reason is for a log line. */
    if (!r->reason[0]) {
        int n = snprintf(r->reason, sizeof r->reason, "%.60s: %s", endpoint, why);
        (void)n;
    }
}

static int s_on_ack(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                    const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    dp_ps_shard_t *s = &c->sh[i];
    s_push_t *push = arg;
    dp_push_result_t *r = push->res;
    uint64_t stamped = s_stamp_of(c, push->p, i);
    s->min_version = 0;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) { /* a refusal of this gradient, not a failure */
        r->rejected++;
        s_set_reason(r, s->endpoint, env->error->message);
        return 0;
    }
    if (env->type != DOWNPOUR__MSG_TYPE__ACK)
        return dp_err(err, "%s: answered PUSH with %s", s->endpoint, dp_wire_type_name(env->type));
    const Downpour__Ack *a = env->ack;
    if (a->status == DOWNPOUR__ACK_STATUS__RECEIVED) {
        /* the last part of a push in parts, and the shard still lacks some
         * before it (lost with a dropped connection): the exchange says
         * HELLO, which discards them there, and sends every part again */
        dp_log_warn("%s: %s; the push goes again", s->endpoint,
                    a->reason && a->reason[0] ? a->reason : "a part is missing");
        s->restarted = 1;
        s->done = 0;
        return 0;
    }
    switch (a->status) {
    case DOWNPOUR__ACK_STATUS__APPLIED: r->applied++; break;
    case DOWNPOUR__ACK_STATUS__DROPPED: r->dropped++; break;
    case DOWNPOUR__ACK_STATUS__REJECTED: r->rejected++; break;
    default: return dp_err(err, "%s: ACK with unknown status %d", s->endpoint, (int)a->status);
    }
    if (a->status != DOWNPOUR__ACK_STATUS__APPLIED)
        s_set_reason(r, s->endpoint, a->reason && a->reason[0] ? a->reason : "no reason given");
    else if (a->reason && a->reason[0]) /* "repeat: ...": applied before, not again */
        s_set_reason(r, s->endpoint, a->reason);
    /* Sync: our gradient is in this version's aggregate (applied, or a
     * duplicate of one that is) — the next pull waits for the step. */
    if (a->status == DOWNPOUR__ACK_STATUS__APPLIED ||
        (a->status == DOWNPOUR__ACK_STATUS__DROPPED && a->staleness == 0))
        s->min_version = stamped + 1;
    if (a->staleness > r->staleness_max) r->staleness_max = a->staleness;
    push->staleness_sum += (double)a->staleness;
    r->version += a->version;
    dp_ps_seen(s, a->version);
    return 0;
}

/* Wait (bounded) until ZeroMQ has let go of every push frame. */
static int s_wait_released(dp_ps_client_t *c, char *err)
{
    double t0 = dp_now();
    while (atomic_load(&c->inflight) > 0) {
        if (dp_now() - t0 > c->timeout_s) {
            c->code = DP_PS_ERR_OTHER;
            return dp_err(err, "ZeroMQ still holds %d gradient frames after %.0f s",
                          atomic_load(&c->inflight), c->timeout_s);
        }
        s_sleep(50e-6);
    }
    return 0;
}

/* After a push with a stamp: a shard that restarted during it (another
 * incarnation, or its version went back below the stamp) keeps the lower of
 * its version and the stamp, so the next push is stamped with the restored
 * version; the others keep their last pull's version. */
static void s_after_stamped(dp_ps_client_t *c, const uint64_t *used, const uint64_t *inc)
{
    for (int i = 0; i < c->n; i++) {
        dp_ps_shard_t *s = &c->sh[i];
        if ((s->incarnation != inc[i] || s->version < used[i]) && used[i] < s->version)
            s->version = used[i];
    }
}

/* The start of a push: checks, and each shard's parts (stream: as many as
 * its plan makes, else one). */
static int s_push_begin(dp_ps_client_t *c, const dp_ps_push_t *p, int stream, char *err)
{
    c->code = DP_PS_ERR_OTHER; /* until the exchange says otherwise */
    c->push = NULL;
    c->streaming = 0;
    for (int i = 0; i < c->n; i++)
        if (!c->sh[i].pulled)
            return dp_err(err, "push before the first pull (the gradient needs a version)");
    if (p->stamp && p->stamp->n != c->n)
        return dp_err(err, "push stamped for %d shard(s) on a client of %d", p->stamp->n, c->n);
    for (int i = 0; i < c->n; i++) {
        s_plan_parts(c, i, stream);
        c->streaming |= c->sh[i].stream;
    }
    c->push = p;
    c->ready_lo = c->m->n_floats;
    c->code = DP_PS_OK;
    return 0;
}

int dp_ps_client_push_begin(dp_ps_client_t *c, const dp_ps_push_t *p, char *err)
{
    return s_push_begin(c, p, 1, err);
}

void dp_ps_client_push_part(dp_ps_client_t *c, size_t off, size_t n)
{
    if (!c->streaming) return;
    if (off + n != c->ready_lo) {
        if (off >= c->ready_lo) return; /* final already */
        /* not the run below what is final: the rest goes with push_end */
        dp_log_debug("push in parts: floats [%zu, %zu) final before [%zu, %zu); the rest of the "
                     "push waits for its end", off, off + n, off + n, c->ready_lo);
        c->streaming = 0;
        return;
    }
    c->ready_lo = off;
    for (int i = 0; i < c->n; i++) {
        dp_ps_shard_t *s = &c->sh[i];
        if (!s->stream || s->restarted || !s->sock) continue; /* push_end: rejoined first */
        while (s->parts_sent < s->parts && c->ready_lo <= s->part_at[s->parts_sent + 1]) {
            char e2[DP_ERR_LEN];
            if (s_send_part(c, i, s->parts_sent, e2) != 0) {
                /* push_end sends it again, and fails there if it must */
                dp_log_debug("push in parts: %s", e2);
                break;
            }
            s->parts_sent++;
        }
    }
}

int dp_ps_client_push_end(dp_ps_client_t *c, dp_push_result_t *res, char *err)
{
    dp_push_result_t local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    const dp_ps_push_t *p = c->push;
    if (!p) {
        c->code = DP_PS_ERR_OTHER;
        return dp_err(err, "push_end without a push_begin");
    }
    c->streaming = 0;
    uint64_t used[DP_ZSOCK_MAX_SHARDS], inc[DP_ZSOCK_MAX_SHARDS];
    for (int i = 0; p->stamp && i < c->n; i++) {
        used[i] = s_stamp_of(c, p, i);
        inc[i] = c->sh[i].incarnation;
    }
    res->bytes = s_encode(c, p->grads);
    c->bytes_pushed += res->bytes;
    for (int i = 0; i < c->n; i++) {
        res->parts += (int)c->sh[i].parts;
        res->parts_early += (int)c->sh[i].parts_sent;
    }
    s_push_t push = {p, res, 0};
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__PUSH, .n_shards = c->n,
                         .before = s_send_parts, .build = s_build_push, .on_reply = s_on_ack,
                         .arg = &push};
    int rc = dp_ps_exchange(c, &plan, err);
    char e2[DP_ERR_LEN];
    if (s_wait_released(c, e2) != 0) {
        if (rc == 0) rc = dp_err(err, "%s", e2);
        dp_log_error("%s", e2);
    }
    if (p->stamp) s_after_stamped(c, used, inc);
    if (rc == 0) res->staleness_mean = push.staleness_sum / c->n;
    c->push = NULL;
    return rc;
}

int dp_ps_client_push(dp_ps_client_t *c, const dp_ps_push_t *p, dp_push_result_t *res, char *err)
{
    if (res) memset(res, 0, sizeof *res);
    if (s_push_begin(c, p, 0, err) != 0) return -1;
    return dp_ps_client_push_end(c, res, err);
}

uint64_t dp_ps_client_bytes_pushed(const dp_ps_client_t *c)
{
    return c->bytes_pushed;
}

uint64_t dp_ps_client_resume_step(const dp_ps_client_t *c)
{
    uint64_t step = UINT64_MAX;
    for (int i = 0; i < c->n; i++)
        if (c->sh[i].worker_step < step) step = c->sh[i].worker_step;
    return c->n ? step : 0;
}

uint64_t dp_ps_client_updates_lost(const dp_ps_client_t *c)
{
    return c->updates_lost;
}

uint64_t dp_ps_client_version(const dp_ps_client_t *c)
{
    uint64_t v = 0;
    for (int i = 0; i < c->n; i++) v += c->sh[i].version;
    return v;
}

/* ---- stats, finish, shutdown ---------------------------------------- */

typedef struct {
    dp_ps_stats_t st;
    int finished, gone, num_workers; /* shard 0's worker counts */
} s_stats_acc_t;

static int s_on_stats(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                      const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    s_stats_acc_t *a = arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    if (env->type != DOWNPOUR__MSG_TYPE__STATS || !env->stats)
        return dp_err(err, "%s: answered STATS with %s", c->sh[i].endpoint,
                      dp_wire_type_name(env->type));
    const Downpour__Stats *s = env->stats;
    if (i == 0) {
        a->st.applied = s->applied;
        a->st.dropped = s->dropped;
        a->st.rejected = s->rejected;
        a->st.staleness_mean = s->staleness_mean;
        a->st.staleness_max = s->staleness_max;
        a->st.staleness_bins = s->n_staleness_hist < DP_STATS_HIST_BINS ? s->n_staleness_hist : DP_STATS_HIST_BINS;
        if (a->st.staleness_bins) /* an empty repeated field is NULL */
            memcpy(a->st.staleness_hist, s->staleness_hist, a->st.staleness_bins * sizeof(uint64_t));
        a->finished = s->workers_finished;
        a->gone = s->workers_gone;
        a->num_workers = s->num_workers;
    }
    a->st.version += s->version;
    a->st.steps_early += s->steps_early;
    return 0;
}

/* STATS to every shard, or to shard 0 only (its worker counts suffice). */
static int s_stats(dp_ps_client_t *c, s_stats_acc_t *a, int only_first, char *err)
{
    memset(a, 0, sizeof *a);
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__STATS, .n_shards = only_first ? 1 : c->n,
                     .on_reply = s_on_stats, .arg = a};
    return dp_ps_exchange(c, &plan, err);
}

int dp_ps_client_stats(dp_ps_client_t *c, dp_ps_stats_t *out, char *err)
{
    s_stats_acc_t a;
    if (s_stats(c, &a, 0, err) != 0) return -1;
    *out = a.st;
    return 0;
}

/* A reply without a body of interest: the request's own type, or ERROR. */
static int s_on_bare(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                     const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    int want = *(const int *)arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    if ((int)env->type != want)
        return dp_err(err, "%s: answered %s with %s", c->sh[i].endpoint, dp_wire_type_name(want),
                      dp_wire_type_name(env->type));
    return 0;
}

static void s_build_finished(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    (void)c, (void)i, (void)arg;
    Downpour__Barrier *b = &rq->body.barrier;
    *b = (Downpour__Barrier)DOWNPOUR__BARRIER__INIT;
    b->finished = 1;
    rq->env.barrier = b;
}

int dp_ps_client_finish(dp_ps_client_t *c, char *err)
{
    int want = DOWNPOUR__MSG_TYPE__BARRIER; /* the reply's type */
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__BARRIER, .n_shards = c->n,
                     .build = s_build_finished, .on_reply = s_on_bare, .arg = &want};
    if (dp_ps_exchange(c, &plan, err) != 0) return -1;
    c->finished = 1;
    return 0;
}

int dp_ps_client_wait_all_finished(dp_ps_client_t *c, double timeout_s, char *err)
{
    if (!c->finished && dp_ps_client_finish(c, err) != 0) return -1;
    double t0 = dp_now();
    for (;;) {
        s_stats_acc_t a;
        if (s_stats(c, &a, 1, err) != 0) return -1;
        int done = a.finished + a.gone;
        if (done >= a.num_workers) return 0;
        if (dp_now() - t0 >= timeout_s) {
            c->code = DP_PS_ERR_TIMEOUT;
            return dp_err(err, "%d of %d workers still running after %.0f s",
                          a.num_workers - done, a.num_workers, timeout_s);
        }
        if (c->stop && *c->stop) {
            c->code = DP_PS_ERR_INTERRUPTED;
            return dp_err(err, "interrupted");
        }
        s_sleep(0.1);
    }
}

int dp_ps_client_shutdown_servers(dp_ps_client_t *c, char *err)
{
    int want = DOWNPOUR__MSG_TYPE__SHUTDOWN; /* the reply's type */
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__SHUTDOWN, .n_shards = c->n,
                     .on_reply = s_on_bare, .arg = &want};
    return dp_ps_exchange(c, &plan, err);
}

int dp_ps_client_shm_shards(const dp_ps_client_t *c)
{
    int k = 0;
    for (int i = 0; i < c->n; i++) k += c->sh[i].shm;
    return k;
}

int dp_ps_transport_parse(const char *s, dp_ps_transport_t *out, char *err)
{
    if (s && strcmp(s, "auto") == 0) *out = DP_PS_TRANSPORT_AUTO;
    else if (s && strcmp(s, "shm") == 0) *out = DP_PS_TRANSPORT_SHM;
    else if (s && strcmp(s, "zmq") == 0) *out = DP_PS_TRANSPORT_ZMQ;
    else return dp_err(err, "'%s' is not a transport (auto, shm or zmq)", s ? s : "");
    return 0;
}

int dp_ps_wire_parse(const char *s, dp_ps_wire_t *out, char *err)
{
    if (s && strcmp(s, "fp32") == 0) *out = DP_PS_WIRE_FP32;
    else if (s && strcmp(s, "bf16") == 0) *out = DP_PS_WIRE_BF16;
    else return dp_err(err, "'%s' is not a wire precision (fp32 or bf16)", s ? s : "");
    return 0;
}

/* ---- pushing on an earlier pull's versions ---------------------------- */

void dp_ps_client_stamp(const dp_ps_client_t *c, dp_ps_stamp_t *out)
{
    out->n = c->n;
    for (int i = 0; i < c->n; i++) out->v[i] = c->sh[i].version;
}

uint64_t dp_ps_stamp_sum(const dp_ps_stamp_t *s)
{
    uint64_t v = 0;
    for (int i = 0; i < s->n; i++) v += s->v[i];
    return v;
}
