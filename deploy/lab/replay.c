/* replay: `downpour replay FILE --out DIR` — a recorded schedule (server/
 * record.h) run again in one process through the lab engine (deploy/lab/engine.h):
 * every gradient recomputed from its worker, data step and the versions it
 * was computed on, every push handed to the same policy code in the order
 * each shard applied it. On the CPU with the recorded kernel threads the
 * weights end bit-identical to the recorded run's; the replay checks each
 * push's decision (status, staleness, version after) and, where recorded,
 * the gradient and update norms against the record as it goes.
 *
 * A gradient needs shard k's weights at the version it was computed on:
 * each (worker, step) is a job; when shard k reaches a version a job needs,
 * its slice is copied (captured); once all K slices are there the gradient
 * is computed, at the first push that needs it, and freed after the last.
 * Shards advance in turn, each in its own recorded order, as far as their
 * gradients allow; a record the real run could not have made stalls that
 * and is refused.
 *
 * An actor-critic run's record (header "env", deploy/lab/rl.h): a job is a
 * worker's segment, recomputed from the worker's seed and its own earlier
 * segments, so each worker's segments must come 1, 2, 3, ... on every
 * shard (as a worker pushes them: the next only after every shard took
 * the last), which is checked before anything runs; a shard then reaches
 * a worker's segment only after its earlier ones, so they are computed in
 * order. The account each push carried (env steps, episodes, the sum of
 * their returns) is checked against the recomputed segment's, and the
 * run's account is kept from shard 0's pushes, as the servers keep it.
 *
 * A sparse model's record (embed:D, deploy/lab/sparse.h): a job also
 * needs the rows its worker read from each shard. Each "rpull" is given
 * the job of the "rows" push that follows it on its shard and reads the
 * shard's table when the replay reaches it (in async, between dense
 * versions); the gradient waits for all K slices and all K row parts;
 * each "rows" event pushes the shard's part and checks its norm ("gn").
 * The chief's final pulls (worker 0's "rpull"s after its last "rows" on
 * that shard: its test batches) are skipped; dp_lab_finish's evaluation
 * makes them again. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "common/opts.h"
#include "common/util.h"
#include "deploy/lab/sim.h"
#include "deploy/launcher/commands.h"
#include "server/core/shard_dc.h"
#include "worker/train/progress.h"

typedef struct {
    int worker;
    uint64_t step;         /* Push.step (1-based) */
    uint64_t *version;     /* [K]: the version it was computed on, per shard */
    int shards_seen, captured, applied;
    float *params, *grad;
    int dealt;             /* shard 0 (an elastic crew) dealt it: */
    dp_deal_batch_t batch; /* ... this batch */
    uint64_t h;            /* DyLU (--local-steps auto): the round's data steps, its pushes' "h" */
    dp_lab_seg_t seg;      /* an actor-critic segment's account, from its computation to its
                            * last push */
    int rows_seen;         /* a sparse model: its row pushes ("rows") in the record, */
    int rows_pulled;       /* ... its row pulls replayed so far (one a shard), */
    dp_lab_batch_t sb;     /* ... its batch, keys, the rows read and their gradients */
} s_job_t;

typedef struct {
    uint64_t version;
    int job;
} s_need_t;

typedef struct {
    const dp_rec_t *rec;
    dp_lab_t L;
    int K;
    s_job_t *jobs;
    int n_jobs;
    uint64_t *versions;    /* jobs x K */
    int *ev_job;           /* per event: its job, -1 for members */
    int *table;            /* (worker, step) -> job + 1, 0 empty */
    size_t n_table;        /* a power of two, at least twice the events */
    size_t **by_shard;     /* [K]: the shard's events in order */
    size_t *n_by_shard, *cur;
    s_need_t **need;       /* [K]: jobs by the version they need of shard k */
    int *cap;              /* [K]: next need to capture */
    size_t n_floats;
    long chief_steps;
    uint64_t mismatches;   /* pushes whose norms differ from the record's */
    size_t first_mismatch;
    uint64_t account_mismatches; /* actor-critic pushes whose account differs from the record's */
    size_t first_account_mismatch;
    uint64_t rows_mismatches;    /* a sparse model's row pushes whose norm differs from the record's */
    size_t first_rows_mismatch;
    uint64_t eval_pulls;   /* the chief's final row pulls (its evaluation's, not training) */
    double test_loss;
    dp_progress_t progress; /* the live line: events replayed of the record's */
} s_replay_t;

/* ---- the jobs ---- */

