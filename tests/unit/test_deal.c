/* test_deal: shard 0's dealing of an elastic crew's batches
 * (server/deal.h) driven call by call, with no sockets: every batch of an
 * epoch dealt once whoever asks, repeats answered alike, a leaver's and a
 * dropped push's batches dealt again uncounted, a dead worker's counted
 * as retrained, a zombie's push counted once, the end and its wait. */
#include "server/deal.h"
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

DP_TESTS(T(test_plan), T(test_every_batch_once), T(test_returned_first), T(test_death),
         T(test_flight_bound))
