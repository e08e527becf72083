/* ps: one parameter-server shard — the library behind downpour-ps.
 *
 * A shard binds a ROUTER and runs a single-threaded zmq_poll loop (no locks,
 * server/loop/ps.c). It owns the contiguous float range [floor(i*n/K),
 * floor((i+1)*n/K)) of the flat parameter vector and the optimizer state of
 * that range (server/core/shard.h); a consistency policy decides what each push
 * and pull does (server/core/policy.h: sync with R gradients per step and backup
 * workers, async, ssp with staleness S); server/crew/members.h keeps who joined,
 * finished or went silent ("live" = not finished and heard from within
 * --heartbeat-timeout, default 5 s; workers send a HEARTBEAT every second
 * from start to exit, waiting or computing); server/core/shard_checkpoint.h
 * writes and restores the shard.
 *
 * Recovery: every reply carries this start's random incarnation; a push
 * with a step (Push.step) is applied once per (worker, step), a repeat is
 * acknowledged APPLIED with a "repeat:" reason and counted in "repeats";
 * the last step applied per worker is kept in the checkpoint and returned
 * in Welcome.worker_step; a step more than one past the highest handled
 * from that worker (--checkpoint-every more for its first push after a
 * restart) is refused with an ERROR, changing nothing; a request from a
 * connection that has not said HELLO gets ERROR ERR_UNKNOWN_WORKER (the
 * client says HELLO again).
 *
 * Every message is bounded (all its parts together at most a PUSH of this
 * shard's range plus an envelope) and validated (proto/wire.h + fingerprint,
 * shard range, finite values) before it touches state; a bad one gets an
 * ERROR reply (or an ACK "rejected" with the reason), is counted, and
 * changes nothing. */
#ifndef DP_PS_H
#define DP_PS_H

#include <signal.h>

#include "server/args.h"

/* What one worker id may hold at a shard (server/loop/ps.c): PARAMS replies
 * ZeroMQ has not sent yet (each references one buffer of the shard's
 * range; a pull beyond them is answered "busy"), and pulls held waiting
 * (one beyond them is refused). A worker has one request per shard in
 * flight, and at most two repeats of it. */
#define DP_PS_PARAMS_PER_WORKER 4
#define DP_PS_HELD_PER_WORKER 4

/* Run the shard until *stop_flag becomes non-zero or a SHUTDOWN arrives.
 * Writes the final checkpoint (if configured), closes its socket and
 * returns 0; -1 with err on a setup failure (bad model, bind failure,
 * corrupt checkpoint) or when the final checkpoint cannot be written.
 * stop_flag may be NULL. */
int dp_ps_run(const dp_ps_config_t *cfg, volatile sig_atomic_t *stop_flag, char *err);

#endif