/* The job of (worker, step), created when new: an open-addressing table. */
static int s_job(s_replay_t *R, int worker, uint64_t step)
{
    uint64_t key = step * 1000003u + (uint64_t)worker;
    size_t mask = R->n_table - 1, h = (size_t)(dp_fnv1a(DP_FNV_SEED, &key, sizeof key) & mask);
    for (;; h = (h + 1) & mask) {
        int j = R->table[h] - 1;
        if (j < 0) break;
        if (R->jobs[j].worker == worker && R->jobs[j].step == step) return j;
    }
    int j = R->n_jobs++;
    R->table[h] = j + 1;
    R->jobs[j] = (s_job_t){.worker = worker, .step = step, .version = R->versions + (size_t)j * R->K};
    return j;
}

static int s_cmp_need(const void *a, const void *b)
{
    const s_need_t *x = a, *y = b;
    return x->version < y->version ? -1 : x->version > y->version ? 1 : (x->job > y->job) - (x->job < y->job);
}

/* Events to jobs and shards; the versions each job needs. */
static int s_index(s_replay_t *R, const char *path, char *err)
{
    const dp_rec_t *rec = R->rec;
    int K = R->K;
    R->jobs = dp_calloc(rec->n + 1, sizeof *R->jobs);
    R->versions = dp_malloc((rec->n + 1) * (size_t)K * sizeof *R->versions);
    memset(R->versions, 0xff, (rec->n + 1) * (size_t)K * sizeof *R->versions); /* UINT64_MAX: unseen */
    for (R->n_table = 16; R->n_table < 2 * (rec->n + 1); R->n_table *= 2) {}
    R->table = dp_calloc(R->n_table, sizeof *R->table);
    R->ev_job = dp_calloc(rec->n + 1, sizeof *R->ev_job);
    R->by_shard = dp_calloc((size_t)K, sizeof *R->by_shard);
    R->n_by_shard = dp_calloc((size_t)K, sizeof *R->n_by_shard);
    R->cur = dp_calloc((size_t)K, sizeof *R->cur);
    for (int k = 0; k < K; k++) R->by_shard[k] = dp_calloc(rec->n + 1, sizeof **R->by_shard);
    for (size_t i = 0; i < rec->n; i++) {
        const dp_rec_event_t *e = &rec->ev[i];
        if (e->shard >= K) return dp_err(err, "%s: event %zu names shard %d of %d", path, i + 1, e->shard, K);
        R->by_shard[e->shard][R->n_by_shard[e->shard]++] = i;
        R->ev_job[i] = -1;
        if ((e->kind == DP_REC_ROWS || e->kind == DP_REC_ROWS_PULL) && !R->L.sp)
            return dp_err(err, "%s: event %zu is a row event, in the record of a model without embed:D",
                          path, i + 1);
        if (e->kind == DP_REC_ROWS) {
            if (e->worker >= R->L.conf.workers || e->step == 0)
                return dp_err(err, "%s: event %zu: worker %d step %" PRIu64 " cannot be recomputed", path,
                              i + 1, e->worker, e->step);
            R->ev_job[i] = s_job(R, e->worker, e->step);
            R->jobs[R->ev_job[i]].rows_seen++;
            continue;
        }
        if (e->kind != DP_REC_PUSH) continue;
        if (e->worker >= R->L.conf.workers || e->step == 0)
            return dp_err(err, "%s: event %zu: worker %d step %" PRIu64 " cannot be recomputed", path,
                          i + 1, e->worker, e->step);
        int j = s_job(R, e->worker, e->step);
        s_job_t *job = &R->jobs[j];
        if (job->version[e->shard] != UINT64_MAX)
            return dp_err(err, "%s: event %zu: shard %d applied worker %d's step %" PRIu64 " twice", path,
                          i + 1, e->shard, e->worker, e->step);
        job->version[e->shard] = e->version;
        job->shards_seen++;
        R->ev_job[i] = j;
        /* DyLU: each push names its round's steps, the same on every shard */
        if (!e->h != !R->L.conf.dylu || (job->h && e->h != job->h))
            return dp_err(err, "%s: event %zu: worker %d's round %" PRIu64 " %s", path, i + 1, e->worker,
                          e->step, R->L.conf.dylu ? "names no data steps (\"h\") or other ones than "
                          "another shard's, in a run of --local-steps auto" : "names data steps (\"h\") "
                          "in a run without --local-steps auto");
        job->h = e->h;
        if (!e->dealt) continue;
        long per_epoch = R->L.s.train.n / R->L.conf.train.batch;
        if (e->batch.index >= (uint64_t)per_epoch || e->batch.epoch > (uint64_t)LONG_MAX)
            return dp_err(err, "%s: event %zu: batch %" PRIu64 " of epoch %" PRIu64 " is not one of "
                          "the data's %ld batches", path, i + 1, e->batch.index, e->batch.epoch,
                          per_epoch);
        job->dealt = 1;
        job->batch = e->batch;
    }
    /* a dealt run's every gradient is recomputed from its batch */
    int dealt = 0;
    for (int j = 0; j < R->n_jobs; j++) dealt += R->jobs[j].dealt;
    for (int j = 0; dealt && j < R->n_jobs; j++)
        if (!R->jobs[j].dealt)
            return dp_err(err, "%s: worker %d's step %" PRIu64 " carried no batch shard 0 dealt, in a "
                          "run whose batches it dealt: its gradient cannot be recomputed", path,
                          R->jobs[j].worker, R->jobs[j].step);
    return 0;
}

