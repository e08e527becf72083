/* test_staleness: the staleness histogram (common/staleness.h) — counts,
 * mean, fresh share, merge, the cap bin, its JSON both ways, and the
 * geometric fit recovering p from draws of a known geometric law. */
#include <math.h>

#include "common/rng.h"
#include "common/staleness.h"
#include "common/util.h"
#include "tests/test.h"

static void test_counts(void)
{
    dp_staleness_t h;
    dp_staleness_init(&h);
    CHECK_NEAR(dp_staleness_mean(&h), 0.0, 0);
    CHECK_NEAR(dp_staleness_geometric_p(&h), 1.0, 0);
    uint64_t v[] = {0, 0, 1, 3, 3, 3, 40};
    for (int i = 0; i < 7; i++) dp_staleness_add(&h, v[i]);
    CHECK_EQ(h.total, 7);
    CHECK_EQ(h.max, 40);
    CHECK_EQ(h.count[0], 2);
    CHECK_EQ(h.count[3], 3);
    CHECK_EQ(h.count[40], 1);
    CHECK_NEAR(dp_staleness_mean(&h), 50.0 / 7, 1e-12);
    CHECK_NEAR(dp_staleness_fresh(&h), 2.0 / 7, 1e-12);
    CHECK_NEAR(dp_staleness_geometric_p(&h), 1.0 / (1.0 + 50.0 / 7), 1e-12);
    dp_staleness_fini(&h);
    dp_staleness_fini(&h); /* safe twice */
}

static void test_cap_and_merge(void)
{
    dp_staleness_t a, b;
    dp_staleness_init(&a);
    dp_staleness_init(&b);
    dp_staleness_add(&a, 2);
    dp_staleness_add(&b, 2);
    dp_staleness_add(&b, (uint64_t)DP_STALENESS_CAP * 3); /* lands in the last bin */
    dp_staleness_merge(&a, &b);
    CHECK_EQ(a.total, 3);
    CHECK_EQ(a.count[2], 2);
    CHECK_EQ(a.bins, DP_STALENESS_CAP);
    CHECK_EQ(a.count[DP_STALENESS_CAP - 1], 1);
    CHECK_EQ(a.max, (uint64_t)DP_STALENESS_CAP * 3);
    CHECK_EQ(a.sum, 4 + (uint64_t)DP_STALENESS_CAP * 3);
    dp_staleness_fini(&a);
    dp_staleness_fini(&b);
}

static void test_json(void)
{
    dp_staleness_t h, back;
    dp_staleness_init(&h);
    dp_staleness_add(&h, 1);
    dp_staleness_add(&h, 1);
    dp_staleness_add(&h, 4);
    cJSON *j = dp_staleness_json(&h);
    char *text = cJSON_PrintUnformatted(j);
    CHECK_STR(text, "[0,2,0,0,1]");
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_staleness_from_json(&back, j, err), 0);
    CHECK_EQ(back.total, 3);
    CHECK_EQ(back.sum, 6);
    CHECK_EQ(back.max, 4);
    dp_staleness_fini(&back); /* from_json starts from an empty histogram */
    cJSON *bad = cJSON_Parse("[1,-2]");
    CHECK_EQ(dp_staleness_from_json(&back, bad, err), -1);
    CHECK(strstr(err, "bin 1") != NULL);
    cJSON_Delete(bad);
    cJSON_free(text);
    cJSON_Delete(j);
    dp_staleness_fini(&h);
    dp_staleness_fini(&back);
    dp_staleness_init(&h);
    j = dp_staleness_json(&h);
    text = cJSON_PrintUnformatted(j);
    CHECK_STR(text, "[]");
    cJSON_free(text);
    cJSON_Delete(j);
}

/* 20000 draws of a geometric law with p = 0.2 (failures before the first
 * success): the fit is within 4 standard errors (sd of the MLE ~
 * p sqrt((1-p)/n) = 0.0013) and the zero share too. */
static void test_geometric_fit(void)
{
    dp_rng_t r;
    dp_rng_seed(&r, 11);
    dp_staleness_t h;
    dp_staleness_init(&h);
    const double p = 0.2;
    for (int i = 0; i < 20000; i++) {
        uint64_t k = 0;
        while (dp_rng_uniform(&r) >= p) k++;
        dp_staleness_add(&h, k);
    }
    CHECK_NEAR(dp_staleness_geometric_p(&h), p, 4 * 0.0013);
    CHECK_NEAR(dp_staleness_fresh(&h), p, 4 * sqrt(p * (1 - p) / 20000));
    dp_staleness_fini(&h);
}

/* Folding into fewer bins: what a STATS reply carries. */
static void test_fold(void)
{
    dp_staleness_t h;
    dp_staleness_init(&h);
    uint64_t out[16] = {9, 9, 9, 9};
    CHECK_EQ(dp_staleness_fold(&h, out, 4), 0);
    dp_staleness_add_n(&h, 1, 3);
    dp_staleness_add(&h, 5);
    dp_staleness_add(&h, 7);
    CHECK_EQ(dp_staleness_fold(&h, out, 4), 4);
    CHECK_EQ(out[0], 0);
    CHECK_EQ(out[1], 3);
    CHECK_EQ(out[2], 0);
    CHECK_EQ(out[3], 2); /* 5 and 7: "3 or more" */
    CHECK_EQ(dp_staleness_fold(&h, out, 16), 8);
    CHECK_EQ(out[7], 1);
    CHECK_EQ(h.sum, 3 + 5 + 7);
    dp_staleness_fini(&h);
}

DP_TESTS(T(test_counts), T(test_fold), T(test_cap_and_merge), T(test_json), T(test_geometric_fit))
