/* a3c_train: what downpour-worker runs with --env (worker/a3c.h): A3C's
 * learner standalone (one worker, its own --optimizer: the baseline) or
 * against the servers (async is A3C, sync A2C, ssp and the delay rules as
 * for any push). Both stop after --env-steps environment steps; the chief
 * (standalone: the one worker) then runs its greedy policy over 100 fresh
 * episodes (test_return), saves --save and writes --summary. */
#ifndef DP_A3C_TRAIN_H
#define DP_A3C_TRAIN_H

#include <signal.h>

#include "worker/train.h"

/* 0 when done (or stopped by *stop: the model saved, no summary), -1 with err. */
int dp_a3c_standalone(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err);
int dp_a3c_distributed(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err);

#endif
