/* test_deal: shard 0's dealing of an elastic crew's batches
 * (server/crew/deal.h) driven call by call, with no sockets: every batch of an
 * epoch dealt once whoever asks, repeats answered alike, a leaver's and a
 * dropped push's batches dealt again uncounted, a dead worker's counted
 * as retrained, a zombie's push counted once, the end and its wait. */
#include "server/crew/deal.h"
#include "tests/test.h"

static dp_deal_answer_t ask(dp_deal_t *d, int w, uint64_t step, dp_deal_batch_t *b)
{
    char why[200] = "";
    return dp_deal_ask(d, w, step, b, why, sizeof why);
}

/* The plan: epochs or steps, one budget; a later HELLO must agree. */
static void test_plan(void)
{
    dp_deal_t d;
    char why[300] = "";
    dp_deal_init(&d, 4);
    CHECK_EQ(dp_deal_plan(&d, 0, 0, 0, 0, why, sizeof why), 0); /* no plan: nothing */
    CHECK(!dp_deal_planned(&d));
    dp_deal_batch_t b;
    CHECK_EQ(ask(&d, 0, 1, &b), DP_DEAL_REFUSED);
    CHECK_EQ(dp_deal_plan(&d, 10, 4, 1, 1, why, sizeof why), -1); /* both budgets */
    CHECK_EQ(dp_deal_plan(&d, 3, 4, 1, 0, why, sizeof why), -1);  /* fewer samples than a batch */
    CHECK_EQ(dp_deal_plan(&d, 1u << 30, 1, 1000, 0, why, sizeof why), -1); /* too many */
    CHECK(!dp_deal_planned(&d));
    CHECK_EQ(dp_deal_plan(&d, 10, 4, 3, 0, why, sizeof why), 0);
    CHECK_EQ(d.per_epoch, 2); /* two samples of tail skipped */
    CHECK_EQ(d.total, 6);
    CHECK_EQ(dp_deal_plan(&d, 10, 4, 3, 0, why, sizeof why), 0);
    CHECK_EQ(dp_deal_plan(&d, 10, 4, 2, 0, why, sizeof why), -1);
    CHECK(strstr(why, "data plan mismatch: the servers deal 6 batches of 4 from 10 samples; "
                      "this worker's is 4 of 4 from 10") != NULL);
    CHECK_EQ(d.total, 6);
    dp_deal_fini(&d);
    dp_deal_init(&d, 4);
    CHECK_EQ(dp_deal_plan(&d, 10, 4, 0, 5, why, sizeof why), 0); /* --steps 5 x MAX 4 */
    CHECK_EQ(d.total, 20);
    dp_deal_fini(&d);
}

/* Two workers in turn: every batch once, in order across epochs, a repeat
 * the same, then the end. */
static void test_every_batch_once(void)
{
    dp_deal_t d;
    char why[200];
    dp_deal_init(&d, 2);
    CHECK_EQ(dp_deal_plan(&d, 12, 3, 2, 0, why, sizeof why), 0); /* 4 a epoch, 8 in all */
    dp_deal_batch_t b, again;
    int seen[8] = {0};
    for (uint64_t s = 1; s <= 4; s++)
        for (int w = 0; w < 2; w++) {
            CHECK_EQ(ask(&d, w, s, &b), DP_DEAL_DEALT);
            CHECK_EQ(ask(&d, w, s, &again), DP_DEAL_DEALT); /* a repeated pull */
            CHECK_EQ(again.epoch * 4 + again.index, b.epoch * 4 + b.index);
            seen[b.epoch * 4 + b.index]++;
            CHECK_EQ(dp_deal_in_flight(&d), 1);
            CHECK(!dp_deal_done(&d));
            CHECK_EQ(dp_deal_pushed(&d, w, s, 1, &again), 1);
            CHECK_EQ(again.index, b.index);
        }
    for (int g = 0; g < 8; g++) CHECK_EQ(seen[g], 1);
    CHECK(dp_deal_done(&d)); /* the last push was the last batch */
    CHECK_EQ(ask(&d, 0, 5, &b), DP_DEAL_END);
    dp_deal_epoch_t e[4];
    CHECK_EQ(dp_deal_epochs(&d, e, 4), 2);
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(e[k].epoch, k);
        CHECK_EQ(e[k].trained, 12);
        CHECK_EQ(e[k].repeated, 0);
        CHECK_EQ(e[k].retrained_after_death, 0);
        CHECK_EQ(e[k].batches, 4);
    }
    CHECK_EQ(d.foreign, 0);
    CHECK_EQ(dp_deal_pushed(&d, 1, 99, 1, &b), 0); /* never dealt: foreign, nothing counted */
    CHECK_EQ(d.foreign, 1);
    CHECK_EQ(dp_deal_epochs(&d, e, 4), 2);
    CHECK_EQ(e[0].repeated, 0);
    dp_deal_fini(&d);
}

