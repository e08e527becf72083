/* ps: the parameter-server shard's event loop, consistency policies and
 * liveness (see ps.h for the contract).
 *
 * Invariants:
 *  - ps->w holds floats [lo, hi) of the flat vector; version counts optimizer
 *    steps of this shard (one per applied async/ssp gradient, one per sync
 *    aggregate), so Adam's t = version after the step and the lr schedule is
 *    indexed by the version before it.
 *  - Nothing touches w, state, acc or a counter other than "rejected" /
 *    "malformed" before the message passed dp_wire_check, the fingerprint,
 *    the range and (for gradients) the finite check.
 *  - ZeroMQ never sees a pointer to live parameters: PARAMS replies send a
 *    per-version snapshot shared by every reply of that version, freed by the
 *    last zmq free callback (atomic refcount; runs on ZeroMQ's I/O thread).
 *  - Every blocking wait is zmq_poll with a timeout of at most 100 ms, so the
 *    stop flag is seen promptly. */
#include "server/ps.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/metrics.h"
#include "common/model.h"
#include "common/safetensors.h"
#include "common/util.h"

#define S_MAX_PENDING 4096

typedef struct {
    int joined;            /* said HELLO at least once */
    int finished;          /* said BARRIER{finished}; cleared by a new HELLO */
    int gone;              /* silent past the heartbeat timeout; cleared by any message */
    double last_seen;      /* dp_now() of its last valid message (start time if none) */
    uint64_t clock;        /* pushes it made that were applied (ssp) */
    uint64_t contributed;  /* sync: version + 1 it last contributed to, 0 = none */
} s_worker_t;

typedef struct {
    zmq_msg_t identity;    /* ROUTER identity to answer */
    uint64_t request_id;
    int worker;
    uint64_t min_version;  /* sync: answer once version >= this */
} s_pending_t;

/* One copy of the parameters at one version, shared by PARAMS replies. */
typedef struct {
    atomic_int refs;       /* server's reference + one per zmq message in flight */
    uint64_t version;
    uint32_t crc;
    size_t n;
    float data[];
} s_snap_t;

typedef struct {
    const dp_ps_config_t *cfg;
    dp_model_t model;
    size_t lo, hi, n;      /* this shard's float range and its length */
    float *w;              /* n floats: live parameters */
    float *state;          /* n * per optimizer state */
    int state_per;
    float *acc;            /* sync: n floats, sum of gradients of this version */
    int acc_count;         /* gradients in acc */
    float *scratch;        /* n floats: gathered / realigned gradient */
    uint64_t version;
    int replicas;          /* R resolved */
    s_worker_t *workers;
    int n_workers;
    s_pending_t *pending;
    int n_pending;
    s_snap_t *snap;        /* the current version's snapshot, or NULL */
    uint64_t applied, dropped, rejected, malformed, staleness_sum, staleness_max;
    void *ctx, *sock;
    char endpoint[256];
    char ckpt_path[DP_PS_PATH_LEN + 64];
    uint64_t ckpt_version; /* version last written (UINT64_MAX: none) */
    dp_metrics_t *metrics; /* JSON lines; a no-op without --metrics */
    double next_metrics;
    int quit;              /* SHUTDOWN received */
} s_ps_t;

/* ---- helpers ---------------------------------------------------------- */

void dp_ps_shard_range(size_t n, int i, int k, size_t *lo, size_t *hi)
{
    /* floor(i*n/k) in 128-bit-safe arithmetic (n < 2^40 and k small). */
    *lo = (size_t)(((unsigned __int128)n * (unsigned)i) / (unsigned)k);
    *hi = (size_t)(((unsigned __int128)n * (unsigned)(i + 1)) / (unsigned)k);
}

void dp_ps_checkpoint_path(char *out, size_t n, const char *dir, int i, int k)
{
    snprintf(out, n, "%s/ps-shard-%d-of-%d.safetensors", dir, i, k);
}


static void s_snap_unref(void *data, void *hint)
{
    (void)data;
    s_snap_t *s = hint;
    if (atomic_fetch_sub(&s->refs, 1) == 1) free(s);
}

/* The shared snapshot of the current version, made on first use. */
static s_snap_t *s_snapshot(s_ps_t *ps)
{
    if (ps->snap && ps->snap->version == ps->version) return ps->snap;
    if (ps->snap) s_snap_unref(NULL, ps->snap);
    s_snap_t *s = dp_malloc(sizeof *s + ps->n * sizeof(float));
    atomic_init(&s->refs, 1);
    s->version = ps->version;
    s->n = ps->n;
    memcpy(s->data, ps->w, ps->n * sizeof(float));
    s->crc = dp_wire_crc32(s->data, ps->n * sizeof(float));
    ps->snap = s;
    return s;
}

static int s_live(const s_worker_t *w)
{
    return !w->finished && !w->gone;
}

/* ---- replies ---------------------------------------------------------- */

