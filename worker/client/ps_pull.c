/* ps_pull: one pull — whole into params, lent to a sink, or in parts as the
 * forward needs them (ps_client.h) — and its request, dp_ps_pull_req_t: where
 * the weights go, and each shard's reply in parts. A whole pull's request
 * lives on its caller's stack for one exchange; a pull in parts' in the
 * client's room for one (c->pull_room, made once), c->pulling from
 * pull_begin until pull_until has every float.
 * The reply callback returns its outcome (done, more parts to come,
 * failed); the exchange (ps_exchange.c) owns the sockets and the
 * liveness rules.
 *
 * A pull in parts: pull_begin asks every shard for its floats into
 * params, each reply cut where a layer begins once DP_PS_PULL_BUCKET_BYTES
 * of the shard's slice lie below the cut, twice that below the next, and
 * so on, at most DP_WIRE_MAX_PULL_PARTS parts (the first layers first;
 * every part of a shard's reply from one snapshot, so of one version);
 * pull_until waits the exchange out until the floats asked for are in,
 * with the usual timeouts, heartbeats and repeats. A shard asked again
 * after floats of it were handed out has its repeated reply taken whole,
 * and pull_until says DP_PULL_TORN (at most once per repeat, which the
 * exchange bounds). A client with a shard through shared memory pulls
 * whole at pull_begin (a copy spread over the forward would let the slot
 * be rewritten under it), and pull_until says OK at once. A shard that
 * takes no cuts (an older one) answers whole, which is as good. Until the
 * pull is over the client takes no other request (a pull abandons an
 * unfinished one). A device region is read whole too: its entry lies on
 * the device already, one copy device to device (pull_device), which a
 * pull in parts would spread over the forward only to keep the entry
 * pinned the longer.
 *
 * Invariants: a shard's parts come in order, each the run between its
 * cuts, all of one version (one snapshot); floats [0, handed) of params
 * were told to the caller, so a shard asked again after it handed some of
 * them tears the pull (DP_PULL_TORN). */
#include "worker/client/ps_client.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "worker/client/ps_exchange.h"

#define DP_PS_PULL_BUCKET_BYTES (16 * 1024)

/* One shard's side of a pull. */
typedef struct {
    uint32_t n_cuts;        /* its reply in n_cuts + 1 parts (0: whole) */
    uint64_t cut[DP_WIRE_MAX_PULL_PARTS - 1]; /* lo < cut[0] < ... < hi (Pull.cuts) */
    uint32_t part;          /* the part awaited next */
    uint64_t got;           /* floats [lo, got) are in */
    bool torn;              /* its shared-memory copy raced a step: pull again */
} s_pull_shard_t;

/* One pull: where its weights go (into params, or each tensor lent to a
 * sink), and how far each shard's reply is in. */
struct dp_ps_pull_req {
    float *params;          /* NULL: to the sink */
    dp_ps_params_sink_fn sink;
    void *sink_arg;
    bool cut;               /* in parts: each reply cut where layers begin */
    size_t until;           /* ... and a wait ends once floats [0, until) are in */
    size_t handed;          /* floats [0, handed) the caller was told are in */
    bool torn;              /* a shard was asked again after some of its floats were handed */
    bool wire;              /* asked through the socket: shared memory tore S_TORN_SHM times */
    bool device;            /* a reply through a device region: c->dev's weights_in */
    s_pull_shard_t sh[DP_ZSOCK_MAX_SHARDS]; /* the first c->n used */
};

static void s_build_pull(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    dp_ps_pull_req_t *pr = arg;
    dp_ps_shard_t *s = &c->sh[i];
    Downpour__Pull *p = &rq->body.pull;
    *p = (Downpour__Pull)DOWNPOUR__PULL__INIT;
    p->min_version = c->info.mode == DP_MODE_SYNC ? s->min_version : 0;
    p->no_checksum = !s->crc;
    p->n_cuts = pr->sh[i].n_cuts;
    p->cuts = pr->sh[i].cut;
    rq->env.pull = p;
    rq->env.devregion = s->devr && !pr->wire; /* preferred to shared memory */
    rq->env.shm = s->shm && !pr->wire && !rq->env.devregion;
    if (c->bf16 && !s->shm && !s->devr) p->dtype = DOWNPOUR__DTYPE__BFLOAT16;
    if (i == 0) p->deal_step = c->deal_step; /* shard 0 deals */
}

