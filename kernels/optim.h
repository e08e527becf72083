/* optim: optimizers over a flat float range, shared by the parameter server
 * (each shard steps its own range) and the standalone trainer.
 *
 * PyTorch's update rules, so results can be compared with torch.optim:
 *   g' = g + weight_decay * w
 *   sgd:       w -= lr * g'
 *   momentum:  v = mu * v + g';           w -= lr * v
 *   nesterov:  v = mu * v + g';           w -= lr * (g' + mu * v)
 *   nesterov with period N > 1 (the Delayed Nesterov, DN, of Liu et al.
 *   2024, "Asynchronous Local-SGD Training for Language Modeling",
 *   arXiv 2401.09135, Algorithm 3 with its momentum activation c = 0, the
 *   paper's default; --outer-optimizer delayed-nesterov):
 *              d += g';  w -= (lr / N) * g'               on every step, and
 *              on every N-th (t % N == 0): v = mu * v + d / N;  w -= lr * mu * v;  d = 0
 *   so N steps of the same gradient g move w exactly as one nesterov step
 *   by g (N pushes of one sync round), while the momentum, which stale
 *   pushes would otherwise accelerate N times a round, moves once
 *   (tests/unit/test_optim.c holds it against the paper's rule in doubles).
 *   adam:      m = b1 m + (1-b1) g';  s = b2 s + (1-b2) g'^2;
 *              w -= lr * (m / (1-b1^t)) / (sqrt(s / (1-b2^t)) + eps)
 *   adagrad:   s += g'^2;                 w -= lr * g' / (sqrt(s) + eps)
 *   rmsprop:   s = alpha s + (1-alpha) g'^2;  w -= lr * g' / (sqrt(s) + eps)
 *              (torch.optim.RMSprop with centered=False and momentum=0)
 * State is per element (0, 1 or 2 floats each), so any contiguous slice of
 * the parameter vector can be stepped on its own: sharding needs nothing
 * more. */
#ifndef DP_OPTIM_H
#define DP_OPTIM_H

#include <stddef.h>

typedef enum {
    DP_OPT_SGD,
    DP_OPT_MOMENTUM,
    DP_OPT_NESTEROV,
    DP_OPT_ADAM,
    DP_OPT_ADAGRAD,
    DP_OPT_RMSPROP,
} dp_optim_kind_t;
/* The kinds are 0 .. DP_OPT_KINDS - 1, for loops over every optimizer. */
#define DP_OPT_KINDS 6

typedef enum {
    DP_LR_CONSTANT,  /* lr */
    DP_LR_STEP,      /* lr * gamma^(floor(step / step_size)) */
    DP_LR_COSINE,    /* lr * 0.5 (1 + cos(pi * min(step, total) / total)) */
} dp_lr_kind_t;

/* Delay compensation (DC-ASGD, Zheng et al. ICML 2017), a transform of a
 * stale gradient g before the optimizer step, which it therefore composes
 * with: g' = g + lambda g*g*(w - w_bak), w the weights the step is applied
 * to, w_bak those the gradient was computed on (the parameter server keeps
 * them per worker: server/core/shard_dc.h). Adaptive (DC-ASGD-a): lambda =
 * lambda0 / sqrt(MS + 1e-7), MS = 0.95 MS + 0.05 g*g per element, updated
 * with this g first. */
typedef enum {
    DP_DC_OFF,
    DP_DC_CONST,     /* lambda constant */
    DP_DC_ADAPTIVE,  /* lambda0 / sqrt(MS + eps) */
} dp_dc_kind_t;
#define DP_DC_MS_DECAY 0.95f /* MS's decay (DC-ASGD-a's m) */
#define DP_DC_MS_EPS 1e-7f   /* added to MS under the root */

