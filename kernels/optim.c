/* optim: the optimizers of kernels/optim.h over a flat float range.
 *
 * Every update is elementwise — element i of w depends only on w[i], g[i]
 * and its own state — and is computed with the same float operations
 * whatever the range, so stepping [0, n) at once or in pieces gives
 * bit-identical results (the parameter server's shards rely on it). The
 * per-call scalars (bias corrections, learning rate) are computed in double
 * once per call and rounded to float, as torch.optim does. */
#include "kernels/optim.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"

void dp_optim_conf_default(dp_optim_conf_t *c)
{
    memset(c, 0, sizeof *c);
    c->kind = DP_OPT_ADAM;
    c->lr = 0.0f;
    c->momentum = 0.9f;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
    c->alpha = 0.99f;
    c->weight_decay = 0.0f;
    c->schedule = DP_LR_CONSTANT;
    c->step_size = 0;
    c->gamma = 0.1f;
    c->total_steps = 0;
    c->dc = DP_DC_OFF;
    c->dc_lambda = 0.0f;
}

static const char *const s_names[] = {
    [DP_OPT_SGD] = "sgd",   [DP_OPT_MOMENTUM] = "momentum", [DP_OPT_NESTEROV] = "nesterov",
    [DP_OPT_ADAM] = "adam", [DP_OPT_ADAGRAD] = "adagrad",   [DP_OPT_RMSPROP] = "rmsprop",
};
_Static_assert(sizeof s_names / sizeof s_names[0] == DP_OPT_KINDS,
               "DP_OPT_KINDS must count every optimizer");

int dp_optim_parse_kind(dp_optim_conf_t *c, const char *name, char *err)
{
    for (int k = 0; k < (int)(sizeof s_names / sizeof s_names[0]); k++)
        if (strcmp(name, s_names[k]) == 0) {
            c->kind = (dp_optim_kind_t)k;
            return 0;
        }
    return dp_err(err, "unknown optimizer '%s' (use sgd, momentum, nesterov, adam, adagrad or "
                  "rmsprop)", name);
}

const char *dp_optim_kind_name(dp_optim_kind_t k)
{
    if ((int)k < 0 || (int)k >= (int)(sizeof s_names / sizeof s_names[0])) return "?";
    return s_names[k];
}

const char *dp_optim_outer_name(const dp_optim_conf_t *c)
{
    if (c->kind == DP_OPT_NESTEROV && c->period > 1) return DP_OPTIM_DELAYED_NESTEROV;
    return dp_optim_kind_name(c->kind);
}

int dp_optim_parse_dc(dp_optim_conf_t *c, const char *text, char *err)
{
    double lambda = 0;
    if (strcmp(text, "off") == 0) {
        c->dc = DP_DC_OFF;
        c->dc_lambda = 0;
        return 0;
    }
    int is_const = strncmp(text, "const:", 6) == 0, is_adaptive = strncmp(text, "adaptive:", 9) == 0;
    if ((is_const || is_adaptive) &&
        dp_opts_parse_double("--delay-compensation", text + (is_const ? 6 : 9), 0, 1e6, &lambda,
                             NULL) == 0) {
        c->dc = is_const ? DP_DC_CONST : DP_DC_ADAPTIVE;
        c->dc_lambda = (float)lambda;
        return 0;
    }
    return dp_err(err, "bad delay compensation '%s' (use off, const:LAMBDA e.g. const:0.04, or "
                  "adaptive:LAMBDA0 e.g. adaptive:2; LAMBDA in [0, 1e6])", text);
}

void dp_optim_float_text(float x, char *out, size_t n)
{
    snprintf(out, n, "%g", x);
    if (strtof(out, NULL) != x) snprintf(out, n, "%.9g", x);
}

void dp_optim_dc_name(const dp_optim_conf_t *c, char *out, size_t n)
{
    char lambda[32];
    dp_optim_float_text(c->dc_lambda, lambda, sizeof lambda);
    if (c->dc == DP_DC_OFF) snprintf(out, n, "off");
    else snprintf(out, n, "%s:%s", c->dc == DP_DC_CONST ? "const" : "adaptive", lambda);
}

