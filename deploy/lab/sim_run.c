/* sim_run: the simulated cluster's event loop, its evaluations and
 * diagnostics (see sim.h).
 *
 * Diagnostics, every --diag-every updates, on the push that made the
 * update (its worker w, its gradient g computed on the weights w pulled):
 *   cosine      cos(g, g_fresh), g_fresh = w's gradient on the same batch
 *               at the weights g was applied to: how much staleness turned
 *               the step
 *   moved       ||weights g was applied to - weights w pulled||: how far the
 *               model moved while w computed (0 for a fresh gradient)
 *   variance    mean ||g_i - mean g||^2 over the gradients in flight (one
 *               per busy worker, w's included), and that over ||mean g||^2
 * Momentum. Mitliagkas et al. (2016): with staleness geometric with
 * P(0) = p, the expected update is a geometric average of past gradients,
 * the recursion of momentum with mu = 1 - p; with M exponential workers p =
 * 1/M. The result sets the explicit momentum (momentum's mu, Adam's beta1)
 * next to that: momentum_implicit = 1 - p fitted to the staleness measured
 * (dp_staleness_geometric_p; it departs from 1 - 1/M with a straggler or a
 * staleness bound), momentum_effective = explicit + implicit, against
 * momentum_total_theory = explicit + 1 - 1/M. And, with --diag-every, a
 * trajectory figure: update_autocorrelation, the least-squares slope of
 * each update on the one before (sum <u_t, u_t-1> / sum ||u_t-1||^2). For
 * explicit momentum with independent batch noise it recovers mu; the
 * implicit momentum acts on the expected update only, so for async SGD
 * it stays near the share of the update that is signal rather than noise
 * — the two figures together separate what momentum the noise carries.
 *
 * An elastic crew (--workers MIN:MAX) starts with MIN live, and shard 0's
 * dealer (server/crew/deal.h) hands out the batches as it does for the daemons.
 * --churn changes the crew every exp(MEAN) simulated seconds: a join (the
 * lowest index not live) or a leave, a fair coin between MIN and MAX live;
 * the leaver is a random live worker but the chief, and it leaves after
 * its push in flight (leave:) or dies with it (kill:, its batch back to
 * the pool and counted when dealt again). The draws have a stream of their
 * own, so a schedule is a function of --seed.
 *
 * A model with embed:D: a worker's pull is the dense weights, then its
 * batch's rows from each shard (s_rows_pull); its push the rows'
 * gradients to each shard, then the dense one to each (s_rows_push,
 * s_finish_one). Once the servers reach --updates no step starts, and
 * the steps in flight are pushed (s_loop): each pulled rows, which the
 * record holds, so each needs its push for a replay. */
#include "deploy/lab/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dylu.h"
#include "common/metrics.h"
#include "common/opts.h"
#include "common/rng.h"
#include "common/util.h"
#include "server/core/shard_dc.h"
#include "server/crew/deal.h"
#include "server/crew/membership.h"
#include "worker/client/ps_client.h"
#include "worker/exec/data.h"
#include "worker/train/progress.h"

typedef struct {
    double t;
    uint64_t seq;
    int w;
    int start;             /* w's pull, not its push: a traced worker's first, or its next
                            * once its push's and pull's round trips have passed */
} s_event_t;

typedef struct {
    int live;              /* in the crew (a fixed crew: always) */
    int leaving;           /* --churn leave: goes after its push in flight */
    int busy;              /* computing: its finish is queued */
    uint64_t version;      /* the version it pulled */
    uint64_t min_version;  /* sync: its next pull waits for this version */
    long step;             /* its next data step */
    float *grad;           /* the gradient in flight */
    float *pulled;         /* diagnostics: the weights it pulled */
    float loss;
    dp_deal_batch_t batch; /* an elastic crew: the batch shard 0 dealt it */
    dp_lab_batch_t sb;     /* a model with embed:D: its step's batch, keys, the rows it pulled
                            * and their gradients, from its pull to its push */
    dp_rng_t rng;          /* its compute times */
    double round_ms;       /* DyLU: its round's simulated compute ms per local step, */
    double step_ms;        /* ... their EWMA, reported with each push (common/dylu.h), */
    long h_sum, rounds;    /* ... and the H of its rounds summed, and counted */
    dp_trace_cursor_t trace; /* --compute trace:DIR: its place in the series it replays, */
    double gap_ms;         /* ... and the wait after its push before the servers answer its next pull */
} s_worker_t;

typedef struct {
    const dp_sim_conf_t *c;
    dp_lab_t L;
    s_worker_t *w;
    s_event_t *heap;
    int n_heap;
    uint64_t seq;
    int *held;             /* pulls waiting, in arrival order */
    int n_held;
    double now;            /* simulated seconds */
    size_t n;              /* floats in the parameter vector */
    float *params, *fresh, *prev_update, *mean;
    long chief_steps;
    double loss_avg;
    uint64_t pushes;
    /* diagnostics */
    double mom_dot, mom_norm; /* sums for the effective momentum */
    int have_prev;
    double cos_sum, moved_sum, var_sum, var_rel_sum;
    long diags;
    cJSON *evals;          /* [{updates, sim_s, test_accuracy}] */
    /* an elastic crew */
    int dealing;           /* shard 0 deals the batches (--workers MIN:MAX) */
    dp_deal_t deal;
    dp_membership_t crew;  /* its joins and leaves */
    dp_dylu_crew_t speeds; /* DyLU: the step times the workers reported, as the servers keep them */
    dp_rng_t churn_rng;
    double next_churn;     /* simulated s of the next change (--churn) */
    int *finishing;        /* told the data is done, to finish after the event at hand */
    int n_finishing;
    int failed;            /* a step could not start (a sparse model's batch or row pull): */
    char err[DP_ERR_LEN];  /* ... why; the loop stops with it */
    dp_progress_t progress; /* the live line (a plain one every 10 s off a terminal) */
} s_sim_t;

