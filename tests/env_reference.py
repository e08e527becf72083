#!/usr/bin/python3
"""env_reference: the expected states of tests/unit/test_env.c, from
Gymnasium's own CartPoleEnv and AcrobotEnv (not a Debian package: run it
where Gymnasium is installed, or with its source tree on PYTHONPATH).

    python3 tests/env_reference.py

Each case sets env.state to the test's start, takes the test's actions and
prints the state after each listed step with %.17g, the rewards' sum and
the step the episode ended at.
"""
import numpy as np
from gymnasium.envs.classic_control.acrobot import AcrobotEnv
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

CASES = [  # env, start, policy(state, k), max steps, steps to print
    ("cartpole alternate", CartPoleEnv, (0.01, -0.02, 0.03, 0.04), lambda s, k: (k + 1) % 2, 10, (1, 2, 3, 10)),
    ("cartpole right", CartPoleEnv, (0.01, -0.02, 0.03, 0.04), lambda s, k: 1, 500, (2, 3, 10)),
    ("acrobot fixed", AcrobotEnv, (0.05, -0.03, 0.02, 0.01),
     lambda s, k: [0, 1, 2, 2, 1, 0, 0, 2, 1, 2][k], 10, (1, 2, 3, 10)),
    ("acrobot pump", AcrobotEnv, (0.05, -0.03, 0.02, 0.01), lambda s, k: 2 if s[3] > 0 else 0, 500, (73,)),
]

for name, make, start, policy, limit, show in CASES:
    env = make()
    env.reset(seed=0)
    env.state = np.array(start, dtype=np.float64)
    total, k, done = 0.0, 0, False
    while not done and k < limit:
        _, r, done, _, _ = env.step(policy(env.state, k))
        total, k = total + r, k + 1
        if k in show:
            print(f"{name}: step {k}: {{" + ", ".join("%.17g" % v for v in env.state) + "}")
    print(f"{name}: ended at step {k} ({'terminated' if done else 'not terminated'}), return {total:g}")