void dp_optim_dc_range(const dp_optim_conf_t *c, float *out, const float *g, const float *w,
                       const float *w_bak, float *ms, size_t lo, size_t hi)
{
    const float lambda = c->dc_lambda;
    switch (c->dc) {
    case DP_DC_OFF: return;
    case DP_DC_CONST:
        if (!w_bak) return;
        for (size_t i = lo; i < hi; i++) {
            float gi = g[i];
            out[i] = gi + lambda * gi * gi * (w[i] - w_bak[i]);
        }
        return;
    case DP_DC_ADAPTIVE:
        for (size_t i = lo; i < hi; i++) {
            float gi = g[i];
            float mi = DP_DC_MS_DECAY * ms[i] + (1.0f - DP_DC_MS_DECAY) * gi * gi;
            ms[i] = mi;
            if (w_bak) out[i] = gi + lambda / sqrtf(mi + DP_DC_MS_EPS) * gi * gi * (w[i] - w_bak[i]);
        }
        return;
    }
}

/* "step:N:G" or "cosine:N": the numbers through the flags' parsers, so a
 * schedule is read like every other value (N a whole positive integer, G a
 * finite decimal > 0). */
static int s_parse_step(dp_optim_conf_t *c, const char *args)
{
    const char *colon = strchr(args, ':');
    char num[32];
    long n = 0;
    double gamma = 0;
    if (!colon || colon - args >= (long)sizeof num) return -1;
    snprintf(num, sizeof num, "%.*s", (int)(colon - args), args);
    if (dp_opts_parse_long("--lr-schedule", num, 1, LONG_MAX, &n, NULL) != 0 ||
        dp_opts_parse_double("--lr-schedule", colon + 1, 1e-30, 1e30, &gamma, NULL) != 0)
        return -1;
    c->schedule = DP_LR_STEP;
    c->step_size = n;
    c->gamma = (float)gamma;
    return 0;
}

int dp_optim_parse_schedule(dp_optim_conf_t *c, const char *text, char *err)
{
    long n = 0;
    if (strcmp(text, "constant") == 0) {
        c->schedule = DP_LR_CONSTANT;
        return 0;
    }
    if (strncmp(text, "step:", 5) == 0 && s_parse_step(c, text + 5) == 0) return 0;
    if (strncmp(text, "cosine:", 7) == 0 &&
        dp_opts_parse_long("--lr-schedule", text + 7, 1, LONG_MAX, &n, NULL) == 0) {
        c->schedule = DP_LR_COSINE;
        c->total_steps = n;
        return 0;
    }
    return dp_err(err, "bad learning-rate schedule '%s' (use constant, step:STEP_SIZE:GAMMA "
                  "e.g. step:1000:0.5, or cosine:TOTAL_STEPS)", text);
}

int dp_optim_state_per_param(dp_optim_kind_t k)
{
    switch (k) {
    case DP_OPT_SGD: return 0;
    case DP_OPT_MOMENTUM:
    case DP_OPT_NESTEROV:
    case DP_OPT_ADAGRAD:
    case DP_OPT_RMSPROP: return 1;
    case DP_OPT_ADAM: return 2;
    }
    return 0;
}

int dp_optim_state_floats(const dp_optim_conf_t *c)
{
    if (c->kind == DP_OPT_NESTEROV && c->period > 1) return 2;
    return dp_optim_state_per_param(c->kind);
}

int dp_optim_outer(const char *name, float lr, float momentum, long every, dp_optim_conf_t *out,
                   char *err)
{
    const char *kind = name && name[0] ? name : "sgd";
    dp_optim_conf_default(out);
    if (strcmp(kind, "sgd") == 0) out->kind = DP_OPT_SGD;
    else if (strcmp(kind, "nesterov") == 0) out->kind = DP_OPT_NESTEROV;
    else if (strcmp(kind, DP_OPTIM_DELAYED_NESTEROV) == 0) out->kind = DP_OPT_NESTEROV;
    else return dp_err(err, "--outer-optimizer '%s': sgd, nesterov or delayed-nesterov", kind);
    /* period 1 is the plain rule's path (its bits), whatever the name */
    if (strcmp(kind, DP_OPTIM_DELAYED_NESTEROV) == 0) out->period = every > 1 ? every : 0;
    out->lr = lr > 0                  ? lr
              : out->kind == DP_OPT_SGD ? 1.0f
              : out->period > 1         ? DP_OPTIM_OUTER_DELAYED_LR
                                        : DP_OPTIM_OUTER_NESTEROV_LR;
    out->momentum = momentum;
    return 0;
}