/* ---- the event queue: a binary heap on (t, seq) ---- */

static int s_before(const s_event_t *a, const s_event_t *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void s_sift_up(s_sim_t *S, int i)
{
    while (i > 0 && s_before(&S->heap[i], &S->heap[(i - 1) / 2])) {
        s_event_t tmp = S->heap[i];
        S->heap[i] = S->heap[(i - 1) / 2];
        S->heap[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static void s_sift_down(s_sim_t *S, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < S->n_heap && s_before(&S->heap[l], &S->heap[m])) m = l;
        if (r < S->n_heap && s_before(&S->heap[r], &S->heap[m])) m = r;
        if (m == i) break;
        s_event_t tmp = S->heap[i];
        S->heap[i] = S->heap[m];
        S->heap[m] = tmp;
        i = m;
    }
}

static void s_heap_push(s_sim_t *S, double t, int w, int start)
{
    int i = S->n_heap++;
    S->heap[i] = (s_event_t){t, S->seq++, w, start};
    s_sift_up(S, i);
}

/* The event at i out of the heap. */
static s_event_t s_heap_take(s_sim_t *S, int i)
{
    s_event_t e = S->heap[i];
    S->heap[i] = S->heap[--S->n_heap];
    if (i < S->n_heap) {
        s_sift_down(S, i);
        s_sift_up(S, i);
    }
    return e;
}

static s_event_t s_heap_pop(s_sim_t *S)
{
    return s_heap_take(S, 0);
}

/* ---- workers ---- */

static int s_going(const s_sim_t *S);

/* A sparse model's step at w's pull (deploy/lab/sparse.h): its batch, then
 * its keys' rows from each shard as they stand now, as the embed worker
 * pulls them after the dense weights (worker/train/embed_train.c). -1 with
 * S->err. */
static int s_rows_pull(s_sim_t *S, int w)
{
    s_worker_t *k = &S->w[w];
    if (dp_lab_batch_load(&S->L, w, k->step, &k->sb, S->err) != 0) return -1;
    for (int s = 0; s < S->L.conf.shards; s++)
        if (dp_lab_rows_pull(&S->L, s, w, &k->sb, S->err) < 0) return -1;
    return 0;
}

/* At w's push: its rows' gradients to each shard, before its dense push
 * (so a row push lands between dense versions, as in the daemons), each
 * pulled at the version its dense pull had (every shard's: they take the
 * same pushes in the same order). */
static int s_rows_push(s_sim_t *S, int w, char *err)
{
    s_worker_t *k = &S->w[w];
    for (int s = 0; s < S->L.conf.shards; s++) {
        dp_push_outcome_t o;
        double norm;
        int repeat;
        dp_lab_rows_push(&S->L, s, w, (uint64_t)k->step + 1, k->version, &k->sb, &o, &norm, &repeat);
        if (repeat || o.status == DP_PUSH_REJECTED)
            return dp_err(err, "simulation: shard %d %s worker %d's row push: %s", s,
                          repeat ? "took as a repeat" : "rejected", w, repeat ? "(a step twice)" : o.reason);
    }
    return 0;
}

/* The batch dealt with w's pull (an elastic crew), else NULL: its own. */
static const dp_deal_batch_t *s_dealt(const s_sim_t *S, int w)
{
    return S->dealing ? &S->w[w].batch : NULL;
}

/* DyLU: w's next round's H, by its own step time against the fastest the
 * crew reported (common/dylu.h), told to the engine before it computes. */
static void s_dylu_round(s_sim_t *S, int w)
{
    s_worker_t *k = &S->w[w];
    long h = dp_dylu_steps(S->c->lab.local_steps, k->step_ms, dp_dylu_fastest(&S->speeds));
    dp_lab_round(&S->L, w, h);
    k->h_sum += h;
    k->rounds++;
}

/* w's pull is answered: it takes the weights and version, computes its
 * gradient and will push when its compute time has passed. 0 when the
 * dealer has no batch for it yet (the pull waits); a worker told the
 * data is done finishes. */
static int s_start(s_sim_t *S, int w)
{
    s_worker_t *k = &S->w[w];
    if (S->dealing) {
        char why[DP_ERR_LEN];
        dp_deal_answer_t a = dp_deal_ask(&S->deal, w, (uint64_t)k->step + 1, &k->batch, why, sizeof why);
        if (a == DP_DEAL_WAIT) return 0;
        if (a != DP_DEAL_DEALT) { /* the end (one batch in flight a worker: never refused) */
            k->live = 0; /* it finishes once the event at hand is done (s_loop) */
            S->finishing[S->n_finishing++] = w;
            return 1;
        }
    }
    /* a sparse run's end: no step starts once the servers reached
     * --updates, since its row pulls would be a step no push follows */
    if (S->L.sp && (S->failed || !s_going(S))) return 1;
    dp_lab_params(&S->L, -1, S->params);
    k->version = S->L.shard[0].version;
    dp_lab_pulled(&S->L, w);
    if (S->L.sp && s_rows_pull(S, w) != 0) {
        S->failed = 1; /* s_loop stops with S->err */
        return 1;
    }
    if (S->c->lab.dylu) s_dylu_round(S, w);
    k->loss = S->L.sp ? dp_lab_sparse_gradient(&S->L, S->params, w, k->step, &k->sb, k->grad)
                      : dp_lab_gradient(&S->L, S->params, w, k->step, s_dealt(S, w), k->grad);
    if (k->pulled) memcpy(k->pulled, S->params, S->n * sizeof(float));
    k->busy = 1;
    /* a round of local steps computes H gradients: H draws (DyLU: its own H) */
    long n = S->c->lab.dylu ? S->L.round_n[w] : S->c->lab.local_steps > 1 ? S->c->lab.local_steps : 1;
    double ms = 0;
    k->gap_ms = 0; /* a traced step's push and next pull: after it lands (s_finish_one) */
    for (long h = 0; h < n; h++) {
        double gap = 0;
        ms += k->gap_ms + (S->c->compute.trace ? dp_trace_next(&k->trace, &gap)
                                               : dp_dist_draw_ms(&S->c->compute, &k->rng));
        k->gap_ms = gap;
    }
    if (n > 0) k->round_ms = ms * S->c->slow[w] / (double)n;
    s_heap_push(S, S->now + ms * S->c->slow[w] / 1000.0, w, 0);
    return 1;
}

/* w asks for the weights: answered now or held, as the daemon would. */
static void s_pull(s_sim_t *S, int w)
{
    if (!S->w[w].live) return;
    if (!dp_policy_pull_ready(S->L.policy[0], w, S->w[w].min_version) || !s_start(S, w))
        S->held[S->n_held++] = w;
}

/* w's first pull: now, or with a trace when the worker it replays began
 * its first step, after the real run's first worker did (trace.h). */
static void s_pull_first(s_sim_t *S, int w)
{
    double at = S->c->compute.trace ? dp_trace_first(&S->w[w].trace) / 1000.0 : 0;
    if (at > 0) s_heap_push(S, at, w, 1);
    else s_pull(S, w);
}

/* After a push or a change of the crew: the held pulls now ready are
 * answered, in arrival order. */
static void s_reask_held(s_sim_t *S)
{
    int kept = 0;
    for (int i = 0; i < S->n_held; i++) {
        int w = S->held[i];
        if (!dp_policy_pull_ready(S->L.policy[0], w, S->w[w].min_version) || !s_start(S, w))
            S->held[kept++] = w;
    }
    S->n_held = kept;
}

/* ---- the crew ---- */

static void s_emit(s_sim_t *S, cJSON *line_fields);

/* w out of the held pulls and the clock (it stops before its push). */
static void s_forget(s_sim_t *S, int w)
{
    int kept = 0;
    for (int i = 0; i < S->n_held; i++)
        if (S->held[i] != w) S->held[kept++] = S->held[i];
    S->n_held = kept;
    for (int i = 0; i < S->n_heap; i++)
        if (S->heap[i].w == w) {
            s_heap_take(S, i);
            break;
        }
    S->w[w].busy = 0;
}

/* w joins, leaves, finishes or dies now: every shard's member table and
 * policy, the dealer (not yet the history: s_crew_note). */
static void s_crew_change(s_sim_t *S, int w, dp_lab_crew_t what)
{
    s_worker_t *k = &S->w[w];
    k->leaving = 0;
    k->live = what == DP_LAB_JOIN;
    if (!k->live) {
        s_forget(S, w);
        if (S->dealing) dp_deal_release(&S->deal, w, what == DP_LAB_DIE);
    }
    dp_lab_crew(&S->L, w, what);
}

/* The crew's history after changes: an event (and a metrics line) each. */
static void s_crew_note(s_sim_t *S)
{
    uint64_t v = S->L.shard[0].version;
    int news = dp_membership_note(&S->crew, &S->L.members[0], v);
    for (int i = news; i > 0; i--) {
        const dp_member_event_t *e = dp_membership_at(&S->crew, S->crew.n_ev - (size_t)i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "event", dp_member_joins(e->why) ? "join" : "leave");
        cJSON_AddNumberToObject(o, "task", e->task);
        cJSON_AddNumberToObject(o, "version", (double)e->version);
        cJSON_AddNumberToObject(o, "live", e->live);
        cJSON_AddStringToObject(o, "why", dp_member_why_name(e->why));
        cJSON_AddNumberToObject(o, "sim_s", dp_metrics_round(S->now, 6));
        s_emit(S, o);
    }
}

/* One change now, noted; a newcomer pulls, held pulls are asked again (a
 * sync step may have fired without a leaver, its batch come back). */
static void s_crew(s_sim_t *S, int w, dp_lab_crew_t what)
{
    s_crew_change(S, w, what);
    s_crew_note(S);
    s_pull(S, w);
    s_reask_held(S);
}

/* Live workers, and those of them that may leave (not the chief, not
 * already leaving): the r-th of them into *pick. */
static int s_live(const s_sim_t *S, int *leavers, uint32_t r, int *pick)
{
    int live = 0, n = 0;
    for (int w = 0; w < S->c->lab.workers; w++) {
        if (!S->w[w].live || S->w[w].leaving) continue;
        live++;
        if (w > 0 && n++ == (int)r) *pick = w;
    }
    *leavers = n;
    return live;
}

/* One change of --churn, and the time of the next. */
static void s_churn(s_sim_t *S)
{
    const dp_sim_conf_t *c = S->c;
    int leavers, pick = -1;
    int live = s_live(S, &leavers, UINT32_MAX, &pick);
    int join = live < c->lab.workers &&
               (live <= c->lab.min_workers || leavers == 0 || (dp_rng_next(&S->churn_rng) >> 63));
    if (join) {
        int w = 0;
        while (S->w[w].live) w++; /* the lowest index not live (a leaving one is still live) */
        s_crew(S, w, DP_LAB_JOIN);
    } else if (leavers > 0) {
        s_live(S, &leavers, dp_rng_below(&S->churn_rng, (uint32_t)leavers), &pick);
        if (c->churn.kind == DP_CHURN_KILL) s_crew(S, pick, DP_LAB_DIE);
        else if (S->w[pick].busy) S->w[pick].leaving = 1; /* after its push */
        else s_crew(S, pick, DP_LAB_LEAVE);
    }
    S->next_churn = S->now - c->churn.mean_s * log(dp_uniform01(&S->churn_rng));
}

/* ---- evaluation and diagnostics ---- */

static void s_emit(s_sim_t *S, cJSON *line_fields)
{
    if (S->c->json) {
        char *text = cJSON_PrintUnformatted(line_fields);
        printf("%s\n", text);
        fflush(stdout);
        cJSON_free(text);
    }
    cJSON *line = dp_metrics_line(S->L.s.metrics);
    if (line) {
        const cJSON *it;
        cJSON_ArrayForEach(it, line_fields) cJSON_AddItemToObject(line, it->string, cJSON_Duplicate(it, 1));
        dp_metrics_write(S->L.s.metrics, &line);
    }
    cJSON_Delete(line_fields);
}

/* Epochs of data the pushes so far stand for (a sparse model's epoch: the
 * file's batches, as the embed kind's cluster loop deals them to the crew). */
static double s_epochs(const s_sim_t *S)
{
    if (S->L.sp) return (double)S->pushes / (double)S->L.sp->data[0].steps_per_epoch;
    return (double)S->pushes * S->c->lab.train.batch / S->L.s.train.n;
}

static void s_evaluate(s_sim_t *S, int limit, double *acc, double *loss)
{
    dp_lab_params(&S->L, -1, S->params);
    dp_net_set_params(&S->L.s.net, S->params);
    dp_session_evaluate(&S->L.s, limit, acc, loss);
}

/* The line of an evaluation at version (acc, loss on the test set). */
static void s_eval_emit(s_sim_t *S, uint64_t version, double acc, double loss)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "eval");
    cJSON_AddNumberToObject(o, "updates", (double)version);
    cJSON_AddNumberToObject(o, "pushes", (double)S->pushes);
    cJSON_AddNumberToObject(o, "sim_s", dp_metrics_round(S->now, 6));
    cJSON_AddNumberToObject(o, "epoch", dp_metrics_round(s_epochs(S), 5));
    cJSON_AddNumberToObject(o, "test_accuracy", dp_metrics_round(acc, 5));
    cJSON_AddNumberToObject(o, "test_loss", dp_metrics_round(loss, 5));
    cJSON_AddNumberToObject(o, "train_loss", dp_metrics_round(S->loss_avg, 5));
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "updates", (double)version);
    cJSON_AddNumberToObject(e, "sim_s", dp_metrics_round(S->now, 6));
    cJSON_AddNumberToObject(e, "test_accuracy", dp_metrics_round(acc, 5));
    cJSON_AddItemToArray(S->evals, e);
    if (!S->c->json && version < S->c->updates)
        fprintf(stderr, "sim: update %llu  %.3f simulated s  test accuracy %.4f\n",
                (unsigned long long)version, S->now, acc);
    s_emit(S, o);
}

