/* members: joined / finished / gone bookkeeping of a shard (see members.h). */
#include "server/members.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

void dp_members_init(dp_members_t *m, int n, int shard, double now)
{
    m->w = dp_calloc((size_t)n, sizeof *m->w);
    m->n = n;
    m->shard = shard;
    for (int i = 0; i < n; i++) m->w[i].last_seen = now;
}

void dp_members_fini(dp_members_t *m)
{
    free(m->w);
    m->w = NULL;
    m->n = 0;
}

int dp_members_live(const dp_members_t *m, int i)
{
    return !m->w[i].finished && !m->w[i].gone;
}

int dp_members_heard(dp_members_t *m, int i, double now)
{
    dp_member_t *w = &m->w[i];
    w->last_seen = now;
    if (!w->gone) return 0;
    w->gone = 0;
    dp_log_info("shard %d: worker %d is back", m->shard, i);
    return 1;
}

void dp_members_join(dp_members_t *m, int i)
{
    dp_member_t *w = &m->w[i];
    if (!w->joined || w->finished) dp_log_info("shard %d: worker %d joined", m->shard, i);
    w->joined = 1;
    w->finished = 0;
}

int dp_members_finish(dp_members_t *m, int i)
{
    dp_member_t *w = &m->w[i];
    if (w->finished) return 0;
    dp_log_info("shard %d: worker %d finished", m->shard, i);
    w->finished = 1;
    return 1;
}

int dp_members_sweep(dp_members_t *m, double now, double timeout)
{
    if (timeout <= 0) return 0;
    int went = 0;
    for (int i = 0; i < m->n; i++) {
        dp_member_t *w = &m->w[i];
        if (!dp_members_live(m, i) || now - w->last_seen <= timeout) continue;
        w->gone = 1;
        went++;
        dp_log_warn("shard %d: worker %d silent for %.0f s (%s): no longer counted", m->shard, i,
                    now - w->last_seen, w->joined ? "heartbeat timeout" : "never joined");
    }
    return went;
}

void dp_members_counts(const dp_members_t *m, int *joined, int *finished, int *gone)
{
    *joined = *finished = *gone = 0;
    for (int i = 0; i < m->n; i++) {
        *joined += m->w[i].joined;
        *finished += m->w[i].finished;
        *gone += m->w[i].gone && !m->w[i].finished;
    }
}

int dp_members_missing(const dp_members_t *m, char *out, size_t n)
{
    int missing = 0;
    size_t used = 0;
    if (n) out[0] = 0;
    for (int i = 0; i < m->n; i++) {
        if (m->w[i].joined) continue;
        if (used + 16 < n) used += (size_t)snprintf(out + used, n - used, "%s%d", missing ? ", " : "", i);
        else if (used + 4 < n) used += (size_t)snprintf(out + used, n - used, "...");
        missing++;
    }
    return missing;
}