/* A leaver's batch and a dropped push's go back and are dealt first,
 * uncounted; the last batch held elsewhere makes the others wait. */
static void test_returned_first(void)
{
    dp_deal_t d;
    char why[200];
    dp_deal_init(&d, 3);
    CHECK_EQ(dp_deal_plan(&d, 4, 1, 1, 0, why, sizeof why), 0); /* 4 batches */
    dp_deal_batch_t b0, b1, b2, b;
    CHECK_EQ(ask(&d, 0, 1, &b0), DP_DEAL_DEALT);
    CHECK_EQ(ask(&d, 1, 1, &b1), DP_DEAL_DEALT);
    CHECK_EQ(ask(&d, 1, 2, &b2), DP_DEAL_DEALT); /* the overlap's pull ahead */
    CHECK_EQ(dp_deal_release(&d, 1, 0), 2);        /* SIGTERM: both back */
    CHECK_EQ(ask(&d, 2, 1, &b), DP_DEAL_DEALT);
    CHECK_EQ(b.index, b1.index);                   /* the pool first, oldest first */
    CHECK_EQ(dp_deal_pushed(&d, 2, 1, 0, &b), 1);  /* dropped (a late backup): back again */
    CHECK_EQ(ask(&d, 2, 2, &b), DP_DEAL_DEALT);
    CHECK_EQ(b.index, b2.index);
    CHECK_EQ(dp_deal_pushed(&d, 2, 2, 1, &b), 1);
    CHECK_EQ(ask(&d, 2, 3, &b), DP_DEAL_DEALT);
    CHECK_EQ(b.index, b1.index);
    CHECK_EQ(dp_deal_pushed(&d, 2, 3, 1, &b), 1);
    CHECK_EQ(ask(&d, 2, 4, &b), DP_DEAL_DEALT); /* the last never dealt */
    CHECK_EQ(b.index, 3);
    CHECK_EQ(ask(&d, 1, 3, &b), DP_DEAL_WAIT);  /* 0 and 2 hold the rest */
    CHECK_EQ(dp_deal_pushed(&d, 0, 1, 1, &b), 1);
    CHECK_EQ(ask(&d, 1, 3, &b), DP_DEAL_WAIT);
    CHECK_EQ(ask(&d, 2, 5, &b), DP_DEAL_END);   /* its own pull ahead: its batch is its push */
    CHECK_EQ(dp_deal_pushed(&d, 2, 4, 1, &b), 1);
    CHECK_EQ(ask(&d, 1, 3, &b), DP_DEAL_END);
    dp_deal_epoch_t e;
    CHECK_EQ(dp_deal_epochs(&d, &e, 1), 1);
    CHECK_EQ(e.trained, 4);
    CHECK_EQ(e.repeated, 0);
    dp_deal_fini(&d);
}

/* A death: its batch dealt to another counts twice and as retrained after
 * a death; a zombie's push of a batch still in the pool takes it out,
 * counted once; its own re-ask takes it back uncounted. */