float dp_optim_default_lr(dp_optim_kind_t k)
{
    switch (k) {
    case DP_OPT_ADAM: return 0.0015f;
    case DP_OPT_ADAGRAD:
    case DP_OPT_RMSPROP: return 0.01f;
    case DP_OPT_SGD:
    case DP_OPT_MOMENTUM:
    case DP_OPT_NESTEROV: break;
    }
    return 0.05f;
}

void dp_optim_actor_critic_default(dp_optim_conf_t *c)
{
    if (c->lr == 0 && c->kind == DP_OPT_ADAM) c->lr = DP_OPTIM_AC_ADAM_LR;
}

float dp_optim_base_lr(const dp_optim_conf_t *c)
{
    return c->lr > 0 ? c->lr : dp_optim_default_lr(c->kind);
}

float dp_optim_lr_at(const dp_optim_conf_t *c, long step)
{
    if (step < 0) step = 0;
    float lr = dp_optim_base_lr(c);
    switch (c->schedule) {
    case DP_LR_CONSTANT: break;
    case DP_LR_STEP:
        if (c->step_size > 0) return (float)(lr * pow(c->gamma, (double)(step / c->step_size)));
        break;
    case DP_LR_COSINE:
        if (c->total_steps > 0) {
            double s = (double)(step < c->total_steps ? step : c->total_steps);
            return (float)(lr * 0.5 * (1.0 + cos(M_PI * s / (double)c->total_steps)));
        }
        break;
    }
    return lr;
}

void dp_optim_step(const dp_optim_conf_t *c, float lr, float *w, const float *g, float *state,
                   size_t n, long t)
{
    dp_optim_step_range(c, lr, w, g, state, n, 0, n, t);
}

/* Delayed Nesterov (optim.h), s_step's slice already taken: v = state,
 * d = state2. Inlined like s_step, for the same reason. */
static inline __attribute__((always_inline)) void
s_step_delayed(const dp_optim_conf_t *c, float lr, float *w, const float *w_from, const float *g,
               float *v, const float *v_from, float *d, const float *d_from, size_t n, long t)
{
    const float wd = c->weight_decay;
    const float mu = c->momentum, part = lr / (float)c->period;
    const float inv_n = 1.0f / (float)c->period;
    const int turn = t > 0 && t % c->period == 0;
    if (!turn && v != v_from) memcpy(v, v_from, n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] + wd * w_from[i];
        float wi = w_from[i] - part * gi;
        if (turn) {
            float vi = mu * v_from[i] + (d_from[i] + gi) * inv_n;
            v[i] = vi;
            d[i] = 0.0f;
            wi -= lr * mu * vi;
        } else {
            d[i] = d_from[i] + gi;
        }
        w[i] = wi;
    }
}

/* The update rules, once: w and state written from w_from and state_from,
 * which are either the same vectors (in place) or vectors that overlap
 * none of the written ones (out of place). Always inlined into the two
 * callers below, so that each is vectorised for its own aliasing: the
 * same float operations per element either way (the same bits). Every
 * state float is written, even one a rule leaves as it was (delayed
 * Nesterov's v between its turns), so that an out-of-place state is
 * whole. */
