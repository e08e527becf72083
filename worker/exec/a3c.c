/* a3c: rollouts of the actor-critic worker and its episodes' bookkeeping
 * (a3c.h). */
#include "worker/exec/a3c.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/ops.h"

void dp_a3c_conf_default(dp_a3c_conf_t *c)
{
    memset(c, 0, sizeof *c);
    c->envs = 1;
    c->t_max = 5;
    c->entropy = DP_AC_ENTROPY_DEFAULT;
    c->gamma = 0.99f;
    c->reward_scale = DP_A3C_REWARD_SCALE;
    c->clip_norm = 40.0f;
    c->env_steps = 500000;
}

int dp_a3c_model(dp_model_t *m, const char *spec, const dp_env_kind_t *kind, int obs_norm, char *err)
{
    char text[DP_MODEL_SPEC_LEN];
    if (dp_model_spec_env(spec ? spec : DP_A3C_DEFAULT_SPEC, kind->n_actions, obs_norm, text,
                          sizeof text, err) != 0 ||
        dp_model_parse(m, text, kind->obs_dim, 1, 1, err) != 0)
        return -1;
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == DP_LAYER_BN)
            return dp_err(err, "--env: '%s' has batch norm, whose statistics an actor-critic worker "
                          "does not keep: leave bn out (obsnorm first normalises observations)", m->spec);
    return 0;
}

double dp_a3c_clip(const dp_model_t *m, float *g, double max_norm)
{
    /* the trained tensors only: an obsnorm's statistics travel in g too
     * (their new values, not a gradient), and would swamp the norm */
    double ss = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        for (size_t k = 0; p->trainable && k < p->count; k++)
            ss += (double)g[p->offset + k] * g[p->offset + k];
    }
    double norm = sqrt(ss);
    if (max_norm > 0 && norm > max_norm) {
        float scale = (float)(max_norm / (norm + 1e-6)); /* as dp_clip_global_norm */
        for (int i = 0; i < m->n_params; i++) {
            const dp_param_t *p = &m->params[i];
            for (size_t k = 0; p->trainable && k < p->count; k++) g[p->offset + k] *= scale;
        }
    }
    return norm;
}

int dp_a3c_init(dp_a3c_t *a, const dp_env_kind_t *kind, const dp_a3c_conf_t *c, uint64_t seed,
                int worker, char *err)
{
    memset(a, 0, sizeof *a);
    if (c->envs < 1 || c->envs > DP_A3C_MAX_ENVS || c->t_max < 1 || c->t_max > DP_A3C_MAX_T)
        return dp_err(err, "--envs %d / --t-max %d: 1..%d environments, 1..%d steps a segment",
                      c->envs, c->t_max, DP_A3C_MAX_ENVS, DP_A3C_MAX_T);
    a->kind = kind;
    a->K = c->envs;
    a->T = c->t_max;
    a->obs = kind->obs_dim;
    a->gamma = c->gamma;
    a->reward_scale = c->reward_scale;
    a->seed = seed;
    a->worker = worker;
    size_t rows = (size_t)a->K * a->T;
    a->env = dp_calloc((size_t)a->K, sizeof *a->env);
    a->x = dp_malloc(rows * (size_t)a->obs * sizeof(float));
    a->act = dp_malloc(rows * sizeof(int));
    a->ret = dp_malloc(rows * sizeof(float));
    a->reward = dp_malloc(rows * sizeof(float));
    a->cut = dp_calloc(rows, sizeof(float));
    a->end = dp_malloc(rows);
    a->probs = dp_malloc((size_t)a->K * kind->n_actions * sizeof(float));
    a->value = dp_malloc((size_t)a->K * sizeof(float));
    a->obs_now = dp_malloc((size_t)a->K * a->obs * sizeof(float));
    a->ended = dp_malloc(rows * sizeof(double));
    a->ended_at = dp_malloc(rows * sizeof(int));
    /* the action stream: its own, not the episodes' */
    dp_rng_seed(&a->actions, dp_fnv1a(seed ^ 0xA3C0A3C0A3C0A3C0ULL, &worker, sizeof worker));
    for (int k = 0; k < a->K; k++) dp_env_reset(&a->env[k], kind, seed, worker, a->next_episode++);
    return 0;
}

