/* staleness: the distribution of a run's staleness values — counts per
 * value (the histogram summary.json carries), their mean and maximum, and
 * the geometric law fitted to them.
 *
 * Why a geometric fit: with M workers whose compute times are exponential
 * (memoryless), the pushes that land while one worker computes are a
 * sequence of independent draws of "which worker finishes next", so the
 * staleness of a push is geometric on {0, 1, ...} with P(0) = 1/M and mean
 * M - 1. The fitted p (the maximum-likelihood 1 / (1 + mean)) is therefore
 * "1 / effective workers", and how far the histogram departs from the
 * geometric law says how far the cluster is from that picture (a straggler,
 * a staleness bound).
 *
 * Values above DP_STALENESS_CAP - 1 are counted in the last bin (their
 * exact value still goes into the mean and the maximum). */
#ifndef DP_STALENESS_H
#define DP_STALENESS_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define DP_STALENESS_CAP 65536
/* Bins a parameter server's STATS reply carries (the last: that or more). */
#define DP_STATS_HIST_BINS 1024

typedef struct {
    uint64_t *count;     /* count[v]: values v seen (the last bin: v >= cap - 1) */
    size_t bins;         /* allocated bins; grows up to DP_STALENESS_CAP */
    uint64_t total;      /* values seen */
    uint64_t sum;        /* their sum (exact values) */
    uint64_t max;        /* the largest */
} dp_staleness_t;

/* Empty; init allocates nothing, fini is safe on a zeroed histogram. */
void dp_staleness_init(dp_staleness_t *h);
void dp_staleness_fini(dp_staleness_t *h);
void dp_staleness_add(dp_staleness_t *h, uint64_t value);
/* n values equal to value. */
void dp_staleness_add_n(dp_staleness_t *h, uint64_t value, uint64_t n);
/* dst += src. */
void dp_staleness_merge(dp_staleness_t *dst, const dp_staleness_t *src);

/* Mean (0 when empty) and the share of zeros ("fresh"; 0 when empty). */
double dp_staleness_mean(const dp_staleness_t *h);
double dp_staleness_fresh(const dp_staleness_t *h);
/* The geometric law's p fitted by maximum likelihood: 1 / (1 + mean); 1
 * when empty (no staleness seen). */
double dp_staleness_geometric_p(const dp_staleness_t *h);

/* The bins in use folded into out[0, n) (values >= n - 1 counted in the
 * last one); returns the bins used. */
size_t dp_staleness_fold(const dp_staleness_t *h, uint64_t *out, size_t n);

/* The counts as a JSON array, index = staleness, up to the largest bin in
 * use ([] when empty). */
cJSON *dp_staleness_json(const dp_staleness_t *h);
/* The reverse, for readers of summary.json and tests: -1 with err when arr
 * is not an array of non-negative integers. */
int dp_staleness_from_json(dp_staleness_t *h, const cJSON *arr, char *err);

#endif
