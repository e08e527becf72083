/* deal: the epoch's batches handed out by shard 0 of an elastic crew
 * (--workers MIN:MAX), so that every sample of an epoch is trained once
 * whoever joins or leaves. Plain bookkeeping, no sockets: the loop
 * (server/loop/ps.c) asks it with a worker's pull, tells it each push's fate
 * and each change of the crew, and answers with what it decides.
 *
 * The batches. The plan (the chief's HELLO, server/loop/ps_deal.c: samples n,
 * batch b, the run's budget) fixes b_e = floor(n / b) batches per epoch and T batches in
 * all (epochs x b_e, or the workers' --steps x MAX). Batch j of epoch e
 * is the positions [j*b, (j+1)*b) of epoch e's permutation of the training
 * set, drawn from (seed, e) by the worker (worker/exec/data.h): the servers
 * deal numbers, never samples. The tail of n that fills no batch is
 * skipped, as in a fixed crew.
 *
 * The deal. A worker asks for the batch of its push step s (Pull.deal_step):
 * it gets the batch back to the pool longest (a returned one, lowest
 * number first), else the next one never dealt; the same (worker, s)
 * asked again (a repeated pull) gets the same batch. At most
 * DP_DEAL_IN_FLIGHT are in flight per worker (the overlapped loop holds
 * two). A push that the policy used (applied, or accumulated in sync)
 * finishes its (worker, step)'s batch; one it did not use (dropped as a
 * late backup, rejected) sends the batch back to the pool. A worker that
 * leaves (SIGTERM, finished) gives its batches in flight back; one that
 * dies (gone, replaced) too, and each such batch counts as trained once
 * by the dead worker when someone else is dealt it (the dead one may have
 * pushed part of it), so that retraining shows as "repeated" and
 * "retrained_after_death". A dead worker that was only slow and pushes
 * the batch after all (a zombie) trained it: if it is still in the pool
 * it leaves it, counted once. When nothing is left to deal, the answer
 * is "wait" while other workers hold batches in flight (one may come
 * back), else "end": the run's data is done (the asker's own batches in
 * flight are in pushes it sends after this pull, so they do not count).
 *
 * A checkpoint of shard 0 holds the dealer (dp_deal_save / restore),
 * so that the batches it dealt match the weights it restored: what was
 * trained after the checkpoint was lost with its updates and is dealt
 * again, not counted. The batches in flight at the checkpoint go back to
 * the pool at a restore, remembered per holder like a dead worker's: the
 * holder's push of one after the restart (its request repeated) takes it
 * out of the pool, counted once; if another was dealt it first, that push
 * makes it repeated. Neither is a death.
 *
 * Trust: any admitted worker may push any gradient (ARCHITECTURE.md,
 * "Trust"); a push of a (worker, step) that was never dealt a batch is
 * applied as the policy says, counted in foreign, and changes nothing
 * here. */
#ifndef DP_DEAL_H
#define DP_DEAL_H

#include <stddef.h>
#include <stdint.h>

#define DP_DEAL_IN_FLIGHT 4        /* batches one worker may hold at once */
#define DP_DEAL_MAX_BATCHES (1u << 26) /* a plan's T at most: one byte of account each */
#define DP_DEAL_TURNS 64           /* turnarounds kept for the lease's median */
#define DP_DEAL_LEASE_TURNS 10     /* a lease: this many median turnarounds ... */
#define DP_DEAL_LEASE_FLOOR 5.0    /* ... and at least this many seconds (a slow first step) */

/* One batch: epoch and its index in the epoch. */
typedef struct {
    uint64_t epoch, index;
} dp_deal_batch_t;

typedef enum {
    DP_DEAL_DEALT,     /* *out is the batch */
    DP_DEAL_WAIT,      /* nothing to deal now; batches are in flight elsewhere */
    DP_DEAL_END,       /* the run's batches are all trained */
    DP_DEAL_REFUSED,   /* why says (no plan, too many in flight) */
} dp_deal_answer_t;

/* Why a batch is back in the pool (or in a holder's lost list). */
typedef enum {
    DP_DEAL_RETURNED = 0, /* given back untrained (a leave, a push not used) */
    DP_DEAL_DIED,         /* its holder died with it: counted as trained once when dealt to another */
    DP_DEAL_RESTORED,     /* in flight at the checkpoint a restarted shard restored */
    DP_DEAL_EXPIRED,      /* held past its lease by a live worker (dp_deal_tick) */
} dp_deal_why_t;

/* A batch out of the store: who holds it (in flight) or last held it (the
 * pool), for which of its steps. */
typedef struct {
    dp_deal_batch_t b;
    int worker;
    uint64_t step;
    dp_deal_why_t why; /* pool and lost: how it came back */
    double at;         /* flight: the clock when it was dealt (its lease runs from there) */
} dp_deal_slot_t;

/* One epoch's account, in samples (dp_deal_epochs). */
typedef struct {
    uint64_t epoch;
    uint64_t trained;               /* samples trained at least once */
    uint64_t repeated;              /* of them, trained more than once */
    uint64_t retrained_after_death; /* of those, in a batch a dead worker held in flight */
    uint64_t batches;               /* the epoch's batches in the plan */
} dp_deal_epoch_t;

