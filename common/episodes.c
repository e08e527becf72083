/* episodes: see episodes.h. */
#include "common/episodes.h"

#include <math.h>
#include <string.h>

void dp_episodes_init(dp_episodes_t *e, double threshold)
{
    memset(e, 0, sizeof *e);
    e->threshold = threshold;
    e->solved_at = -1;
}

double dp_episodes_mean(const dp_episodes_t *e)
{
    uint64_t n = e->episodes < DP_EPISODES_WINDOW ? e->episodes : DP_EPISODES_WINDOW;
    if (n == 0) return 0;
    double s = 0;
    for (uint64_t i = 0; i < n; i++) s += e->window[i];
    return s / (double)n;
}

/* A point at env step `at` when it starts a stretch of the curve the last
 * point does not cover (the curve full: every other point dropped first). */
static void s_curve_add(dp_episodes_t *e, uint64_t at, double mean)
{
    if (e->stride == 0) e->stride = DP_EPISODES_STRIDE0;
    int n = e->n_curve;
    if (n > 0 && at / e->stride <= e->curve_at[n - 1] / e->stride) return;
    if (n == DP_EPISODES_CURVE) {
        for (int i = 0; i < n / 2; i++) {
            e->curve_at[i] = e->curve_at[2 * i];
            e->curve_mean[i] = e->curve_mean[2 * i];
        }
        e->n_curve = n / 2;
        e->stride *= 2;
        s_curve_add(e, at, mean);
        return;
    }
    e->curve_at[n] = at;
    e->curve_mean[n] = mean;
    e->n_curve = n + 1;
}

void dp_episodes_add(dp_episodes_t *e, double ret, uint64_t at)
{
    e->window[e->episodes % DP_EPISODES_WINDOW] = ret;
    e->episodes++;
    double mean = dp_episodes_mean(e);
    if (e->solved_at < 0 && e->episodes >= DP_EPISODES_WINDOW && !isnan(e->threshold) &&
        mean >= e->threshold)
        e->solved_at = (int64_t)at;
    s_curve_add(e, at, mean);
}
