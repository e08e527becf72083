/* env: the table of environments and an episode's bookkeeping (env.h). */
#include "worker/exec/env/env.h"

#include <stdio.h>
#include <string.h>

#include "common/util.h"

static const dp_env_kind_t *const s_kinds[] = {&dp_env_cartpole_v1, &dp_env_acrobot_v1};
#define S_N_KINDS ((int)(sizeof s_kinds / sizeof s_kinds[0]))

void dp_env_names(char *out, size_t n)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < S_N_KINDS && used < n; i++)
        used += (size_t)snprintf(out + used, n - used, "%s%s", i ? ", " : "", s_kinds[i]->name);
}

const dp_env_kind_t *dp_env_find(const char *name, char *err)
{
    for (int i = 0; i < S_N_KINDS; i++)
        if (strcmp(name, s_kinds[i]->name) == 0) return s_kinds[i];
    char names[128];
    dp_env_names(names, sizeof names);
    dp_err(err, "--env '%s': no such environment (there are: %s)", name, names);
    return NULL;
}

void dp_env_return_range(const dp_env_kind_t *k, double *lo, double *hi)
{
    /* the fewest steps give the least of a positive reward, the most of a negative one */
    double n = (double)k->max_steps;
    *lo = k->reward_lo < 0 ? n * k->reward_lo : k->reward_lo;
    *hi = k->reward_hi > 0 ? n * k->reward_hi : k->reward_hi;
}

double dp_env_uniform(dp_rng_t *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(dp_rng_next(r) >> 11) * (1.0 / 9007199254740992.0));
}

void dp_env_reset(dp_env_t *e, const dp_env_kind_t *k, uint64_t seed, int worker, uint64_t episode)
{
    memset(e, 0, sizeof *e);
    e->kind = k;
    /* One stream per (seed, worker, episode): an episode's start does not
     * depend on how many draws the ones before it made. */
    dp_rng_t r;
    dp_rng_seed(&r, seed * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)(uint32_t)worker << 40) ^
                        (episode * 0xBF58476D1CE4E5B9ULL + 0x94D049BB133111EBULL));
    k->reset(e->state, &r);
}

int dp_env_step(dp_env_t *e, int action, double *reward, int *done, char *err)
{
    const dp_env_kind_t *k = e->kind;
    if (action < 0 || action >= k->n_actions)
        return dp_err(err, "%s: action %d is not one of 0 .. %d", k->name, action, k->n_actions - 1);
    if (e->terminated || e->truncated)
        return dp_err(err, "%s: a step after the episode ended (%s at step %d): reset first", k->name,
                      e->terminated ? "terminated" : "truncated", e->steps);
    double next[DP_ENV_MAX_STATE];
    k->step(e->state, action, next, reward, &e->terminated);
    memcpy(e->state, next, (size_t)k->state_dim * sizeof *next);
    e->steps++;
    e->ret += *reward;
    e->truncated = !e->terminated && e->steps >= k->max_steps;
    *done = e->terminated || e->truncated;
    return 0;
}

void dp_env_observe(const dp_env_t *e, float *obs)
{
    e->kind->observe(e->state, obs);
}