/* A sparse record's row pulls, each given the step whose row push follows
 * it on its shard (walking back: a pull takes the push after it). A pull
 * no push follows is the chief's final evaluation's (worker 0, after its
 * last push on that shard: its test batches' rows), which the replay's
 * own evaluation repeats at the end, so it is no training step's; any
 * other pull without a push, or a push without a pull, is no run's. */
static int s_index_pulls(s_replay_t *R, const char *path, char *err)
{
    int W = R->L.conf.workers;
    size_t n = (size_t)R->K * (size_t)W;
    long *next = dp_malloc(n * sizeof *next); /* (shard, worker): the event of the push ahead, -1 none */
    int *pushed = dp_calloc(n, sizeof *pushed); /* (shard, worker): a push seen ahead of here */
    for (size_t i = 0; i < n; i++) next[i] = -1;
    int rc = 0;
    for (size_t i = R->rec->n; i-- > 0 && rc == 0;) {
        const dp_rec_event_t *e = &R->rec->ev[i];
        if (e->kind != DP_REC_ROWS && e->kind != DP_REC_ROWS_PULL) continue;
        if (e->worker < 0 || e->worker >= W) {
            rc = dp_err(err, "%s: event %zu names worker %d of %d", path, i + 1, e->worker, W);
            break;
        }
        size_t at = (size_t)e->shard * (size_t)W + (size_t)e->worker;
        if (e->kind == DP_REC_ROWS) {
            if (next[at] >= 0)
                rc = dp_err(err, "%s: event %zu: worker %d's row push on shard %d follows no row pull of "
                            "its own", path, (size_t)next[at] + 1, e->worker, e->shard);
            next[at] = (long)i;
            pushed[at] = 1;
        } else if (next[at] >= 0) {
            const dp_rec_event_t *p = &R->rec->ev[next[at]];
            if (p->version != e->version)
                rc = dp_err(err, "%s: event %zu: a row push pulled at version %" PRIu64 " after a row "
                            "pull answered at %" PRIu64, path, (size_t)next[at] + 1, p->version, e->version);
            R->ev_job[i] = R->ev_job[next[at]];
            next[at] = -1;
        } else if (e->worker == 0 && !pushed[at]) {
            R->eval_pulls++; /* ev_job stays -1: skipped */
        } else {
            rc = dp_err(err, "%s: event %zu: worker %d's row pull on shard %d is followed by no row push "
                        "(not the chief's evaluation: a step the record does not hold)", path, i + 1,
                        e->worker, e->shard);
        }
    }
    for (size_t at = 0; at < n && rc == 0; at++)
        if (next[at] >= 0)
            rc = dp_err(err, "%s: event %zu: a row push with no row pull before it", path,
                        (size_t)next[at] + 1);
    free(next);
    free(pushed);
    return rc;
}

/* An actor-critic record: on every shard each worker's segments come 1, 2,
 * 3, ... (the order its rollouts can be recomputed in). */
static int s_check_segments(const s_replay_t *R, const char *path, char *err)
{
    int W = R->L.conf.workers;
    uint64_t *last = dp_calloc((size_t)R->K * (size_t)W, sizeof *last);
    int rc = 0;
    for (size_t i = 0; i < R->rec->n && rc == 0; i++) {
        const dp_rec_event_t *e = &R->rec->ev[i];
        if (e->kind != DP_REC_PUSH) continue;
        uint64_t *l = &last[(size_t)e->shard * (size_t)W + (size_t)e->worker];
        if (e->step != *l + 1)
            rc = dp_err(err, "%s: event %zu: shard %d took worker %d's segment %" PRIu64 " after its "
                        "segment %" PRIu64 ": its rollouts cannot be recomputed", path, i + 1, e->shard,
                        e->worker, e->step, *l);
        *l = e->step;
    }
    free(last);
    return rc;
}

