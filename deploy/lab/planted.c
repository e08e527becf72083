/* planted: the planted sparse logistic model and its sampler (planted.h).
 *
 * The Zipf draw is rejection-inversion as in Apache Commons RNG's
 * RejectionInversionZipfSampler (Hörmann & Derflinger's ZRI with the hat's
 * integral H(x) = (x^(1-s) - 1) / (1 - s), which has a limit at s = 1, so
 * every s > 0 works); ranks are 64-bit here. test_planted checks its
 * frequencies against the exact law. */
#include "deploy/lab/planted.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/libsvm.h"
#include "common/util.h"

#define S_C1 0xbf58476d1ce4e5b9ULL
#define S_C2 0x94d049bb133111ebULL

uint64_t dp_planted_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * S_C1;
    z = (z ^ (z >> 27)) * S_C2;
    return z ^ (z >> 31);
}

/* c^-1 mod 2^64 for odd c: Newton's iteration doubles the correct bits. */
static uint64_t s_inverse(uint64_t c)
{
    uint64_t x = c;
    for (int i = 0; i < 6; i++) x *= 2 - c * x;
    return x;
}

uint64_t dp_planted_unmix(uint64_t z)
{
    z ^= (z >> 31) ^ (z >> 62);
    z *= s_inverse(S_C2);
    z ^= (z >> 27) ^ (z >> 54);
    z *= s_inverse(S_C1);
    z ^= (z >> 30) ^ (z >> 60);
    return z;
}

double dp_planted_uniform(dp_rng_t *rng)
{
    return (double)(dp_rng_next(rng) >> 11) * 0x1.0p-53;
}

double dp_planted_normal(dp_rng_t *rng)
{
    /* Box-Muller; 1 - u keeps the logarithm's argument in (0, 1]. */
    double u1 = 1.0 - dp_planted_uniform(rng), u2 = dp_planted_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ---- Zipf by rejection-inversion ------------------------------------------ */

/* log1p(x) / x and expm1(x) / x, by their series near 0. */
static double s_helper1(double x)
{
    return fabs(x) > 1e-8 ? log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - x * 0.25));
}
static double s_helper2(double x)
{
    return fabs(x) > 1e-8 ? expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + x * 0.25));
}
/* H(x) = (x^(1-s) - 1) / (1 - s); h(x) = x^-s; H's inverse. */
static double s_H(double s, double x)
{
    double lx = log(x);
    return s_helper2((1.0 - s) * lx) * lx;
}
static double s_h(double s, double x) { return exp(-s * log(x)); }
static double s_Hinv(double s, double x)
{
    double t = x * (1.0 - s);
    if (t < -1.0) t = -1.0; /* rounding only */
    return exp(s_helper1(t) * x);
}

uint64_t dp_planted_rank(const dp_planted_t *p, dp_rng_t *rng)
{
    if (p->zipf == 0) /* uniform: Lemire's multiply-shift, bias < K / 2^64 */
        return 1 + (uint64_t)(((unsigned __int128)dp_rng_next(rng) * p->keys) >> 64);
    double s = p->zipf;
    for (;;) {
        double u = p->h_n + dp_planted_uniform(rng) * (p->h_x1 - p->h_n);
        double x = s_Hinv(s, u);
        double kd = floor(x + 0.5);
        uint64_t k;
        if (kd < 1) k = 1;
        else if (kd >= 0x1.0p64) k = p->keys;
        else k = (uint64_t)kd < p->keys ? (uint64_t)kd : p->keys;
        if ((double)k - x <= p->s || u >= s_H(s, (double)k + 0.5) - s_h(s, (double)k)) return k;
    }
}

/* ---- the model ---------------------------------------------------------- */