static void s_eval_line(s_sim_t *S, uint64_t version)
{
    double acc, loss;
    s_evaluate(S, S->c->eval_limit, &acc, &loss);
    s_eval_emit(S, version, acc, loss);
}

static double s_dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* The update just made (weights now - before it) against the one before. */
static void s_momentum_sample(s_sim_t *S)
{
    const dp_shard_t *sh = &S->L.shard[0];
    const float *before = S->L.policy[0]->before;
    float *u = S->fresh; /* scratch */
    for (size_t i = 0; i < S->n; i++) u[i] = sh->w[i] - before[i];
    if (S->have_prev) {
        S->mom_dot += s_dot(u, S->prev_update, S->n);
        S->mom_norm += s_dot(S->prev_update, S->prev_update, S->n);
    }
    memcpy(S->prev_update, u, S->n * sizeof(float));
    S->have_prev = 1;
}

/* Variance of the gradients in flight across the busy workers. */
static void s_variance(s_sim_t *S, double *var, double *rel)
{
    int m = 0;
    memset(S->mean, 0, S->n * sizeof(float));
    for (int w = 0; w < S->c->lab.workers; w++)
        if (S->w[w].busy) {
            for (size_t i = 0; i < S->n; i++) S->mean[i] += S->w[w].grad[i];
            m++;
        }
    *var = *rel = 0;
    if (m < 2) return;
    for (size_t i = 0; i < S->n; i++) S->mean[i] /= (float)m;
    double sum = 0;
    for (int w = 0; w < S->c->lab.workers; w++)
        if (S->w[w].busy)
            for (size_t i = 0; i < S->n; i++) {
                double d = (double)S->w[w].grad[i] - S->mean[i];
                sum += d * d;
            }
    *var = sum / m;
    double mn = s_dot(S->mean, S->mean, S->n);
    *rel = mn > 0 ? *var / mn : 0;
}