static void s_send(s_ps_t *ps, zmq_msg_t *id, Downpour__Envelope *env,
                   const dp_wire_payload_t *pl, int n_pl)
{
    char err[DP_ERR_LEN];
    if (dp_wire_send(ps->sock, id, env, pl, n_pl, err) != 0)
        dp_log_warn("shard %d: reply %s not sent: %s", ps->cfg->shard_index,
                    dp_wire_type_name(env->type), err);
}

static void s_reply_error(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker, const char *msg)
{
    ps->malformed++;
    ps->rejected++;
    dp_log_debug("shard %d: ERROR to worker %d: %s", ps->cfg->shard_index, worker, msg);
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ERROR, req, worker, ps->model.fingerprint);
    Downpour__Error e = DOWNPOUR__ERROR__INIT;
    e.message = (char *)msg;
    env.error = &e;
    s_send(ps, id, &env, NULL, 0);
}

static void s_reply_params(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker)
{
    s_snap_t *s = s_snapshot(ps);
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PARAMS, req, worker, ps->model.fingerprint);
    Downpour__Params p = DOWNPOUR__PARAMS__INIT;
    p.version = s->version;
    env.params = &p;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    dp_wire_desc_fill(&d, shape, "params", s->data, s->n, ps->lo, 1, s->crc);
    env.n_tensors = 1;
    env.tensors = dv;
    atomic_fetch_add(&s->refs, 1); /* released by zmq (or dp_wire_send on failure) */
    dp_wire_payload_t pl = {s->data, s->n * sizeof(float), s_snap_unref, s};
    s_send(ps, id, &env, &pl, 1);
}

static void s_reply_ack(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker, int status,
                        const char *reason, uint64_t staleness)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ACK, req, worker, ps->model.fingerprint);
    Downpour__Ack a = DOWNPOUR__ACK__INIT;
    a.status = (Downpour__AckStatus)status;
    a.reason = (char *)(reason ? reason : "");
    a.staleness = staleness;
    a.version = ps->version;
    env.ack = &a;
    s_send(ps, id, &env, NULL, 0);
}

/* ---- checkpoints -------------------------------------------------------- */

static int s_checkpoint_write(s_ps_t *ps, char *err)
{
    if (!ps->cfg->checkpoint_dir[0]) return 0;
    if (ps->ckpt_version == ps->version) return 0;
    int64_t pshape[1] = {(int64_t)ps->n};
    int64_t sshape[2] = {ps->state_per, (int64_t)ps->n};
    dp_st_tensor_t t[2] = {{"params", ps->w, 1, pshape}, {"optim.state", ps->state, 2, sshape}};
    char ver[32], lo[32], hi[32], nf[32], fp[32], shard[32], input[48];
    snprintf(ver, sizeof ver, "%" PRIu64, ps->version);
    snprintf(lo, sizeof lo, "%zu", ps->lo);
    snprintf(hi, sizeof hi, "%zu", ps->hi);
    snprintf(nf, sizeof nf, "%zu", ps->model.n_floats);
    snprintf(fp, sizeof fp, "%016" PRIx64, ps->model.fingerprint);
    snprintf(shard, sizeof shard, "%d/%d", ps->cfg->shard_index, ps->cfg->shard_count);
    snprintf(input, sizeof input, "%dx%dx%d", ps->model.in_c, ps->model.in_h, ps->model.in_w);
    const char *meta[] = {"format", "downpour-ps-shard", "spec", ps->model.spec, "input", input,
                          "fingerprint", fp, "shard", shard, "range_lo", lo, "range_hi", hi,
                          "n_floats", nf, "optimizer", dp_optim_kind_name(ps->cfg->optim.kind),
                          "version", ver, "step", ver, NULL};
    if (dp_safetensors_write(ps->ckpt_path, t, ps->state_per ? 2 : 1, meta, err) != 0) return -1;
    ps->ckpt_version = ps->version;
    dp_log_debug("shard %d: checkpoint at version %" PRIu64 " in %s", ps->cfg->shard_index,
                 ps->version, ps->ckpt_path);
    return 0;
}

/* Metadata value key must equal want. */
static int s_meta_is(const char *path, const char *key, const char *want, char *err)
{
    char e2[DP_ERR_LEN] = "";
    char *v = dp_safetensors_read_meta(path, key, e2);
    if (!v) {
        if (e2[0]) return dp_err(err, "%s", e2);
        return dp_err(err, "%s: corrupt shard checkpoint: no '%s' in its metadata", path, key);
    }
    int same = strcmp(v, want) == 0;
    if (!same)
        dp_err(err, "%s: checkpoint has %s '%s', this shard has '%s' (remove the file or fix the flags)",
               path, key, v, want);
    free(v);
    return same ? 0 : -1;
}

/* Restore from ps->ckpt_path if it exists. A file that exists but does not
 * match or does not read is an error, never a silent fresh start. */
