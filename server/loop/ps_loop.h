/* ps_loop: the state of downpour-ps's event loop and what the files of
 * the loop share. server/loop/ps.h is the loop's interface and
 * server/loop/ps.c says its invariants; the loop is eight files, one job
 * each:
 *   ps.c           receiving under the limits, dispatch, held pulls, pushes
 *                  (whole and in parts), BARRIER, setup, the loop
 *   ps_msgs.c      the message table: each request type, who may send it
 *                  (server/loop/auth.h) and its handler; admission and
 *                  dispatch both read it
 *   ps_admit.c     who and what may reach a handler: the model checks (a
 *                  HELLO's model, every other request's fingerprint; refused
 *                  with ERR_MODEL_MISMATCH), the worker id's claim at HELLO
 *                  and its authority after, the WELCOME
 *   ps_reply.c     the replies: ERROR, PARAMS (the live buffer lent to
 *                  ZeroMQ), ACK
 *   ps_admin.c     the shard's account: checkpoints (when due, at start, at
 *                  the end), metrics lines, STATS, SHUTDOWN, HEARTBEAT
 *   ps_rows_wire.c the row table's requests (ROWS_PULL, ROWS_PUSH) on the
 *                  wire; their rules are server/core/ps_rows.h
 *   ps_deal.c      shard 0 dealing an elastic crew's batches: who sets the
 *                  plan, the batch of a pull, a push's fate, leases
 *   ps_shm.c       the shared-memory segments of co-located workers
 *   ps_devregion.c the device region of co-located workers (proto/devregion.h)
 * (auth.c: who may speak for a worker id, the chief's rule.)
 * Nothing else includes this header, but the unit tests that drive the
 * loop's state. */
#ifndef DP_PS_LOOP_H
#define DP_PS_LOOP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/dylu.h"
#include "common/episodes.h"
#include "common/metrics.h"
#include "proto/curve.h"
#include "proto/wire_zmq.h"
#include "server/core/account.h"
#include "server/core/policy.h"
#include "server/core/ps_rows.h"
#include "server/core/record.h"
#include "server/core/shard.h"
#include "server/core/shard_checkpoint.h"
#include "server/core/shard_early.h"
#include "server/core/shard_parts.h"
#include "server/crew/deal.h"
#include "server/crew/members.h"
#include "server/crew/membership.h"
#include "server/loop/auth.h"
#include "server/loop/ps.h"
#include "server/loop/ps_devregion.h"
#include "server/loop/ps_shm.h"

/* Replies ZeroMQ may queue per peer before the ROUTER drops further ones to
 * it (ZMQ_ROUTER_MANDATORY is off: a peer that does not read loses replies,
 * the shard never blocks on it). A worker reads every reply: it has one
 * request per shard in flight and its heartbeat answers, so a queue this
 * long only fills behind a peer that stopped reading. */
#define DP_PS_SNDHWM 16

/* A PARAMS reply lent to ZeroMQ: DP_PS_PARAMS_PER_WORKER of them per worker
 * id, so the buffers a peer that does not read pins are bounded. A reply in
 * parts is one loan: every part's frame points into the same buffer. */
typedef struct {
    dp_snap_t *snap;       /* the buffer sent (its reference), while busy */
    atomic_int frames;     /* its frames ZeroMQ still holds (set before the first is sent) */
    atomic_int busy;       /* 1 from the send until ZeroMQ's free callback of its last frame
                            * (I/O thread) */
} dp_ps_lent_t;

/* How a PARAMS reply carries the tensor (the PULL asked). */
typedef enum {
    DP_PS_PARAMS_CRC,      /* a frame with its CRC-32 */
    DP_PS_PARAMS_NO_CRC,   /* a frame without one (Pull.no_checksum) */
    DP_PS_PARAMS_SHM,      /* the live slot of the shared segment (Envelope.shm), else as NO_CRC */
    DP_PS_PARAMS_DEVREGION, /* the newest entry of the device region's ring (Envelope.devregion),
                             * else (the ring busy) as NO_CRC */
} dp_ps_params_how_t;