/* Every job reached every shard once; the capture lists by version. */
static int s_plan(s_replay_t *R, const char *path, char *err)
{
    int K = R->K;
    R->need = dp_calloc((size_t)K, sizeof *R->need);
    R->cap = dp_calloc((size_t)K, sizeof *R->cap);
    for (int j = 0; j < R->n_jobs; j++)
        if (R->jobs[j].shards_seen != K)
            return dp_err(err, "%s: worker %d's step %" PRIu64 " reached %d of %d shards: its gradient's "
                          "versions are not all known", path, R->jobs[j].worker, R->jobs[j].step,
                          R->jobs[j].shards_seen, K);
    for (int j = 0; R->L.sp && j < R->n_jobs; j++)
        if (R->jobs[j].rows_seen != K)
            return dp_err(err, "%s: worker %d's step %" PRIu64 " pushed rows to %d of %d shards: its rows "
                          "are not all known", path, R->jobs[j].worker, R->jobs[j].step,
                          R->jobs[j].rows_seen, K);
    for (int k = 0; k < K; k++) {
        R->need[k] = dp_calloc((size_t)R->n_jobs + 1, sizeof **R->need);
        for (int j = 0; j < R->n_jobs; j++) R->need[k][j] = (s_need_t){R->jobs[j].version[k], j};
        qsort(R->need[k], (size_t)R->n_jobs, sizeof **R->need, s_cmp_need);
    }
    return 0;
}

/* Shard k is at a new version: the jobs computed on it take its slice. */
static int s_capture(s_replay_t *R, int k, char *err)
{
    const dp_shard_t *s = &R->L.shard[k];
    while (R->cap[k] < R->n_jobs && R->need[k][R->cap[k]].version <= s->version) {
        s_need_t nd = R->need[k][R->cap[k]++];
        if (nd.version < s->version)
            return dp_err(err, "the record needs shard %d at version %" PRIu64 ", which the replay passed "
                          "(the schedule is not one a run could make)", k, nd.version);
        s_job_t *job = &R->jobs[nd.job];
        if (!job->params) job->params = dp_aligned_alloc(R->n_floats * sizeof(float));
        dp_lab_params(&R->L, k, job->params);
        job->captured++;
    }
    return 0;
}

/* ---- one event ---- */

static void s_check_norms(s_replay_t *R, size_t i, const dp_rec_event_t *e, const dp_push_outcome_t *o)
{
    int differ = (e->grad_norm >= 0 && o->grad_norm >= 0 && e->grad_norm != o->grad_norm) ||
                 (e->update_norm >= 0 && o->update_norm >= 0 && e->update_norm != o->update_norm);
    if (differ && R->mismatches++ == 0) R->first_mismatch = i + 1;
}

/* The job's gradient, computed once when all it needs is there (each
 * shard's weights at its version; a sparse model's rows from each shard):
 * 1, or 0 not yet. */
static int s_gradient(s_replay_t *R, s_job_t *job)
{
    if (job->captured < R->K || (R->L.sp && job->rows_pulled < R->K)) return 0;
    if (job->grad) return 1;
    job->grad = dp_aligned_alloc(R->n_floats * sizeof(float));
    if (R->L.sp)
        dp_lab_sparse_gradient(&R->L, job->params, job->worker, (long)job->step - 1, &job->sb, job->grad);
    else {
        if (R->L.conf.dylu) dp_lab_round(&R->L, job->worker, (long)job->h);
        dp_lab_gradient(&R->L, job->params, job->worker, (long)job->step - 1,
                        job->dealt ? &job->batch : NULL, job->grad);
    }
    if (R->L.rl) {
        dp_lab_seg_alloc(&job->seg, R->L.rl->rows);
        dp_lab_seg_copy(&job->seg, &R->L.rl->seg[job->worker]);
    }
    if (!R->L.shard[0].dc) { /* compensation needs them until the last shard's push */
        free(job->params);
        job->params = NULL;
    }
    if (job->worker == 0) R->chief_steps += dp_lab_push_steps(&R->L, 0, (long)job->step - 1);
    return 1;
}

/* A job's event done: after its last (a push on every shard, and a row
 * push on every shard for a sparse model) it is freed. */
static void s_used(s_replay_t *R, s_job_t *job)
{
    if (++job->applied < R->K * (R->L.sp ? 2 : 1)) return;
    free(job->grad);
    free(job->params);
    job->grad = job->params = NULL;
    dp_lab_seg_free(&job->seg);
    dp_lab_batch_free(&job->sb);
}