static int s_checkpoint_restore(s_ps_t *ps, char *err)
{
    if (!ps->cfg->checkpoint_dir[0] || access(ps->ckpt_path, F_OK) != 0) return 0;
    const char *path = ps->ckpt_path;
    char lo[32], hi[32], fp[32];
    snprintf(lo, sizeof lo, "%zu", ps->lo);
    snprintf(hi, sizeof hi, "%zu", ps->hi);
    snprintf(fp, sizeof fp, "%016" PRIx64, ps->model.fingerprint);
    if (s_meta_is(path, "format", "downpour-ps-shard", err) != 0 ||
        s_meta_is(path, "fingerprint", fp, err) != 0 || s_meta_is(path, "range_lo", lo, err) != 0 ||
        s_meta_is(path, "range_hi", hi, err) != 0 ||
        s_meta_is(path, "optimizer", dp_optim_kind_name(ps->cfg->optim.kind), err) != 0)
        return -1;
    char e2[DP_ERR_LEN] = "";
    char *v = dp_safetensors_read_meta(path, "version", e2);
    if (!v) return dp_err(err, "%s", e2[0] ? e2 : "corrupt shard checkpoint: no version");
    char *end = NULL;
    errno = 0;
    unsigned long long ver = strtoull(v, &end, 10);
    int bad = errno || end == v || *end;
    free(v);
    if (bad) return dp_err(err, "%s: corrupt shard checkpoint: bad version in metadata", path);
    float *w = dp_malloc(ps->n * sizeof(float) + 1);
    float *st = dp_calloc(ps->n * (size_t)ps->state_per + 1, sizeof(float));
    int rc = -1;
    if (dp_safetensors_read_tensor(path, "params", w, ps->n, err) != 0) goto done;
    if (ps->state_per &&
        dp_safetensors_read_tensor(path, "optim.state", st, ps->n * ps->state_per, err) != 0)
        goto done;
    for (size_t i = 0; i < ps->n; i++)
        if (!isfinite(w[i])) {
            dp_err(err, "%s: corrupt shard checkpoint: parameter %zu is not finite", path, i);
            goto done;
        }
    memcpy(ps->w, w, ps->n * sizeof(float));
    if (ps->state_per) memcpy(ps->state, st, ps->n * ps->state_per * sizeof(float));
    ps->version = ver;
    ps->ckpt_version = ver;
    dp_log_info("shard %d: restored version %llu from %s", ps->cfg->shard_index, ver, path);
    rc = 0;
done:
    free(w);
    free(st);
    return rc;
}

/* ---- metrics ---------------------------------------------------------- */

static void s_metrics_line(s_ps_t *ps)
{
    cJSON *line = dp_metrics_line(ps->metrics);
    if (!line) return;
    double mean = ps->applied ? (double)ps->staleness_sum / (double)ps->applied : 0.0;
    cJSON_AddNumberToObject(line, "shard", ps->cfg->shard_index);
    cJSON_AddNumberToObject(line, "version", (double)ps->version);
    cJSON_AddNumberToObject(line, "applied", (double)ps->applied);
    cJSON_AddNumberToObject(line, "dropped", (double)ps->dropped);
    cJSON_AddNumberToObject(line, "rejected", (double)ps->rejected);
    cJSON_AddNumberToObject(line, "staleness_mean", dp_metrics_round(mean, 4));
    cJSON_AddNumberToObject(line, "staleness_max", (double)ps->staleness_max);
    dp_metrics_write(ps->metrics, &line);
}

/* ---- policies --------------------------------------------------------- */

static int s_has_pending(const s_ps_t *ps, int worker)
{
    for (int i = 0; i < ps->n_pending; i++)
        if (ps->pending[i].worker == worker) return 1;
    return 0;
}

static int s_pull_ready(const s_ps_t *ps, int worker, uint64_t min_version)
{
    switch (ps->cfg->mode) {
    case DP_MODE_SYNC:
        /* A min_version beyond the next step cannot come from a correct
         * worker of this shard (e.g. the shard restarted from an older
         * checkpoint): answer rather than wait for ever. */
        return ps->version >= min_version || min_version > ps->version + 1;
    case DP_MODE_SSP: {
        uint64_t min_clock = UINT64_MAX;
        for (int i = 0; i < ps->n_workers; i++)
            if (s_live(&ps->workers[i]) && ps->workers[i].clock < min_clock)
                min_clock = ps->workers[i].clock;
        if (min_clock == UINT64_MAX) return 1;
        return ps->workers[worker].clock <= min_clock + (uint64_t)ps->cfg->staleness;
    }
    case DP_MODE_ASYNC:
    default: return 1;
    }
}

/* Answer every deferred pull whose condition now holds, in arrival order. */
static void s_release_pending(s_ps_t *ps)
{
    int j = 0;
    for (int i = 0; i < ps->n_pending; i++) {
        s_pending_t *p = &ps->pending[i];
        if (s_pull_ready(ps, p->worker, p->min_version)) {
            s_reply_params(ps, &p->identity, p->request_id, p->worker);
            zmq_msg_close(&p->identity);
        } else {
            if (j != i) {
                ps->pending[j] = *p;
                zmq_msg_init(&ps->pending[j].identity);
                zmq_msg_move(&ps->pending[j].identity, &p->identity);
            }
            j++;
        }
    }
    ps->n_pending = j;
}

