/* ps_push: one push — whole, or in parts as the backward makes them
 * (ps_client.h) — and its request, dp_ps_push_req_t: the caller's push,
 * each shard's parts, and the ACKs summed as they come back. It lies in the
 * client's room for one (c->push_room, made once), c->pushing from
 * push_begin to push_end. The reply callback returns its outcome (done,
 * again: the shard lacks parts, failed); the exchange (ps_exchange.c) owns
 * the sockets and the liveness rules.
 *
 * A push in parts: each shard's parts are planned at push_begin from the
 * model's layers, the last layer first (the order the backward finishes
 * them): a cut where a layer begins once at least DP_PS_PUSH_BUCKET_BYTES
 * of the slice are pending above it. A run made final out of order (not
 * the one just below what is final) makes the rest wait for push_end
 * (still correct, only later). push_end awaits every reply with the usual
 * timeouts, heartbeats and repeats: after a restart or a lost reply, all
 * the parts to that shard go again. Through shared memory a part is
 * written to its place in the gradient segment and its message says so. A
 * compressed push (--compress) and a shard that takes no parts (an older
 * one, its WELCOME says) get the push whole at push_end. push_part outside
 * a push does nothing.
 *
 * Invariants: a shard's parts tile its slice, the last layer's first
 * (part_at[0] = hi > ... > part_at[parts] = lo); the parts before the last
 * go without awaiting a reply, the last is the one the exchange awaits;
 * push frames point into the caller's gradient and c->inflight counts
 * those ZeroMQ still holds, so push_end returns only once it is 0. */
#include "worker/client/ps_client.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "worker/client/ps_exchange.h"

#define DP_PS_PUSH_BUCKET_BYTES (256 * 1024)

/* One shard's side of a push. */
typedef struct {
    uint32_t parts;         /* 1: whole; part k is floats [part_at[k + 1], part_at[k]) */
    uint32_t parts_sent;    /* the first ones sent, by push_part or push_end's exchange */
    bool stream;            /* push_part may send them (a dense push streamed) */
    uint64_t part_at[DP_WIRE_MAX_PUSH_PARTS + 1]; /* part_at[0] = hi > ... > part_at[parts] = lo */
} s_push_shard_t;

/* One push. */
struct dp_ps_push_req {
    const dp_ps_push_t *p;  /* the caller's, until push_end returns */
    dp_push_result_t *res;  /* push_end's: the ACKs summed */
    double staleness_sum;
    bool streaming;         /* push_part sends the parts it makes ready */
    size_t ready_lo;        /* floats [ready_lo, n_floats) are final */
    s_push_shard_t sh[DP_ZSOCK_MAX_SHARDS]; /* the first c->n used */
};

/* The version shard i's slice is stamped with: the push's stamp, but never
 * above the shard's own version — one lowered by its restart (the WELCOME
 * of a rejoin) wins, so a repeated push carries the restored version. */