/* Row pull event i: the worker's step reads its keys of the shard now, or
 * (the chief's evaluation) nothing. -1 with err when the replay differs. */
static int s_rows_pull(s_replay_t *R, size_t i, char *err)
{
    const dp_rec_event_t *e = &R->rec->ev[i];
    if (R->ev_job[i] < 0) return 0;
    s_job_t *job = &R->jobs[R->ev_job[i]];
    if (!job->sb.batch && dp_lab_batch_load(&R->L, job->worker, (long)job->step - 1, &job->sb, err) != 0)
        return -1;
    uint64_t version = R->L.shard[e->shard].version;
    long n = dp_lab_rows_pull(&R->L, e->shard, job->worker, &job->sb, err);
    if (n < 0) return -1;
    if ((uint64_t)n != e->keys || version != e->version)
        return dp_err(err, "replay diverged at event %zu (shard %d, worker %d, step %" PRIu64 "): its row "
                      "pull asked %ld keys at version %" PRIu64 ", the record says %" PRIu64 " at %" PRIu64,
                      i + 1, e->shard, e->worker, job->step, n, version, e->keys, e->version);
    job->rows_pulled++;
    return 0;
}

/* Row push event i if its gradient can be had: 1 done, 0 not yet, -1 with
 * err when the shard's decision differs from the record's. */
static int s_rows_push(s_replay_t *R, size_t i, char *err)
{
    const dp_rec_event_t *e = &R->rec->ev[i];
    s_job_t *job = &R->jobs[R->ev_job[i]];
    if (!s_gradient(R, job)) return 0;
    dp_push_outcome_t o;
    double norm;
    int repeat;
    size_t n = dp_lab_rows_push(&R->L, e->shard, e->worker, e->step, e->version, &job->sb, &o, &norm, &repeat);
    if (repeat || (int)o.status != e->status || o.staleness != e->staleness || n != e->keys)
        return dp_err(err, "replay diverged at event %zu (shard %d, worker %d, step %" PRIu64 "): the "
                      "shard took its row push of %zu keys as %s%d staleness %" PRIu64 ", the record says "
                      "%" PRIu64 " keys %d %" PRIu64, i + 1, e->shard, e->worker, e->step, n,
                      repeat ? "a repeat, " : "", (int)o.status, o.staleness, e->keys, e->status, e->staleness);
    if (e->grad_norm >= 0 && norm != e->grad_norm && R->rows_mismatches++ == 0) R->first_rows_mismatch = i + 1;
    s_used(R, job);
    return 1;
}

/* Push event i on shard k if its gradient can be had: 1 done, 0 not yet,
 * -1 with err when the replay's decision differs from the record's. */
static int s_push(s_replay_t *R, size_t i, char *err)
{
    const dp_rec_event_t *e = &R->rec->ev[i];
    s_job_t *job = &R->jobs[R->ev_job[i]];
    if (!s_gradient(R, job)) return 0;
    dp_shard_t *s = &R->L.shard[e->shard];
    if (s->dc && e->dc == 1) dp_shard_dc_hold(s, e->worker, e->version, job->params + s->lo);
    else if (s->dc) dp_shard_dc_forget(s, e->worker); /* the recorded push fell back */
    dp_push_outcome_t o;
    if (R->L.rl) {
        dp_lab_push_rl(&R->L, e->shard, e->worker, (long)e->step - 1, e->version, job->grad, &job->seg, &o);
        if (e->account && (e->env_steps != job->seg.env_steps || e->episodes != (uint64_t)job->seg.n ||
                           e->returns != dp_lab_seg_returns(&job->seg)) &&
            R->account_mismatches++ == 0)
            R->first_account_mismatch = i + 1;
    } else {
        dp_lab_push(&R->L, e->shard, e->worker, (long)e->step - 1, e->version, job->grad,
                    job->dealt ? &job->batch : NULL, &o);
    }
    if ((int)o.status != e->status || o.staleness != e->staleness || R->L.shard[e->shard].version != e->after ||
        (s->dc && o.status == DP_PUSH_APPLIED && o.compensated != e->dc))
        return dp_err(err, "replay diverged at event %zu (shard %d, worker %d, step %" PRIu64 "): the "
                      "policy decided %d staleness %" PRIu64 " version %" PRIu64 ", the record says %d %"
                      PRIu64 " %" PRIu64, i + 1, e->shard, e->worker, e->step, (int)o.status,
                      o.staleness, R->L.shard[e->shard].version, e->status, e->staleness, e->after);
    s_check_norms(R, i, e, &o);
    s_used(R, job);
    return 1;
}

