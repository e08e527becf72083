/* members: joined / finished / gone bookkeeping of a shard (see members.h). */
#include "server/crew/members.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

void dp_members_init(dp_members_t *m, int n, int min, int shard, double now)
{
    m->w = dp_calloc((size_t)n, sizeof *m->w);
    m->n = n;
    m->min = min;
    m->shard = shard;
    for (int i = 0; i < n; i++) {
        m->w[i].last_seen = now;
        m->w[i].gone = min > 0; /* elastic: absent until its HELLO */
    }
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

int dp_members_active(const dp_members_t *m, int i)
{
    return m->w[i].joined && dp_members_live(m, i);
}

int dp_members_active_count(const dp_members_t *m)
{
    int k = 0;
    for (int i = 0; i < m->n; i++) k += dp_members_active(m, i);
    return k;
}

int dp_members_completed(const dp_members_t *m)
{
    int k = 0;
    for (int i = 0; i < m->n; i++) k += m->w[i].finished && !m->w[i].left;
    return k;
}

int dp_members_heard(dp_members_t *m, int i, double now)
{
    dp_member_t *w = &m->w[i];
    w->last_seen = now;
    if (!w->gone || (m->min > 0 && !w->joined)) return 0; /* elastic: only a HELLO counts it in */
    w->gone = 0;
    w->back = 1;
    dp_log_info("shard %d: worker %d is back (%d live)", m->shard, i, dp_members_active_count(m));
    return 1;
}

void dp_members_join(dp_members_t *m, int i)
{
    dp_member_t *w = &m->w[i];
    int news = !dp_members_active(m, i);
    w->hellos++;
    w->joined = 1;
    w->finished = w->left = 0;
    w->gone = 0;
    if (news) w->back = 0;
    if (news && !m->quiet)
        dp_log_info("shard %d: worker %d joined (%d live)", m->shard, i, dp_members_active_count(m));
}

int dp_members_finish(dp_members_t *m, int i, int leave)
{
    dp_member_t *w = &m->w[i];
    if (w->finished) return 0;
    w->finished = 1;
    w->left = leave;
    if (!m->quiet)
        dp_log_info("shard %d: worker %d %s (%d live)", m->shard, i,
                    leave ? "left before its last step" : "finished", dp_members_active_count(m));
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
        dp_log_warn("shard %d: worker %d silent for %.0f s (%s): no longer counted (%d live)",
                    m->shard, i, now - w->last_seen, w->joined ? "heartbeat timeout" : "never joined",
                    dp_members_active_count(m));
    }
    return went;
}

int dp_members_drop(dp_members_t *m, int i)
{
    if (!dp_members_live(m, i)) return 0;
    m->w[i].gone = 1;
    return 1;
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