typedef struct {
    dp_optim_kind_t kind;
    float lr;            /* base learning rate; 0: the optimizer's default */
    float momentum;      /* momentum / nesterov mu */
    float beta1, beta2;  /* adam */
    float eps;           /* adam, adagrad, rmsprop */
    float alpha;         /* rmsprop: smoothing of the square average */
    float weight_decay;  /* L2, added to the gradient */
    dp_lr_kind_t schedule;
    long step_size;      /* DP_LR_STEP: steps between decays */
    float gamma;         /* DP_LR_STEP: decay factor */
    long total_steps;    /* DP_LR_COSINE: steps to reach 0 */
    long period;         /* nesterov: the momentum moves once per `period` steps (delayed
                          * Nesterov, above); 0 or 1: every step */
    dp_dc_kind_t dc;     /* delay compensation (the parameter server's; off elsewhere) */
    float dc_lambda;     /* DP_DC_CONST: lambda; DP_DC_ADAPTIVE: lambda0 */
} dp_optim_conf_t;

/* The project's defaults, for the standalone trainer and the parameter
 * server alike: adam, lr 0 (= the optimizer's default, below), momentum 0.9,
 * adam betas 0.9/0.999, eps 1e-8, rmsprop alpha 0.99 (PyTorch's; A3C's
 * shared RMSProp used eps 0.1), constant schedule. Adam is the default
 * because it measured the most robust to the staleness of asynchronous
 * updates (BENCHMARKS.md, "accuracy"). */
void dp_optim_conf_default(dp_optim_conf_t *c);
/* The learning rate an optimizer gets when none is given: adam 0.0015,
 * adagrad and rmsprop 0.01 (PyTorch's), sgd / momentum / nesterov 0.05.
 * (Adam's 0.0015, not PyTorch's 0.001: on the default network and
 * Fashion-MNIST it measured better after one epoch in every mode;
 * BENCHMARKS.md.) */
float dp_optim_default_lr(dp_optim_kind_t k);
/* An actor-critic run's (--env) Adam learning rate when none is given:
 * 0.0007, not the image trainer's 0.0015. Measured in real processes
 * (downpour local --env, 2 async workers, 500 k env steps, --reward-scale
 * 0.1): on cartpole-v1 0.0015 left 1 greedy policy of 5 short of 500 and
 * the last 100 episodes at 338-488, 0.0007 every greedy policy at 500 and
 * 469-484; acrobot-v1 likewise (docs/LAB.md, "Defaults", has the runs). */
#define DP_OPTIM_AC_ADAM_LR 0.0007f
/* c->lr set to DP_OPTIM_AC_ADAM_LR when it is 0 (not given) and c is Adam:
 * what every program that runs an actor-critic model calls (the worker,
 * the servers told --env, downpour local, the simulator). */
void dp_optim_actor_critic_default(dp_optim_conf_t *c);
/* c->lr, or the optimizer's default when c->lr is 0. */
float dp_optim_base_lr(const dp_optim_conf_t *c);
/* "sgd", "momentum", "nesterov", "adam", "adagrad", "rmsprop". */
int dp_optim_parse_kind(dp_optim_conf_t *c, const char *name, char *err);
/* "constant", "step:STEP_SIZE:GAMMA", "cosine:TOTAL_STEPS". */
int dp_optim_parse_schedule(dp_optim_conf_t *c, const char *text, char *err);
const char *dp_optim_kind_name(dp_optim_kind_t k);
/* --delay-compensation: "off", "const:LAMBDA" or "adaptive:LAMBDA0", each
 * lambda a finite number in [0, 1e6]. */
int dp_optim_parse_dc(dp_optim_conf_t *c, const char *text, char *err);
/* c's compensation as that text ("off", "const:2", "adaptive:0.04"), the
 * lambda as dp_optim_float_text writes it. */
void dp_optim_dc_name(const dp_optim_conf_t *c, char *out, size_t n);
/* x as the shorter of %g and %.9g that reads back as the same float. */
void dp_optim_float_text(float x, char *out, size_t n);