/* Shard k's events as far as the gradients allow; 1 when it moved. */
static int s_advance(s_replay_t *R, int k, char *err)
{
    int moved = 0;
    while (R->cur[k] < R->n_by_shard[k]) {
        size_t i = R->by_shard[k][R->cur[k]];
        const dp_rec_event_t *e = &R->rec->ev[i];
        if (e->kind == DP_REC_MEMBERS) {
            dp_lab_members(&R->L, k, e->members, e->call);
        } else if (e->kind == DP_REC_ROWS_PULL) {
            if (s_rows_pull(R, i, err) != 0) return -1;
        } else {
            int r = e->kind == DP_REC_ROWS ? s_rows_push(R, i, err) : s_push(R, i, err);
            if (r < 0) return -1;
            if (r == 0) break;
        }
        if (s_capture(R, k, err) != 0) return -1;
        R->cur[k]++;
        moved = 1;
    }
    return moved;
}

/* The progress line: the record's events replayed so far, of all. */
static void s_progress(s_replay_t *R, int final)
{
    size_t done = 0, all = 0;
    for (int k = 0; k < R->K; k++) done += R->cur[k], all += R->n_by_shard[k];
    dp_progress_update(&R->progress, final, "replay  events %zu/%zu  pushes that differ %" PRIu64, done, all,
                       R->mismatches + R->account_mismatches + R->rows_mismatches);
}

static int s_run(s_replay_t *R, char *err)
{
    for (int k = 0; k < R->K; k++)
        if (s_capture(R, k, err) != 0) return -1;
    for (;;) {
        int moved = 0, left = 0;
        for (int k = 0; k < R->K; k++) {
            int r = s_advance(R, k, err);
            if (r < 0) return -1;
            moved |= r;
            left |= R->cur[k] < R->n_by_shard[k];
        }
        s_progress(R, !left);
        if (!left) {
            dp_progress_done(&R->progress);
            return 0;
        }
        if (!moved) return dp_err(err, "the record's shards wait for each other's versions (not a schedule a run could make)");
    }
}

static void s_free(s_replay_t *R)
{
    for (int j = 0; R->jobs && j < R->n_jobs; j++) {
        free(R->jobs[j].params);
        free(R->jobs[j].grad);
        dp_lab_seg_free(&R->jobs[j].seg);
        dp_lab_batch_free(&R->jobs[j].sb);
    }
    for (int k = 0; k < R->K; k++) {
        if (R->by_shard) free(R->by_shard[k]);
        if (R->need) free(R->need[k]);
    }
    free(R->jobs);
    free(R->versions);
    free(R->ev_job);
    free(R->table);
    free(R->by_shard);
    free(R->n_by_shard);
    free(R->cur);
    free(R->need);
    free(R->cap);
    dp_lab_fini(&R->L);
}

/* ---- the command ---- */

static const char s_synopsis[] =
    "usage: downpour replay FILE --out DIR [--data SPEC] [--batch B] [--threads N] [--data-seed N]\n"
    "                       [--precision fp32|bf16]\n"
    "Runs a schedule recorded by `downpour local --record`, `downpour-ps --record` or\n"
    "`downpour sim --record` again in one process and leaves DIR/model.safetensors\n"
    "and DIR/summary.json; on the CPU, with the recorded kernel threads, the weights\n"
    "are bit-identical to the recorded run's. The flags fill in what a record from\n"
    "downpour-ps alone lacks (the workers' side) and override the record. A sparse\n"
    "model's record (embed:D on libsvm data) replays with its shards' row tables.\n"
    "\n";

typedef struct {
    const char *out, *data, *json_line;
    int batch, threads, json;
    int progress;          /* dp_progress_mode_t (--progress / --no-progress) */
    uint64_t data_seed;
    dp_precision_t precision; /* --precision, when given */
    char save[4096], summary[4096];
} s_args_t;

static int s_set_precision(void *arg, const char *v, char *err)
{
    return dp_precision_parse(v, &((s_args_t *)arg)->precision, err);
}

