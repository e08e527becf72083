/* account: see account.h. */
#include "server/core/account.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"

int dp_account_bounds(dp_account_bounds_t *b, const char *env, int envs, int t_max, char *err)
{
    memset(b, 0, sizeof *b);
    if (envs < 1 || envs > DP_A3C_MAX_ENVS || t_max < 1 || t_max > DP_A3C_MAX_T)
        return dp_err(err, "--envs %d / --t-max %d: 1..%d environments, 1..%d steps a segment", envs,
                      t_max, DP_A3C_MAX_ENVS, DP_A3C_MAX_T);
    b->max_steps = (uint64_t)envs * (uint64_t)t_max;
    if (!env || !env[0]) return 0;
    if (!(b->env = dp_env_find(env, err))) return -1;
    dp_env_return_range(b->env, &b->ret_lo, &b->ret_hi);
    return 0;
}

/* The episodes' part of the check: ends and returns. */
static int s_check_episodes(const dp_account_bounds_t *b, const Downpour__Push *p, char *why, size_t n)
{
    for (size_t k = 0; k < p->n_episode_ends; k++) {
        uint32_t e = p->episode_ends[k];
        if (e < 1 || e > p->env_steps || (k > 0 && e <= p->episode_ends[k - 1])) {
            snprintf(why, n, "env account: episode end %" PRIu32 " (the %zu-th) is not after the last "
                     "and within the segment's %" PRIu64 " steps", e, k + 1, p->env_steps);
            return -1;
        }
        double r = p->episode_returns[k];
        if (!(r >= b->ret_lo && r <= b->ret_hi)) { /* NaN fails too */
            snprintf(why, n, "env account: episode return %.17g is outside %s's range [%g, %g]", r,
                     b->env->name, b->ret_lo, b->ret_hi);
            return -1;
        }
    }
    return 0;
}

int dp_account_check(const dp_account_bounds_t *b, const Downpour__Push *p, char *why, size_t n)
{
    if (p->env_steps == 0 && p->n_episode_returns == 0 && p->n_episode_ends == 0) return 0;
    if (!b->env) {
        snprintf(why, n, "env account: this shard was not told the environment (downpour-ps --env "
                 "NAME, and the workers' --envs, --t-max)");
        return -1;
    }
    if (p->env_steps > b->max_steps) {
        snprintf(why, n, "env account: a segment of %" PRIu64 " env steps, over the shard's --envs x "
                 "--t-max = %" PRIu64, p->env_steps, b->max_steps);
        return -1;
    }
    if (p->n_episode_returns != p->n_episode_ends) {
        snprintf(why, n, "env account: %zu episode returns but %zu ends", p->n_episode_returns,
                 p->n_episode_ends);
        return -1;
    }
    /* equal, not near: the worker sends its table's number, the same as ours */
    if (p->solved_threshold != b->env->solved) {
        snprintf(why, n, "env account: solved threshold %.17g is not %s's %g (a worker of another "
                 "--env?)", p->solved_threshold, b->env->name, b->env->solved);
        return -1;
    }
    return s_check_episodes(b, p, why, n);
}

double dp_account_add(dp_episodes_t *e, const Downpour__Push *p)
{
    double sum = 0;
    for (size_t k = 0; k < p->n_episode_ends; k++) {
        dp_episodes_add(e, p->episode_returns[k], e->env_steps + p->episode_ends[k]);
        sum += p->episode_returns[k];
    }
    e->env_steps += p->env_steps;
    return sum;
}
