/* test_planted: the planted sparse logistic model (deploy/lab/planted.h) —
 * the key bijection against its inverse, the Zipf sampler's frequencies
 * against the exact law (small K) and its range (K = 2^40, 2^64 - 1), the
 * weights as a pure function of (seed, key) with the intended spread, and
 * a sample's keys, logit and label against a plain recomputation. */
#include "deploy/lab/planted.h"
#include "tests/test.h"

static void test_mix_is_a_bijection(void)
{
    dp_rng_t r;
    dp_rng_seed(&r, 3);
    int back = 1;
    for (int i = 0; i < 100000; i++) {
        uint64_t x = i < 3 ? (uint64_t[]){0, 1, UINT64_MAX}[i] : dp_rng_next(&r);
        back &= dp_planted_unmix(dp_planted_mix(x)) == x && dp_planted_mix(dp_planted_unmix(x)) == x;
    }
    CHECK(back);
    CHECK(dp_planted_mix(1) != 1 && dp_planted_mix(2) != dp_planted_mix(1));
}

/* Draws of K = 10 ranks: each rank's frequency within 5 standard errors of
 * r^-s / H(10, s) (s = 0: 1/10). The draws are seeded: no flakiness. */
static void s_check_law(double s, int draws)
{
    char err[DP_ERR_LEN];
    dp_planted_t p;
    CHECK_EQ(dp_planted_init(&p, 11, 10, s, 1, 0, 1, err), 0);
    dp_rng_t r;
    dp_rng_seed(&r, 5);
    long count[11] = {0};
    int in_range = 1;
    for (int i = 0; i < draws; i++) {
        uint64_t k = dp_planted_rank(&p, &r);
        in_range &= k >= 1 && k <= 10;
        if (k >= 1 && k <= 10) count[k]++;
    }
    CHECK(in_range);
    double h = 0;
    for (int k = 1; k <= 10; k++) h += pow(k, -s);
    for (int k = 1; k <= 10; k++) {
        double want = pow(k, -s) / h, se = sqrt(want * (1 - want) / draws);
        CHECK_NEAR((double)count[k] / draws, want, 5 * se);
    }
    dp_planted_fini(&p);
}

static void test_zipf_law(void)
{
    const double s[] = {0, 0.5, 1.0, 1.1, 2.0, 4.0};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) s_check_law(s[i], 200000);
}

/* Huge key spaces: every rank in [1, K], and rank 1's frequency 1 / H(K, s)
 * (H by its first 10^6 terms plus the midpoint integral of the rest). */
static void test_zipf_huge(void)
{
    char err[DP_ERR_LEN];
    const uint64_t ks[] = {(uint64_t)1 << 40, UINT64_MAX};
    for (int t = 0; t < 2; t++) {
        dp_planted_t p;
        const double s = 1.1;
        CHECK_EQ(dp_planted_init(&p, 1, ks[t], s, 4, 0, 1, err), 0);
        dp_rng_t r;
        dp_rng_seed(&r, 9);
        long ones = 0, n = 200000;
        int in_range = 1;
        uint64_t top = 0;
        for (long i = 0; i < n; i++) {
            uint64_t k = dp_planted_rank(&p, &r);
            in_range &= k >= 1 && k <= ks[t];
            ones += k == 1;
            if (k > top) top = k;
        }
        CHECK(in_range);
        CHECK(top > 1000000); /* the tail is reached */
        double h = 0;
        for (int k = 1; k <= 1000000; k++) h += pow(k, -s);
        h += (pow((double)ks[t] + 0.5, 1 - s) - pow(1000000.5, 1 - s)) / (1 - s);
        double want = 1 / h;
        CHECK_NEAR((double)ones / n, want, 5 * sqrt(want * (1 - want) / n));
        dp_planted_fini(&p);
    }
}