void dp_a3c_fini(dp_a3c_t *a)
{
    free(a->env), free(a->x), free(a->act), free(a->ret), free(a->reward), free(a->cut);
    free(a->end), free(a->probs), free(a->value), free(a->obs_now), free(a->ended);
    free(a->ended_at);
    memset(a, 0, sizeof *a);
}

/* An action drawn from one row of the policy: the first whose cumulative
 * probability passes a uniform draw (the last if rounding leaves a gap). */
static int s_draw(dp_rng_t *r, const float *p, int A)
{
    double u = (double)(dp_rng_next(r) >> 11) * (1.0 / 9007199254740992.0), c = 0;
    for (int k = 0; k < A - 1; k++)
        if (u < (c += p[k])) return k;
    return A - 1;
}

int dp_a3c_segment(dp_a3c_t *a, dp_net_t *net, char *err)
{
    const int K = a->K, T = a->T, O = a->obs, A = a->kind->n_actions;
    a->n_ended = 0;
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) {
            dp_env_observe(&a->env[k], a->obs_now + (size_t)k * O);
            memcpy(a->x + ((size_t)k * T + t) * O, a->obs_now + (size_t)k * O, (size_t)O * sizeof(float));
        }
        dp_net_act(net, a->obs_now, K, a->probs, NULL);
        for (int k = 0; k < K; k++) {
            size_t row = (size_t)k * T + t;
            int act = s_draw(&a->actions, a->probs + (size_t)k * A, A), done = 0;
            double r = 0;
            if (dp_env_step(&a->env[k], act, &r, &done, err) != 0) return -1;
            a->act[row] = act;
            a->reward[row] = (float)(r * a->reward_scale);
            a->end[row] = DP_AC_GOES_ON;
            a->cut[row] = 0;
            if (!done) continue;
            a->ended_at[a->n_ended] = t * K + k + 1;
            a->ended[a->n_ended++] = a->env[k].ret;
            a->end[row] = a->env[k].terminated ? DP_AC_TERMINATED : DP_AC_TRUNCATED;
            if (!a->env[k].terminated) { /* cut by the time limit: its future is estimated */
                float o[DP_ENV_MAX_OBS], p[DP_MODEL_MAX_ACTIONS], v = 0;
                dp_env_observe(&a->env[k], o);
                dp_net_act(net, o, 1, p, &v);
                a->cut[row] = v;
            }
            dp_env_reset(&a->env[k], a->kind, a->seed, a->worker, a->next_episode++);
        }
    }
    /* the bootstrap: the critic's value of each state the segment stopped in */
    for (int k = 0; k < K; k++) dp_env_observe(&a->env[k], a->obs_now + (size_t)k * O);
    dp_net_act(net, a->obs_now, K, a->probs, a->value);
    for (int k = 0; k < K; k++) {
        size_t r0 = (size_t)k * T;
        dp_ac_returns(a->ret + r0, a->reward + r0, a->end + r0, a->cut + r0, T, a->gamma,
                      a->value[k]);
    }
    return 0;
}

double dp_a3c_test_return(const dp_env_kind_t *kind, dp_net_t *net, uint64_t seed, int worker,
                          int n)
{
    double sum = 0;
    char err[DP_ERR_LEN];
    for (int e = 0; e < n; e++) {
        dp_env_t env;
        dp_env_reset(&env, kind, seed, worker, ((uint64_t)1 << 62) + (uint64_t)e);
        int done = 0;
        while (!done) {
            float o[DP_ENV_MAX_OBS], p[DP_MODEL_MAX_ACTIONS];
            dp_env_observe(&env, o);
            dp_net_act(net, o, 1, p, NULL);
            int best = 0;
            for (int k = 1; k < kind->n_actions; k++)
                if (p[k] > p[best]) best = k;
            double r;
            if (dp_env_step(&env, best, &r, &done, err) != 0) break; /* cannot: best is in range */
        }
        sum += env.ret;
    }
    return n > 0 ? sum / n : 0;
}