static inline __attribute__((always_inline)) void
s_step(const dp_optim_conf_t *c, float lr, float *w, const float *w_from, const float *g,
       float *state, const float *state_from, size_t n_all, size_t lo, size_t hi, long t)
{
    const float wd = c->weight_decay;
    /* the slice [lo, hi) of w, g and of each state vector (laid [n_all] then [n_all]) */
    float *state2 = state + n_all + lo;
    const float *state2_from = state_from + n_all + lo;
    size_t n = hi - lo;
    w += lo;
    w_from += lo;
    g += lo;
    state += lo;
    state_from += lo;
    switch (c->kind) {
    case DP_OPT_SGD:
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * w_from[i];
            w[i] = w_from[i] - lr * gi;
        }
        break;
    case DP_OPT_NESTEROV:
        if (c->period > 1) { /* delayed Nesterov (optim.h): v = state, d = state2 */
            s_step_delayed(c, lr, w, w_from, g, state, state_from, state2, state2_from, n, t);
            break;
        }
        /* fall through */
    case DP_OPT_MOMENTUM: {
        const float mu = c->momentum;
        const int nesterov = c->kind == DP_OPT_NESTEROV;
        float *v = state;
        const float *v_from = state_from;
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * w_from[i];
            float vi = mu * v_from[i] + gi;
            v[i] = vi;
            w[i] = w_from[i] - lr * (nesterov ? gi + mu * vi : vi);
        }
        break;
    }
    case DP_OPT_ADAM: {
        /* torch.optim.Adam: step_size = lr / bc1; denom = sqrt(s)/sqrt(bc2) + eps. */
        if (t < 1) t = 1;
        const float b1 = c->beta1, b2 = c->beta2, eps = c->eps;
        const double bc1 = 1.0 - pow((double)b1, (double)t);
        const double bc2 = 1.0 - pow((double)b2, (double)t);
        const float step_size = (float)(lr / bc1);
        const float bc2_sqrt = (float)sqrt(bc2);
        float *m = state, *s = state2;
        const float *m_from = state_from, *s_from = state2_from;
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * w_from[i];
            float mi = b1 * m_from[i] + (1.0f - b1) * gi;
            float si = b2 * s_from[i] + (1.0f - b2) * gi * gi;
            m[i] = mi;
            s[i] = si;
            w[i] = w_from[i] - step_size * (mi / (sqrtf(si) / bc2_sqrt + eps));
        }
        break;
    }
    case DP_OPT_ADAGRAD: {
        const float eps = c->eps;
        float *s = state;
        const float *s_from = state_from;
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * w_from[i];
            float si = s_from[i] + gi * gi;
            s[i] = si;
            w[i] = w_from[i] - lr * (gi / (sqrtf(si) + eps));
        }
        break;
    }
    case DP_OPT_RMSPROP: {
        /* torch.optim.RMSprop: square_avg.mul_(alpha).addcmul_(g, g, 1 - alpha);
         * param.addcdiv_(g, square_avg.sqrt() + eps, -lr). */
        const float alpha = c->alpha, eps = c->eps;
        float *s = state;
        const float *s_from = state_from;
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * w_from[i];
            float si = alpha * s_from[i] + (1.0f - alpha) * gi * gi;
            s[i] = si;
            w[i] = w_from[i] - lr * (gi / (sqrtf(si) + eps));
        }
        break;
    }
    }
}

void dp_optim_step_range(const dp_optim_conf_t *c, float lr, float *w, const float *g,
                         float *state, size_t n_all, size_t lo, size_t hi, long t)
{
    s_step(c, lr, w, w, g, state, state, n_all, lo, hi, t);
}

/* dp_optim_step_from's three cases apart from the one in place, each with
 * its vectors restrict (a written vector read where it is written is one
 * vector), so that each loop is vectorised without checks for overlaps. */
static void s_step_w_apart(const dp_optim_conf_t *c, float lr, float *restrict w,
                           const float *restrict w_from, const float *restrict g,
                           float *restrict state, size_t n_all, size_t lo, size_t hi, long t)
{
    s_step(c, lr, w, w_from, g, state, state, n_all, lo, hi, t);
}

static void s_step_state_apart(const dp_optim_conf_t *c, float lr, float *restrict w,
                               const float *restrict g, float *restrict state,
                               const float *restrict state_from, size_t n_all, size_t lo,
                               size_t hi, long t)
{
    s_step(c, lr, w, w, g, state, state_from, n_all, lo, hi, t);
}

static void s_step_apart(const dp_optim_conf_t *c, float lr, float *restrict w,
                         const float *restrict w_from, const float *restrict g,
                         float *restrict state, const float *restrict state_from, size_t n_all,
                         size_t lo, size_t hi, long t)
{
    s_step(c, lr, w, w_from, g, state, state_from, n_all, lo, hi, t);
}

void dp_optim_step_from(const dp_optim_conf_t *c, float lr, float *w, const float *w_from,
                        const float *g, float *state, const float *state_from, size_t n_all,
                        size_t lo, size_t hi, long t)
{
    if (w == w_from && state == state_from)
        dp_optim_step_range(c, lr, w, g, state, n_all, lo, hi, t);
    else if (state == state_from)
        s_step_w_apart(c, lr, w, w_from, g, state, n_all, lo, hi, t);
    else if (w == w_from)
        s_step_state_apart(c, lr, w, g, state, state_from, n_all, lo, hi, t);
    else
        s_step_apart(c, lr, w, w_from, g, state, state_from, n_all, lo, hi, t);
}
