/* rng: a small deterministic generator (xoshiro256**) so that every run with
 * the same seed draws the same weights, shuffles and delays on any machine. */
#ifndef DP_RNG_H
#define DP_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4]; /* xoshiro256** state, never all zero */
} dp_rng_t;

void dp_rng_seed(dp_rng_t *r, uint64_t seed);
/* The next 64 raw bits. */
uint64_t dp_rng_next(dp_rng_t *r);
/* Uniform in [0, 1). */
float dp_rng_uniform(dp_rng_t *r);
/* Uniform integer in [0, n). */
uint32_t dp_rng_below(dp_rng_t *r, uint32_t n);
/* Fisher-Yates shuffle of a[0..n). */
void dp_rng_shuffle(dp_rng_t *r, int *a, int n);

#endif
