/* auc: Mann-Whitney U over (score, label) pairs sorted by score (auc.h).
 *
 * For each group of equal scores, every positive in it beats the negatives
 * of all lower groups and ties with the group's own negatives:
 *   U = sum over groups of pos_g * (neg_below + neg_g / 2),  AUC = U / (P N).
 * The sums are counted in integers (halves doubled) so no rounding creeps in
 * before the one division. */
#include "common/auc.h"

#include <stdint.h>
#include <stdlib.h>

#include "common/util.h"

typedef struct {
    float score; /* the model's output */
    int pos;     /* label 1 */
} s_pair_t;

static int s_by_score(const void *a, const void *b)
{
    float x = ((const s_pair_t *)a)->score, y = ((const s_pair_t *)b)->score;
    return (x > y) - (x < y);
}

int dp_auc(const float *score, const float *label, size_t n, double *auc, char *err)
{
    uint64_t npos = 0;
    for (size_t i = 0; i < n; i++) {
        if (label[i] != 0 && label[i] != 1)
            return dp_err(err, "auc: label %g of sample %zu is not 0 or 1", (double)label[i], i);
        /* NaN: the sort's order and the walk's groups would be undefined */
        if (score[i] != score[i]) return dp_err(err, "auc: score of sample %zu is NaN", i);
        npos += label[i] == 1;
    }
    uint64_t nneg = n - npos;
    if (npos == 0 || nneg == 0)
        return dp_err(err, "auc: undefined with %s only (%zu samples)", npos ? "positives" : "negatives", n);
    s_pair_t *p = dp_malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (s_pair_t){score[i], label[i] == 1};
    qsort(p, n, sizeof *p, s_by_score);
    /* u2 = 2 U in a long double: exact while it stays below 2^64 (n below
     * about 2^32), where a uint64_t product could overflow. */
    long double u2 = 0;
    uint64_t neg_below = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        uint64_t pos_g = 0, neg_g = 0;
        for (; j < n && p[j].score == p[i].score; j++) {
            pos_g += (uint64_t)p[j].pos;
            neg_g += (uint64_t)!p[j].pos;
        }
        u2 += (long double)pos_g * (long double)(2 * neg_below + neg_g);
        neg_below += neg_g;
        i = j;
    }
    free(p);
    *auc = (double)(u2 / (2.0L * (long double)npos * (long double)nneg));
    return 0;
}
