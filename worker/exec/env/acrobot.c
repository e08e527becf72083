/* acrobot: Acrobot-v1 as Gymnasium defines it (classic_control/
 * acrobot.py, Sutton and Barto's "book" dynamics): two links, torque -1,
 * 0 or +1 on the joint between them, one RK4 step of 0.2 s per action,
 * angles wrapped to [-pi, pi] and velocities bounded to 4 pi and 9 pi,
 * reward -1 a step until the tip is above the bar (-cos(t1) - cos(t1 +
 * t2) > 1: terminated, reward 0), truncation after 500 steps; the first
 * state uniform in [-0.1, 0.1) per component. State: theta1, theta2,
 * dtheta1, dtheta2; observation: cos t1, sin t1, cos t2, sin t2, dt1, dt2. */
#include "worker/exec/env/env.h"

#include <math.h>

#define S_DT 0.2
#define S_L1 1.0   /* link 1's length */
#define S_M1 1.0
#define S_M2 1.0
#define S_LC1 0.5  /* the links' centres of mass */
#define S_LC2 0.5
#define S_I1 1.0   /* moments of inertia */
#define S_I2 1.0
#define S_G 9.8
#define S_MAX_VEL_1 (4 * M_PI)
#define S_MAX_VEL_2 (9 * M_PI)

static void s_reset(double *s, dp_rng_t *r)
{
    for (int i = 0; i < 4; i++) s[i] = dp_env_uniform(r, -0.1, 0.1);
}

/* d/dt of (theta1, theta2, dtheta1, dtheta2) under torque a. */
static void s_dsdt(const double *s, double a, double *d)
{
    double t1 = s[0], t2 = s[1], dt1 = s[2], dt2 = s[3];
    double d1 = S_M1 * S_LC1 * S_LC1 + S_M2 * (S_L1 * S_L1 + S_LC2 * S_LC2 + 2 * S_L1 * S_LC2 * cos(t2)) +
                S_I1 + S_I2;
    double d2 = S_M2 * (S_LC2 * S_LC2 + S_L1 * S_LC2 * cos(t2)) + S_I2;
    double phi2 = S_M2 * S_LC2 * S_G * cos(t1 + t2 - M_PI / 2.0);
    /* Gymnasium's association, so that the bits agree: squares first */
    double phi1 = -S_M2 * S_L1 * S_LC2 * (dt2 * dt2) * sin(t2) - 2 * S_M2 * S_L1 * S_LC2 * dt2 * dt1 * sin(t2) +
                  (S_M1 * S_LC1 + S_M2 * S_L1) * S_G * cos(t1 - M_PI / 2) + phi2;
    double ddt2 = (a + d2 / d1 * phi1 - S_M2 * S_L1 * S_LC2 * (dt1 * dt1) * sin(t2) - phi2) /
                  (S_M2 * S_LC2 * S_LC2 + S_I2 - d2 * d2 / d1);
    double ddt1 = -(d2 * ddt2 + phi1) / d1;
    d[0] = dt1, d[1] = dt2, d[2] = ddt1, d[3] = ddt2;
}

static double s_wrap(double x, double lo, double hi)
{
    double span = hi - lo;
    while (x > hi) x -= span;
    while (x < lo) x += span;
    return x;
}

static double s_bound(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static void s_step(const double *s, int action, double *n, double *reward, int *terminated)
{
    double a = (double)(action - 1); /* torques -1, 0, +1 */
    double k1[4], k2[4], k3[4], k4[4], y[4];
    const double h = S_DT, h2 = S_DT / 2;
    s_dsdt(s, a, k1);
    for (int i = 0; i < 4; i++) y[i] = s[i] + h2 * k1[i];
    s_dsdt(y, a, k2);
    for (int i = 0; i < 4; i++) y[i] = s[i] + h2 * k2[i];
    s_dsdt(y, a, k3);
    for (int i = 0; i < 4; i++) y[i] = s[i] + h * k3[i];
    s_dsdt(y, a, k4);
    for (int i = 0; i < 4; i++) n[i] = s[i] + h / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
    n[0] = s_wrap(n[0], -M_PI, M_PI);
    n[1] = s_wrap(n[1], -M_PI, M_PI);
    n[2] = s_bound(n[2], -S_MAX_VEL_1, S_MAX_VEL_1);
    n[3] = s_bound(n[3], -S_MAX_VEL_2, S_MAX_VEL_2);
    *terminated = -cos(n[0]) - cos(n[1] + n[0]) > 1.0;
    *reward = *terminated ? 0.0 : -1.0;
}

static void s_observe(const double *s, float *obs)
{
    obs[0] = (float)cos(s[0]);
    obs[1] = (float)sin(s[0]);
    obs[2] = (float)cos(s[1]);
    obs[3] = (float)sin(s[1]);
    obs[4] = (float)s[2];
    obs[5] = (float)s[3];
}

const dp_env_kind_t dp_env_acrobot_v1 = {
    .name = "acrobot-v1", .state_dim = 4, .obs_dim = 6, .n_actions = 3, .max_steps = 500,
    .solved = -100, .reward_lo = -1, .reward_hi = 0, .reset = s_reset, .step = s_step, .observe = s_observe,
};