static dp_opts_result_t s_parse(s_args_t *a, dp_opts_t *o, int argc, char **argv, char *err)
{
    const dp_opts_flag_t t[] = {
        DP_FLAG_STR("out", "DIR", &a->out, 0, "DIR/model.safetensors and DIR/summary.json (required)"),
        DP_FLAG_STR("data", "SPEC", &a->data, 0, "the dataset (default: the record's, else fashion-mnist)"),
        DP_FLAG_NUM("batch", DP_OPTS_INT, "B", &a->batch, 1, 1 << 16, 0, "per-worker batch (default: the record's, else 64)"),
        DP_FLAG_NUM("threads", DP_OPTS_INT, "N", &a->threads, 1, 1024, 0,
                    "CPU kernel threads (default: the record's, else 1); bit-identity\nneeds the recorded workers' count"),
        DP_FLAG_SEED("data-seed", &a->data_seed, 0, "the workers' --seed (default: the record's, else its --seed)"),
        DP_FLAG_CALL("precision", "fp32|bf16", s_set_precision, a, 0,
                     "the workers' conv and fc arithmetic (default: the record's,\nelse fp32)"),
        DP_FLAG_SET("json", &a->json, 1, 0, "print the result as one JSON line"),
        DP_FLAG_SET("progress", &a->progress, DP_PROGRESS_ON, 0, "the progress line (default: on a terminal)"),
        DP_FLAG_SET("no-progress", &a->progress, DP_PROGRESS_OFF, 0, "no progress line"),
    };
    dp_opts_init(o, "downpour replay", s_synopsis, NULL);
    dp_opts_add(o, t, (int)(sizeof t / sizeof t[0]));
    return dp_opts_parse(o, argc, argv, err);
}

/* The lab's conf: the record's header, then the flags. */
static int s_conf(dp_lab_conf_t *c, const s_args_t *a, dp_opts_t *o, const cJSON *h, char *err)
{
    dp_lab_conf_default(c);
    if (!dp_record_str(h, "data_seed")) { /* a shard's record: the workers took the servers' seed */
        const char *seed = dp_record_str(h, "seed");
        if (seed && dp_opts_parse_u64("seed", seed, &c->train.seed, err) != 0) return -1;
    }
    if (dp_lab_conf_from_header(c, h, err) != 0) return -1;
    if (a->data) c->train.data = a->data;
    if (a->batch) c->train.batch = a->batch;
    if (a->threads) c->train.threads = a->threads;
    if (dp_opts_find(o, "data-seed")->given) c->train.seed = a->data_seed;
    if (dp_opts_find(o, "precision")->given) c->train.precision = a->precision;
    if (dp_precision_check(c->train.device, c->train.precision, err) != 0) return -1;
    if (dp_lab_is_sparse(c) && !c->has_rows)
        return dp_err(err, "record header: a model with embed:D but no \"rows\" (the row tables' conf): "
                      "a record from before its row pulls and pushes were recorded, which cannot be "
                      "replayed (record the run again)");
    if (dp_record_num(h, "start_version", 0) != 0)
        return dp_err(err, "the recorded shards started from a checkpoint (version %g): the weights it "
                      "held are not in the record", dp_record_num(h, "start_version", 0));
    return 0;
}

static void s_report(const s_replay_t *R, const s_args_t *a, double acc, double wall_s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "events", (double)R->rec->n);
    cJSON_AddNumberToObject(o, "gradients", R->n_jobs);
    cJSON_AddNumberToObject(o, "version", (double)R->L.shard[0].version);
    int differs = R->mismatches || R->account_mismatches || R->rows_mismatches;
    cJSON_AddBoolToObject(o, "matches_record", !differs);
    cJSON_AddNumberToObject(o, "norm_mismatches", (double)R->mismatches);
    if (R->L.sp) {
        cJSON_AddNumberToObject(o, "rows_norm_mismatches", (double)R->rows_mismatches);
        cJSON_AddNumberToObject(o, "eval_row_pulls", (double)R->eval_pulls); /* skipped: the chief's test */
        cJSON_AddNumberToObject(o, "test_loss", R->test_loss);
        cJSON_AddNumberToObject(o, "test_auc", R->L.test_auc);
    }
    if (R->L.rl) {
        cJSON_AddNumberToObject(o, "account_mismatches", (double)R->account_mismatches);
        dp_lab_rl_json(R->L.rl, &R->L.conf.train.a3c, o);
    } else {
        cJSON_AddNumberToObject(o, "test_accuracy", dp_metrics_round(acc, 5));
    }
    cJSON_AddNumberToObject(o, "wall_s", dp_metrics_round(wall_s, 4));
    cJSON_AddStringToObject(o, "out", a->out);
    char *text = cJSON_PrintUnformatted(o);
    const dp_lab_rl_t *rl = R->L.rl;
    if (a->json) printf("%s\n", text);
    else if (rl)
        fprintf(stderr, "replay: %zu events, %d segments, version %" PRIu64 ": %s, %" PRIu64 " env steps, %"
                PRIu64 " episodes, return of the last 100 %.1f, greedy test return %.1f; %s\n", R->rec->n,
                R->n_jobs, R->L.shard[0].version, rl->kind->name, rl->run.env_steps, rl->run.episodes,
                dp_episodes_mean(&rl->run), rl->test_return,
                differs ? "DIFFERS from the record (see the warning)" : "every recorded norm and account matched");
    else if (R->L.sp)
        fprintf(stderr, "replay: %zu events, %d gradients, version %" PRIu64 ": test accuracy %.4f, loss "
                "%.17g, AUC %.17g; %s\n", R->rec->n, R->n_jobs, R->L.shard[0].version, acc, R->test_loss,
                R->L.test_auc, differs ? "DIFFERS from the record (see the warning)" : "every recorded norm matched");
    else fprintf(stderr, "replay: %zu events, %d gradients, version %" PRIu64 ": test accuracy %.4f; %s\n",
                 R->rec->n, R->n_jobs, R->L.shard[0].version, acc,
                 differs ? "DIFFERS from the record (see the warning)" : "every recorded norm matched");
    cJSON_free(text);
    cJSON_Delete(o);
    if (R->mismatches)
        dp_log_warn("replay: %" PRIu64 " push(es) differ from the record in their gradient or update norm, "
                    "the first at event %zu: the recorded workers ran other kernels (threads, ISA, device)?",
                    R->mismatches, R->first_mismatch);
    if (R->rows_mismatches)
        dp_log_warn("replay: %" PRIu64 " row push(es) differ from the record in their rows' norm, the first "
                    "at event %zu: the recorded workers ran other kernels (threads, ISA, device)?",
                    R->rows_mismatches, R->first_rows_mismatch);
    if (R->account_mismatches)
        dp_log_warn("replay: %" PRIu64 " push(es) carried another segment's account (env steps, episodes, "
                    "returns) than the one recomputed, the first at event %zu", R->account_mismatches,
                    R->first_account_mismatch);
}