/* What a PULL asked of its reply. */
typedef struct {
    dp_ps_params_how_t how;
    int bf16;              /* bfloat16 frames (Pull.dtype) */
    uint32_t n_cuts;       /* a reply in n_cuts + 1 parts (Pull.cuts; 0: whole) */
    uint64_t cuts[DP_WIRE_MAX_PULL_PARTS - 1];
} dp_ps_params_ask_t;
_Static_assert(DP_WIRE_MAX_PULL_PARTS <= DP_PS_SNDHWM / 2,
               "a reply in parts fits the per-peer send queue with room for other replies");

/* Epochs a STATS reply accounts for (the last ones): some 25 bytes each,
 * well inside an envelope (DP_WIRE_MAX_ENVELOPE). */
#define DP_PS_STATS_EPOCHS 4096

typedef struct {
    zmq_msg_t identity;    /* ROUTER identity to answer */
    uint64_t request_id;
    int worker;
    uint64_t min_version;  /* sync: answer once the version is >= this */
    dp_ps_params_ask_t ask;
    uint64_t deal_step;    /* the dealer's batch for this push step goes with it (0: none) */
} dp_ps_pending_t;

/* The loop's state, one per dp_ps_run. */
typedef struct {
    const dp_ps_config_t *cfg;
    dp_shard_t shard;
    dp_members_t members;
    dp_membership_t membership; /* the crew's joins and leaves (metrics, STATS) */
    dp_policy_t *policy;
    dp_ps_pending_t *pending;  /* held pulls, in arrival order: DP_PS_HELD_PER_WORKER per worker */
    int n_pending;
    int *held;             /* per worker: its pulls in pending */
    dp_ps_lent_t *lent;        /* per worker DP_PS_PARAMS_PER_WORKER: PARAMS frames ZeroMQ holds */
    void *ctx, *sock;
    size_t max_msg;        /* bytes of the largest message accepted, all parts */
    uint64_t net_errors;   /* ZeroMQ calls that failed inside the loop */
    char endpoint[256];
    char ckpt_path[DP_PS_PATH_LEN + 64];
    uint64_t ckpt_version; /* version last written (UINT64_MAX: none) */
    uint64_t ckpt_failures; /* checkpoint writes that failed (metrics, stop line) */
    dp_ckpt_run_t run;     /* the run the checkpoints belong to; .finished as last written */
    dp_metrics_t *metrics; /* JSON lines; a no-op without --metrics */
    dp_record_t *rec;      /* --record: the schedule, or NULL */
    double next_metrics;
    int quit;              /* SHUTDOWN received */
    dp_auth_t auth;        /* worker ids bound to connections / keys, the chief's token */
    dp_zap_t *zap;         /* CURVE: the gate (NULL without --curve-secret) */
    const char *peer_key;  /* CURVE: User-Id of the message being handled, else NULL */
    const char *peer_addr; /* its Peer-Address (ZeroMQ's; NULL when it has none) */
    double startup_deadline; /* dp_now() by which every worker must have said HELLO; 0 = none */
    uint64_t incarnation;  /* random per start, on every reply: clients see a restart */
    uint64_t start_version; /* the version this start restored (0 fresh): Welcome.start_version */
    dp_ps_shm_t *shm;      /* shared memory for co-located workers; NULL until one asks */
    dp_ps_devr_t *devr;    /* the device region for co-located workers; NULL until one asks
                            * and the shard has a provider (ps_devregion.h) */
    uint64_t mismatches;   /* requests refused for another model (logged: s_log_mismatch) */
    dp_shard_parts_t parts; /* pushes in parts being assembled, one per worker at most */
    dp_shard_early_t early; /* the early step of one of them (server/core/shard_early.h) */
    dp_deal_t deal;        /* shard 0 of an elastic crew: the epoch's batches (server/crew/deal.h) */
    bool dealing;          /* ... this shard deals them */
    unsigned char *foreign_said; /* per worker: its push of no dealt batch was logged */
    dp_deal_terms_t *plans;      /* per worker: its HELLO's data plan (batch 0: none, its own data) */
    uint64_t *asked_from;        /* per worker: the first step it asked a batch for since this start */
    bool deal_restored;          /* the dealer came from a checkpoint (this shard restarted) */
    dp_episodes_t episodes; /* an actor-critic run's env steps and episodes (Push.env_steps) */
    dp_account_bounds_t account; /* ... the bounds a push's account keeps (--env, --envs, --t-max) */
    uint64_t account_refused; /* pushes refused for their account (logged: s_refuse_account) */
    dp_ps_rows_t rows;     /* the model's row table (embed:D), empty without one */
    dp_dylu_crew_t speeds; /* --local-steps auto: the step times the crew's pushes reported */
} dp_ps_loop_t;

