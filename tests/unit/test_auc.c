/* test_auc: the exact AUC (common/auc.h) against the O(n^2) definition —
 * every (positive, negative) pair, a tie counted half — on random data with
 * many ties, on hand-made cases, and its refusals. */
#include "common/auc.h"
#include "common/rng.h"
#include "tests/test.h"

/* The definition, pair by pair. */
static double s_auc_ref(const float *score, const float *label, size_t n)
{
    double u = 0, pos = 0, neg = 0;
    for (size_t i = 0; i < n; i++) {
        pos += label[i] == 1;
        neg += label[i] == 0;
        if (label[i] != 1) continue;
        for (size_t j = 0; j < n; j++)
            if (label[j] == 0) u += score[i] > score[j] ? 1 : score[i] == score[j] ? 0.5 : 0;
    }
    return u / (pos * neg);
}

static void test_hand_cases(void)
{
    char err[DP_ERR_LEN];
    double auc = -1;
    const float y[] = {0, 0, 1, 1};
    const float perfect[] = {0.1f, 0.2f, 0.8f, 0.9f}, reversed[] = {0.9f, 0.8f, 0.2f, 0.1f};
    const float tied[] = {0.5f, 0.5f, 0.5f, 0.5f}, half[] = {0.1f, 0.9f, 0.5f, 0.5f};
    CHECK_EQ(dp_auc(perfect, y, 4, &auc, err), 0);
    CHECK_NEAR(auc, 1, 0);
    CHECK_EQ(dp_auc(reversed, y, 4, &auc, err), 0);
    CHECK_NEAR(auc, 0, 0);
    CHECK_EQ(dp_auc(tied, y, 4, &auc, err), 0);
    CHECK_NEAR(auc, 0.5, 0);
    /* pairs: (0.5 vs 0.1) x2 win, (0.5 vs 0.9) x2 lose: 2 of 4 */
    CHECK_EQ(dp_auc(half, y, 4, &auc, err), 0);
    CHECK_NEAR(auc, 0.5, 0);
    /* -0 and +0 are one score: a tie */
    const float zeros[] = {-0.0f, 0.0f}, y2[] = {0, 1};
    CHECK_EQ(dp_auc(zeros, y2, 2, &auc, err), 0);
    CHECK_NEAR(auc, 0.5, 0);
}

/* Random scores from a few levels (so many ties), random labels, sizes from
 * 2 to 3000: equal to the definition to rounding. */
static void test_against_reference(void)
{
    char err[DP_ERR_LEN];
    dp_rng_t r;
    dp_rng_seed(&r, 7);
    static float score[3000], label[3000];
    const size_t sizes[] = {2, 3, 10, 101, 1000, 3000};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        size_t n = sizes[t];
        for (int levels = 2; levels <= 2048; levels *= 8) {
            for (size_t i = 0; i < n; i++) {
                label[i] = (float)(dp_rng_below(&r, 3) == 0);
                /* positives a little higher: an AUC away from 0.5 */
                score[i] = (float)dp_rng_below(&r, (uint32_t)levels) + label[i] * (float)levels / 4;
            }
            label[0] = 0, label[n - 1] = 1; /* both classes */
            double auc = -1;
            CHECK_EQ(dp_auc(score, label, n, &auc, err), 0);
            CHECK_NEAR(auc, s_auc_ref(score, label, n), 1e-12);
        }
    }
}

static void test_refusals(void)
{
    char err[DP_ERR_LEN];
    double auc = 42;
    const float s[] = {0.1f, 0.2f, 0.3f};
    const float ones[] = {1, 1, 1}, bad[] = {0, 2, 1};
    CHECK_EQ(dp_auc(s, ones, 3, &auc, err), -1);
    CHECK_STR(err, "auc: undefined with positives only (3 samples)");
    CHECK_EQ(dp_auc(s, bad, 3, &auc, err), -1);
    CHECK_STR(err, "auc: label 2 of sample 1 is not 0 or 1");
    const float nan_s[] = {0.1f, NAN, 0.3f}, y[] = {0, 1, 1};
    CHECK_EQ(dp_auc(nan_s, y, 3, &auc, err), -1);
    CHECK_STR(err, "auc: score of sample 1 is NaN");
    CHECK_EQ(dp_auc(s, y, 0, &auc, err), -1);
    CHECK_NEAR(auc, 42, 0); /* untouched */
}

DP_TESTS(T(test_hand_cases), T(test_against_reference), T(test_refusals))