/* The diagnostics at the push of worker w that made update version,
 * against the weights the server applied it to (the policy's copy of the
 * range before the step; the simulator has one shard, the whole vector). */
static void s_diag(s_sim_t *S, int w, uint64_t version, uint64_t staleness)
{
    s_worker_t *k = &S->w[w];
    memcpy(S->params, S->L.policy[0]->before, S->n * sizeof(float));
    dp_lab_gradient(&S->L, S->params, w, k->step, s_dealt(S, w), S->fresh);
    double gg = s_dot(k->grad, k->grad, S->n), ff = s_dot(S->fresh, S->fresh, S->n);
    double cosine = gg > 0 && ff > 0 ? s_dot(k->grad, S->fresh, S->n) / sqrt(gg * ff) : 0;
    double moved = 0;
    for (size_t i = 0; i < S->n; i++) {
        double d = (double)S->params[i] - k->pulled[i];
        moved += d * d;
    }
    moved = sqrt(moved);
    double var, rel;
    s_variance(S, &var, &rel);
    S->cos_sum += cosine;
    S->moved_sum += moved;
    S->var_sum += var;
    S->var_rel_sum += rel;
    S->diags++;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "diag");
    cJSON_AddNumberToObject(o, "updates", (double)version);
    cJSON_AddNumberToObject(o, "sim_s", dp_metrics_round(S->now, 6));
    cJSON_AddNumberToObject(o, "worker", w);
    cJSON_AddNumberToObject(o, "staleness", (double)staleness);
    cJSON_AddNumberToObject(o, "cosine_stale_fresh", dp_metrics_round(cosine, 6));
    cJSON_AddNumberToObject(o, "moved", dp_metrics_round(moved, 6));
    cJSON_AddNumberToObject(o, "grad_variance", dp_metrics_round(var, 6));
    cJSON_AddNumberToObject(o, "grad_variance_rel", dp_metrics_round(rel, 6));
    s_emit(S, o);
}