/* ---- server/loop/ps.c ---------------------------------------------------- */

/* The member table changed: the record and the policy told (a checkpoint
 * when the version moved and one is due), the held pulls asked again. */
void dp_ps_members_changed(dp_ps_loop_t *ps);

/* ---- server/loop/ps_reply.c ---------------------------------------------- */

/* Send a reply (its payload frames after the envelope); a failure is
 * logged and counted in net_errors. */
void dp_ps_send(dp_ps_loop_t *ps, zmq_msg_t *id, Downpour__Envelope *env,
                const dp_wire_payload_t *pl, int n_pl);
/* An envelope of this shard: type, request id, worker, the model's
 * fingerprint and this start's incarnation. */
void dp_ps_env(const dp_ps_loop_t *ps, Downpour__Envelope *env, int type, uint64_t req, int worker);
/* ERROR with Error.code (DOWNPOUR__ERROR_CODE__*), not counted. */
void dp_ps_send_error(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                      const char *msg);
/* ERROR with Error.code, counted as malformed and in requests_refused. */
void dp_ps_reply_error_code(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                            const char *msg);
/* The same with code ERR_NONE. */
void dp_ps_reply_error(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, const char *msg);
/* ERROR to an admitted worker's PUSH (a bad range, step, slot): counted as
 * malformed and rejected (a push refused), not as a refused request. */
void dp_ps_reply_push_error(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                            const char *msg);
/* The same with Error.code (a refused push's reason a worker acts on:
 * ERR_ACCOUNT), counted as rejected too. */
void dp_ps_reply_push_error_code(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                                 const char *msg);
/* PARAMS as the PULL asked (ask), or "busy" when the worker's loans are
 * all out; deal (NULL: none) goes with the first part. */
void dp_ps_reply_params(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                        const dp_ps_params_ask_t *ask, const Downpour__Deal *deal);
/* ACK with the policy's decision o and the shard's version. */
void dp_ps_reply_ack(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                     const dp_push_outcome_t *o);
/* ACK REJECTED for a push refused before the policy saw it (counted). */
void dp_ps_reply_rejected(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                          const char *why);
/* A reply of this type with no body (HEARTBEAT, SHUTDOWN). */
void dp_ps_reply_bare(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env, int type);

/* ---- server/loop/ps_msgs.c ----------------------------------------------- */

/* A request's handler: it answers the request (frames: the tensors' bytes
 * after the envelope, n_frames of them, checked by dp_wire_check). */
typedef void (*dp_ps_handler_fn)(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                                 const dp_wire_frame_t *frames, int n_frames);

/* One row of the message table: a request type, who may send it and its
 * handler. A type without a row is not a request (a reply, or unknown):
 * admission refuses it. */
typedef struct {
    int type;              /* DOWNPOUR__MSG_TYPE__* */
    dp_auth_who_t who;
    dp_ps_handler_fn on;
} dp_ps_msg_t;

/* The row of type, or NULL when it is not a request. */
const dp_ps_msg_t *dp_ps_msg_of(int type);
/* The whole table (its rows into *n). */
const dp_ps_msg_t *dp_ps_msgs(size_t *n);

/* The handlers of the table, one a request type. */

/* HELLO: the model checked, the worker id claimed, the worker joined,
 * answered with the WELCOME (ps_admit.c). */
void dp_ps_on_hello(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                    const dp_wire_frame_t *frames, int n_frames);
/* PULL: PARAMS, or held until the policy lets it through (ps.c). */
void dp_ps_on_pull(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                   const dp_wire_frame_t *frames, int n_frames);
/* PUSH, whole or a part: its account and gradient checked, then
 * dp_push_apply (ps.c). */
