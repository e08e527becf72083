/* obs_norm: observation normalisation (kernels/ops.h), the obsnorm layer's
 * arithmetic. B x F floats a call, F an observation's few components: one
 * plain version serves as the reference and the CPU engine alike. */
#include <math.h>

#include "kernels/ops.h"

void dp_obs_norm_forward(float *out, const float *in, const float *mean, const float *var, int B, int F)
{
    for (int i = 0; i < F; i++) {
        /* statistics from a push, so from a peer: a negative variance (which no
         * merge makes) is taken as 0, never as a NaN in every worker's policy */
        float m = mean[i], inv = 1.0f / sqrtf((var[i] > 0 ? var[i] : 0) + DP_OBS_NORM_EPS);
        for (int n = 0; n < B; n++) {
            float v = (in[(size_t)n * F + i] - m) * inv;
            out[(size_t)n * F + i] = v > DP_OBS_NORM_CLIP ? DP_OBS_NORM_CLIP : v < -DP_OBS_NORM_CLIP ? -DP_OBS_NORM_CLIP : v;
        }
    }
}

void dp_obs_norm_update(float *mean, float *var, float *count, const float *in, int B, int F)
{
    if (B < 1) return;
    double n = *count > 0 ? *count : 0, b = B, total = n + b; /* a count from a peer: as above */
    for (int i = 0; i < F; i++) {
        double s = 0, ss = 0;
        for (int k = 0; k < B; k++) s += in[(size_t)k * F + i];
        double bm = s / b;
        for (int k = 0; k < B; k++) {
            double d = in[(size_t)k * F + i] - bm;
            ss += d * d;
        }
        /* Chan et al.'s pairwise merge of (n, mean, var) with the batch's */
        double delta = bm - mean[i];
        double m2 = (var[i] > 0 ? (double)var[i] : 0) * n + ss + delta * delta * n * b / total;
        mean[i] = (float)(mean[i] + delta * b / total);
        var[i] = (float)(m2 / total);
    }
    *count = (float)(total < DP_OBS_NORM_MAX_COUNT ? total : DP_OBS_NORM_MAX_COUNT);
}