/* ---- the run ---- */

static int s_setup(s_sim_t *S, const dp_sim_conf_t *c, char *err)
{
    memset(S, 0, sizeof *S);
    S->c = c;
    dp_lab_conf_t lc = c->lab;
    lc.measure = lc.measure || c->diag_every > 0;
    if (dp_lab_init(&S->L, &lc, err) != 0) return -1;
    int M = c->lab.workers;
    S->n = S->L.s.model.n_floats;
    S->w = dp_calloc((size_t)M, sizeof *S->w);
    S->heap = dp_calloc((size_t)M + 1, sizeof *S->heap);
    S->held = dp_calloc((size_t)M, sizeof *S->held);
    S->params = dp_aligned_alloc(S->n * sizeof(float));
    S->fresh = dp_aligned_alloc(S->n * sizeof(float));
    if (c->diag_every > 0) {
        S->prev_update = dp_aligned_alloc(S->n * sizeof(float));
        S->mean = dp_aligned_alloc(S->n * sizeof(float));
    }
    for (int w = 0; w < M; w++) {
        S->w[w].grad = dp_aligned_alloc(S->n * sizeof(float));
        if (c->diag_every > 0) S->w[w].pulled = dp_aligned_alloc(S->n * sizeof(float));
        /* Per worker, so one worker's draws do not shift with the others'. */
        dp_rng_seed(&S->w[w].rng, c->lab.train.seed * 0x9E3779B97F4A7C15ULL + 7919u * (uint64_t)w + 1);
        if (c->compute.trace) dp_trace_cursor(c->compute.trace, w, M, &S->w[w].trace);
    }
    S->evals = cJSON_CreateArray();
    S->finishing = dp_calloc((size_t)M, sizeof *S->finishing);
    S->dealing = c->lab.min_workers > 0;
    dp_membership_init(&S->crew, M);
    dp_dylu_crew_init(&S->speeds, M);
    if (S->dealing) {
        /* the budget is the servers' version: a batch for every push that
         * could take (updates x MAX, sync's most), so the data never runs out
         * first; each epoch's batches are dealt once */
        char why[DP_ERR_LEN];
        dp_deal_init(&S->deal, M);
        if (dp_deal_plan(&S->deal, (uint64_t)S->L.s.train.n, (uint32_t)c->lab.train.batch, 0,
                         c->updates, why, sizeof why) != 0)
            return dp_err(err, "elastic crew: %s", why);
    }
    dp_rng_seed(&S->churn_rng, c->lab.train.seed * 0xD1B54A32D192ED03ULL + 0x5EED);
    return 0;
}

static void s_teardown(s_sim_t *S)
{
    for (int w = 0; S->w && w < S->c->lab.workers; w++) {
        free(S->w[w].grad);
        free(S->w[w].pulled);
        dp_lab_batch_free(&S->w[w].sb);
    }
    free(S->w);
    free(S->heap);
    free(S->held);
    free(S->params);
    free(S->fresh);
    free(S->prev_update);
    free(S->mean);
    cJSON_Delete(S->evals);
    free(S->finishing);
    dp_deal_fini(&S->deal);
    dp_membership_fini(&S->crew);
    dp_dylu_crew_fini(&S->speeds);
    dp_lab_fini(&S->L);
}