/* State floats per parameter for this optimizer (0, 1 or 2). */
int dp_optim_state_per_param(dp_optim_kind_t k);
/* The same for a configuration: delayed Nesterov keeps its buffer d too. */
int dp_optim_state_floats(const dp_optim_conf_t *c);

/* The outer optimizer of local steps (--outer-optimizer, --outer-lr,
 * --outer-momentum; DiLoCo, Douillard et al. 2023): "sgd" is averaging,
 * at lr 1 by default; "nesterov" DiLoCo's, lr 0.7 by default, its momentum
 * moving on every step; "delayed-nesterov" the same with period `every`
 * (Liu et al.'s DN, above; every <= 1: the plain rule, and its lr), at lr
 * 0.5 by default: each push's delta is a worker's own, taken on weights the
 * others have moved since, and a smaller step pays for that (two PyTorch
 * workers, docs/EXPERIMENTS.md section 6: 0.8649 mean test accuracy over 4
 * runs at 0.5 against 0.8411 at 0.7, sync at 0.7 0.8582); lr 0: that
 * default. Constant schedule. -1 with err for another name. */
#define DP_OPTIM_DELAYED_NESTEROV "delayed-nesterov"
#define DP_OPTIM_OUTER_NESTEROV_LR 0.7f
#define DP_OPTIM_OUTER_DELAYED_LR 0.5f
int dp_optim_outer(const char *name, float lr, float momentum, long every, dp_optim_conf_t *out,
                   char *err);
/* The outer optimizer's name as --outer-optimizer takes it: "sgd",
 * "nesterov", or "delayed-nesterov" for a period > 1. */
const char *dp_optim_outer_name(const dp_optim_conf_t *c);

/* Learning rate at (0-based) step under c's schedule. */
float dp_optim_lr_at(const dp_optim_conf_t *c, long step);

/* One update of w[0..n) by g with learning rate lr (already scheduled and,
 * for async, staleness-scaled). state holds n * dp_optim_state_per_param
 * floats laid [n] then [n], zero at start. t is the 1-based count of updates
 * of this range (Adam's bias correction). */
void dp_optim_step(const dp_optim_conf_t *c, float lr, float *w, const float *g, float *state,
                   size_t n, long t);
/* The same step on elements [lo, hi) only, of vectors of n_all elements
 * (state laid [n_all] then [n_all]): a thread's share of a parallel step. */
void dp_optim_step_range(const dp_optim_conf_t *c, float lr, float *w, const float *g,
                         float *state, size_t n_all, size_t lo, size_t hi, long t);
/* The same step from other vectors: w and state (state floats per
 * parameter vectors of n_all) made from w_from and state_from, which are
 * left as they were. w_from may be w and state_from state (that one in
 * place); vectors apart must not overlap any other. The same bits as
 * copying w_from and state_from in and stepping in place, without the
 * copies' passes (a parameter server's next version, written beside the
 * live one: BENCHMARKS.md, "1 PS + 1 worker"). state and state_from are
 * not read for an optimizer without state (NULL then). */
void dp_optim_step_from(const dp_optim_conf_t *c, float lr, float *w, const float *w_from,
                        const float *g, float *state, const float *state_from, size_t n_all,
                        size_t lo, size_t hi, long t);

/* Delay compensation on elements [lo, hi) of a shard's range (every
 * pointer indexes that range from 0): out = g + lambda g*g*(w - w_bak),
 * for DP_DC_ADAPTIVE with ms (n floats, zero at start) updated first and
 * lambda = dc_lambda / sqrtf(ms + DP_DC_MS_EPS) per element. out may be g.
 * w_bak NULL (the weights the gradient was computed on are not known):
 * out is not written, only ms is updated (adaptive), so MS follows every
 * gradient whether or not it could be compensated. Nothing for DP_DC_OFF. */
void dp_optim_dc_range(const dp_optim_conf_t *c, float *out, const float *g, const float *w,
                       const float *w_bak, float *ms, size_t lo, size_t hi);

#endif