/* Shard 0's first part of a pull that asked for a batch: the batch. */
static int s_take_deal(dp_ps_client_t *c, int i, const Downpour__Envelope *env, char *err)
{
    if (i != 0 || !c->deal_step || env->params->part != 0) return 0;
    const Downpour__Deal *d = env->params->deal;
    if (!d) {
        c->code = DP_PS_ERR_OTHER;
        return dp_err(err, "%s: PARAMS without the batch asked for (is this shard 0 of an "
                      "elastic crew, --workers MIN:MAX?)", c->sh[i].endpoint);
    }
    c->dealt = (dp_ps_dealt_t){.end = d->end, .epoch = d->epoch, .index = d->index};
    c->dealt_got = true;
    return 0;
}

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
static void s_plan_cuts(dp_ps_client_t *c, int i, bool cut, s_pull_shard_t *ps)
{
    const dp_ps_shard_t *s = &c->sh[i];
    ps->n_cuts = 0;
    uint64_t from = s->lo, bucket = S_PULL_BUCKET_FLOATS;
    for (int l = 0; cut && l < c->m->n_layers && ps->n_cuts + 1 < DP_WIRE_MAX_PULL_PARTS; l++) {
        size_t a, b;
        if (!dp_model_layer_span(c->m, l, &a, &b) || a <= from || a >= s->hi) continue;
        if (a - from >= bucket) {
            ps->cut[ps->n_cuts++] = from = a;
            bucket *= 2;
        }
    }
}

/* The exchange's "before" for a pull: shard i's reply starts from its
 * first part. again: the shard was said HELLO anew (its WELCOME may bring
 * another range, so the cuts are planned again), and if floats of it had
 * been handed to the caller already, what the caller read of them may be
 * of another version than the repeated reply: the pull is torn. */
static int s_pull_before(dp_ps_client_t *c, int i, bool again, void *arg, char *err)
{
    (void)err;
    dp_ps_pull_req_t *pr = arg;
    s_pull_shard_t *ps = &pr->sh[i];
    if (again && pr->handed > c->sh[i].lo) pr->torn = true;
    s_plan_cuts(c, i, pr->cut, ps);
    ps->part = 0;
    ps->got = c->sh[i].lo;
    return 0;
}

/* The floats [off, off + n) of the vector at src, to the pull's destination:
 * src is params itself, the client's landing buffer, or a received frame. */
static void s_deliver(const dp_ps_pull_req_t *to, size_t off, const float *src, size_t n)
{
    if (to->params) {
        if (src != to->params + off) memcpy(to->params + off, src, n * sizeof(float));
    } else
        to->sink(to->sink_arg, off, src, n);
}

/* Shard i's tensors through shared memory (its torn set, and the rest left,
 * when a step raced the copy). */
static void s_params_from_shm(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                              dp_ps_pull_req_t *to)
{
    dp_ps_shard_t *s = &c->sh[i];
    bool *torn = &to->sh[i].torn;
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
                *torn = true;
                return;
            }
            to->sink(to->sink_arg, d->offset, dp_shm_slot(&s->shm_params, slot) + (d->offset - s->lo), n);
            atomic_thread_fence(memory_order_acquire); /* the sink's copy before the second look */
            if (dp_shm_seq(&s->shm_params, slot) != seq) {
                *torn = true;
                return;
            }
            continue;
        }
        if (!dp_shm_read(&s->shm_params, (int)env->params->shm_slot, env->params->shm_seq,
                         (size_t)(d->offset - s->lo), dst + d->offset, n)) {
            *torn = true; /* the pull goes again */
            return;
        }
        s_deliver(to, d->offset, dst + d->offset, n);
    }
}

/* A frame's floats: lent in place when they are float32 at a float-aligned
 * address (ZeroMQ's receive buffer may start anywhere), else widened or
 * copied into params or the landing buffer first. */
static void s_params_from_frame(dp_ps_client_t *c, const Downpour__TensorDesc *d,
                                const dp_wire_frame_t *fr, const dp_ps_pull_req_t *to)
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
static int s_params_due(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                        s_pull_shard_t *ps, char *err)
{
    const dp_ps_shard_t *s = &c->sh[i];
    const Downpour__Params *p = env->params;
    uint32_t k = p->part, parts = dp_wire_params_parts(p);
    char e2[DP_ERR_LEN];
    if (parts > 1 && parts != ps->n_cuts + 1)
        return dp_err(err, "%s: bad PARAMS: in %u parts, %u asked for", s->endpoint, parts,
                      ps->n_cuts + 1);
    if (k != ps->part)
        return dp_err(err, "%s: bad PARAMS: part %u where part %u was due", s->endpoint, k,
                      ps->part);
    if (k > 0 && p->version != s->version)
        return dp_err(err, "%s: bad PARAMS: part %u is of version %llu, part 0 of %llu (a pull is one version)",
                      s->endpoint, k, (unsigned long long)p->version,
                      (unsigned long long)s->version);
    uint64_t a, b;
    if (dp_wire_check_run(env, s->lo, s->hi, &a, &b, e2) != 0)
        return dp_err(err, "%s: bad PARAMS: %s", s->endpoint, e2);
    uint64_t want_a = k ? ps->cut[k - 1] : s->lo;
    uint64_t want_b = parts > 1 && k < ps->n_cuts ? ps->cut[k] : s->hi;
    if (a != want_a || b != want_b)
        return dp_err(err, "%s: bad PARAMS: part %u of %u holds floats [%llu, %llu), not [%llu, %llu)",
                      s->endpoint, k, parts, (unsigned long long)a, (unsigned long long)b,
                      (unsigned long long)want_a, (unsigned long long)want_b);
    ps->got = b;
    return 0;
}

