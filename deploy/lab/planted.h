/* planted: sparse data of known truth — a planted sparse logistic model,
 * the generator behind `downpour gen-libsvm` (deploy/lab/gen_libsvm.c).
 *
 * A sample has nnz distinct keys. Each is a rank in [1, K] drawn from a
 * Zipf law of exponent s (rank r with probability r^-s / H(K, s); s = 0 is
 * uniform), by rejection-inversion (Hörmann & Derflinger 1996): O(1) per
 * draw with no table, so K can be 2^40 or 2^64 - 1. The rank is mapped to
 * its key by a seeded bijection of the 64-bit integers (dp_planted_key),
 * so the frequent keys are spread over the whole range, as hashed features
 * are. A key's value is 1, or N(0, 1) with gauss.
 *
 * The truth: a weight per key, N(0, sigma^2) as a pure function of (seed,
 * key) (no table of K weights), sigma = signal / sqrt(nnz) so that w.x has
 * standard deviation `signal`, and a bias drawn from the seed; a sample's
 * label is Bernoulli(sigmoid(w.x + b)). Everything is a function of the
 * seed and the draws of the caller's rng: the same seed, the same samples. */
#ifndef DP_PLANTED_H
#define DP_PLANTED_H

#include <stdint.h>

#include "common/rng.h"

typedef struct {
    uint64_t keys;        /* K: ranks 1..K */
    double zipf;          /* the exponent s (0: uniform) */
    int nnz;              /* features per sample, distinct, <= K */
    int gauss;            /* values N(0, 1); else 1 */
    double sigma;         /* the weights' standard deviation */
    double bias;          /* b */
    uint64_t key_salt;    /* rank -> key: dp_planted_mix(rank + key_salt) */
    uint64_t weight_salt; /* key -> weight: hashed with this */
    double h_x1, h_n, s;  /* rejection-inversion's constants (zipf > 0) */
    /* a sample's scratch, allocated once: the distinct-rank set */
    uint64_t *set;        /* [set_mask + 1] open addressing, 0 = empty (ranks >= 1) */
    uint64_t set_mask;
    uint64_t *filled;     /* [nnz] the slots set for this sample, cleared after it */
} dp_planted_t;

/* -1 with err when nnz > keys or the numbers are out of their ranges
 * (zipf in [0, 10], signal in [0, 100], nnz >= 1). */
int dp_planted_init(dp_planted_t *p, uint64_t seed, uint64_t keys, double zipf, int nnz, int gauss,
                    double signal, char *err);
void dp_planted_fini(dp_planted_t *p);

/* A bijection of the 64-bit integers (splitmix64's finalizer) and its
 * inverse. */
uint64_t dp_planted_mix(uint64_t x);
uint64_t dp_planted_unmix(uint64_t x);
/* Rank in [1, K] from the Zipf law (one or more draws of rng). */
uint64_t dp_planted_rank(const dp_planted_t *p, dp_rng_t *rng);
/* The key of a rank. */
static inline uint64_t dp_planted_key(const dp_planted_t *p, uint64_t rank)
{
    return dp_planted_mix(rank + p->key_salt);
}
/* The planted weight of a key. */
double dp_planted_weight(const dp_planted_t *p, uint64_t key);
/* A uniform double in [0, 1) and a standard normal, from rng. */
double dp_planted_uniform(dp_rng_t *rng);
double dp_planted_normal(dp_rng_t *rng);

/* One sample: keys[nnz] (ascending) and values[nnz], its logit w.x + b and
 * its label (0 or 1). -1 with err when nnz distinct keys could not be
 * drawn in a bounded number of tries (nnz too close to K under a steep law). */
int dp_planted_sample(dp_planted_t *p, dp_rng_t *rng, uint64_t *keys, float *values,
                      double *logit, int *label, char *err);

#endif
