/* members: who a shard serves — which workers joined, finished or went
 * silent — and the heartbeat sweep that decides "silent". Plain bookkeeping,
 * no sockets: the loop (server/loop/ps.c) reports what it heard, and the policies
 * (server/core/policy.h) read who is live.
 *
 * A worker is live when it has not finished and was heard from within the
 * heartbeat timeout. Workers send a HEARTBEAT every second from start to
 * exit (worker/client/ps_beat.h), also while a pull of theirs is held, so a held
 * pull proves nothing: a worker that died waiting goes gone like any other.
 *
 * A fixed crew (--workers N) counts every worker from the start: sync waits
 * for one that has not said HELLO yet until the heartbeat timeout. An
 * elastic one (--workers MIN:MAX) counts none before its HELLO: each of
 * the MAX slots starts absent (gone, never joined), a HELLO makes it live,
 * a leave (BARRIER{finished, leave}: its SIGTERM) or the heartbeat timeout
 * takes it out, a new HELLO brings it back. Only a HELLO counts an absent
 * slot in: its HEARTBEATs alone do not. */
#ifndef DP_MEMBERS_H
#define DP_MEMBERS_H

#include <stddef.h>

typedef struct {
    int joined;            /* said HELLO at least once */
    int finished;          /* said BARRIER{finished}; cleared by a new HELLO */
    int left;              /* with finished: it left before its last step (BARRIER.leave) */
    int gone;              /* silent past the heartbeat timeout; cleared by any message */
    int back;              /* counted again by a message after it went gone (not a HELLO's join) */
    unsigned hellos;       /* HELLOs taken: one more while live is a new process under its id */
    double last_seen;      /* dp_now() of its last valid message (start time if none) */
} dp_member_t;

typedef struct {
    dp_member_t *w;        /* n workers, by worker id */
    int n;                 /* MAX: worker ids are 0 .. n - 1 */
    int min;               /* elastic: MIN (sync steps with at least MIN live); 0: a fixed crew */
    int shard;             /* shard index, for log lines */
    int quiet;             /* no log lines (the lab's tables: a simulation changes its crew
                            * thousands of times) */
} dp_members_t;

/* n workers, none joined, all last seen at now; min 0: a fixed crew of n,
 * else elastic (every slot absent). */
void dp_members_init(dp_members_t *m, int n, int min, int shard, double now);
/* Safe on a zeroed or finished table. */
void dp_members_fini(dp_members_t *m);

int dp_members_live(const dp_members_t *m, int i);
/* Joined and live: in the crew now (what the membership events count). */
int dp_members_active(const dp_members_t *m, int i);
int dp_members_active_count(const dp_members_t *m);
/* Workers done with their steps (finished, not left): the run is ending. */
int dp_members_completed(const dp_members_t *m);

/* A valid message from worker i at now. Returns 1 when i was gone (it
 * counts again: liveness changed), else 0. */
int dp_members_heard(dp_members_t *m, int i, double now);
/* HELLO from i: joined, live, and no longer finished (a worker may run again). */
void dp_members_join(dp_members_t *m, int i);
/* BARRIER{finished} from i (leave: BARRIER.leave, before its last step).
 * Returns 1 when that is news. */
int dp_members_finish(dp_members_t *m, int i, int leave);

/* Marks gone every live worker silent for more than timeout seconds (never
 * when timeout <= 0). Returns how many went gone now. */
int dp_members_sweep(dp_members_t *m, double now, double timeout);

/* Worker i no longer counted now, as if silent (its key was removed from
 * the allow list): 1 when it was live. A message heard from it later
 * counts it again, so the caller refuses them first. */
int dp_members_drop(dp_members_t *m, int i);

/* Workers that joined, that finished, that are gone (and not finished). */
void dp_members_counts(const dp_members_t *m, int *joined, int *finished, int *gone);

/* The ids of the workers that never said HELLO, as "1, 3, 7" into out (n
 * bytes; "..." ends a list that does not fit). Returns how many. */
int dp_members_missing(const dp_members_t *m, char *out, size_t n);

#endif