static void s_after_version_bump(s_ps_t *ps)
{
    long every = ps->cfg->checkpoint_every;
    if (every > 0 && ps->version % (uint64_t)every == 0) {
        char err[DP_ERR_LEN];
        if (s_checkpoint_write(ps, err) != 0)
            dp_log_error("shard %d: checkpoint failed: %s", ps->cfg->shard_index, err);
    }
}

/* One optimizer step of the whole range with gradient g. */
static void s_step(s_ps_t *ps, const float *g, float lr)
{
    dp_optim_step(&ps->cfg->optim, lr, ps->w, g, ps->state, ps->n, (long)ps->version + 1);
    ps->version++;
}

/* Sync: fire when min(R, workers that are live or already contributed)
 * gradients of this version are in. Workers that finished or went silent
 * no longer count, so the last steps never hang. */
static void s_sync_maybe_step(s_ps_t *ps)
{
    if (ps->cfg->mode != DP_MODE_SYNC || ps->acc_count == 0) return;
    int counting = 0;
    for (int i = 0; i < ps->n_workers; i++) {
        const s_worker_t *w = &ps->workers[i];
        if (s_live(w) || w->contributed == ps->version + 1) counting++;
    }
    int need = ps->replicas < counting ? ps->replicas : counting;
    if (need < 1) need = 1;
    if (ps->acc_count < need) return;
    float inv = 1.0f / (float)ps->acc_count;
    for (size_t i = 0; i < ps->n; i++) ps->acc[i] *= inv;
    s_step(ps, ps->acc, dp_optim_lr_at(&ps->cfg->optim, (long)ps->version));
    memset(ps->acc, 0, ps->n * sizeof(float));
    ps->acc_count = 0;
    s_after_version_bump(ps);
}

/* Re-evaluate everything that depends on who is live. */
static void s_liveness_changed(s_ps_t *ps)
{
    s_sync_maybe_step(ps);
    s_release_pending(ps);
}

static void s_sweep(s_ps_t *ps, double now)
{
    double hb = ps->cfg->heartbeat_timeout;
    if (hb <= 0) return;
    int changed = 0;
    for (int i = 0; i < ps->n_workers; i++) {
        s_worker_t *w = &ps->workers[i];
        if (w->finished || w->gone) continue;
        if (s_has_pending(ps, i)) { /* waiting on us: alive by definition */
            w->last_seen = now;
            continue;
        }
        if (now - w->last_seen > hb) {
            w->gone = 1;
            changed = 1;
            dp_log_warn("shard %d: worker %d silent for %.0f s (%s): no longer counted",
                        ps->cfg->shard_index, i, now - w->last_seen,
                        w->joined ? "heartbeat timeout" : "never joined");
        }
    }
    if (changed) s_liveness_changed(ps);
}

/* ---- request handlers ------------------------------------------------- */

static void s_on_hello(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    const Downpour__Hello *h = env->hello;
    const dp_model_t *m = &ps->model;
    char msg[1400];
    const char *spec = h->model_spec ? h->model_spec : "";
    if (env->model_fingerprint != m->fingerprint || strcmp(spec, m->spec) != 0 ||
        h->in_c != m->in_c || h->in_h != m->in_h || h->in_w != m->in_w ||
        h->n_floats != m->n_floats) {
        snprintf(msg, sizeof msg,
                 "model mismatch: worker has '%.500s' on %dx%dx%d (fingerprint %016" PRIx64
                 "), server has '%s' on %dx%dx%d (fingerprint %016" PRIx64 ")",
                 spec, h->in_c, h->in_h, h->in_w, env->model_fingerprint, m->spec, m->in_c,
                 m->in_h, m->in_w, m->fingerprint);
        s_reply_error(ps, id, env->request_id, env->worker_id, msg);
        return;
    }
    s_worker_t *w = &ps->workers[env->worker_id];
    if (!w->joined || w->finished)
        dp_log_info("shard %d: worker %d joined", ps->cfg->shard_index, env->worker_id);
    w->joined = 1;
    w->finished = 0;
    Downpour__Envelope rep;
    dp_wire_env_init(&rep, DOWNPOUR__MSG_TYPE__WELCOME, env->request_id, env->worker_id,
                     m->fingerprint);
    Downpour__Welcome wl = DOWNPOUR__WELCOME__INIT;
    wl.mode = (Downpour__Mode)ps->cfg->mode;
    wl.num_workers = ps->n_workers;
    wl.replicas = ps->replicas;
    wl.staleness = ps->cfg->staleness;
    wl.shard_index = ps->cfg->shard_index;
    wl.shard_count = ps->cfg->shard_count;
    wl.range_lo = ps->lo;
    wl.range_hi = ps->hi;
    wl.n_floats = m->n_floats;
    wl.version = ps->version;
    wl.heartbeat_timeout = ps->cfg->heartbeat_timeout;
    rep.welcome = &wl;
    s_send(ps, id, &rep, NULL, 0);
    s_liveness_changed(ps); /* it may have been "gone" before */
}