static void test_weights(void)
{
    char err[DP_ERR_LEN];
    dp_planted_t a, b, c;
    CHECK_EQ(dp_planted_init(&a, 7, 1000, 1.1, 16, 0, 2, err), 0);
    CHECK_EQ(dp_planted_init(&b, 7, 1u << 30, 0.5, 16, 1, 2, err), 0);
    CHECK_EQ(dp_planted_init(&c, 8, 1000, 1.1, 16, 0, 2, err), 0);
    CHECK_NEAR(a.sigma, 0.5, 1e-15); /* 2 / sqrt(16) */
    CHECK(a.bias == b.bias && a.bias != c.bias);
    int same = 1, differ = 0;
    double sum = 0, sq = 0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        uint64_t key = dp_planted_mix((uint64_t)i);
        double w = dp_planted_weight(&a, key);
        same &= w == dp_planted_weight(&b, key); /* (seed, key) only */
        differ += w != dp_planted_weight(&c, key);
        sum += w, sq += w * w;
    }
    CHECK(same);
    CHECK_EQ(differ, n);
    CHECK_NEAR(sum / n, 0, 5 * 0.5 / sqrt(n));
    CHECK_NEAR(sqrt(sq / n), 0.5, 0.01);
    dp_planted_fini(&a), dp_planted_fini(&b), dp_planted_fini(&c);
}

/* Samples: nnz distinct ascending keys from the key map, the logit
 * recomputed by hand, and the labels' mean that of sigmoid(logit). */
static void test_samples(void)
{
    char err[DP_ERR_LEN];
    for (int gauss = 0; gauss < 2; gauss++) {
        dp_planted_t p;
        CHECK_EQ(dp_planted_init(&p, 3, 40, 1.5, 20, gauss, 3, err), 0);
        dp_rng_t r;
        dp_rng_seed(&r, 4);
        uint64_t keys[20];
        float values[20];
        int ok = 1, n = 20000;
        double pos = 0, mean_p = 0, var = 0;
        for (int i = 0; i < n; i++) {
            double z;
            int y;
            if (dp_planted_sample(&p, &r, keys, values, &z, &y, err) != 0) {
                CHECK_STR(err, "");
                break;
            }
            double want = p.bias;
            for (int k = 0; k < 20; k++) {
                ok &= k == 0 || keys[k] > keys[k - 1];
                ok &= gauss || values[k] == 1;
                want += dp_planted_weight(&p, keys[k]) * values[k];
                /* every key is some rank's in [1, 40] */
                uint64_t rank = dp_planted_unmix(keys[k]) - p.key_salt;
                ok &= rank >= 1 && rank <= 40;
            }
            ok &= fabs(z - want) <= 1e-12 * (1 + fabs(want));
            double q = 1 / (1 + exp(-z));
            pos += y, mean_p += q, var += q * (1 - q);
        }
        CHECK(ok);
        CHECK_NEAR(pos, mean_p, 5 * sqrt(var));
        dp_planted_fini(&p);
    }
}

static void test_refusals(void)
{
    char err[DP_ERR_LEN];
    dp_planted_t p;
    CHECK_EQ(dp_planted_init(&p, 1, 10, 1.1, 11, 0, 1, err), -1);
    CHECK_STR(err, "--nnz 11: expected 1 to --keys (10) distinct features per sample");
    /* all 50 keys under a steep law: the rarest has probability ~ 50^-10 */
    CHECK_EQ(dp_planted_init(&p, 1, 50, 10, 50, 0, 1, err), 0);
    dp_rng_t r;
    dp_rng_seed(&r, 1);
    uint64_t keys[50];
    float values[50];
    double z;
    int y;
    CHECK_EQ(dp_planted_sample(&p, &r, keys, values, &z, &y, err), -1);
    CHECK_STR(err, "could not draw 50 distinct keys of 50 under --zipf 10: lower --nnz or --zipf");
    dp_planted_fini(&p);
    /* every key, uniformly: possible */
    CHECK_EQ(dp_planted_init(&p, 1, 50, 0, 50, 0, 1, err), 0);
    CHECK_EQ(dp_planted_sample(&p, &r, keys, values, &z, &y, err), 0);
    dp_planted_fini(&p);
}

DP_TESTS(T(test_mix_is_a_bijection), T(test_zipf_law), T(test_zipf_huge), T(test_weights),
         T(test_samples), T(test_refusals))