static uint64_t s_stamp_of(const dp_ps_client_t *c, const dp_ps_push_t *p, int i)
{
    uint64_t v = c->sh[i].version;
    return p->stamp && p->stamp->v[i] < v ? p->stamp->v[i] : v;
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
        rq->payload[0] = (dp_wire_payload_t){z->idx, z->k * 4, dp_ps_frame_released, &c->inflight};
        rq->payload[1] = (dp_wire_payload_t){z->val, z->k * 4, dp_ps_frame_released, &c->inflight};
        nd = 2;
    } else {
        p->compression = DOWNPOUR__COMPRESSION__SIGN;
        p->scale = z->scale;
        size_t nb = (z->n + 7) / 8;
        dp_wire_desc_fill(&rq->desc[0], &rq->shape[0], "signs", NULL, z->n, s->lo, 1, 0);
        rq->desc[0].dtype = DOWNPOUR__DTYPE__BIT;
        rq->desc[0].byte_length = nb;
        rq->desc[0].crc32 = s->crc ? dp_wire_crc32(z->bits, nb) : 0;
        rq->payload[0] = (dp_wire_payload_t){z->bits, nb, dp_ps_frame_released, &c->inflight};
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

/* A device push's slice of shard i that goes through shared memory or
 * frames (its slot not free, its region gone at a new HELLO): copied to
 * the host first, into the client's buffer. A copy that fails leaves NaN,
 * which the shard refuses (not finite): never a gradient half copied. */
static const float *s_grads_host(dp_ps_client_t *c, int i, const float *from)
{
    const dp_ps_shard_t *s = &c->sh[i];
    size_t n = (size_t)(s->hi - s->lo);
    char err[DP_ERR_LEN];
    if (!c->grads_host) c->grads_host = dp_aligned_alloc(c->m->n_floats * sizeof(float));
    float *h = c->grads_host + s->lo;
    if (c->dev->enter) c->dev->enter(c->dev->arg);
    if (c->dev->grads_out(c->dev->arg, h, from, (size_t)s->lo, n, 0, err) != 0) {
        dp_log_error("%s: the push's gradient off the device: %s", s->endpoint, err);
        for (size_t j = 0; j < n; j++) h[j] = NAN;
    }
    return c->grads_host;
}

/* Part k of shard i's slice of the gradient (the whole slice when the push
 * to it is one part), handed to ZeroMQ without a copy. */
static void s_build_part(dp_ps_client_t *c, int i, uint32_t k, dp_ps_req_t *rq,
                         const dp_ps_push_req_t *pr)
{
    const dp_ps_shard_t *s = &c->sh[i];
    const s_push_shard_t *ps = &pr->sh[i];
    const dp_ps_push_t *pp = pr->p;
    const float *grads = pp->grads;
    Downpour__Push *p = &rq->body.push;
    *p = (Downpour__Push)DOWNPOUR__PUSH__INIT;
    p->version = s_stamp_of(c, pp, i);
    p->loss = pp->loss;
    p->batch = pp->batch;
    p->step = pp->step;
    p->local_steps = pp->local_steps; /* DyLU: on every part, each shard checks them */
    p->step_ms = pp->step_ms;
    if (ps->parts > 1) {
        p->part = k;
        p->parts = ps->parts;
    }
    if (pp->segment && k + 1 == ps->parts) { /* with the part that completes the push */
        const dp_ps_segment_t *sg = pp->segment;
        p->env_steps = sg->env_steps;
        p->n_episode_returns = p->n_episode_ends = sg->n;
        p->episode_returns = (double *)sg->returns;
        p->episode_ends = (uint32_t *)sg->ends;
        p->solved_threshold = sg->threshold;
    }
    rq->env.push = p;
    rq->env.tensors = rq->descs;
    if (s->z && s->z->kind != DP_COMPRESS_NONE) {
        s_build_compressed(c, s, rq);
        return;
    }
    uint64_t a = ps->part_at[k + 1]; /* the plan of push_begin: [lo, hi) when whole */
    size_t cnt = (size_t)(ps->part_at[k] - a);
    rq->descs[0] = &rq->desc[0];
    rq->env.n_tensors = 1;
    /* The device region: a whole dense push, written into our slot (from
     * the device's gradient itself when grads is NULL) and counted; the
     * slot not ours yet (its last push not taken) sends it as before. */
    if (s->devr && ps->parts == 1 && cnt == s->hi - s->lo &&
        dp_ps_devr_write(&c->sh[i], grads ? grads + s->lo : NULL, pp->d_grads, cnt, c->dev) == 0) {
        c->dev_pushes += !grads;
        dp_wire_desc_fill(&rq->desc[0], rq->shape, "params", NULL, cnt, a, 1, 0);
        dp_wire_desc_no_checksum(&rq->desc[0]);
        rq->env.devregion = 1;
        return;
    }
    if (!grads) grads = s_grads_host(c, i, pp->d_grads); /* the device's slice, another way */
    /* the slice as sent: the caller's, or with error feedback the client's
     * (a slice too small for top-k goes dense, its residual added) */
    const float *slice = (s->z ? s->z->v : grads + s->lo) + (a - s->lo);
    dp_wire_desc_fill(&rq->desc[0], rq->shape, "params", slice, cnt, a,
                      !s->crc || s->shm || c->bf16, 0); /* bf16: its own CRC below */
    if (!s->crc) dp_wire_desc_no_checksum(&rq->desc[0]);
    if (s->shm) { /* our slot, where the floats lie: the shard copies them out first */
        float *slot = dp_shm_slot(&s->shm_grad, 0) + (a - s->lo);
        if (slot != slice) /* computed there: dp_ps_client_push_buffer */
            memcpy(slot, slice, cnt * sizeof(float));
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
        rq->payload[0] = (dp_wire_payload_t){h, cnt * 2, dp_ps_frame_released, &c->inflight};
    } else
        rq->payload[0] = (dp_wire_payload_t){slice, cnt * sizeof(float), dp_ps_frame_released,
                                             &c->inflight};
    rq->n_payloads = 1;
}

/* The request the push's exchange awaits from shard i: its last part. */
static void s_build_push(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    const dp_ps_push_req_t *pr = arg;
    s_build_part(c, i, pr->sh[i].parts - 1, rq, pr);
}

/* Part k of the push in progress to shard i, sent without awaiting its
 * reply (RECEIVED, which proves the shard alive and nothing more). */
static int s_send_part(dp_ps_client_t *c, dp_ps_push_req_t *pr, int i, uint32_t k, char *err)
{
    dp_ps_req_t rq;
    memset(&rq, 0, sizeof rq);
    dp_wire_env_init(&rq.env, DOWNPOUR__MSG_TYPE__PUSH, 0, c->worker_id, c->m->fingerprint);
    s_build_part(c, i, k, &rq, pr);
    if (dp_ps_send_only(c, i, &rq, err) != 0) return -1;
    if (k + 1 == pr->sh[i].parts) dp_ps_await_sent(c, i, rq.env.request_id); /* the one awaited */
    return 0;
}

static void s_plan_parts(dp_ps_client_t *c, dp_ps_push_req_t *pr, int i, bool stream);

/* The exchange's "before" for shard i: the parts before the last that
 * have not gone yet, or all of them again after a new HELLO (the shard
 * dropped what it had of this push: server/core/shard_parts.h). The last is
 * the exchange's own request (or went already: dp_ps_await_sent). */
static int s_send_parts(dp_ps_client_t *c, int i, bool again, void *arg, char *err)
{
    dp_ps_push_req_t *pr = arg;
    s_push_shard_t *ps = &pr->sh[i];
    if (again) s_plan_parts(c, pr, i, ps->stream); /* its WELCOME may bring another range */
    for (; ps->parts_sent + 1 < ps->parts; ps->parts_sent++)
        if (s_send_part(c, pr, i, ps->parts_sent, err) != 0) return -1;
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
static void s_plan_parts(dp_ps_client_t *c, dp_ps_push_req_t *pr, int i, bool stream)
{
    const dp_ps_shard_t *s = &c->sh[i];
    s_push_shard_t *ps = &pr->sh[i];
    ps->parts = 1;
    ps->parts_sent = 0;
    dp_ps_await_sent(c, i, 0);
    ps->part_at[0] = s->hi;
    ps->part_at[1] = s->lo;
    /* a compressed push is encoded whole at push_end */
    ps->stream = stream && c->compress.kind == DP_COMPRESS_NONE;
    uint32_t max = s->push_parts < DP_WIRE_MAX_PUSH_PARTS ? s->push_parts : DP_WIRE_MAX_PUSH_PARTS;
    /* whole, but still as soon as the slice is final; the device region
     * takes a push whole (one slot, one count) */
    if (!ps->stream || max < 2 || s->devr) return;
    uint32_t k = 0;
    uint64_t top = s->hi;
    for (int l = c->m->n_layers - 1; l >= 0 && k + 2 <= max; l--) {
        size_t a, b;
        if (!dp_model_layer_span(c->m, l, &a, &b) || b <= s->lo || a >= top) continue;
        if (a > s->lo && top - a >= S_BUCKET_FLOATS) ps->part_at[++k] = top = a;
    }
    ps->part_at[++k] = s->lo;
    ps->parts = k;
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

/* The reply callback: shard i's ACK summed into the push's result; again
 * when the shard lacks parts of it. */
static dp_ps_reply_t s_on_ack(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                              const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    dp_ps_shard_t *s = &c->sh[i];
    dp_ps_push_req_t *push = arg;
    dp_push_result_t *r = push->res;
    uint64_t stamped = s_stamp_of(c, push->p, i);
    s->min_version = 0;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) { /* a refusal of this gradient, not a failure */
        r->rejected++;
        r->account_refused += env->error->code == DOWNPOUR__ERROR_CODE__ERR_ACCOUNT;
        s_set_reason(r, s->endpoint, env->error->message);
        return DP_PS_REPLY_DONE;
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
        return DP_PS_REPLY_AGAIN;
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
    if (a->workers_live > r->workers_live) r->workers_live = a->workers_live;
    if (a->env_steps > r->env_steps) r->env_steps = a->env_steps;
    if (a->crew_step_ms > 0 && (r->crew_step_ms == 0 || a->crew_step_ms < r->crew_step_ms))
        r->crew_step_ms = a->crew_step_ms;
    dp_ps_seen(s, a->version);
    return DP_PS_REPLY_DONE;
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
static int s_push_begin(dp_ps_client_t *c, const dp_ps_push_t *p, bool stream, char *err)
{
    c->code = DP_PS_ERR_OTHER; /* until the exchange says otherwise */
    c->pushing = NULL;
    for (int i = 0; i < c->n; i++)
        if (!c->sh[i].pulled)
            return dp_err(err, "push before the first pull (the gradient needs a version)");
    if (p->stamp && p->stamp->n != c->n)
        return dp_err(err, "push stamped for %d shard(s) on a client of %d", p->stamp->n, c->n);
    if (!p->grads && (stream || !c->dev || c->compress.kind != DP_COMPRESS_NONE))
        return dp_err(err, "a push from the device (no host gradient) needs the device's copies "
                      "set, dense and whole");
    if (!c->push_room) c->push_room = dp_malloc(sizeof *c->push_room);
    dp_ps_push_req_t *pr = c->push_room; /* lives until push_end */
    pr->p = p;
    pr->streaming = false;
    pr->ready_lo = c->m->n_floats;
    for (int i = 0; i < c->n; i++) {
        s_plan_parts(c, pr, i, stream);
        pr->streaming |= pr->sh[i].stream;
    }
    c->pushing = pr;
    c->code = DP_PS_OK;
    return 0;
}

int dp_ps_client_push_begin(dp_ps_client_t *c, const dp_ps_push_t *p, char *err)
{
    return s_push_begin(c, p, true, err);
}

void dp_ps_client_push_part(dp_ps_client_t *c, size_t off, size_t n)
{
    dp_ps_push_req_t *pr = c->pushing;
    if (!pr || !pr->streaming) return;
    if (off + n != pr->ready_lo) {
        if (off >= pr->ready_lo) return; /* final already */
        /* not the run below what is final: the rest goes with push_end */
        dp_log_debug("push in parts: floats [%zu, %zu) final before [%zu, %zu); the rest of the "
                     "push waits for its end", off, off + n, off + n, pr->ready_lo);
        pr->streaming = false;
        return;
    }
    pr->ready_lo = off;
    for (int i = 0; i < c->n; i++) {
        const dp_ps_shard_t *s = &c->sh[i];
        s_push_shard_t *ps = &pr->sh[i];
        if (!ps->stream || s->restarted || s->reconnected || !s->sock)
            continue; /* push_end: rejoined first */
        while (ps->parts_sent < ps->parts && pr->ready_lo <= ps->part_at[ps->parts_sent + 1]) {
            char e2[DP_ERR_LEN];
            if (s_send_part(c, pr, i, ps->parts_sent, e2) != 0) {
                /* push_end sends it again, and fails there if it must */
                dp_log_debug("push in parts: %s", e2);
                break;
            }
            ps->parts_sent++;
        }
    }
}

int dp_ps_client_push_end(dp_ps_client_t *c, dp_push_result_t *res, char *err)
{
    dp_push_result_t local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    dp_ps_push_req_t *pr = c->pushing;
    if (!pr) {
        c->code = DP_PS_ERR_OTHER;
        return dp_err(err, "push_end without a push_begin");
    }
    const dp_ps_push_t *p = pr->p;
    pr->streaming = false;
    uint64_t used[DP_ZSOCK_MAX_SHARDS], inc[DP_ZSOCK_MAX_SHARDS];
    for (int i = 0; p->stamp && i < c->n; i++) {
        used[i] = s_stamp_of(c, p, i);
        inc[i] = c->sh[i].incarnation;
    }
    res->bytes = s_encode(c, p->grads);
    c->bytes_pushed += res->bytes;
    for (int i = 0; i < c->n; i++) {
        res->parts += (int)pr->sh[i].parts;
        res->parts_early += (int)pr->sh[i].parts_sent;
    }
    pr->res = res;
    pr->staleness_sum = 0;
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__PUSH, .n_shards = c->n,
                         .before = s_send_parts, .build = s_build_push, .on_reply = s_on_ack,
                         .arg = pr};
    int rc = dp_ps_exchange(c, &plan, err);
    char e2[DP_ERR_LEN];
    if (dp_ps_wait_released(c, e2) != 0) {
        if (rc == 0) rc = dp_err(err, "%s", e2);
        dp_log_error("%s", e2);
    }
    if (p->stamp) s_after_stamped(c, used, inc);
    if (rc == 0) res->staleness_mean = pr->staleness_sum / c->n;
    c->pushing = NULL;
    return rc;
}

int dp_ps_client_push(dp_ps_client_t *c, const dp_ps_push_t *p, dp_push_result_t *res, char *err)
{
    if (res) memset(res, 0, sizeof *res);
    if (s_push_begin(c, p, false, err) != 0) return -1;
    return dp_ps_client_push_end(c, res, err);
}