/* The reply callback: shard i's PARAMS (all, or one part) to the pull's
 * destination; more to come while parts are due. */
static dp_ps_reply_t s_on_params(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                                 const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    dp_ps_pull_req_t *to = arg;
    s_pull_shard_t *ps = &to->sh[i];
    char e2[DP_ERR_LEN];
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    if (env->type != DOWNPOUR__MSG_TYPE__PARAMS)
        return dp_err(err, "%s: answered PULL with %s", s->endpoint, dp_wire_type_name(env->type));
    if (s_take_deal(c, i, env, err) != 0) return DP_PS_REPLY_FAILED;
    if (env->devregion) {
        if (dp_wire_check_range(env, s->lo, s->hi, e2) != 0)
            return dp_err(err, "%s: bad PARAMS: %s", s->endpoint, e2);
        if (!s->devr)
            return dp_err(err, "%s: PARAMS through a device region we do not map", s->endpoint);
        float *dst = to->params ? to->params : c->landing;
        if (!to->device && c->dev && c->dev->enter) c->dev->enter(c->dev->arg); /* ops->copy's */
        int rc = to->device ? dp_ps_devr_read_device(s, env->params->version, c->dev)
                            : dp_ps_devr_read(s, env->params->version, dst + s->lo);
        if (rc != 0) {
            ps->torn = true; /* s_pull asks again, in frames after S_TORN_SHM tries */
            return DP_PS_REPLY_DONE;
        }
        if (to->device) c->dev_pulls++; /* in the network already, device to device */
        else s_deliver(to, s->lo, dst + s->lo, (size_t)(s->hi - s->lo));
        ps->got = s->hi;
        c->bytes_pulled += (s->hi - s->lo) * sizeof(float);
    } else if (env->shm) {
        if (dp_wire_check_range(env, s->lo, s->hi, e2) != 0)
            return dp_err(err, "%s: bad PARAMS: %s", s->endpoint, e2);
        if (!s->shm || env->params->shm_slot >= DP_SHM_PARAM_SLOTS)
            return dp_err(err, "%s: PARAMS through shared memory we do not have (slot %u)",
                          s->endpoint, env->params->shm_slot);
        s_params_from_shm(c, i, env, to);
        if (ps->torn) return DP_PS_REPLY_DONE; /* s_pull asks again */
        ps->got = s->hi;
        for (size_t f = 0; f < env->n_tensors; f++) c->bytes_pulled += env->tensors[f]->byte_length;
    } else if (s_params_due(c, i, env, ps, err) != 0)
        return DP_PS_REPLY_FAILED;
    for (int f = 0; f < nf; f++) {
        s_params_from_frame(c, env->tensors[f], &frames[f], to);
        c->bytes_pulled += frames[f].len;
    }
    s->version = env->params->version;
    dp_ps_seen(s, s->version);
    s->pulled = true;
    c->pulls_parts++;
    if (!env->shm && !env->devregion && ++ps->part < dp_wire_params_parts(env->params))
        return DP_PS_REPLY_MORE;
    return DP_PS_REPLY_DONE;
}

/* The enough of a pull in parts: every shard's floats below to->until are in. */
static bool s_pulled_until(const dp_ps_client_t *c, void *arg)
{
    const dp_ps_pull_req_t *to = arg;
    for (int i = 0; i < c->n; i++) {
        const dp_ps_shard_t *s = &c->sh[i];
        if (s->lo < to->until && to->sh[i].got < (to->until < s->hi ? to->until : s->hi))
            return false;
    }
    return true;
}

static dp_ps_plan_t s_pull_plan(dp_ps_client_t *c, dp_ps_pull_req_t *to)
{
    return (dp_ps_plan_t){.type = DOWNPOUR__MSG_TYPE__PULL, .n_shards = c->n,
                          .before = s_pull_before, .build = s_build_pull, .on_reply = s_on_params,
                          .enough = to->cut ? s_pulled_until : NULL, .arg = to};
}

