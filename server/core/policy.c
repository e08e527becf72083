/* policy: what every consistency policy shares — construction, the refusal
 * of gradients from the future, dispatch to the ops (see policy.h). */
#include "server/core/policy.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"
#include "server/core/shard_dc.h"
#include "server/core/shard_early.h"

int dp_policy_new(dp_policy_t **out, const dp_policy_ops_t *ops, const dp_policy_conf_t *conf,
                  dp_shard_t *shard, const dp_members_t *members, char *err)
{
    *out = NULL;
    if (conf->replicas < 1 || conf->replicas > members->n)
        return dp_err(err, "bad --replicas-to-aggregate %d (1 to --workers %d)", conf->replicas,
                      members->n);
    if (conf->staleness < 0) return dp_err(err, "bad --staleness %d", conf->staleness);
    if (conf->delay_lr < DP_DELAY_NONE || conf->delay_lr > DP_DELAY_THRESHOLD ||
        (conf->delay_lr == DP_DELAY_THRESHOLD && conf->delay_k != 0 &&
         !(conf->delay_k >= 1 && conf->delay_k <= 1e6f)))
        return dp_err(err, "bad --delay-lr rule %d (K %g)", conf->delay_lr, (double)conf->delay_k);
    dp_policy_t *p = dp_calloc(1, sizeof *p);
    p->ops = ops;
    p->conf = *conf;
    if (p->conf.delay_lr == DP_DELAY_THRESHOLD && p->conf.delay_k == 0) p->conf.delay_k = DP_DELAY_K_DEFAULT;
    p->shard = shard;
    p->members = members;
    p->clock = dp_calloc((size_t)members->n, sizeof *p->clock);
    p->contributed = dp_calloc((size_t)members->n, sizeof *p->contributed);
    p->was_live = dp_calloc((size_t)members->n, 1);
    *out = p;
    return 0;
}

void dp_policy_destroy(dp_policy_t **p_p)
{
    if (!p_p || !*p_p) return;
    free((*p_p)->clock);
    free((*p_p)->contributed);
    free((*p_p)->was_live);
    free((*p_p)->before);
    dp_staleness_fini(&(*p_p)->staleness);
    free(*p_p);
    *p_p = NULL;
}

void dp_policy_push(dp_policy_t *p, int worker, uint64_t version, const dp_grad_slice_t *g, int n,
                    bool early, dp_push_outcome_t *out)
{
    dp_shard_t *s = p->shard;
    out->staleness = 0;
    out->stepped = 0;
    out->reason[0] = 0;
    out->lr = 0;
    out->grad_norm = out->update_norm = -1;
    out->compensated = -1;
    if (version > s->version) {
        s->counts.rejected++;
        out->status = DP_PUSH_REJECTED;
        snprintf(out->reason, sizeof out->reason,
                 "from the future: computed on version %" PRIu64 ", this shard is at version %" PRIu64,
                 version, s->version);
        return;
    }
    p->ops->push(p, worker, version, g, n, early, out);
}

int dp_policy_pull_ready(const dp_policy_t *p, int worker, uint64_t min_version)
{
    return p->ops->pull_ready(p, worker, min_version);
}

int dp_policy_members_changed(dp_policy_t *p)
{
    return p->ops->members_changed(p);
}

void dp_policy_measure(dp_policy_t *p)
{
    if (!p->before) p->before = dp_aligned_alloc((p->shard->n + 1) * sizeof(float));
}

/* sqrt(sum x^2) over n floats at any byte address (zero-copy frames). */
static double s_norm_bytes(const void *data, size_t n)
{
    double sum = 0;
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, b + 4 * i, 4);
        sum += (double)x * x;
    }
    return sqrt(sum);
}

/* ||w - before|| after a measured step. */
static double s_moved(const dp_policy_t *p)
{
    const dp_shard_t *s = p->shard;
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) {
        double d = (double)s->w[i] - p->before[i];
        sum += d * d;
    }
    return sqrt(sum);
}

void dp_policy_early_steps(dp_policy_t *p, dp_shard_early_t *e)
{
    p->early = e;
}

/* The step by g at lr: the early step's commit when it is that step, else
 * the early step overtaken and the step computed now. */
static void s_step(dp_policy_t *p, const dp_grad_slice_t *g, int n, float lr, bool early)
{
    if (early && dp_shard_early_commit(p->early, lr, 0) == DP_EARLY_COMMITTED) return;
    dp_shard_early_overtaken(p->early);
    dp_shard_step(p->shard, g, n, lr);
}

/* Sync's step by the mean of acc, the same way (nothing when acc is empty). */
static void s_step_mean(dp_policy_t *p, bool early)
{
    dp_shard_t *s = p->shard;
    if (s->acc_count == 0) return;
    if (early && dp_shard_early_commit(p->early, dp_shard_lr(s), s->acc_count) == DP_EARLY_COMMITTED)
        return;
    dp_shard_early_overtaken(p->early);
    dp_shard_step_mean(s);
}

void dp_policy_step(dp_policy_t *p, const dp_grad_slice_t *g, int n, float lr, bool early,
                    dp_push_outcome_t *out)
{
    dp_shard_t *s = p->shard;
    out->lr = lr;
    if (!p->before) {
        s_step(p, g, n, lr, early);
        return;
    }
    dp_grad_slice_t one;
    if (dp_shard_dc_host(s, g, n, &one)) g = &one; /* compensated on a device: its bits here */
    double sq = 0;
    for (int f = 0; f < n; f++) {
        double x = s_norm_bytes(g[f].data, g[f].len / 4);
        sq += x * x;
    }
    memcpy(p->before, s->w, s->n * sizeof(float));
    s_step(p, g, n, lr, early);
    out->grad_norm = sqrt(sq);
    out->update_norm = s_moved(p);
}