void dp_ps_on_push(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                   const dp_wire_frame_t *frames, int n_frames);
/* BARRIER: a worker finished (or leaves), answered at once (ps.c). */
void dp_ps_on_barrier(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                      const dp_wire_frame_t *frames, int n_frames);
/* ROWS_PULL: the rows of the keys asked, or an ERROR naming the bad key
 * (ps_rows_wire.c). */
void dp_ps_on_rows_pull(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int n_frames);
/* ROWS_PUSH: applied, waiting for the sync step, a repeat, or REJECTED
 * (ps_rows_wire.c). */
void dp_ps_on_rows_push(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int n_frames);
/* STATS: the counters, the members, the staleness histogram (ps_admin.c). */
void dp_ps_on_stats(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                    const dp_wire_frame_t *frames, int n_frames);
/* SHUTDOWN: the final checkpoint, then the reply; the loop ends (ps_admin.c). */
void dp_ps_on_shutdown(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                       const dp_wire_frame_t *frames, int n_frames);
/* HEARTBEAT: answered with one; admission counted the worker heard
 * (ps_admin.c). */
void dp_ps_on_heartbeat(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int n_frames);

/* ---- server/loop/ps_admit.c ---------------------------------------------- */

/* May this valid envelope reach its handler? Its row of the message table
 * (its worker heard from: liveness); NULL: it was answered instead,
 * nothing else changed. */
const dp_ps_msg_t *dp_ps_admit(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env);

/* ---- server/loop/ps_deal.c ----------------------------------------------- */

void dp_ps_deal_init(dp_ps_loop_t *ps, int workers);
void dp_ps_deal_fini(dp_ps_loop_t *ps);
/* A HELLO's data plan: the chief's sets the run's, another's must agree
 * with it once set; -1 with why (the HELLO refused) when not. */
int dp_ps_deal_hello(dp_ps_loop_t *ps, const Downpour__Envelope *env, char *why, size_t n);
/* Answer a pull the policy allows: PARAMS, with the batch of its push step
 * when it asks for one (deal_step) — the batch, or the end — or an ERROR
 * when the dealer refuses. 0: not answered (the dealer says wait, or the
 * chief's plan has not come): hold it. */
int dp_ps_deal_answer_pull(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                           const dp_ps_params_ask_t *ask, uint64_t deal_step);
/* A push's fate to the dealer: the batch it carried into *b (returned),
 * or NULL when it names none dealt to it (said once per worker). */
const dp_deal_batch_t *dp_ps_deal_pushed(dp_ps_loop_t *ps, int worker, uint64_t step, int used,
                                         dp_deal_batch_t *b);
/* 1 when a push is to be refused as one whose batch was dealt before this
 * shard restarted (the restored dealer deals it again), said once a worker. */
int dp_ps_deal_unknown(dp_ps_loop_t *ps, int worker, uint64_t step);
/* The crew's news to the dealer: a leaver's batches in flight go back to
 * the pool, a dead worker's counted as trained by it once dealt again. */
void dp_ps_deal_members(dp_ps_loop_t *ps, int news);
/* The leases' clock: how many batches went back to the pool (logged). */
int dp_ps_deal_tick(dp_ps_loop_t *ps, double now);

/* ---- server/loop/ps_admin.c ---------------------------------------------- */

/* Write the shard unless there is no --checkpoint-dir or this version is
 * on disk already, finished as asked (the chief's SHUTDOWN). -1 with err
 * (logged loud and counted in ckpt_failures). */
int dp_ps_checkpoint(dp_ps_loop_t *ps, int finished, char *err);
/* The version moved: a checkpoint when --checkpoint-every says so. */
void dp_ps_version_moved(dp_ps_loop_t *ps);
/* At start: the run's id, and the checkpoint restored when the directory
 * holds one this run may take (else a fresh start's first checkpoint). */
int dp_ps_restore(dp_ps_loop_t *ps, char *err);
/* A metrics line of the counters (a no-op without --metrics). */
void dp_ps_metrics_line(dp_ps_loop_t *ps);
/* The last news events of the membership as metrics lines ({"event":
 * "join"|"leave", "task", "version", "live", "why"}). */
void dp_ps_metrics_members(dp_ps_loop_t *ps, int news);
/* The start line that begins each start's lines. */
void dp_ps_metrics_start(dp_ps_loop_t *ps);

#endif