static void test_death(void)
{
    dp_deal_t d;
    char why[200];
    dp_deal_init(&d, 2);
    CHECK_EQ(dp_deal_plan(&d, 6, 2, 1, 0, why, sizeof why), 0); /* 3 batches of 2 */
    dp_deal_batch_t b, k, z;
    CHECK_EQ(ask(&d, 1, 7, &k), DP_DEAL_DEALT);
    CHECK_EQ(dp_deal_release(&d, 1, 1), 1);  /* gone */
    CHECK(!dp_deal_done(&d)); /* batches left: its own back in the pool, two never dealt */
    CHECK_EQ(ask(&d, 0, 1, &b), DP_DEAL_DEALT);
    CHECK_EQ(b.index, k.index);
    CHECK_EQ(dp_deal_pushed(&d, 0, 1, 1, &b), 1);
    CHECK_EQ(dp_deal_pushed(&d, 1, 7, 1, &z), 1); /* the zombie: already counted by its death */
    CHECK_EQ(z.index, k.index);
    /* a second death; the zombie pushes before anyone is dealt it */
    CHECK_EQ(ask(&d, 1, 8, &k), DP_DEAL_DEALT);
    CHECK_EQ(dp_deal_release(&d, 1, 1), 1);
    CHECK_EQ(dp_deal_pushed(&d, 1, 8, 1, &z), 1);
    CHECK_EQ(d.n_pool, 0);
    /* a third, and the same worker asks for that step again */
    CHECK_EQ(ask(&d, 1, 9, &k), DP_DEAL_DEALT);
    CHECK_EQ(dp_deal_release(&d, 1, 1), 1);
    CHECK_EQ(ask(&d, 1, 9, &z), DP_DEAL_DEALT);
    CHECK_EQ(z.index, k.index);
    CHECK_EQ(dp_deal_pushed(&d, 1, 9, 1, &z), 1);
    CHECK_EQ(ask(&d, 0, 2, &b), DP_DEAL_END);
    dp_deal_epoch_t e;
    CHECK_EQ(dp_deal_epochs(&d, &e, 1), 1);
    CHECK_EQ(e.trained, 6);
    CHECK_EQ(e.repeated, 2);
    CHECK_EQ(e.retrained_after_death, 2);
    CHECK_EQ(d.foreign, 0);
    dp_deal_fini(&d);
}

/* A worker may hold at most DP_DEAL_IN_FLIGHT; a flood of asks is refused
 * and deals nothing more. */
static void test_flight_bound(void)
{
    dp_deal_t d;
    char why[200] = "";
    dp_deal_init(&d, 1);
    CHECK_EQ(dp_deal_plan(&d, 100, 1, 1, 0, why, sizeof why), 0);
    dp_deal_batch_t b;
    for (uint64_t s = 1; s <= DP_DEAL_IN_FLIGHT; s++) CHECK_EQ(ask(&d, 0, s, &b), DP_DEAL_DEALT);
    CHECK_EQ(dp_deal_ask(&d, 0, 99, &b, why, sizeof why), DP_DEAL_REFUSED);
    CHECK_STR(why, "worker 0 holds 4 batches in flight already (at most 4): push them first");
    CHECK_EQ(d.next, DP_DEAL_IN_FLIGHT);
    CHECK_EQ(dp_deal_release(&d, 0, 1), DP_DEAL_IN_FLIGHT);
    CHECK_EQ(d.n_pool, DP_DEAL_IN_FLIGHT);
    dp_deal_fini(&d);
}

/* A hoarder (the issue's: takes its 4 batches and beats without pushing)
 * holds them no longer than its lease, driven by the test's clock: they
 * go back to the pool, another worker is dealt them and the epoch ends;
 * the hoarder's late push of one counts it again (repeated), and no lease
 * runs out before a turnaround was measured. */