static void s_on_pull(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    int wid = env->worker_id;
    if (s_pull_ready(ps, wid, env->pull->min_version)) {
        s_reply_params(ps, id, env->request_id, wid);
        return;
    }
    if (ps->n_pending >= S_MAX_PENDING) {
        s_reply_error(ps, id, env->request_id, wid, "too many deferred pulls at this shard");
        return;
    }
    s_pending_t *p = &ps->pending[ps->n_pending++];
    zmq_msg_init(&p->identity);
    zmq_msg_copy(&p->identity, id);
    p->request_id = env->request_id;
    p->worker = wid;
    p->min_version = env->pull->min_version;
}

static void s_on_push(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                      const dp_wire_frame_t *frames, int n_frames)
{
    char msg[DP_ERR_LEN + 64];
    int wid = env->worker_id;
    s_worker_t *w = &ps->workers[wid];
    uint64_t v = env->push->version;
    if (dp_wire_check_range(env, ps->lo, ps->hi, msg) != 0) {
        s_reply_error(ps, id, env->request_id, wid, msg);
        return;
    }
    if (dp_wire_check_finite(frames, n_frames, msg) != 0) {
        ps->rejected++;
        s_reply_ack(ps, id, env->request_id, wid, DOWNPOUR__ACK_STATUS__REJECTED, msg, 0);
        return;
    }
    if (v > ps->version) {
        ps->rejected++;
        snprintf(msg, sizeof msg, "from the future: computed on version %" PRIu64
                 ", this shard is at version %" PRIu64, v, ps->version);
        s_reply_ack(ps, id, env->request_id, wid, DOWNPOUR__ACK_STATUS__REJECTED, msg, 0);
        return;
    }
    uint64_t staleness = ps->version - v;
    if (ps->cfg->mode == DP_MODE_SYNC) {
        if (v < ps->version) {
            ps->dropped++;
            snprintf(msg, sizeof msg, "stale: computed on version %" PRIu64 ", current %" PRIu64,
                     v, ps->version);
            s_reply_ack(ps, id, env->request_id, wid, DOWNPOUR__ACK_STATUS__DROPPED, msg, staleness);
            return;
        }
        if (w->contributed == ps->version + 1) {
            ps->dropped++;
            snprintf(msg, sizeof msg, "duplicate: worker %d already contributed to version %" PRIu64,
                     wid, ps->version);
            s_reply_ack(ps, id, env->request_id, wid, DOWNPOUR__ACK_STATUS__DROPPED, msg, 0);
            return;
        }
        /* Sum straight from the received frames (no copy). */
        for (int f = 0; f < n_frames; f++) {
            float *a = ps->acc + (env->tensors[f]->offset - ps->lo);
            size_t cnt = frames[f].len / 4;
            if (((uintptr_t)frames[f].data & 3) == 0) {
                const float *g = frames[f].data;
                for (size_t i = 0; i < cnt; i++) a[i] += g[i];
            } else {
                memcpy(ps->scratch, frames[f].data, frames[f].len);
                for (size_t i = 0; i < cnt; i++) a[i] += ps->scratch[i];
            }
        }
        ps->acc_count++;
        w->contributed = ps->version + 1;
        w->clock++;
        ps->applied++;
        s_sync_maybe_step(ps);
        s_reply_ack(ps, id, env->request_id, wid, DOWNPOUR__ACK_STATUS__APPLIED, "", 0);
        s_release_pending(ps);
        return;
    }
    /* async / ssp: apply on arrival, from the frame itself when it is the
     * whole range and float-aligned (ZeroMQ's zero-copy receive may hand us
     * any byte offset), else gathered into scratch. */
    const float *g;
    if (n_frames == 1 && ((uintptr_t)frames[0].data & 3) == 0) {
        g = frames[0].data;
    } else {
        for (int f = 0; f < n_frames; f++)
            memcpy(ps->scratch + (env->tensors[f]->offset - ps->lo), frames[f].data, frames[f].len);
        g = ps->scratch;
    }
    float lr = dp_optim_lr_at(&ps->cfg->optim, (long)ps->version);
    if (ps->cfg->lr_staleness && staleness > 1) lr /= (float)staleness;
    s_step(ps, g, lr);
    w->clock++;
    ps->applied++;
    ps->staleness_sum += staleness;
    if (staleness > ps->staleness_max) ps->staleness_max = staleness;
    s_reply_ack(ps, id, env->request_id, wid, DOWNPOUR__ACK_STATUS__APPLIED, "", staleness);
    s_after_version_bump(ps);
    s_release_pending(ps);
}

static void s_fill_counts(const s_ps_t *ps, int *joined, int *finished, int *gone)
{
    *joined = *finished = *gone = 0;
    for (int i = 0; i < ps->n_workers; i++) {
        *joined += ps->workers[i].joined;
        *finished += ps->workers[i].finished;
        *gone += ps->workers[i].gone && !ps->workers[i].finished;
    }
}

