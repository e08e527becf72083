/* shard_parts: a push in parts assembled per worker (see shard_parts.h). */
#include "server/core/shard_parts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void dp_shard_parts_init(dp_shard_parts_t *p, size_t lo, size_t hi, int n_workers)
{
    memset(p, 0, sizeof *p);
    p->lo = lo;
    p->hi = hi;
    p->n = hi - lo;
    p->n_workers = n_workers;
    p->w = dp_calloc(n_workers > 0 ? (size_t)n_workers : 1, sizeof *p->w);
}

void dp_shard_parts_fini(dp_shard_parts_t *p)
{
    for (int i = 0; p->w && i < p->n_workers; i++) free(p->w[i].buf);
    free(p->w);
    memset(p, 0, sizeof *p);
}

/* The step is refused at a part: the assembly goes, nothing of it was
 * applied, and its later parts get the same answer. */
static dp_parts_result_t s_reject(dp_parts_worker_t *w, uint64_t step, char *why)
{
    w->active = 0;
    w->rejected_step = step;
    snprintf(w->why, sizeof w->why, "%s", why);
    return DP_PARTS_REJECTED;
}

/* The part's tensors into the buffer, widened from bfloat16 where they are,
 * each float checked finite in the copy (which is what gets applied: the
 * worker may write its segment again). */
static int s_copy_in(const dp_shard_parts_t *p, dp_parts_worker_t *w,
                     const Downpour__Envelope *env, const dp_wire_frame_t *frames,
                     const float *shm, char *err)
{
    for (size_t f = 0; f < env->n_tensors; f++) {
        const Downpour__TensorDesc *d = env->tensors[f];
        size_t cnt = (size_t)dp_wire_desc_count(d);
        float *dst = w->buf + (d->offset - p->lo);
        if (env->shm) { /* FLOAT32 only there (dp_wire_check) */
            if (dp_wire_copy_finite(dst, shm + (d->offset - p->lo), cnt, err) != 0) return -1;
        } else if (d->dtype == DOWNPOUR__DTYPE__BFLOAT16) {
            dp_wire_from_bf16(dst, frames[f].data, cnt);
            if (dp_wire_any_nonfinite(dst, cnt)) {
                dp_wire_frame_t fr = {dst, cnt * sizeof(float)};
                return dp_wire_check_finite(&fr, 1, err);
            }
        } else if (dp_wire_copy_finite(dst, frames[f].data, cnt, err) != 0)
            return -1;
    }
    return 0;
}