static void test_lease(void)
{
    dp_deal_t d;
    char why[200];
    dp_deal_init(&d, 2);
    CHECK_EQ(dp_deal_plan(&d, 7, 1, 1, 0, why, sizeof why), 0); /* 7 batches of 1 */
    dp_deal_batch_t b, h[DP_DEAL_IN_FLIGHT];
    CHECK_EQ(dp_deal_tick(&d, 100.0), 0);
    for (uint64_t s = 1; s <= DP_DEAL_IN_FLIGHT; s++) CHECK_EQ(ask(&d, 1, s, &h[s - 1]), DP_DEAL_DEALT);
    /* the real worker's first batch takes 900 s (a slow start): till it is
     * measured, no lease runs out */
    CHECK_EQ(ask(&d, 0, 1, &b), DP_DEAL_DEALT);
    CHECK_EQ(dp_deal_tick(&d, 1000.0), 0);
    CHECK_EQ(dp_deal_lease(&d), 0.0);
    CHECK_EQ(dp_deal_pushed(&d, 0, 1, 1, &b), 1);
    /* then 0.1 s a batch: the median falls to 0.1 s, the lease to the floor */
    for (uint64_t s = 2; s <= 3; s++) {
        CHECK_EQ(ask(&d, 0, s, &b), DP_DEAL_DEALT);
        CHECK_EQ(dp_deal_tick(&d, 1000.0 + 0.1 * (double)(s - 1)), 0); /* lease 9000 s: not yet */
        CHECK_EQ(dp_deal_pushed(&d, 0, s, 1, &b), 1);
    }
    CHECK_NEAR(dp_deal_lease(&d), DP_DEAL_LEASE_FLOOR, 1e-9); /* 10 x 0.1 s, under the floor */
    CHECK_EQ(ask(&d, 0, 4, &b), DP_DEAL_WAIT); /* the hoarder holds the rest */
    CHECK_EQ(dp_deal_tick(&d, 1000.3), DP_DEAL_IN_FLIGHT); /* 900 s past 5 */
    CHECK_EQ(d.n_flight[1], 0);
    CHECK_EQ(d.expired, DP_DEAL_IN_FLIGHT);
    uint64_t step = 4;
    for (int k = 0; k < DP_DEAL_IN_FLIGHT; k++) {
        CHECK_EQ(ask(&d, 0, step, &b), DP_DEAL_DEALT);
        CHECK_EQ(b.index, h[k].index); /* the hoarder's, oldest first */
        /* a lease just short of the floor holds */
        CHECK_EQ(dp_deal_tick(&d, d.clock + DP_DEAL_LEASE_FLOOR - 0.01), 0);
        CHECK_EQ(dp_deal_pushed(&d, 0, step++, 1, &b), 1);
    }
    CHECK(dp_deal_done(&d));
    CHECK_EQ(ask(&d, 0, step, &b), DP_DEAL_END);
    dp_deal_epoch_t e;
    CHECK_EQ(dp_deal_epochs(&d, &e, 1), 1);
    CHECK_EQ(e.trained, 7);
    CHECK_EQ(e.repeated, 0);
    CHECK_EQ(dp_deal_pushed(&d, 1, 2, 1, &b), 1); /* the hoarder's late push: a batch it held */
    CHECK_EQ(b.index, h[1].index);
    CHECK_EQ(dp_deal_epochs(&d, &e, 1), 1);
    CHECK_EQ(e.repeated, 1);
    CHECK_EQ(e.retrained_after_death, 0);
    CHECK_EQ(d.foreign, 0);
    dp_deal_fini(&d);
}

/* The batch number of b in d. */
static uint64_t num(const dp_deal_t *d, dp_deal_batch_t b)
{
    return b.epoch * d->per_epoch + b.index;
}

/* A dealer with something of everything: 3 workers, 2 epochs of 8;
 * worker 1 died holding batch 1, which worker 0 trained again (a death's
 * count, worker 1's lost list), worker 2 holds batches 2 and 3 in flight,
 * one push named no batch. */