typedef struct {
    int workers;                    /* ids 0 .. workers - 1 */
    /* the plan; batch 0 = none yet */
    uint64_t samples, per_epoch, total;
    uint32_t batch;
    uint64_t next;                  /* batches [0, next) dealt at least once */
    unsigned char *count;           /* [total]: times trained (7 bits), 0x80: a dead worker held it */
    dp_deal_slot_t *flight;         /* [workers * DP_DEAL_IN_FLIGHT]: worker w's at w * K .. */
    int *n_flight;                  /* [workers] */
    dp_deal_slot_t *pool;           /* returned batches, oldest first */
    size_t n_pool, cap_pool;
    dp_deal_slot_t *lost;           /* [workers * DP_DEAL_IN_FLIGHT]: a dead worker's last
                                     * batches, for its zombie push */
    int *n_lost;
    uint64_t foreign;               /* pushes naming no batch dealt to their (worker, step) */
    double clock;                   /* the caller's time at its last dp_deal_tick */
    double turn[DP_DEAL_TURNS];     /* the last turnarounds (deal to used push), a ring */
    size_t n_turn, next_turn;
    double lease;                   /* from turn[] at the last used push: 0 till one is measured */
    uint64_t expired;               /* batches taken back from a live holder past its lease */
    double lease_floor;             /* the lease's floor: DP_DEAL_LEASE_FLOOR (a test may raise it) */
} dp_deal_t;

void dp_deal_init(dp_deal_t *d, int workers);
void dp_deal_fini(dp_deal_t *d); /* safe on a zeroed or finished one */

/* The plan from a HELLO: n samples at batch b for epochs, or (epochs 0)
 * steps per worker x workers. The first given sets it (the caller decides
 * whose may: server/loop/ps_deal.c); a later one must agree
 * (the same budget), else -1 with why (and nothing changes). A HELLO
 * without a plan (all 0: a worker of its own data, a library client)
 * changes nothing. */
int dp_deal_plan(dp_deal_t *d, uint64_t samples, uint32_t batch, uint64_t epochs, uint64_t steps,
                 char *why, size_t n);
int dp_deal_planned(const dp_deal_t *d);

/* A HELLO's plan, as a worker asks it. */
typedef struct {
    uint64_t samples, epochs, steps;
    uint32_t batch; /* 0: no plan (a worker of its own data) */
} dp_deal_terms_t;

/* t is a plan (as dp_deal_plan checks it) and agrees with the one set, if
 * any; -1 with why (the same lines) when not. Changes nothing. */
int dp_deal_plan_check(const dp_deal_t *d, const dp_deal_terms_t *t, char *why, size_t n);

/* The batch for worker's push step (>= 1). */
dp_deal_answer_t dp_deal_ask(dp_deal_t *d, int worker, uint64_t step, dp_deal_batch_t *out,
                             char *why, size_t n);

/* Worker's push of step, used by the policy or not: the batch it carried
 * into *b (1), or 0 when it names no batch dealt to it (foreign). */
int dp_deal_pushed(dp_deal_t *d, int worker, uint64_t step, int used, dp_deal_batch_t *b);

/* Worker's push of step names a batch dealt to it: in flight, or kept for
 * its late push (a death, a restore). */
int dp_deal_holds(const dp_deal_t *d, int worker, uint64_t step);

/* Worker left (died 0: SIGTERM, finished) or died (gone, replaced): its
 * batches in flight go back to the pool. Returns how many. */
int dp_deal_release(dp_deal_t *d, int worker, int died);

/* The clock is now (seconds, any origin, never backwards): what
 * dp_deal_ask and dp_deal_pushed stamp from here on. Every batch held
 * past its lease goes back to the pool; returns how many. */
int dp_deal_tick(dp_deal_t *d, double now);
/* The lease in seconds now; 0 while no turnaround was measured (none runs out). */
double dp_deal_lease(const dp_deal_t *d);

/* Batches in flight at every worker. */
int dp_deal_in_flight(const dp_deal_t *d);
/* The plan's batches are all trained: none left to deal, none back in the
 * pool, none in flight. */
int dp_deal_done(const dp_deal_t *d);

/* The dealer's state as text for a checkpoint's metadata (malloc'd; NULL
 * without a plan) and the times each batch was trained, count[total]
 * (the counts, a died bit 0x80), which the checkpoint keeps as a tensor
 * of its own: d->count. */
char *dp_deal_save(const dp_deal_t *d);
/* d (initialised for the same workers, no plan yet) from the text and the
 * counts (total bytes, as dp_deal_save's d->count) of a checkpoint: the
 * batches then in flight go back to the pool (DP_DEAL_RESTORED). The file
 * is not trusted: -1 with err (and d unchanged) unless every field is in
 * range and the whole agrees with itself. */
int dp_deal_restore(dp_deal_t *d, const char *text, const unsigned char *count, uint64_t total,
                    char *err);
/* The total number of batches the text's plan holds, to size the counts
 * before dp_deal_restore; -1 with err when the text does not read. */
int dp_deal_saved_total(const char *text, uint64_t *total, char *err);

/* The account of epochs [0, last dealt]: up to max into out. Returns how
 * many epochs there are (0 without a plan). */
size_t dp_deal_epochs(const dp_deal_t *d, dp_deal_epoch_t *out, size_t max);

#endif
