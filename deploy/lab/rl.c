/* lab/rl: virtual actor-critic workers and the run's account (see rl.h). */
#include "deploy/lab/rl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "worker/train/a3c_train.h"

int dp_lab_rl_session(dp_session_t *s, const dp_train_conf_t *c, char *err)
{
    memset(s, 0, sizeof *s);
    s->conf = *c;
    s->t_start = dp_now();
    if (c->threads > 0) dp_cpu_set_threads(c->threads);
    const dp_env_kind_t *kind = dp_env_find(c->a3c.env, err);
    if (!kind || dp_a3c_model(&s->model, c->model, kind, c->a3c.obs_norm, err) != 0) return -1;
    if (c->a3c.envs < 1 || c->a3c.envs > DP_A3C_MAX_ENVS || c->a3c.t_max < 1 || c->a3c.t_max > DP_A3C_MAX_T)
        return dp_err(err, "--envs %d / --t-max %d: 1..%d environments, 1..%d steps a segment",
                      c->a3c.envs, c->a3c.t_max, DP_A3C_MAX_ENVS, DP_A3C_MAX_T);
    if (dp_backend_new_in(&s->be, c->device, c->precision, err) != 0) goto fail;
    if (dp_net_init(&s->net, &s->model, s->be, c->a3c.envs * c->a3c.t_max, err) != 0) goto fail;
    s->net.ac_entropy = c->a3c.entropy; /* as worker/train/a3c_train.c sets it */
    size_t bytes = s->model.n_floats * sizeof(float);
    s->h_params = s->be->ops->host_alloc(s->be, bytes);
    s->h_grads = s->be->ops->host_alloc(s->be, bytes);
    if (dp_metrics_new(&s->metrics, c->metrics, err) != 0) goto fail;
    dp_progress_init(&s->progress, DP_PROGRESS_OFF);
    return 0;
fail:
    dp_session_fini(s);
    return -1;
}

void dp_lab_seg_alloc(dp_lab_seg_t *g, int rows)
{
    memset(g, 0, sizeof *g);
    g->ret = dp_malloc((size_t)rows * sizeof *g->ret);
    g->at = dp_malloc((size_t)rows * sizeof *g->at);
}

void dp_lab_seg_copy(dp_lab_seg_t *dst, const dp_lab_seg_t *src)
{
    dst->env_steps = src->env_steps;
    dst->n = src->n;
    memcpy(dst->ret, src->ret, (size_t)src->n * sizeof *src->ret);
    memcpy(dst->at, src->at, (size_t)src->n * sizeof *src->at);
}

void dp_lab_seg_free(dp_lab_seg_t *g)
{
    free(g->ret);
    free(g->at);
    memset(g, 0, sizeof *g);
}

double dp_lab_seg_returns(const dp_lab_seg_t *g)
{
    double sum = 0;
    for (int i = 0; i < g->n; i++) sum += g->ret[i];
    return sum;
}

int dp_lab_rl_init(dp_lab_rl_t *r, const dp_train_conf_t *c, int workers, char *err)
{
    memset(r, 0, sizeof *r);
    if (!(r->kind = dp_env_find(c->a3c.env, err))) return -1;
    r->workers = workers;
    r->rows = c->a3c.envs * c->a3c.t_max;
    r->a = dp_calloc((size_t)workers, sizeof *r->a);
    r->next = dp_calloc((size_t)workers, sizeof *r->next);
    r->seg = dp_calloc((size_t)workers, sizeof *r->seg);
    for (int w = 0; w < workers; w++) {
        if (dp_a3c_init(&r->a[w], r->kind, &c->a3c, c->seed, w, err) != 0) {
            dp_lab_rl_fini(r);
            return -1;
        }
        dp_lab_seg_alloc(&r->seg[w], r->rows);
    }
    dp_episodes_init(&r->run, r->kind->solved);
    return 0;
}

void dp_lab_rl_fini(dp_lab_rl_t *r)
{
    for (int w = 0; r->a && w < r->workers; w++) {
        if (r->a[w].env) dp_a3c_fini(&r->a[w]);
        dp_lab_seg_free(&r->seg[w]);
    }
    free(r->a);
    free(r->next);
    free(r->seg);
    memset(r, 0, sizeof *r);
}

