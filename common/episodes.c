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

void dp_episodes_add(dp_episodes_t *e, double ret, uint64_t at)
{
    e->window[e->episodes % DP_EPISODES_WINDOW] = ret;
    e->episodes++;
    if (e->solved_at < 0 && e->episodes >= DP_EPISODES_WINDOW && !isnan(e->threshold) &&
        dp_episodes_mean(e) >= e->threshold)
        e->solved_at = (int64_t)at;
}
