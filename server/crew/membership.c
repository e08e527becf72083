/* membership: the crew's history of joins and leaves (see membership.h). */
#include "server/crew/membership.h"

#include <stdlib.h>

#include "common/util.h"

void dp_membership_init(dp_membership_t *h, int n)
{
    h->active = dp_calloc((size_t)n, 1);
    h->hellos = dp_calloc((size_t)n, sizeof *h->hellos);
    h->n = n;
    h->n_ev = h->next = 0;
    h->total = 0;
    h->live = 0;
    h->live_min = h->live_max = -1;
    h->closed = 0;
}

void dp_membership_fini(dp_membership_t *h)
{
    free(h->active);
    free(h->hellos);
    h->active = NULL;
    h->hellos = NULL;
    h->n = 0;
}

static dp_member_why_t s_why(const dp_member_t *w, int active)
{
    if (active) return w->back ? DP_JOIN_BACK : DP_JOIN_HELLO;
    if (w->finished) return w->left ? DP_LEAVE_LEFT : DP_LEAVE_FINISHED;
    return DP_LEAVE_GONE;
}

static void s_add(dp_membership_t *h, dp_member_event_t e)
{
    h->ev[h->next] = e;
    h->next = (h->next + 1) % DP_MEMBERSHIP_MAX;
    if (h->n_ev < DP_MEMBERSHIP_MAX) h->n_ev++;
    h->total++;
}

int dp_membership_note(dp_membership_t *h, const dp_members_t *m, uint64_t version)
{
    int live = h->live, added = 0;
    /* joins first, so that a swap within one note never shows fewer live;
     * each event's count is the crew's after it */
    for (int i = 0; i < h->n && i < m->n; i++) { /* a process replaced under a live id */
        if (h->active[i] && dp_members_active(m, i) && m->w[i].hellos != h->hellos[i]) {
            s_add(h, (dp_member_event_t){DP_LEAVE_REPLACED, i, version, live - 1});
            s_add(h, (dp_member_event_t){DP_JOIN_HELLO, i, version, live});
            added += 2;
        }
        h->hellos[i] = m->w[i].hellos;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < h->n && i < m->n; i++) {
            int a = dp_members_active(m, i);
            if (a == h->active[i] || a != (pass == 0)) continue;
            h->active[i] = (unsigned char)a;
            live += a ? 1 : -1;
            s_add(h, (dp_member_event_t){s_why(&m->w[i], a), i, version, live});
            added++;
        }
    h->live = live;
    if (!h->closed && dp_members_completed(m) > 0) h->closed = 1;
    if (!h->closed && (live > 0 || h->live_max >= 0)) {
        if (h->live_min < 0 || live < h->live_min) h->live_min = live;
        if (live > h->live_max) h->live_max = live;
    }
    return added;
}

const dp_member_event_t *dp_membership_at(const dp_membership_t *h, size_t k)
{
    return &h->ev[(h->next + DP_MEMBERSHIP_MAX - h->n_ev + k) % DP_MEMBERSHIP_MAX];
}

int dp_member_joins(dp_member_why_t why)
{
    return why == DP_JOIN_HELLO || why == DP_JOIN_BACK;
}

const char *dp_member_why_name(dp_member_why_t why)
{
    switch (why) {
    case DP_JOIN_HELLO: return "hello";
    case DP_JOIN_BACK: return "back";
    case DP_LEAVE_FINISHED: return "finished";
    case DP_LEAVE_LEFT: return "leave";
    case DP_LEAVE_GONE: return "gone";
    case DP_LEAVE_REPLACED: return "replaced";
    }
    return "?";
}
