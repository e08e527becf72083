/* cartpole: CartPole-v1 as Gymnasium defines it (classic_control/
 * cartpole.py, after Barto, Sutton and Anderson 1983): a pole on a cart,
 * two actions (push left, push right with 10 N), Euler steps of 0.02 s,
 * reward 1 for every step taken (the terminating one included),
 * termination when |x| > 2.4 or |theta| > 12 degrees, truncation after
 * 500 steps; the first state uniform in [-0.05, 0.05) per component.
 * State and observation: x, x_dot, theta, theta_dot. */
#include "worker/exec/env/env.h"

#include <math.h>

#define S_GRAVITY 9.8
#define S_MASS_CART 1.0
#define S_MASS_POLE 0.1
#define S_TOTAL_MASS (S_MASS_POLE + S_MASS_CART)
#define S_LENGTH 0.5 /* half the pole's length */
#define S_POLEMASS_LENGTH (S_MASS_POLE * S_LENGTH)
#define S_FORCE 10.0
#define S_TAU 0.02
#define S_X_LIMIT 2.4
#define S_THETA_LIMIT (12 * 2 * M_PI / 360)

static void s_reset(double *s, dp_rng_t *r)
{
    for (int i = 0; i < 4; i++) s[i] = dp_env_uniform(r, -0.05, 0.05);
}

static void s_step(const double *s, int action, double *n, double *reward, int *terminated)
{
    double x = s[0], x_dot = s[1], theta = s[2], theta_dot = s[3];
    double force = action == 1 ? S_FORCE : -S_FORCE;
    double c = cos(theta), sn = sin(theta);
    /* Gymnasium's association, so that the bits agree: (k * (v * v)) * ... */
    double temp = (force + S_POLEMASS_LENGTH * (theta_dot * theta_dot) * sn) / S_TOTAL_MASS;
    double thetaacc = (S_GRAVITY * sn - c * temp) /
                      (S_LENGTH * (4.0 / 3.0 - S_MASS_POLE * (c * c) / S_TOTAL_MASS));
    double xacc = temp - S_POLEMASS_LENGTH * thetaacc * c / S_TOTAL_MASS;
    /* Euler, in Gymnasium's order: positions from the old velocities */
    n[0] = x + S_TAU * x_dot;
    n[1] = x_dot + S_TAU * xacc;
    n[2] = theta + S_TAU * theta_dot;
    n[3] = theta_dot + S_TAU * thetaacc;
    *terminated = n[0] < -S_X_LIMIT || n[0] > S_X_LIMIT || n[2] < -S_THETA_LIMIT || n[2] > S_THETA_LIMIT;
    *reward = 1.0;
}

static void s_observe(const double *s, float *obs)
{
    for (int i = 0; i < 4; i++) obs[i] = (float)s[i];
}

const dp_env_kind_t dp_env_cartpole_v1 = {
    .name = "cartpole-v1", .state_dim = 4, .obs_dim = 4, .n_actions = 2, .max_steps = 500,
    .solved = 475, .reward_lo = 1, .reward_hi = 1, .reset = s_reset, .step = s_step, .observe = s_observe,
};
