/* rng: xoshiro256** seeded through splitmix64, as its authors recommend. */
#include "common/rng.h"

static uint64_t s_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t s_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void dp_rng_seed(dp_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = s_splitmix(&seed);
}

uint64_t dp_rng_next(dp_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = s_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return result;
}

float dp_rng_uniform(dp_rng_t *r)
{
    return (float)(dp_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

uint32_t dp_rng_below(dp_rng_t *r, uint32_t n)
{
    /* Lemire's multiply-shift; the tiny bias is irrelevant for shuffling. */
    return (uint32_t)(((dp_rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

void dp_rng_shuffle(dp_rng_t *r, int *a, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)dp_rng_below(r, (uint32_t)(i + 1));
        int t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}