void dp_policy_step_mean(dp_policy_t *p, bool early, dp_push_outcome_t *out)
{
    dp_shard_t *s = p->shard;
    if (out) out->lr = dp_shard_lr(s);
    if (!p->before || !out) {
        s_step_mean(p, early);
        return;
    }
    out->grad_norm = s_norm_bytes(s->acc, s->n) / (s->acc_count ? s->acc_count : 1);
    memcpy(p->before, s->w, s->n * sizeof(float));
    s_step_mean(p, early);
    out->update_norm = s_moved(p);
}

int dp_policy_replicas_parse(const char *flag, const char *text, int *r, float *frac, char *err)
{
    if (strchr(text, '.')) {
        double f = 0;
        if (dp_opts_parse_double(flag, text, 1e-9, 1, &f, NULL) != 0)
            return dp_err(err, "%s '%s': expected a count R (an integer in [1, 100000]) or a "
                          "fraction F in (0, 1] of the live workers", flag, text);
        *r = 0;
        *frac = (float)f;
        return 0;
    }
    long n = 0;
    if (dp_opts_parse_long(flag, text, 1, 100000, &n, NULL) != 0)
        return dp_err(err, "%s '%s': expected a count R (an integer in [1, 100000]) or a "
                      "fraction F in (0, 1] of the live workers (with a point: 0.5)", flag, text);
    *r = (int)n;
    *frac = 0;
    return 0;
}

int dp_delay_lr_parse(const char *text, int *kind, float *k, char *err)
{
    static const char *const names[] = {"none", "inverse", "adaptive", "threshold"};
    double x = DP_DELAY_K_DEFAULT;
    for (int i = 0; i < 4; i++)
        if (strcmp(text, names[i]) == 0) {
            *kind = i;
            *k = i == DP_DELAY_THRESHOLD ? DP_DELAY_K_DEFAULT : 0;
            return 0;
        }
    if (strncmp(text, "threshold:", 10) == 0 &&
        dp_opts_parse_double("--delay-lr", text + 10, 1, 1e6, &x, NULL) == 0) {
        *kind = DP_DELAY_THRESHOLD;
        *k = (float)x;
        return 0;
    }
    return dp_err(err, "bad delay rule '%s' (use none, inverse, adaptive, threshold or threshold:K "
                  "with K in [1, 1e6], e.g. threshold:2)", text);
}

void dp_delay_lr_name(int kind, float k, char *out, size_t n)
{
    switch (kind) {
    case DP_DELAY_NONE: snprintf(out, n, "none"); return;
    case DP_DELAY_INVERSE: snprintf(out, n, "inverse"); return;
    case DP_DELAY_ADAPTIVE: snprintf(out, n, "adaptive"); return;
    case DP_DELAY_THRESHOLD: {
        char text[32];
        dp_optim_float_text(k != 0 ? k : DP_DELAY_K_DEFAULT, text, sizeof text);
        snprintf(out, n, "threshold:%s", text);
        return;
    }
    }
    snprintf(out, n, "?");
}

void dp_policy_for_mode(dp_mode_t mode, dp_policy_conf_t *pc, dp_optim_conf_t *o, const char *who)
{
    if (mode != DP_MODE_SYNC) return;
    char name[48];
    if (pc->delay_lr != DP_DELAY_NONE) {
        dp_delay_lr_name(pc->delay_lr, pc->delay_k, name, sizeof name);
        dp_log_info("%s: --delay-lr %s has no effect in sync mode (it applies only gradients of "
                    "the current version: every delay is 0)", who, name);
        pc->delay_lr = DP_DELAY_NONE;
    }
    if (o->dc != DP_DC_OFF) {
        dp_optim_dc_name(o, name, sizeof name);
        dp_log_info("%s: --delay-compensation %s has no effect in sync mode (a gradient is "
                    "applied to the weights it was computed on)", who, name);
        o->dc = DP_DC_OFF;
    }
}

int dp_policy_early(const dp_policy_t *p, int worker, uint64_t version, float *lr, int *count)
{
    return p->ops->early(p, worker, version, lr, count);
}

int dp_policy_delay_skip(dp_policy_t *p, uint64_t tau, char *why, size_t n)
{
    if (p->conf.delay_lr != DP_DELAY_THRESHOLD) return 0;
    uint64_t sum = p->delay_sum, count = p->delay_count;
    p->delay_sum += tau;
    p->delay_count++;
    /* tau > K max(1, sum / count), without the division: tau count > K
     * max(sum, count), in double (exact for counts below 2^53). */
    double k = p->conf.delay_k;
    if (count == 0 || (double)tau * (double)count <= k * (double)(sum > count ? sum : count)) return 0;
    snprintf(why, n, "delay: %" PRIu64 " versions, over %.9g x the mean delay %.4g (--delay-lr threshold)",
             tau, k, (double)sum / (double)count);
    return 1;
}

float dp_policy_delay_lr(const dp_policy_t *p, uint64_t tau, float lr)
{
    switch (p->conf.delay_lr) {
    case DP_DELAY_INVERSE:
        if (tau > 1) lr /= (float)tau;
        break;
    case DP_DELAY_ADAPTIVE: {
        uint64_t m = (uint64_t)p->members->n;
        if (tau > m) lr *= (float)m / (float)tau;
        break;
    }
    default: break;
    }
    return lr;
}