/* One worker's finish: its push, what the update triggers, its next pull. */
static int s_finish_one(s_sim_t *S, int w, char *err)
{
    s_worker_t *k = &S->w[w];
    const dp_sim_conf_t *c = S->c;
    dp_push_outcome_t o;
    if (S->L.sp && s_rows_push(S, w, err) != 0) return -1;
    if (c->lab.dylu) { /* its push carries its step time; the servers keep the crew's */
        k->step_ms = dp_dylu_ewma(k->step_ms, k->round_ms);
        dp_dylu_report(&S->speeds, w, k->step_ms);
    }
    /* every shard its slice, in order; shard 0's outcome decides (all
     * shards take the same pushes, so they step together) */
    for (int s = 0; s < S->L.conf.shards; s++) {
        dp_push_outcome_t os;
        if (S->L.rl) dp_lab_push_rl(&S->L, s, w, k->step, k->version, k->grad, &S->L.rl->seg[w], &os);
        else dp_lab_push(&S->L, s, w, k->step, k->version, k->grad, s_dealt(S, w), &os);
        if (s == 0) o = os;
    }
    if (o.status == DP_PUSH_REJECTED) return dp_err(err, "simulation: push rejected: %s", o.reason);
    dp_deal_batch_t done;
    if (S->dealing) dp_deal_pushed(&S->deal, w, (uint64_t)k->step + 1, o.status == DP_PUSH_APPLIED, &done);
    S->pushes++;
    if (w == 0) S->chief_steps += dp_lab_push_steps(&S->L, 0, k->step);
    if (!isfinite(k->loss))
        return dp_err(err, "loss is %f at update %llu: training diverged (lower --lr)", k->loss,
                      (unsigned long long)S->L.shard[0].version);
    S->loss_avg = S->pushes == 1 ? k->loss : 0.98 * S->loss_avg + 0.02 * k->loss;
    if (c->lab.mode == DP_MODE_SYNC) k->min_version = k->version + 1;
    uint64_t v = S->L.shard[0].version;
    if (o.stepped && c->diag_every > 0) {
        s_momentum_sample(S);
        if (v % (uint64_t)c->diag_every == 0) s_diag(S, w, v, o.staleness);
    }
    k->busy = 0; /* after the diagnostics: its gradient counts in the variance */
    k->step++;
    if (o.stepped && c->eval_every > 0 && v % (uint64_t)c->eval_every == 0 && v < c->updates)
        s_eval_line(S, v);
    /* a batch back in the pool (a push not used) may be dealt to a held pull */
    if (o.status == DP_PUSH_APPLIED || S->dealing) s_reask_held(S);
    if (k->leaving) {
        s_crew(S, w, DP_LAB_LEAVE);
    } else if (S->L.rl && S->L.rl->run.env_steps >= (uint64_t)c->lab.train.a3c.env_steps) {
        /* the ACK says the run's budget is spent: the worker stops and
         * finishes, as the actor-critic worker does (worker/train/a3c_train.c) */
        k->live = 0;
        S->finishing[S->n_finishing++] = w;
    } else if (k->gap_ms > 0) {
        s_heap_push(S, S->now + k->gap_ms * c->slow[w] / 1000.0, w, 1);
    } else {
        s_pull(S, w);
    }
    return 0;
}

/* Not done yet: an actor-critic run until every worker has finished (the
 * budget spent), any other until the servers' version reaches --updates
 * (or a dealt run's data is done). */
static int s_going(const s_sim_t *S)
{
    if (S->L.rl) {
        for (int w = 0; w < S->c->lab.workers; w++)
            if (S->w[w].live || S->w[w].busy) return 1;
        return 0;
    }
    return S->L.shard[0].version < S->c->updates && !(S->dealing && dp_deal_done(&S->deal));
}

/* The progress line: where the run is against where it stops. */
static void s_progress(s_sim_t *S, int final)
{
    const dp_sim_conf_t *c = S->c;
    if (S->L.rl) {
        const dp_episodes_t *e = &S->L.rl->run;
        dp_progress_update(&S->progress, final, "sim  env steps %llu/%ld  episodes %llu  return(100) %.1f  "
                           "sim %.1f s", (unsigned long long)e->env_steps, c->lab.train.a3c.env_steps,
                           (unsigned long long)e->episodes, dp_episodes_mean(e), S->now);
        return;
    }
    dp_progress_update(&S->progress, final, "sim  updates %llu/%llu  pushes %llu  loss %.4f  sim %.1f s",
                       (unsigned long long)S->L.shard[0].version, (unsigned long long)c->updates,
                       (unsigned long long)S->pushes, S->loss_avg, S->now);
}

static int s_loop(s_sim_t *S, char *err)
{
    const dp_sim_conf_t *c = S->c;
    if (S->dealing) { /* MIN at once */
        for (int w = 0; w < c->lab.min_workers; w++) s_crew_change(S, w, DP_LAB_JOIN);
        s_crew_note(S);
        for (int w = 0; w < c->lab.min_workers; w++) s_pull_first(S, w);
    } else {
        for (int w = 0; w < c->lab.workers; w++) S->w[w].live = 1;
        for (int w = 0; w < c->lab.workers; w++) s_pull_first(S, w);
    }
    S->next_churn = c->churn.kind == DP_CHURN_NONE ? INFINITY
                                                   : -c->churn.mean_s * log(dp_uniform01(&S->churn_rng));
    uint64_t pushes_seen = 0;
    long idle_changes = 0; /* changes of the crew since the last push */
    dp_progress_init(&S->progress, (dp_progress_mode_t)c->progress);
    while (s_going(S)) {
        if (S->pushes != pushes_seen) pushes_seen = S->pushes, idle_changes = 0;
        if (S->n_heap > 0 && S->heap[0].t < S->next_churn) {
            s_event_t e = s_heap_pop(S);
            S->now = e.t;
            if (e.start) s_pull(S, e.w);
            else if (s_finish_one(S, e.w, err) != 0) return -1;
        } else if (S->next_churn < INFINITY && ++idle_changes <= 100000) {
            S->now = S->next_churn;
            s_churn(S);
        } else {
            return dp_err(err, "simulation: every worker waits (a policy that never steps?)");
        }
        while (S->n_finishing > 0) s_crew(S, S->finishing[--S->n_finishing], DP_LAB_FINISH);
        if (S->failed) return dp_err(err, "%s", S->err);
        s_progress(S, 0);
    }
    s_progress(S, 1);
    dp_progress_done(&S->progress);
    /* A sparse run's steps in flight are pushed: each pulled its rows, and
     * a record's row pull that no push follows is no run's (downpour
     * replay refuses it); no new step starts (s_start), so the version
     * ends past --updates by at most the pushes in flight. */
    while (S->L.sp && S->n_heap > 0) {
        s_event_t e = s_heap_pop(S);
        S->now = e.t;
        if (!e.start && s_finish_one(S, e.w, err) != 0) return -1; /* one not started: no step */
    }
    if (S->failed) return dp_err(err, "%s", S->err);
    return 0;
}