static int s_replay(const dp_rec_t *rec, const char *file, s_args_t *a, dp_opts_t *o, char *err)
{
    static s_replay_t R;
    memset(&R, 0, sizeof R);
    R.rec = rec;
    dp_progress_init(&R.progress, (dp_progress_mode_t)a->progress);
    dp_lab_conf_t c;
    if (s_conf(&c, a, o, rec->header, err) != 0) return -1;
    snprintf(a->save, sizeof a->save, "%s/model.safetensors", a->out);
    snprintf(a->summary, sizeof a->summary, "%s/summary.json", a->out);
    c.train.save = a->save;
    c.train.summary = a->summary;
    c.measure = 1;
    double t0 = dp_now(), acc = 0;
    int rc = dp_lab_init(&R.L, &c, err);
    R.K = c.shards;
    if (rc == 0) {
        R.n_floats = R.L.s.model.n_floats;
        rc = s_index(&R, file, err);
    }
    if (rc == 0 && R.L.rl) rc = s_check_segments(&R, file, err);
    if (rc == 0 && R.L.sp) rc = s_index_pulls(&R, file, err);
    if (rc == 0) rc = s_plan(&R, file, err);
    if (rc == 0) rc = s_run(&R, err);
    if (rc == 0) rc = dp_lab_finish(&R.L, R.chief_steps, dp_now() - t0, NULL, &acc, &R.test_loss, err);
    if (rc == 0) s_report(&R, a, acc, dp_now() - t0);
    s_free(&R);
    return rc;
}

int dp_replay_main(int argc, char **argv)
{
    s_args_t a;
    memset(&a, 0, sizeof a);
    a.progress = DP_PROGRESS_AUTO;
    dp_opts_t o;
    char err[DP_ERR_LEN] = "";
    const char *file = argc > 1 && argv[1][0] != '-' ? argv[1] : NULL;
    dp_opts_result_t rc = file ? s_parse(&a, &o, argc - 1, argv + 1, err) : s_parse(&a, &o, argc, argv, err);
    if (rc == DP_OPTS_PARSED && !file) rc = dp_err(err, "which record? downpour replay FILE --out DIR");
    if (rc == DP_OPTS_PARSED && !a.out) rc = dp_err(err, "--out DIR is required (see downpour replay --help)");
    if (rc != DP_OPTS_PARSED) return dp_opts_exit_status("downpour replay", rc, err);
    if (dp_mkdirs(a.out, 0755, err) != 0) {
        fprintf(stderr, "downpour replay: %s\n", err);
        return 1;
    }
    dp_rec_t rec;
    if (dp_rec_load(&rec, file, err) != 0 || s_replay(&rec, file, &a, &o, err) != 0) {
        fprintf(stderr, "downpour replay: %s\n", err);
        dp_rec_fini(&rec);
        return 1;
    }
    dp_rec_fini(&rec);
    return 0;
}
