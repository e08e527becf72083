/* a3c_train: the rl kind (worker/train/driver.h's dp_train_rl), what
 * downpour-worker runs with --env (worker/exec/a3c.h): A3C's learner
 * standalone (one worker, its own --optimizer: the baseline) or against the
 * servers (async is A3C, sync A2C, ssp and the delay rules as for any
 * push). Both stop after --env-steps environment steps; the chief
 * (standalone: the one worker) then runs its greedy policy over 100 fresh
 * episodes (test_return), saves --save and writes --summary (its
 * dp_rl_summary_t, worker/train/train.h). */
#ifndef DP_A3C_TRAIN_H
#define DP_A3C_TRAIN_H

#include <signal.h>

#include "worker/train/train.h"

#define DP_A3C_TEST_EPISODES 100 /* test_return: the greedy policy over this many */

#endif