/* Each worker's histogram, as the worker daemons end their metrics. */
static void s_metrics_per_worker(s_sim_t *S)
{
    for (int w = 0; w < S->c->lab.workers; w++) {
        cJSON *line = dp_metrics_line(S->L.s.metrics);
        if (!line) return;
        cJSON_AddStringToObject(line, "event", "staleness");
        cJSON_AddNumberToObject(line, "worker", w);
        cJSON_AddItemToObject(line, "staleness_histogram", dp_staleness_json(&S->L.per_worker[w]));
        cJSON_AddNumberToObject(line, "staleness_geometric_p",
                                dp_metrics_round(dp_staleness_geometric_p(&S->L.per_worker[w]), 6));
        dp_metrics_write(S->L.s.metrics, &line);
    }
}

static cJSON *s_result(s_sim_t *S, double acc, double loss, double wall_s)
{
    s_metrics_per_worker(S);
    const dp_sim_conf_t *c = S->c;
    dp_shard_counts_t cnt;
    dp_staleness_t all;
    dp_lab_counts(&S->L, &cnt, &all);
    int M = c->lab.workers;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", dp_mode_name(c->lab.mode));
    cJSON_AddNumberToObject(o, "workers", M);
    cJSON_AddNumberToObject(o, "updates", (double)S->L.shard[0].version);
    cJSON_AddNumberToObject(o, "pushes", (double)S->pushes);
    cJSON_AddNumberToObject(o, "updates_applied", (double)cnt.applied);
    cJSON_AddNumberToObject(o, "updates_dropped", (double)cnt.dropped);
    if (!S->L.rl) /* an actor-critic run has no data: its account instead (below) */
        cJSON_AddNumberToObject(o, "epochs", dp_metrics_round(s_epochs(S), 5));
    cJSON_AddNumberToObject(o, "sim_s", dp_metrics_round(S->now, 6));
    cJSON_AddNumberToObject(o, "fresh_fraction", dp_metrics_round(dp_staleness_fresh(&all), 6));
    cJSON_AddNumberToObject(o, "staleness_mean", dp_metrics_round(dp_staleness_mean(&all), 6));
    cJSON_AddNumberToObject(o, "staleness_max", (double)all.max);
    cJSON_AddNumberToObject(o, "staleness_geometric_p", dp_metrics_round(dp_staleness_geometric_p(&all), 6));
    cJSON_AddItemToObject(o, "staleness_histogram", dp_staleness_json(&all));
    cJSON *pw = cJSON_AddArrayToObject(o, "staleness_mean_per_worker");
    for (int w = 0; w < M; w++)
        cJSON_AddItemToArray(pw, cJSON_CreateNumber(dp_metrics_round(dp_staleness_mean(&S->L.per_worker[w]), 5)));
    if (S->L.rl) {
        dp_lab_rl_json(S->L.rl, &c->lab.train.a3c, o);
    } else {
        cJSON_AddNumberToObject(o, "test_accuracy", dp_metrics_round(acc, 5));
        cJSON_AddNumberToObject(o, "test_loss", dp_metrics_round(loss, 5));
        if (S->L.sp) cJSON_AddNumberToObject(o, "test_auc", dp_metrics_round(S->L.test_auc, 6));
    }
    cJSON_AddNumberToObject(o, "ps_shards", c->lab.shards);
    cJSON_AddNumberToObject(o, "train_loss", dp_metrics_round(S->loss_avg, 5));
    int local = c->lab.local_steps > 1; /* the optimizer typed is then the workers' */
    const dp_optim_conf_t *op = local ? &c->lab.inner : &c->lab.optim;
    cJSON_AddStringToObject(o, "optimizer", dp_optim_kind_name(op->kind));
    cJSON_AddNumberToObject(o, "lr", dp_metrics_round(dp_optim_base_lr(op), 7));
    cJSON_AddNumberToObject(o, "local_steps", (double)(local ? c->lab.local_steps : 1));
    if (local) dp_summary_outer_json(o, &c->lab.optim);
    if (c->lab.dylu) { /* each worker's mean H over its rounds */
        cJSON_AddBoolToObject(o, "local_steps_auto", 1);
        cJSON *hs = cJSON_AddArrayToObject(o, "local_steps_mean");
        for (int w = 0; w < c->lab.workers; w++)
            cJSON_AddItemToArray(hs, cJSON_CreateNumber(dp_metrics_round(
                S->w[w].rounds ? (double)S->w[w].h_sum / (double)S->w[w].rounds : 0, 3)));
    }
    char rule[48], dc[48]; /* as the servers ran them (sync turns them off) */
    const dp_shard_t *sh = &S->L.shard[0];
    dp_delay_lr_name(S->L.policy[0]->conf.delay_lr, S->L.policy[0]->conf.delay_k, rule, sizeof rule);
    dp_optim_dc_name(&sh->optim, dc, sizeof dc);
    cJSON_AddStringToObject(o, "delay_lr", rule);
    cJSON_AddStringToObject(o, "delay_compensation", dc);
    char compress[48]; /* the workers' --compress, and the chief's bytes as summary.json has them */
    dp_compress_name(&c->lab.train.compress, compress, sizeof compress);
    cJSON_AddStringToObject(o, "compress", compress);
    cJSON_AddStringToObject(o, "error_feedback", c->lab.train.compress.error_feedback ? "on" : "off");
    cJSON_AddNumberToObject(o, "bytes_pushed", (double)S->L.bytes_chief);
    if (sh->dc) {
        cJSON_AddNumberToObject(o, "dc_compensated", (double)sh->dc->compensated);
        cJSON_AddNumberToObject(o, "dc_fallback", (double)sh->dc->fallback);
    }
    double explicit_mu = op->kind == DP_OPT_MOMENTUM || op->kind == DP_OPT_NESTEROV ? op->momentum
                         : op->kind == DP_OPT_ADAM                                ? op->beta1 : 0;
    cJSON_AddNumberToObject(o, "momentum", dp_metrics_round(explicit_mu, 7));
    cJSON_AddNumberToObject(o, "momentum_implicit_theory", dp_metrics_round(1.0 - 1.0 / M, 7));
    cJSON_AddNumberToObject(o, "momentum_total_theory", dp_metrics_round(explicit_mu + 1.0 - 1.0 / M, 7));
    double implicit = c->lab.mode == DP_MODE_SYNC ? 0 : 1.0 - dp_staleness_geometric_p(&all);
    cJSON_AddNumberToObject(o, "momentum_implicit", dp_metrics_round(implicit, 6));
    cJSON_AddNumberToObject(o, "momentum_effective", dp_metrics_round(explicit_mu + implicit, 6));
    if (c->diag_every > 0) {
        cJSON_AddNumberToObject(o, "update_autocorrelation",
                                dp_metrics_round(S->mom_norm > 0 ? S->mom_dot / S->mom_norm : 0, 6));
        double d = S->diags ? (double)S->diags : 1;
        cJSON_AddNumberToObject(o, "diag_samples", (double)S->diags);
        cJSON_AddNumberToObject(o, "cosine_stale_fresh_mean", dp_metrics_round(S->cos_sum / d, 6));
        cJSON_AddNumberToObject(o, "moved_mean", dp_metrics_round(S->moved_sum / d, 6));
        cJSON_AddNumberToObject(o, "grad_variance_mean", dp_metrics_round(S->var_sum / d, 6));
        cJSON_AddNumberToObject(o, "grad_variance_rel_mean", dp_metrics_round(S->var_rel_sum / d, 6));
    }
    if (!S->L.rl) {
        cJSON_AddItemToObject(o, "evals", S->evals);
        S->evals = NULL;
    }
    cJSON_AddStringToObject(o, "model", S->L.s.model.spec);
    if (!S->L.rl) cJSON_AddNumberToObject(o, "batch", c->lab.train.batch);
    cJSON_AddNumberToObject(o, "wall_s", dp_metrics_round(wall_s, 4));
    dp_staleness_fini(&all);
    return o;
}

