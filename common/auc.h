/* auc: the exact area under the ROC curve of scores against 0/1 labels,
 * as the Mann-Whitney statistic: the fraction of (positive, negative)
 * pairs the scores order correctly, a tie counted half. O(n log n): the
 * pairs sorted by score once, then one walk over groups of equal scores. */
#ifndef DP_AUC_H
#define DP_AUC_H

#include <stddef.h>

/* *auc from score[0..n) and label[0..n) (each 0 or 1). -1 with err when a
 * label is neither, a score is NaN, or one class is missing (the AUC is
 * then undefined). Allocates n pairs for the sort (an evaluation, not a
 * training step). */
int dp_auc(const float *score, const float *label, size_t n, double *auc, char *err);

#endif
