/* ac_row: one row of the actor-critic loss (kernels/ops.h,
 * dp_ac_loss_forward), shared by the CPU's kernels/ac_loss.c and the CUDA
 * kernels of kernels/cuda/ops_gpu.cu, so that both compute it by one
 * text: in double, the max taken out. */
#ifndef DP_AC_ROW_H
#define DP_AC_ROW_H

#include <math.h>

#ifdef __CUDACC__
#define DP_AC_HD __host__ __device__
#else
#define DP_AC_HD
#endif

/* log pi[0..A) of one row of logits, and pi; returns the row's entropy. */
static inline DP_AC_HD double dp_ac_row_log_softmax(const float *z, int A, double *logp, double *p)
{
    double mx = z[0], sum = 0, h = 0;
    for (int k = 1; k < A; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < A; k++) sum += exp((double)z[k] - mx);
    double lse = log(sum);
    for (int k = 0; k < A; k++) {
        logp[k] = (double)z[k] - mx - lse;
        p[k] = exp(logp[k]);
        h -= p[k] * logp[k];
    }
    return h;
}

/* The gradient of one row of a batch of B: dz[0..A) and *dv, for action a
 * and return ret (logp, p, h: the row's log softmax). */
static inline DP_AC_HD void dp_ac_row_grad(float *dz, float *dv, const double *logp,
                                           const double *p, double h, float v, int a, float ret,
                                           int B, int A, float beta, float vcoef)
{
    double adv = (double)ret - v;
    for (int k = 0; k < A; k++) {
        /* -adv d log pi(a) / dz_k  -  beta dH / dz_k, dH / dz_k = -pi_k (log pi_k + H) */
        double g = -adv * ((k == a) - p[k]) + beta * p[k] * (logp[k] + h);
        dz[k] = (float)(g / B);
    }
    *dv = (float)(2.0 * vcoef * ((double)v - ret) / B);
}

#endif