/* An elastic crew's history as the chief's summary has it from shard 0's
 * STATS: the joins and leaves, the live range, the dealt epochs. */
static void s_crew_summary(const s_sim_t *S, dp_ps_membership_t *m)
{
    memset(m, 0, sizeof *m);
    const dp_membership_t *h = &S->crew;
    m->ev = dp_calloc(h->n_ev ? h->n_ev : 1, sizeof *m->ev);
    for (size_t k = 0; k < h->n_ev; k++) {
        const dp_member_event_t *e = dp_membership_at(h, k);
        m->ev[k] = (dp_ps_member_event_t){.join = dp_member_joins(e->why), .task = e->task,
                                          .version = e->version, .live = e->live};
        snprintf(m->ev[k].why, sizeof m->ev[k].why, "%s", dp_member_why_name(e->why));
    }
    m->n = h->n_ev;
    size_t n_ep = dp_deal_epochs(&S->deal, NULL, 0);
    dp_deal_epoch_t *de = dp_calloc(n_ep ? n_ep : 1, sizeof *de);
    dp_deal_epochs(&S->deal, de, n_ep);
    m->epochs = dp_calloc(n_ep ? n_ep : 1, sizeof *m->epochs);
    for (size_t k = 0; k < n_ep; k++)
        m->epochs[k] = (dp_ps_epoch_samples_t){de[k].epoch, de[k].trained, de[k].repeated,
                                               de[k].retrained_after_death, de[k].batches};
    free(de);
    m->n_epochs = n_ep;
    m->deal_foreign = S->deal.foreign;
    m->live_min = h->live_min;
    m->live_max = h->live_max;
    m->live = h->live;
}

/* The result's view of it: counts, the range and the epochs. */
static void s_crew_result(cJSON *o, const s_sim_t *S, const dp_ps_membership_t *m)
{
    int joins = 0, leaves = 0;
    for (size_t k = 0; k < m->n; k++) m->ev[k].join ? joins++ : leaves++;
    cJSON_AddNumberToObject(o, "min_workers", S->c->lab.min_workers);
    cJSON_AddNumberToObject(o, "joins", joins);
    cJSON_AddNumberToObject(o, "leaves", leaves);
    cJSON_AddNumberToObject(o, "live_min", m->live_min);
    cJSON_AddNumberToObject(o, "live_max", m->live_max);
    dp_summary_epoch_samples_json(o, m);
}

int dp_sim_run(const dp_sim_conf_t *c, cJSON **result, char *err)
{
    *result = NULL;
    s_sim_t *S = dp_malloc(sizeof *S);
    double t0 = dp_now();
    int rc = s_setup(S, c, err);
    if (rc == 0) rc = s_loop(S, err);
    double acc = 0, loss = 0;
    dp_ps_membership_t crew = {0};
    if (rc == 0 && S->dealing) s_crew_summary(S, &crew);
    if (rc == 0)
        rc = dp_lab_finish(&S->L, S->chief_steps, dp_now() - t0, S->dealing ? &crew : NULL, &acc, &loss, err);
    if (rc == 0) {
        if (!S->L.rl) /* the last point of the curve: all of the test set */
            s_eval_emit(S, S->L.shard[0].version, acc, loss);
        *result = s_result(S, acc, loss, dp_now() - t0);
        if (S->dealing) s_crew_result(*result, S, &crew);
    }
    dp_ps_membership_fini(&crew);
    s_teardown(S);
    free(S);
    return rc;
}