static void s_busy(dp_deal_t *d)
{
    char why[200];
    dp_deal_batch_t b;
    dp_deal_init(d, 3);
    CHECK_EQ(dp_deal_plan(d, 16, 2, 2, 0, why, sizeof why), 0); /* 8 a epoch, 16 in all */
    CHECK_EQ(ask(d, 0, 1, &b), DP_DEAL_DEALT);                  /* batch 0 */
    CHECK_EQ(dp_deal_pushed(d, 0, 1, 1, &b), 1);
    CHECK_EQ(ask(d, 1, 1, &b), DP_DEAL_DEALT);                  /* batch 1: dies with it */
    CHECK_EQ(ask(d, 2, 1, &b), DP_DEAL_DEALT);                  /* batch 2 */
    CHECK_EQ(ask(d, 2, 2, &b), DP_DEAL_DEALT);                  /* batch 3 */
    CHECK_EQ(dp_deal_release(d, 1, 1), 1);
    CHECK_EQ(ask(d, 0, 2, &b), DP_DEAL_DEALT);                  /* batch 1 again: counted */
    CHECK_EQ(num(d, b), 1);
    CHECK_EQ(dp_deal_pushed(d, 0, 2, 1, &b), 1);
    CHECK_EQ(dp_deal_pushed(d, 1, 7, 1, &b), 0);                /* foreign */
}

/* A checkpoint's dealer back: plan, counts, pool and lost lists alike; the
 * batches in flight back in the pool, the holder's late push counted
 * once, a second trainer's push making it repeated, never a death. */
static void test_restore(void)
{
    dp_deal_t a, r;
    char err[DP_ERR_LEN] = "";
    s_busy(&a);
    char *text = dp_deal_save(&a);
    CHECK(text != NULL);
    uint64_t total = 0;
    CHECK_EQ(dp_deal_saved_total(text, &total, err), 0);
    CHECK_EQ(total, 16);
    dp_deal_init(&r, 3);
    CHECK_EQ(dp_deal_restore(&r, text, a.count, a.total, err), 0);
    CHECK_STR(err, "");
    CHECK_EQ(r.next, a.next);
    CHECK_EQ(r.total, 16);
    CHECK_EQ(r.per_epoch, 8);
    CHECK_EQ(r.foreign, 1);
    CHECK(memcmp(r.count, a.count, 16) == 0);
    CHECK_EQ(dp_deal_in_flight(&r), 0);
    CHECK_EQ(r.n_pool, a.n_pool + 2);      /* worker 2's two batches */
    CHECK_EQ(r.n_lost[1], a.n_lost[1]);    /* the dead worker's */
    CHECK_EQ(r.n_lost[2], 2);
    CHECK_EQ(r.lost[2 * DP_DEAL_IN_FLIGHT].why, DP_DEAL_RESTORED);
    /* worker 2 repeats its push of step 1 (batch 2): trained once, out of the pool */
    dp_deal_batch_t b;
    CHECK_EQ(dp_deal_pushed(&r, 2, 1, 1, &b), 1);
    CHECK_EQ(num(&r, b), 2);
    CHECK_EQ(r.count[2], 1);
    CHECK_EQ(r.n_pool, a.n_pool + 1);
    /* batch 3 (worker 2's step 2) is dealt to worker 0 first, uncounted ... */
    CHECK_EQ(ask(&r, 0, 3, &b), DP_DEAL_DEALT);
    CHECK_EQ(num(&r, b), 3);
    CHECK_EQ(r.count[3], 0);
    CHECK_EQ(dp_deal_pushed(&r, 0, 3, 1, &b), 1);
    /* ... and worker 2's late push of it makes it repeated, not a death's */
    CHECK_EQ(dp_deal_pushed(&r, 2, 2, 1, &b), 1);
    CHECK_EQ(r.count[3], 2);
    /* the rest of the run: every batch, each once but batch 1 (a death) and 3 */
    uint64_t step = 10;
    while (ask(&r, 0, step, &b) == DP_DEAL_DEALT) CHECK_EQ(dp_deal_pushed(&r, 0, step++, 1, &b), 1);
    CHECK(dp_deal_done(&r));
    dp_deal_epoch_t e[2];
    CHECK_EQ(dp_deal_epochs(&r, e, 2), 2);
    CHECK_EQ(e[0].trained, 16);
    CHECK_EQ(e[0].repeated, 4);              /* batches 1 and 3 */
    CHECK_EQ(e[0].retrained_after_death, 2); /* batch 1 only */
    CHECK_EQ(e[1].trained, 16);
    CHECK_EQ(e[1].repeated, 0);
    free(text);
    dp_deal_fini(&r);
    dp_deal_fini(&a);
}

