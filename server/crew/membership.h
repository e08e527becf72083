/* membership: the history of a shard's crew — each join and leave as an
 * event (which worker, the version then, how many live after it, why), and
 * the fewest and most workers live while the run trained. The loop
 * (server/loop/ps.c) notes the member table (server/crew/members.h) after every
 * change of it; the events go to the metrics lines, and with STATS to the
 * chief's summary.json ("membership", "live_min", "live_max").
 *
 * "Live" here is dp_members_active: joined and live, so a fixed crew's
 * workers join at their HELLO like an elastic crew's. The range closes at
 * the first worker done with its steps (dp_members_completed): the crew
 * thinning out at the end of a run is not churn. */
#ifndef DP_MEMBERSHIP_H
#define DP_MEMBERSHIP_H

#include <stddef.h>
#include <stdint.h>

#include "server/crew/members.h"

/* Events kept (and sent in a STATS reply): the last this many; a run with
 * more counts the rest in dropped. */
#define DP_MEMBERSHIP_MAX 4096

typedef enum {
    DP_JOIN_HELLO = 0,     /* joined: its HELLO */
    DP_JOIN_BACK,          /* came back: heard from after the heartbeat timeout */
    DP_LEAVE_FINISHED,     /* done with its steps */
    DP_LEAVE_LEFT,         /* left before its last step (its SIGTERM) */
    DP_LEAVE_GONE,         /* silent past the heartbeat timeout */
    DP_LEAVE_REPLACED,     /* a new process said HELLO under its id while it counted as live
                            * (restarted within the heartbeat timeout): it left, the new one joins */
} dp_member_why_t;

typedef struct {
    dp_member_why_t why;
    int task;
    uint64_t version;
    int live;              /* active workers after it */
} dp_member_event_t;

typedef struct {
    unsigned char *active; /* per worker, at the last note */
    unsigned *hellos;      /* per worker, its HELLOs at the last note */
    int n;
    dp_member_event_t ev[DP_MEMBERSHIP_MAX]; /* a ring: the last n_ev, oldest at (next - n_ev) */
    size_t n_ev, next;
    uint64_t total;        /* events ever (total - n_ev dropped) */
    int live;              /* active workers at the last note (the count the events end on) */
    int live_min, live_max; /* -1 until the first join */
    int closed;            /* a worker finished its steps: the range is final */
} dp_membership_t;

/* Safe to fini zeroed. */
void dp_membership_init(dp_membership_t *h, int n);
void dp_membership_fini(dp_membership_t *h);

/* Compare m with the last note: one event per worker whose activity
 * changed, at version. Returns how many are new (the last ones kept:
 * dp_membership_at). */
int dp_membership_note(dp_membership_t *h, const dp_members_t *m, uint64_t version);

/* The k-th kept event, oldest first (k < n_ev). */
const dp_member_event_t *dp_membership_at(const dp_membership_t *h, size_t k);

int dp_member_joins(dp_member_why_t why);
/* "hello", "back", "finished", "leave", "gone". */
const char *dp_member_why_name(dp_member_why_t why);

#endif