static void s_on_barrier(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    if (env->barrier->finished) {
        s_worker_t *w = &ps->workers[env->worker_id];
        if (!w->finished)
            dp_log_info("shard %d: worker %d finished", ps->cfg->shard_index, env->worker_id);
        w->finished = 1;
    }
    Downpour__Envelope rep;
    dp_wire_env_init(&rep, DOWNPOUR__MSG_TYPE__BARRIER, env->request_id, env->worker_id,
                     ps->model.fingerprint);
    Downpour__Barrier b = DOWNPOUR__BARRIER__INIT;
    int joined;
    s_fill_counts(ps, &joined, &b.workers_finished, &b.workers_gone);
    b.finished = env->barrier->finished;
    b.num_workers = ps->n_workers;
    rep.barrier = &b;
    s_send(ps, id, &rep, NULL, 0);
    s_liveness_changed(ps);
}

static void s_on_stats(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    Downpour__Envelope rep;
    dp_wire_env_init(&rep, DOWNPOUR__MSG_TYPE__STATS, env->request_id, env->worker_id,
                     ps->model.fingerprint);
    Downpour__Stats s = DOWNPOUR__STATS__INIT;
    s.applied = ps->applied;
    s.dropped = ps->dropped;
    s.rejected = ps->rejected;
    s.version = ps->version;
    s.staleness_sum = ps->staleness_sum;
    s.staleness_max = ps->staleness_max;
    s.staleness_mean = ps->applied ? (double)ps->staleness_sum / (double)ps->applied : 0.0;
    s.malformed = ps->malformed;
    s_fill_counts(ps, &s.workers_joined, &s.workers_finished, &s.workers_gone);
    s.num_workers = ps->n_workers;
    rep.stats = &s;
    s_send(ps, id, &rep, NULL, 0);
}

static void s_reply_bare(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env, int type)
{
    Downpour__Envelope rep;
    dp_wire_env_init(&rep, type, env->request_id, env->worker_id, ps->model.fingerprint);
    s_send(ps, id, &rep, NULL, 0);
}