int dp_planted_init(dp_planted_t *p, uint64_t seed, uint64_t keys, double zipf, int nnz, int gauss,
                    double signal, char *err)
{
    memset(p, 0, sizeof *p);
    if (nnz < 1 || keys < 1 || (uint64_t)nnz > keys)
        return dp_err(err, "--nnz %d: expected 1 to --keys (%llu) distinct features per sample", nnz,
                      (unsigned long long)keys);
    if (!(zipf >= 0 && zipf <= 10)) return dp_err(err, "--zipf %g: expected a number in [0, 10]", zipf);
    if (!(signal >= 0 && signal <= 100))
        return dp_err(err, "--signal %g: expected a number in [0, 100]", signal);
    p->keys = keys;
    p->zipf = zipf;
    p->nnz = nnz;
    p->gauss = gauss;
    p->sigma = signal / sqrt((double)nnz);
    /* Independent streams from one seed: each salt its own mix. */
    p->key_salt = dp_planted_mix(seed ^ 0x6b65797300000001ULL);
    p->weight_salt = dp_planted_mix(seed ^ 0x7765696700000002ULL);
    dp_rng_t r;
    dp_rng_seed(&r, dp_planted_mix(seed ^ 0x6269617300000003ULL));
    p->bias = 0.5 * dp_planted_normal(&r);
    if (zipf > 0) {
        p->h_x1 = s_H(zipf, 1.5) - 1.0;
        p->h_n = s_H(zipf, (double)keys + 0.5);
        p->s = 2.0 - s_Hinv(zipf, s_H(zipf, 2.5) - s_h(zipf, 2.0));
    }
    uint64_t slots = 4;
    while (slots < 4 * (uint64_t)nnz) slots *= 2; /* load <= 1/4: short probes */
    p->set = dp_calloc(slots, sizeof *p->set);
    p->set_mask = slots - 1;
    p->filled = dp_malloc((size_t)nnz * sizeof *p->filled);
    return 0;
}

void dp_planted_fini(dp_planted_t *p)
{
    free(p->set), free(p->filled);
    p->set = p->filled = NULL;
}

double dp_planted_weight(const dp_planted_t *p, uint64_t key)
{
    /* Two 32-bit uniforms from one hash of (salt, key), Box-Muller. */
    uint64_t h = dp_planted_mix(dp_planted_mix(key) ^ p->weight_salt);
    double u1 = ((double)(h >> 32) + 0.5) * 0x1.0p-32, u2 = (double)(h & 0xffffffffu) * 0x1.0p-32;
    return p->sigma * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Insert rank; 1 if new, 0 if there already. */
static int s_insert(dp_planted_t *p, uint64_t rank, int *filled)
{
    uint64_t i = dp_planted_mix(rank) & p->set_mask;
    while (p->set[i]) {
        if (p->set[i] == rank) return 0;
        i = (i + 1) & p->set_mask;
    }
    p->set[i] = rank;
    p->filled[(*filled)++] = i;
    return 1;
}

int dp_planted_sample(dp_planted_t *p, dp_rng_t *rng, uint64_t *keys, float *values,
                      double *logit, int *label, char *err)
{
    int n = 0;
    /* Rejection of repeats; bounded so that a hopeless --nnz ends with a line. */
    uint64_t tries = 1000 + 64 * (uint64_t)p->nnz;
    while (n < p->nnz && tries-- > 0) {
        uint64_t rank = dp_planted_rank(p, rng);
        if (s_insert(p, rank, &n)) keys[n - 1] = dp_planted_key(p, rank);
    }
    for (int i = 0; i < n; i++) p->set[p->filled[i]] = 0;
    if (n < p->nnz)
        return dp_err(err, "could not draw %d distinct keys of %llu under --zipf %g: lower --nnz or --zipf",
                      p->nnz, (unsigned long long)p->keys, p->zipf);
    dp_libsvm_sort(keys, NULL, (size_t)n);
    double z = p->bias;
    for (int i = 0; i < n; i++) {
        values[i] = p->gauss ? (float)dp_planted_normal(rng) : 1.0f;
        z += dp_planted_weight(p, keys[i]) * (double)values[i];
    }
    *logit = z;
    *label = dp_planted_uniform(rng) < 1.0 / (1.0 + exp(-z));
    return 0;
}
