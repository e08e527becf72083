/* row_optim: the optimizers of a sparse row table (server/core/rows.h), one row
 * of D floats at a time, each row with its own state and its own step
 * count. Shared by the servers' row tables and, later, a worker library
 * that keeps rows of its own; plain C, no allocation.
 *
 * Lazy: a row is stepped only when a push carries its gradient, so a row
 * that is not in a push keeps its weights, its state and its step count.
 * Adam's bias correction therefore uses the row's own count t (the
 * "lazy Adam" of sparse embeddings), never the table's version.
 *
 * Per element i of the row (g the row's gradient, t the row's 1-based
 * count of steps including this one):
 *   sgd:      w -= lr g
 *   adagrad:  s += g^2;  w -= lr g / (sqrt(s) + eps)
 *   adam:     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *             w -= (lr / (1-b1^t)) m / (sqrt(v) / sqrt(1-b2^t) + eps)
 *             (kernels/optim.h's Adam, PyTorch's expression order)
 *   sparse_adam: torch.optim.SparseAdam's rule, for a table stepped as one
 *             parameter: t is the table's count of pushes (each worker
 *             step pushes to every shard, so it counts the steps, as
 *             SparseAdam's one count does), not the row's; PyTorch's
 *             order of operations, eps inside the bias correction:
 *             u = (g - m)(1-b1);  m += u;  q = (g^2 - v)(1-b2);  v += q;
 *             w += -(lr sqrt(1-b2^t) / (1-b1^t)) ((u + m_old) / (sqrt(q + v_old) + eps))
 *   ftrl:     FTRL-Proximal (McMahan et al. 2013, "Ad Click Prediction: a
 *             View from the Trenches", Algorithm 1), alpha = lr:
 *             sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;
 *             z += g - sigma w;  n += g^2;
 *             w = 0 if |z| <= l1, else
 *                 -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
 *             The stored w is always that closed form of (z, n), so a row
 *             starts at w = z = n = 0 (a seeded start would break it).
 * State per element: sgd none, adagrad s, adam and sparse_adam m and v,
 * ftrl z and n;
 * laid out [D] then [D] after the row's weights. */
#ifndef DP_ROW_OPTIM_H
#define DP_ROW_OPTIM_H

#include <stdint.h>

typedef enum {
    DP_ROW_SGD,
    DP_ROW_ADAGRAD,
    DP_ROW_ADAM,
    DP_ROW_FTRL,
    DP_ROW_SPARSE_ADAM, /* last: the kinds' numbers are in saved tables */
} dp_row_optim_kind_t;
#define DP_ROW_OPTIM_KINDS 5

typedef struct {
    dp_row_optim_kind_t kind;
    float lr;            /* sgd, adagrad, adam, sparse_adam: the step; ftrl: alpha */
    float eps;           /* adagrad, adam, sparse_adam */
    float beta1, beta2;  /* adam, sparse_adam */
    float ftrl_beta;     /* ftrl: beta of the per-coordinate rate (1 in the paper) */
    float l1, l2;        /* ftrl: the regularisation strengths */
} dp_row_optim_conf_t;

/* kind's defaults: lr (sgd 0.05, adagrad 0.01, adam 0.001, ftrl alpha
 * 0.05), eps 1e-8, betas 0.9 / 0.999, ftrl beta 1, l1 = l2 = 0. */
void dp_row_optim_conf_default(dp_row_optim_conf_t *c, dp_row_optim_kind_t kind);
/* -1 with err naming the field for a value out of range (lr <= 0, eps < 0,
 * betas outside [0, 1), l1 or l2 < 0, ftrl beta < 0, any non-finite). */
int dp_row_optim_check(const dp_row_optim_conf_t *c, char *err);
/* "sgd", "adagrad", "adam", "ftrl", "sparse_adam". */
const char *dp_row_optim_kind_name(dp_row_optim_kind_t k);
int dp_row_optim_parse_kind(const char *name, dp_row_optim_kind_t *out, char *err);
/* State floats per element of a row: 0 (sgd), 1 (adagrad), 2 (adam, sparse_adam, ftrl). */
int dp_row_optim_state_per_elem(dp_row_optim_kind_t k);
/* 1 when t is the table's push count (sparse_adam), 0 the row's own. */
int dp_row_optim_table_steps(dp_row_optim_kind_t k);
int dp_row_optim_state_per_elem(dp_row_optim_kind_t k);

/* One step of a row of d floats: w[d], its state (d floats per state
 * vector, laid [d] then [d]), g[d] finite. t is the step count including
 * this one (>= 1; the adams' bias correction): the row's, or the table's
 * where dp_row_optim_table_steps says so. */
void dp_row_optim_step(const dp_row_optim_conf_t *c, float *w, float *state, const float *g,
                       int d, uint32_t t);

#endif