/* One received multipart: validate, then dispatch. */
static void s_handle(s_ps_t *ps, dp_wire_rx_t *rx)
{
    char err[DP_ERR_LEN];
    char msg[DP_ERR_LEN + 128];
    zmq_msg_t *id = &rx->parts[0]; /* ROUTER always prepends the identity */
    if (rx->n_parts < 2) {
        s_reply_error(ps, id, 0, -1, "malformed: message without an envelope frame");
        return;
    }
    if (rx->n_total > rx->n_parts) {
        snprintf(msg, sizeof msg, "malformed: %d frames (limit %d)", rx->n_total - 1,
                 DP_WIRE_MAX_PARTS - 1);
        s_reply_error(ps, id, 0, -1, msg);
        return;
    }
    Downpour__Envelope *env =
        dp_wire_decode(zmq_msg_data(&rx->parts[1]), zmq_msg_size(&rx->parts[1]), err);
    if (!env) {
        s_reply_error(ps, id, 0, -1, err);
        return;
    }
    dp_wire_frame_t frames[DP_WIRE_MAX_TENSORS];
    int n_frames = rx->n_parts - 2;
    if (n_frames > DP_WIRE_MAX_TENSORS) n_frames = DP_WIRE_MAX_TENSORS; /* checked again below */
    for (int i = 0; i < n_frames; i++) {
        frames[i].data = zmq_msg_data(&rx->parts[2 + i]);
        frames[i].len = zmq_msg_size(&rx->parts[2 + i]);
    }
    uint64_t req = env->request_id;
    int wid = env->worker_id;
    int type = env->type;
    if (dp_wire_check(env, frames, rx->n_parts - 2, err) != 0) {
        s_reply_error(ps, id, req, wid, err);
        goto done;
    }
    int admin = type == DOWNPOUR__MSG_TYPE__STATS || type == DOWNPOUR__MSG_TYPE__HEARTBEAT ||
                type == DOWNPOUR__MSG_TYPE__SHUTDOWN;
    int request = admin || type == DOWNPOUR__MSG_TYPE__HELLO || type == DOWNPOUR__MSG_TYPE__PULL ||
                  type == DOWNPOUR__MSG_TYPE__PUSH || type == DOWNPOUR__MSG_TYPE__BARRIER;
    if (!request) {
        snprintf(msg, sizeof msg, "malformed: %s is a reply, not a request", dp_wire_type_name(type));
        s_reply_error(ps, id, req, wid, msg);
        goto done;
    }
    /* Tools may ask STATS / HEARTBEAT / SHUTDOWN with fingerprint 0; HELLO
     * answers a mismatch with both specs itself. */
    if (type != DOWNPOUR__MSG_TYPE__HELLO && env->model_fingerprint != ps->model.fingerprint &&
        !(admin && env->model_fingerprint == 0)) {
        snprintf(msg, sizeof msg,
                 "model mismatch: worker has fingerprint %016" PRIx64 ", server has %016" PRIx64
                 " ('%.200s')",
                 env->model_fingerprint, ps->model.fingerprint, ps->model.spec);
        s_reply_error(ps, id, req, wid, msg);
        goto done;
    }
    int in_range = wid >= 0 && wid < ps->n_workers;
    if (!admin && !in_range) {
        snprintf(msg, sizeof msg, "worker id %d out of range: this cluster has %d workers (--workers)",
                 wid, ps->n_workers);
        s_reply_error(ps, id, req, wid, msg);
        goto done;
    }
    if (in_range) {
        s_worker_t *w = &ps->workers[wid];
        w->last_seen = dp_now();
        if (w->gone) {
            w->gone = 0;
            dp_log_info("shard %d: worker %d is back", ps->cfg->shard_index, wid);
        }
        if ((type == DOWNPOUR__MSG_TYPE__PULL || type == DOWNPOUR__MSG_TYPE__PUSH ||
             type == DOWNPOUR__MSG_TYPE__BARRIER) && !w->joined) {
            if (type == DOWNPOUR__MSG_TYPE__PUSH) {
                ps->rejected++;
                snprintf(msg, sizeof msg, "worker %d has not said HELLO to this shard", wid);
                s_reply_ack(ps, id, req, wid, DOWNPOUR__ACK_STATUS__REJECTED, msg, 0);
            } else {
                snprintf(msg, sizeof msg, "worker %d has not said HELLO to this shard", wid);
                s_reply_error(ps, id, req, wid, msg);
            }
            goto done;
        }
    }
    switch (type) {
    case DOWNPOUR__MSG_TYPE__HELLO: s_on_hello(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__PULL: s_on_pull(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__PUSH: s_on_push(ps, id, env, frames, n_frames); break;
    case DOWNPOUR__MSG_TYPE__BARRIER: s_on_barrier(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__STATS: s_on_stats(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__HEARTBEAT: s_reply_bare(ps, id, env, DOWNPOUR__MSG_TYPE__HEARTBEAT); break;
    case DOWNPOUR__MSG_TYPE__SHUTDOWN:
        dp_log_info("shard %d: SHUTDOWN from worker %d", ps->cfg->shard_index, wid);
        /* The final checkpoint is on disk before the requester hears back. */
        if (s_checkpoint_write(ps, err) != 0)
            dp_log_error("shard %d: final checkpoint failed: %s", ps->cfg->shard_index, err);
        s_reply_bare(ps, id, env, DOWNPOUR__MSG_TYPE__SHUTDOWN);
        ps->quit = 1;
        break;
    }
done:
    dp_wire_destroy(&env);
}

/* ---- setup and loop --------------------------------------------------- */

static int s_setup(s_ps_t *ps, const dp_ps_config_t *cfg, char *err)
{
    ps->cfg = cfg;
    ps->ckpt_version = UINT64_MAX;
    if (cfg->shard_count < 1 || cfg->shard_index < 0 || cfg->shard_index >= cfg->shard_count)
        return dp_err(err, "bad shard %d/%d (--shard I/K with 0 <= I < K)", cfg->shard_index,
                      cfg->shard_count);
    if (cfg->num_workers < 1 || cfg->num_workers > 100000)
        return dp_err(err, "bad --workers %d", cfg->num_workers);
    if (cfg->replicas < 0 || cfg->replicas > cfg->num_workers)
        return dp_err(err, "bad --replicas-to-aggregate %d (1 to --workers %d)", cfg->replicas,
                      cfg->num_workers);
    if (cfg->staleness < 0) return dp_err(err, "bad --staleness %d", cfg->staleness);
    if (dp_model_parse(&ps->model, cfg->model_spec, cfg->in_c, cfg->in_h, cfg->in_w, err) != 0)
        return -1;
    dp_ps_shard_range(ps->model.n_floats, cfg->shard_index, cfg->shard_count, &ps->lo, &ps->hi);
    ps->n = ps->hi - ps->lo;
    ps->replicas = cfg->replicas ? cfg->replicas : cfg->num_workers;
    /* Every shard draws the full vector so any sharding starts identical. */
    float *full = dp_aligned_alloc(ps->model.n_floats * sizeof(float));
    dp_model_init_params(&ps->model, full, cfg->seed);
    ps->w = dp_aligned_alloc((ps->n + 1) * sizeof(float));
    memcpy(ps->w, full + ps->lo, ps->n * sizeof(float));
    free(full);
    ps->state_per = dp_optim_state_per_param(cfg->optim.kind);
    ps->state = dp_aligned_alloc((ps->n * (size_t)ps->state_per + 1) * sizeof(float));
    memset(ps->state, 0, ps->n * (size_t)ps->state_per * sizeof(float));
    ps->acc = dp_aligned_alloc((ps->n + 1) * sizeof(float));
    memset(ps->acc, 0, ps->n * sizeof(float));
    ps->scratch = dp_aligned_alloc((ps->n + 1) * sizeof(float));
    ps->n_workers = cfg->num_workers;
    ps->workers = dp_calloc((size_t)ps->n_workers, sizeof *ps->workers);
    double now = dp_now();
    for (int i = 0; i < ps->n_workers; i++) ps->workers[i].last_seen = now;
    ps->pending = dp_calloc(S_MAX_PENDING, sizeof *ps->pending);
    if (cfg->checkpoint_dir[0]) {
        if (mkdir(cfg->checkpoint_dir, 0755) != 0 && errno != EEXIST)
            return dp_err(err, "--checkpoint-dir %s: %s", cfg->checkpoint_dir, strerror(errno));
        dp_ps_checkpoint_path(ps->ckpt_path, sizeof ps->ckpt_path, cfg->checkpoint_dir,
                              cfg->shard_index, cfg->shard_count);
        if (s_checkpoint_restore(ps, err) != 0) return -1;
    }
    if (dp_metrics_new(&ps->metrics, cfg->metrics_path, err) != 0) return -1;
    ps->ctx = zmq_ctx_new();
    ps->sock = zmq_socket(ps->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(ps->sock, ZMQ_LINGER, &zero, sizeof zero);
    /* Bound what one peer can make us buffer: a gradient of this shard plus
     * room for the envelope; a larger message is garbage. */
    int64_t maxmsg = (int64_t)ps->n * 4 + ((int64_t)DP_WIRE_MAX_ENVELOPE << 1);
    zmq_setsockopt(ps->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    int hwm = 10000;
    zmq_setsockopt(ps->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (zmq_bind(ps->sock, cfg->bind) != 0)
        return dp_err(err, "cannot bind %s: %s (is another downpour-ps using the port?)", cfg->bind,
                      zmq_strerror(errno));
    size_t len = sizeof ps->endpoint;
    zmq_getsockopt(ps->sock, ZMQ_LAST_ENDPOINT, ps->endpoint, &len);
    if (cfg->ready_file[0] &&
        dp_write_file_atomic(cfg->ready_file, ps->endpoint, strlen(ps->endpoint), err) != 0)
        return -1;
    dp_log_info("shard %d/%d on %s: floats [%zu, %zu) of %zu, %s, %d workers, R=%d, S=%d, %s lr %g, version %" PRIu64,
                cfg->shard_index, cfg->shard_count, ps->endpoint, ps->lo, ps->hi, ps->model.n_floats,
                dp_mode_name(cfg->mode), ps->n_workers, ps->replicas, cfg->staleness,
                dp_optim_kind_name(cfg->optim.kind), dp_optim_base_lr(&cfg->optim), ps->version);
    return 0;
}

static void s_teardown(s_ps_t *ps)
{
    if (ps->sock) {
        /* Pending pulls hear why instead of timing out. */
        for (int i = 0; i < ps->n_pending; i++) {
            s_reply_error(ps, &ps->pending[i].identity, ps->pending[i].request_id,
                          ps->pending[i].worker, "shard shutting down");
            zmq_msg_close(&ps->pending[i].identity);
        }
        ps->n_pending = 0;
        /* After SHUTDOWN give its reply a moment to leave; otherwise drop. */
        int linger = ps->quit ? 1000 : 0;
        zmq_setsockopt(ps->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(ps->sock);
    }
    if (ps->snap) s_snap_unref(NULL, ps->snap); /* zmq may still hold references */
    if (ps->ctx) zmq_ctx_term(ps->ctx);         /* waits for the I/O thread: snapshots freed */
    dp_metrics_destroy(&ps->metrics);
    free(ps->w);
    free(ps->state);
    free(ps->acc);
    free(ps->scratch);
    free(ps->workers);
    free(ps->pending);
}

int dp_ps_run(const dp_ps_config_t *cfg, volatile sig_atomic_t *stop_flag, char *err)
{
    s_ps_t ps;
    memset(&ps, 0, sizeof ps);
    int rc = -1;
    if (s_setup(&ps, cfg, err) != 0) goto done;
    if (cfg->on_ready) cfg->on_ready(ps.endpoint, cfg->on_ready_arg);
    ps.next_metrics = dp_now() + cfg->metrics_every;
    s_metrics_line(&ps);
    while (!ps.quit && !(stop_flag && *stop_flag)) {
        zmq_pollitem_t it = {ps.sock, 0, ZMQ_POLLIN, 0};
        int r = zmq_poll(&it, 1, 100);
        if (r < 0 && errno != EINTR) {
            dp_err(err, "poll: %s", zmq_strerror(errno));
            goto done;
        }
        /* Drain what is there, a bounded batch, then do housekeeping. */
        for (int k = 0; r > 0 && k < 256 && !ps.quit; k++) {
            dp_wire_rx_t rx;
            char e2[DP_ERR_LEN];
            if (dp_wire_recv(ps.sock, &rx, ZMQ_DONTWAIT, e2) != 0) break;
            s_handle(&ps, &rx);
            dp_wire_rx_fini(&rx);
        }
        double now = dp_now();
        s_sweep(&ps, now);
        if (ps.metrics && now >= ps.next_metrics) {
            s_metrics_line(&ps);
            ps.next_metrics = now + cfg->metrics_every;
        }
    }
    if (s_checkpoint_write(&ps, err) != 0) {
        dp_log_error("shard %d: final checkpoint failed: %s", cfg->shard_index, err);
        goto done;
    }
    s_metrics_line(&ps);
    dp_log_info("shard %d: stopping at version %" PRIu64 " (applied %" PRIu64 ", dropped %" PRIu64
                ", rejected %" PRIu64 ")",
                cfg->shard_index, ps.version, ps.applied, ps.dropped, ps.rejected);
    rc = 0;
done:
    s_teardown(&ps);
    return rc;
}
