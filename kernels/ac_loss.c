/* ac_loss: the actor-critic loss of A3C / A2C and global-norm clipping
 * (kernels/ops.h). Small next to the network's layers (B x A floats), so
 * one plain version serves as the reference and the CPU engine alike. */
#include <math.h>

#include "common/model.h"
#include "kernels/ac_row.h"
#include "kernels/ops.h"

_Static_assert(DP_AC_MAX_ACTIONS >= DP_MODEL_MAX_ACTIONS, "every ac:A head fits the loss");

float dp_ac_loss_forward(float *probs, const float *logits, const float *value, const int *action,
                         const float *ret, int B, int A, float beta, float vcoef, dp_ac_parts_t *parts)
{
    double lp[DP_AC_MAX_ACTIONS], p[DP_AC_MAX_ACTIONS];
    double pol = 0, val = 0, ent = 0;
    for (int n = 0; n < B; n++) {
        double h = dp_ac_row_log_softmax(logits + (size_t)n * A, A, lp, p);
        for (int k = 0; k < A; k++) probs[(size_t)n * A + k] = (float)p[k];
        double adv = (double)ret[n] - value[n];
        pol += -adv * lp[action[n]];
        val += adv * adv;
        ent += h;
    }
    pol /= B, val /= B, ent /= B;
    if (parts) *parts = (dp_ac_parts_t){pol, val, ent};
    return (float)(pol + vcoef * val - beta * ent);
}

void dp_ac_policy(float *probs, const float *logits, int B, int A)
{
    double lp[DP_AC_MAX_ACTIONS], p[DP_AC_MAX_ACTIONS];
    for (int n = 0; n < B; n++) {
        dp_ac_row_log_softmax(logits + (size_t)n * A, A, lp, p);
        for (int k = 0; k < A; k++) probs[(size_t)n * A + k] = (float)p[k];
    }
}

void dp_ac_loss_backward(float *dlogits, float *dvalue, const float *logits, const float *value,
                         const int *action, const float *ret, int B, int A, float beta, float vcoef)
{
    double lp[DP_AC_MAX_ACTIONS], p[DP_AC_MAX_ACTIONS];
    for (int n = 0; n < B; n++) {
        double h = dp_ac_row_log_softmax(logits + (size_t)n * A, A, lp, p);
        dp_ac_row_grad(dlogits + (size_t)n * A, dvalue + n, lp, p, h, value[n], action[n], ret[n],
                       B, A, beta, vcoef);
    }
}

void dp_ac_returns(float *ret, const float *reward, const unsigned char *end, const float *cut_value,
                   int T, float gamma, float bootstrap)
{
    double next = bootstrap;
    for (int t = T - 1; t >= 0; t--) {
        if (end[t] == DP_AC_TERMINATED) next = 0;
        else if (end[t] == DP_AC_TRUNCATED) next = cut_value[t];
        next = (double)reward[t] + (double)gamma * next;
        ret[t] = (float)next;
    }
}

double dp_clip_global_norm(float *g, size_t n, double max_norm)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    double norm = sqrt(ss);
    if (max_norm > 0 && norm > max_norm) {
        /* PyTorch's clip_grad_norm_: times max / (norm + 1e-6) */
        float scale = (float)(max_norm / (norm + 1e-6));
        for (size_t i = 0; i < n; i++) g[i] *= scale;
    }
    return norm;
}