/* A shared-memory copy is torn when two steps land between the servers'
 * reply and the end of the copy: rare, except on a loaded machine where
 * the reader waits for a core while a small model's steps come every few
 * microseconds (two A3C workers on 2 busy cores tore 16 in a row). After
 * S_TORN_SHM tries the pull goes through the socket, whose copy is the
 * servers' own and cannot tear; S_TORN_TRIES bounds the loop all the same. */
#define S_TORN_SHM 4
#define S_TORN_TRIES 16

/* A whole pull, request to reply (an unfinished pull in parts abandoned). */
static int s_pull(dp_ps_client_t *c, dp_ps_pull_req_t *to, char *err)
{
    c->pulling = NULL;
    dp_ps_plan_t pull = s_pull_plan(c, to);
    c->pulls_parts = 0;
    c->dealt_got = false;
    for (int t = 0; t < S_TORN_TRIES; t++) {
        bool torn = false;
        to->wire = t >= S_TORN_SHM;
        for (int i = 0; i < c->n; i++) to->sh[i].torn = false;
        if (dp_ps_exchange(c, &pull, err) != 0) return -1;
        for (int i = 0; i < c->n; i++) torn |= to->sh[i].torn;
        if (!torn) return 0;
    }
    c->code = DP_PS_ERR_OTHER;
    return dp_err(err, "shared memory: %d pulls in a row raced the servers' steps", S_TORN_TRIES);
}

int dp_ps_client_pull(dp_ps_client_t *c, float *params, char *err)
{
    dp_ps_pull_req_t to = {.params = params}; /* the caller's: one exchange */
    return s_pull(c, &to, err);
}

int dp_ps_client_pull_to(dp_ps_client_t *c, dp_ps_params_sink_fn sink, void *arg, char *err)
{
    if (!c->landing) c->landing = dp_aligned_alloc(c->m->n_floats * sizeof(float));
    dp_ps_pull_req_t to = {.sink = sink, .sink_arg = arg};
    return s_pull(c, &to, err);
}

int dp_ps_client_pull_device(dp_ps_client_t *c, dp_ps_params_sink_fn sink, void *arg, char *err)
{
    if (!c->landing) c->landing = dp_aligned_alloc(c->m->n_floats * sizeof(float));
    dp_ps_pull_req_t to = {.sink = sink, .sink_arg = arg, .device = c->dev != NULL};
    return s_pull(c, &to, err);
}

int dp_ps_client_pull_begin(dp_ps_client_t *c, float *params, char *err)
{
    c->pulling = NULL; /* one unfinished is abandoned */
    if (dp_ps_client_shm_shards(c) > 0 || dp_ps_client_devregion_shards(c) > 0)
        return dp_ps_client_pull(c, params, err); /* whole, now */
    if (!c->pull_room) c->pull_room = dp_malloc(sizeof *c->pull_room);
    dp_ps_pull_req_t *to = c->pull_room; /* lives until pull_until has every float */
    *to = (dp_ps_pull_req_t){.params = params, .cut = true};
    dp_ps_plan_t pull = s_pull_plan(c, to);
    c->pulls_parts = 0;
    c->dealt_got = false;
    if (dp_ps_exchange_send(c, &pull, err) != 0) return -1;
    c->pulling = to;
    return 0;
}

/* The pull in parts waited out until floats [0, until) are in (all of
 * them: the pull is over); a torn one is first waited out whole. */
dp_pull_status_t dp_ps_client_pull_until(dp_ps_client_t *c, size_t until, char *err)
{
    dp_ps_pull_req_t *to = c->pulling;
    if (!to) return DP_PULL_OK; /* pulled whole at pull_begin, or none in progress */
    to->until = until;
    dp_ps_plan_t pull = s_pull_plan(c, to);
    int rc = dp_ps_exchange_wait(c, &pull, err);
    if (rc == 0 && to->torn) {
        pull.enough = NULL;
        rc = dp_ps_exchange_wait(c, &pull, err);
        if (rc == 0) {
            dp_log_warn("pull in parts: a shard was asked again after the forward read part of its "
                        "reply; the forward starts again on the repeated reply");
            to->torn = false;
            to->handed = 0;
            return DP_PULL_TORN;
        }
    }
    if (rc != 0 || until >= c->m->n_floats) {
        c->pulling = NULL;
        return rc != 0 ? DP_PULL_FAILED : DP_PULL_OK;
    }
    if (until > to->handed) to->handed = until;
    return DP_PULL_OK;
}

void dp_ps_client_deal_step(dp_ps_client_t *c, uint64_t step)
{
    c->deal_step = step;
}

int dp_ps_client_dealt(const dp_ps_client_t *c, dp_ps_dealt_t *out)
{
    if (!c->dealt_got) return -1;
    *out = c->dealt;
    return 0;
}

uint32_t dp_ps_client_pull_parts(const dp_ps_client_t *c)
{
    return c->pulls_parts;
}
