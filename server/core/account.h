/* account: the bounds a shard holds an actor-critic push's account to
 * (Push.env_steps, episode_returns, episode_ends, solved_threshold) before
 * anything of the push is taken.
 *
 * The bounds come from what the shard is told at start, never from a push:
 * the environment (--env NAME: its episodes' return range and its solved
 * threshold, worker/exec/env/env.h) and the workers' segment (--envs K x
 * --t-max T environment steps at most); `downpour local --env` gives its
 * shards all three. A push outside them is refused whole (server/loop/ps.c:
 * ERROR ERR_ACCOUNT, counted, one line), so its gradient changes nothing
 * either. A shard not told the environment refuses every push that
 * carries an account: there is nothing to bound it by, and no push (nor a
 * HELLO) may set the bounds a later lie would be judged by. The run's
 * threshold is the environment's; a push's solved_threshold only has to
 * agree with it (a worker of another --env is refused). */
#ifndef DP_ACCOUNT_H
#define DP_ACCOUNT_H

#include <stddef.h>
#include <stdint.h>

#include "common/episodes.h"
#include "proto/wire.h"
#include "worker/exec/env/env.h"

typedef struct {
    const dp_env_kind_t *env;  /* --env; NULL: not told, every account refused */
    uint64_t max_steps;        /* a segment's environment steps at most: --envs x --t-max */
    double ret_lo, ret_hi;     /* an episode's return lies in [lo, hi] (dp_env_return_range) */
} dp_account_bounds_t;

/* The bounds of environment env ("" or NULL: none told) with envs x t_max
 * steps a segment; -1 with err naming the flag for an unknown name or
 * counts out of 1 .. DP_A3C_MAX_ENVS / DP_A3C_MAX_T. */
int dp_account_bounds(dp_account_bounds_t *b, const char *env, int envs, int t_max, char *err);

/* Does push p's account (if it carries one) keep the bounds? 0 when it
 * carries none or keeps them; -1 with a short line in why (n bytes) naming
 * the bound it breaks and the flag that sets it. Checked: the counts of
 * returns and ends agree; env_steps at most max_steps; the ends strictly
 * increase within 1 .. env_steps (one episode ends at a time in an
 * environment, K of them step in turn); every return finite and within
 * [ret_lo, ret_hi]; the threshold the environment's. */
int dp_account_check(const dp_account_bounds_t *b, const Downpour__Push *p, char *why, size_t n);

/* A checked push's segment into the run's account e: its episodes at the
 * run's env steps where they ended, then its steps. The sum of its
 * returns (for the record). */
double dp_account_add(dp_episodes_t *e, const Downpour__Push *p);

#endif
