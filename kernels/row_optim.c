/* row_optim: the per-row optimizers of a sparse row table (row_optim.h
 * has the formulas). Element-wise over one row, in float, no allocation. */
#include "kernels/row_optim.h"

#include <math.h>
#include <string.h>

#include "common/util.h"

void dp_row_optim_conf_default(dp_row_optim_conf_t *c, dp_row_optim_kind_t kind)
{
    memset(c, 0, sizeof *c);
    c->kind = kind;
    switch (kind) {
    case DP_ROW_SGD: c->lr = 0.05f; break;
    case DP_ROW_ADAGRAD: c->lr = 0.01f; break;
    case DP_ROW_ADAM: c->lr = 0.001f; break;
    case DP_ROW_FTRL: c->lr = 0.05f; break;
    case DP_ROW_SPARSE_ADAM: c->lr = 0.001f; break;
    }
    c->eps = 1e-8f;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->ftrl_beta = 1.0f;
}

static const char *const s_names[DP_ROW_OPTIM_KINDS] = {"sgd", "adagrad", "adam", "ftrl",
                                                               "sparse_adam"};

const char *dp_row_optim_kind_name(dp_row_optim_kind_t k)
{
    return (unsigned)k < DP_ROW_OPTIM_KINDS ? s_names[k] : "?";
}

int dp_row_optim_parse_kind(const char *name, dp_row_optim_kind_t *out, char *err)
{
    for (int k = 0; k < DP_ROW_OPTIM_KINDS; k++)
        if (name && strcmp(name, s_names[k]) == 0) {
            *out = (dp_row_optim_kind_t)k;
            return 0;
        }
    return dp_err(err, "row optimizer '%s': sgd, adagrad, adam, sparse_adam or ftrl", name ? name : "");
}

int dp_row_optim_state_per_elem(dp_row_optim_kind_t k)
{
    switch (k) {
    case DP_ROW_SGD: return 0;
    case DP_ROW_ADAGRAD: return 1;
    case DP_ROW_ADAM:
    case DP_ROW_SPARSE_ADAM:
    case DP_ROW_FTRL: return 2;
    }
    return 0;
}

int dp_row_optim_table_steps(dp_row_optim_kind_t k)
{
    return k == DP_ROW_SPARSE_ADAM;
}

int dp_row_optim_check(const dp_row_optim_conf_t *c, char *err)
{
    if ((unsigned)c->kind >= DP_ROW_OPTIM_KINDS)
        return dp_err(err, "row optimizer kind %d: sgd, adagrad, adam, sparse_adam or ftrl", (int)c->kind);
    if (!isfinite(c->lr) || c->lr <= 0)
        return dp_err(err, "row optimizer lr %g: a finite number > 0", (double)c->lr);
    if (!isfinite(c->eps) || c->eps < 0)
        return dp_err(err, "row optimizer eps %g: a finite number >= 0", (double)c->eps);
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
        return dp_err(err, "row optimizer betas %g, %g: each in [0, 1)", (double)c->beta1,
                      (double)c->beta2);
    if (!isfinite(c->ftrl_beta) || c->ftrl_beta < 0)
        return dp_err(err, "ftrl beta %g: a finite number >= 0", (double)c->ftrl_beta);
    if (!isfinite(c->l1) || c->l1 < 0 || !isfinite(c->l2) || c->l2 < 0)
        return dp_err(err, "ftrl l1 %g, l2 %g: finite numbers >= 0", (double)c->l1,
                      (double)c->l2);
    return 0;
}

/* FTRL-Proximal's weight from its (z, n), McMahan et al. 2013 Algorithm 1. */
static inline float s_ftrl_w(float z, float n, float alpha, float beta, float l1, float l2)
{
    if (fabsf(z) <= l1) return 0.0f;
    float zs = z > 0 ? z - l1 : z + l1; /* z - sign(z) l1 */
    return -zs / ((beta + sqrtf(n)) / alpha + l2);
}

void dp_row_optim_step(const dp_row_optim_conf_t *c, float *w, float *state, const float *g,
                       int d, uint32_t t)
{
    const float lr = c->lr;
    switch (c->kind) {
    case DP_ROW_SGD:
        for (int i = 0; i < d; i++) w[i] -= lr * g[i];
        break;
    case DP_ROW_ADAGRAD: {
        float *s = state;
        for (int i = 0; i < d; i++) {
            float si = s[i] + g[i] * g[i];
            s[i] = si;
            w[i] -= lr * (g[i] / (sqrtf(si) + c->eps));
        }
        break;
    }
    case DP_ROW_ADAM: {
        if (t < 1) t = 1;
        const float b1 = c->beta1, b2 = c->beta2;
        const double bc1 = 1.0 - pow((double)b1, (double)t);
        const double bc2 = 1.0 - pow((double)b2, (double)t);
        const float step_size = (float)(lr / bc1);
        const float bc2_sqrt = (float)sqrt(bc2);
        float *m = state, *v = state + d;
        for (int i = 0; i < d; i++) {
            float mi = b1 * m[i] + (1.0f - b1) * g[i];
            float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
            m[i] = mi;
            v[i] = vi;
            w[i] -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + c->eps));
        }
        break;
    }
    case DP_ROW_SPARSE_ADAM: {
        /* torch.optim.SparseAdam (PyTorch 1.13's sparse_adam): its scalars
         * in double as Python computes them, then float as the tensors */
        if (t < 1) t = 1;
        const double b1 = c->beta1, b2 = c->beta2;
        const float c1 = (float)(1.0 - b1), c2 = (float)(1.0 - b2);
        const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
        const float step = (float)-((double)lr * sqrt(bc2) / bc1);
        float *m = state, *v = state + d;
        for (int i = 0; i < d; i++) {
            float u = (g[i] - m[i]) * c1, q = (g[i] * g[i] - v[i]) * c2;
            float numer = u + m[i], denom = sqrtf(q + v[i]) + c->eps;
            m[i] += u;
            v[i] += q;
            w[i] += step * (numer / denom);
        }
        break;
    }
    case DP_ROW_FTRL: {
        float *z = state, *n = state + d;
        for (int i = 0; i < d; i++) {
            float ni = n[i] + g[i] * g[i];
            float sigma = (sqrtf(ni) - sqrtf(n[i])) / lr;
            z[i] += g[i] - sigma * w[i];
            n[i] = ni;
            w[i] = s_ftrl_w(z[i], ni, lr, c->ftrl_beta, c->l1, c->l2);
        }
        break;
    }
    }
}