dp_parts_result_t dp_shard_parts_add(dp_shard_parts_t *p, int wid, const Downpour__Envelope *env,
                                     const dp_wire_frame_t *frames, int n_frames,
                                     const float *shm, dp_grad_slice_t *out, char *why)
{
    dp_parts_worker_t *w = &p->w[wid];
    const Downpour__Push *push = env->push;
    uint64_t step = push->step;
    uint32_t K = dp_wire_push_parts(push), k = push->part;
    char e2[DP_ERR_LEN];
    if (step == 0) {
        dp_err(why, "part %u of %u without a step: a push in parts needs Push.step", k, K);
        return DP_PARTS_REJECTED;
    }
    if (w->rejected_step == step) {
        dp_err(why, "part %u of %u of step %" PRIu64 ": the step was rejected at an earlier "
                    "part: %.300s", k, K, step, w->why);
        return DP_PARTS_REJECTED;
    }
    if (w->active && step < w->step) {
        dp_err(why, "part %u of %u of step %" PRIu64 " while step %" PRIu64 " is being "
                    "assembled (an older step's part comes too late)", k, K, step, w->step);
        return DP_PARTS_REJECTED;
    }
    if (w->active && step > w->step) {
        dp_log_debug("worker %d: step %" PRIu64 " (%u of %u parts in) given up for step %" PRIu64,
                     wid, w->step, w->got, w->parts, step);
        w->active = 0;
    }
    uint64_t a, b;
    if (dp_wire_check_run(env, p->lo, p->hi, &a, &b, e2) != 0) {
        dp_err(why, "part %u of %u of step %" PRIu64 ": %s; the push is discarded", k, K, step, e2);
        return s_reject(w, step, why);
    }
    if (a == b) {
        dp_err(why, "part %u of %u of step %" PRIu64 " holds no floats; the push is discarded", k,
               K, step);
        return s_reject(w, step, why);
    }
    if (!w->active) {
        *w = (dp_parts_worker_t){.active = 1, .step = step, .version = push->version, .parts = K,
                                 .buf = w->buf};
        if (!w->buf) w->buf = dp_aligned_alloc(p->n * sizeof(float));
    } else if (K != w->parts) {
        dp_err(why, "part %u of step %" PRIu64 " says %u parts, its first part said %u; the push "
                    "is discarded", k, step, K, w->parts);
        return s_reject(w, step, why);
    } else if (push->version != w->version) {
        dp_err(why, "part %u of %u of step %" PRIu64 " is stamped with version %" PRIu64
                    ", its first part with %" PRIu64 "; the push is discarded",
               k, K, step, push->version, w->version);
        return s_reject(w, step, why);
    }
    if (w->have >> k & 1) {
        dp_err(why, "part %u of %u of step %" PRIu64 " came twice (more parts than %u); the push "
                    "is discarded", k, K, step, K);
        return s_reject(w, step, why);
    }
    for (uint32_t j = 0; j < w->got; j++)
        if (a < w->hi[j] && w->lo[j] < b) {
            dp_err(why, "part %u of %u of step %" PRIu64 " (floats [%" PRIu64 ", %" PRIu64
                        ")) overlaps a part already in ([%" PRIu64 ", %" PRIu64 ")); the push is "
                        "discarded", k, K, step, a, b, w->lo[j], w->hi[j]);
            return s_reject(w, step, why);
        }
    if (env->shm && !shm) {
        dp_err(why, "part %u of %u of step %" PRIu64 " says it is in shared memory, which this "
                    "shard has not granted this worker; the push is discarded", k, K, step);
        return s_reject(w, step, why);
    }
    (void)n_frames; /* one per descriptor, or none through shared memory (dp_wire_check) */
    if (s_copy_in(p, w, env, frames, shm, e2) != 0) {
        dp_err(why, "part %u of %u of step %" PRIu64 " (floats [%" PRIu64 ", %" PRIu64 ")): %s; "
                    "the push is discarded", k, K, step, a, b, e2);
        return s_reject(w, step, why);
    }
    w->lo[w->got] = a;
    w->hi[w->got] = b;
    w->got++;
    w->have |= (uint64_t)1 << k;
    w->filled += b - a;
    if (w->got < K) {
        dp_err(why, "part %u of %u of step %" PRIu64 " received", k, K, step);
        return DP_PARTS_RECEIVED;
    }
    w->active = 0;
    /* disjoint runs inside the range: they tile it when they add up to it */
    if (w->filled != p->n) {
        dp_err(why, "the %u parts of step %" PRIu64 " cover %" PRIu64 " of this shard's %zu "
                    "floats; the push is discarded", K, step, w->filled, p->n);
        return s_reject(w, step, why);
    }
    *out = (dp_grad_slice_t){w->buf, p->n * sizeof(float), p->lo};
    return DP_PARTS_COMPLETE;
}

int dp_shard_parts_whole(dp_shard_parts_t *p, int wid, uint64_t step, char *why)
{
    dp_parts_worker_t *w = &p->w[wid];
    if (step != 0 && w->rejected_step == step)
        return dp_err(why, "step %" PRIu64 " was rejected at a part: %.300s", step, w->why);
    if (!w->active) return 0;
    if (step == w->step) {
        dp_err(why, "a whole push of step %" PRIu64 " while %u of its %u parts are in (its parts "
                    "changed to 1); the push is discarded", step, w->got, w->parts);
        s_reject(w, step, why);
        return -1;
    }
    dp_log_debug("worker %d: step %" PRIu64 " (%u of %u parts in) given up for a whole push",
                 wid, w->step, w->got, w->parts);
    w->active = 0;
    return 0;
}

void dp_shard_parts_drop(dp_shard_parts_t *p, int wid)
{
    dp_parts_worker_t *w = &p->w[wid];
    if (w->active)
        dp_log_debug("worker %d said HELLO again: step %" PRIu64 " (%u of %u parts in) discarded",
                     wid, w->step, w->got, w->parts);
    w->active = 0;
    w->rejected_step = 0;
}