/* A crafted checkpoint: each lie is one line, and the dealer stays as it
 * was (no plan). */
static void test_restore_refused(void)
{
    dp_deal_t a;
    s_busy(&a);
    unsigned char counted[16] = {1, 1};
    counted[9] = 1; /* batch 9 was never dealt */
    struct {
        const char *text, *want;
        const unsigned char *count;
    } cases[] = {
        {"not json", "not JSON", a.count},
        {"{\"workers\":4,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0,"
         "\"pool\":[],\"flight\":[],\"lost\":[]}", "crew has 4 task indexes, this one 3", a.count},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":17,\"foreign\":0,"
         "\"pool\":[],\"flight\":[],\"lost\":[]}", "'next' is not a whole number", a.count},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0.5,"
         "\"pool\":[],\"flight\":[],\"lost\":[]}", "'foreign' is not a whole number", a.count},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0,"
         "\"pool\":[[4,0,1,0]],\"flight\":[],\"lost\":[]}", "an entry of 'pool' is out of range", a.count},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0,"
         "\"pool\":[],\"flight\":[[1,3,1]],\"lost\":[]}", "an entry of 'flight' is out of range", a.count},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0,"
         "\"pool\":[[1,0,1,4]],\"flight\":[],\"lost\":[]}", "an entry of 'pool' is out of range", a.count},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0,"
         "\"pool\":[],\"flight\":[[1,0,1],[1,0,2],[1,0,3],[1,0,4],[1,0,5]],\"lost\":[]}",
         "'flight' holds more batches than a crew of 3 may", a.count},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0,"
         "\"pool\":[],\"flight\":[],\"lost\":[]}", "batch 9 counted though never dealt", counted},
        {"{\"workers\":3,\"samples\":16,\"batch\":2,\"total\":16,\"next\":4,\"foreign\":0,"
         "\"pool\":[],\"lost\":[]}", "no list 'flight'", a.count},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dp_deal_t r;
        char err[DP_ERR_LEN] = "";
        dp_deal_init(&r, 3);
        CHECK_EQ(dp_deal_restore(&r, cases[k].text, cases[k].count, 16, err), -1);
        if (!strstr(err, cases[k].want)) printf("  case %zu: '%s'\n", k, err);
        CHECK(strstr(err, cases[k].want) != NULL);
        CHECK(!dp_deal_planned(&r));
        CHECK_EQ(r.n_pool, 0);
        dp_deal_fini(&r);
    }
    /* counts that do not match the plan's total */
    char *text = dp_deal_save(&a), err[DP_ERR_LEN] = "";
    dp_deal_t r;
    dp_deal_init(&r, 3);
    CHECK_EQ(dp_deal_restore(&r, text, a.count, 15, err), -1);
    CHECK(strstr(err, "15 counts for a plan of 16 batches") != NULL);
    free(text);
    dp_deal_fini(&r);
    dp_deal_fini(&a);
}

DP_TESTS(T(test_plan), T(test_every_batch_once), T(test_returned_first), T(test_death),
         T(test_flight_bound), T(test_lease), T(test_restore), T(test_restore_refused))