float dp_lab_rl_gradient(dp_lab_rl_t *r, dp_session_t *s, const dp_a3c_conf_t *c,
                         const float *params, int worker, long step, float *grad)
{
    if (step != r->next[worker]) { /* a caller's misuse: the rollouts would be another run's */
        dp_log_warn("lab: worker %d's segment %ld computed before its segment %ld", worker, step,
                    r->next[worker]);
        abort();
    }
    dp_a3c_t *a = &r->a[worker];
    char err[DP_ERR_LEN];
    dp_net_set_params(&s->net, params);
    r->next[worker]++;
    if (dp_a3c_segment(a, &s->net, err) != 0) {
        dp_log_warn("lab: worker %d: %s", worker, err);
        return NAN;
    }
    float loss = dp_net_train_step_ac(&s->net, a->x, a->act, a->ret, r->rows);
    dp_net_get_grads(&s->net, grad);
    dp_a3c_clip(&s->model, grad, c->clip_norm);
    dp_lab_seg_t *g = &r->seg[worker];
    g->env_steps = (uint64_t)r->rows;
    g->n = a->n_ended;
    memcpy(g->ret, a->ended, (size_t)a->n_ended * sizeof *g->ret);
    memcpy(g->at, a->ended_at, (size_t)a->n_ended * sizeof *g->at);
    return loss;
}

void dp_lab_rl_count(dp_lab_rl_t *r, const dp_lab_seg_t *g)
{
    dp_episodes_t *e = &r->run;
    for (int i = 0; i < g->n; i++) dp_episodes_add(e, g->ret[i], e->env_steps + (uint64_t)g->at[i]);
    e->env_steps += g->env_steps;
}

void dp_lab_rl_json(const dp_lab_rl_t *r, const dp_a3c_conf_t *c, cJSON *o)
{
    cJSON_AddStringToObject(o, "env", r->kind->name);
    cJSON_AddNumberToObject(o, "env_steps", (double)r->run.env_steps);
    cJSON_AddNumberToObject(o, "episodes", (double)r->run.episodes);
    cJSON_AddNumberToObject(o, "return_mean_100", dp_metrics_round(dp_episodes_mean(&r->run), 4));
    if (r->run.solved_at >= 0) cJSON_AddNumberToObject(o, "solved_at_env_steps", (double)r->run.solved_at);
    else cJSON_AddNullToObject(o, "solved_at_env_steps");
    cJSON_AddNumberToObject(o, "test_return", dp_metrics_round(r->test_return, 4));
    cJSON_AddItemToObject(o, "return_curve", dp_a3c_curve_json(r->run.curve_at, r->run.curve_mean, r->run.n_curve,
                                                              r->run.env_steps, dp_episodes_mean(&r->run)));
    cJSON_AddNumberToObject(o, "envs", c->envs);
    cJSON_AddNumberToObject(o, "t_max", c->t_max);
    cJSON_AddNumberToObject(o, "entropy", dp_metrics_round(c->entropy, 6));
    cJSON_AddNumberToObject(o, "gamma", dp_metrics_round(c->gamma, 6));
    cJSON_AddNumberToObject(o, "reward_scale", dp_metrics_round(c->reward_scale, 6));
    cJSON_AddNumberToObject(o, "clip_norm", dp_metrics_round(c->clip_norm, 6));
}

void dp_lab_rl_header(cJSON *h, const dp_a3c_conf_t *a)
{
    cJSON_AddStringToObject(h, "env", a->env);
    cJSON_AddNumberToObject(h, "envs", a->envs);
    cJSON_AddNumberToObject(h, "t_max", a->t_max);
    cJSON_AddNumberToObject(h, "entropy", a->entropy); /* floats as doubles: they read back exact */
    cJSON_AddNumberToObject(h, "gamma", a->gamma);
    cJSON_AddNumberToObject(h, "reward_scale", a->reward_scale);
    cJSON_AddNumberToObject(h, "clip_norm", a->clip_norm);
    cJSON_AddNumberToObject(h, "env_steps", (double)a->env_steps);
}
