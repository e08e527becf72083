/* ps_exchange: the machinery under ps_client (not for other callers) —
 * the sockets to the shards, one exchange (a request to each shard, then
 * every reply), the liveness rules, a restarted shard's rejoin (HELLO,
 * WELCOME, shared memory), and the client's life (new, destroy). The
 * request types (pull, push, stats, the end of a run) are plans handed to
 * dp_ps_exchange, in ps_client.c.
 *
 * Every operation is one exchange, dp_ps_exchange(c, plan): a request to
 * each shard the plan names (all sent before any reply is awaited, so the
 * shards work in parallel), then the reply of each, matched by request id.
 * Anything else from a shard — a heartbeat answer, a late reply to an
 * abandoned request — only proves it alive. The plan says what is asked (a
 * message type and a builder for each shard's body) and what is done with
 * each reply; the exchange owns the liveness rules, the stop flag and the
 * clean-up after a failure.
 *
 * A request may go out before its exchange (a push's parts, sent while the
 * backward runs): the plan's "before" sends those ahead of the awaited one,
 * and a shard's early_req names an awaited one that went already. A reply
 * may come in parts (a pull's, cut where layers begin) and an exchange may
 * be waited out in steps (dp_ps_exchange_send, then dp_ps_exchange_wait
 * until plan->enough): the forward runs on the first layers while the
 * rest arrives.
 *
 * Invariants: a shard's range [lo, hi) comes from its WELCOME and the ranges
 * tile [0, n_floats); push frames point into the caller's gradient and
 * c->inflight counts those ZeroMQ still holds, so push returns only once it
 * is 0; after a failed exchange the shards that did not answer get a fresh
 * socket (linger 0 drops what was queued, releasing the caller's buffer). */
#ifndef DP_PS_EXCHANGE_H
#define DP_PS_EXCHANGE_H

#include <stdatomic.h>

#include "proto/compress.h"
#include "proto/shm.h"
#include "worker/ps_client.h"

typedef struct {
    void *sock;             /* DEALER; NULL after a reconnect failed (retried next exchange) */
    char endpoint[DP_ZSOCK_ENDPOINT_LEN]; /* tcp://HOST:PORT, as given */
    uint64_t lo, hi;        /* floats this shard owns */
    uint64_t version;       /* shard version of the last pull */
    uint64_t min_version;   /* sync: the next pull waits for this version */
    int pulled;             /* a pull has completed */
    uint64_t want_req;      /* request awaited in the current exchange, 0 = none */
    int done;               /* its reply arrived */
    double last_heard;      /* dp_now() of its last message (or of our request) */
    double last_hb;         /* dp_now() of our last HEARTBEAT */
    dp_ps_info_t info;      /* from its WELCOME */
    uint64_t run_token;     /* from its WELCOME (the chief's only): its STATS / SHUTDOWN carry it */
    dp_curve_key_t server_key; /* CURVE: the shard's public key */
    /* recovery */
    uint64_t incarnation;   /* from its WELCOME; 0: unknown (a server that sends none) */
    int restarted;          /* a reply showed another incarnation, or ERR_UNKNOWN_WORKER */
    uint64_t seen_version;  /* highest version it reported (WELCOME, PARAMS, ACK) */
    uint64_t worker_step;   /* from its WELCOME: our last step it applied */
    double sent_at;         /* dp_now() when the awaited request went out */
    int repeats;            /* times the awaited request was repeated */
    int crc;                /* tensors to and from it carry a CRC-32 (opts.crc) */
    /* shared memory (proto/shm.h): the shard's parameter slots and our
     * gradient slot, mapped when its WELCOME granted them */
    int shm;                /* tensors go through the segments */
    dp_shm_t shm_params, shm_grad;
    int torn;               /* the last shm pull's copy raced a step: pull again */
    uint16_t *push16;       /* --wire bf16: this shard's gradient slice in bfloat16 (frames only) */
    dp_compressor_t *z;     /* --compress: this slice's encoder and error feedback (made on
                             * the first push); its last encoding is what the push sends */
    uint32_t push_parts;    /* from its WELCOME: the most parts it assembles a push from (0:
                             * an older shard, whole pushes only) */
    /* the push in progress (push_begin .. push_end): its parts to this shard */
    uint32_t parts;         /* 1: whole; part k is floats [part_at[k + 1], part_at[k]) */
    uint32_t parts_sent;    /* the first ones sent, by push_part or push_end's exchange */
    int stream;             /* push_part may send them (a dense push streamed) */
    uint64_t early_req;     /* the request the next exchange awaits from it went out already
                             * (a push's last part, from push_part): its id, 0 none; the
                             * exchange awaits it instead of sending it (but after a rejoin) */
    uint64_t part_at[DP_WIRE_MAX_PUSH_PARTS + 1]; /* part_at[0] = hi > ... > part_at[parts] = lo */
    /* the pull in progress: its reply in pull_cuts + 1 parts (0: whole) */
    uint32_t pull_cuts;
    uint64_t pull_cut[DP_WIRE_MAX_PULL_PARTS - 1]; /* lo < pull_cut[0] < ... < hi (Pull.cuts) */
    uint32_t pull_part;     /* the part awaited next */
    uint64_t pull_got;      /* floats [lo, pull_got) are in */
} dp_ps_shard_t;

struct dp_ps_client {
    void *ctx;              /* ZeroMQ context, owned */
    int n;                  /* shards */
    dp_ps_shard_t *sh;      /* [DP_ZSOCK_MAX_SHARDS], the first n used */
    const dp_model_t *m;    /* the caller's, outlives the client */
    int worker_id;
    double timeout_s;       /* silence allowed to a shard owing a reply */
    uint64_t next_req;      /* last request id used */
    dp_ps_info_t info;      /* shard 0's WELCOME (every shard agrees) */
    int finished;           /* BARRIER finished sent and answered */
    volatile sig_atomic_t *stop; /* non-zero: blocked calls give up; NULL: never */
    atomic_int inflight;    /* push frames ZeroMQ has not released yet */
    int curve;              /* connect with CURVE: our key pair and each shard's key */
    dp_curve_key_t secret, pub;
    uint64_t updates_lost;  /* versions the shards went back by when they restarted */
    dp_ps_transport_t transport; /* how tensors travel (opts) */
    int bf16;               /* tensors in frames as bfloat16 (opts.wire) */
    dp_compress_conf_t compress; /* pushes compressed per shard slice (opts.compress) */
    uint64_t bytes_pushed;  /* every push's gradient bytes (dp_push_result_t.bytes) */
    dp_ps_err_t code;       /* the kind of the last failure (dp_ps_client_error) */
    float *landing;         /* m->n_floats, made on first use: a sink's tensors that cannot
                             * be lent as received (bfloat16, misaligned, shared memory) */
    const dp_ps_push_t *push; /* push_begin's, until push_end; NULL between pushes */
    int streaming;          /* push_part sends the parts it makes ready */
    size_t ready_lo;        /* the push in progress: floats [ready_lo, n_floats) are final */
    /* a pull in parts (pull_begin .. pull_end) */
    float *pull_params;     /* where it lands; NULL: none in progress */
    size_t pull_handed;     /* floats [0, pull_handed) the caller was told are in */
    int pull_torn;          /* a shard was asked again after some of its floats were handed */
    uint32_t pulls_parts;   /* the last pull's PARAMS messages, all shards */
};

/* Storage one request points into until it is sent. */
typedef struct {
    Downpour__Envelope env;
    union {
        Downpour__Hello hello;
        Downpour__Pull pull;
        Downpour__Push push;
        Downpour__Barrier barrier;
    } body;                         /* the sub-message env points at, if any */
    Downpour__TensorDesc desc[2];   /* PUSH: the gradient slice (top-k: indices, values) */
    Downpour__TensorDesc *descs[2]; /* env.tensors */
    int64_t shape[2];               /* desc[i].shape */
    dp_wire_payload_t payload[2];   /* PUSH: the slice's bytes */
    int n_payloads;                 /* 0 to 2 */
} dp_ps_req_t;

/* Fills shard i's request: rq->env is already initialised with the plan's
 * type; the builder sets the body (and payload) it needs. */
typedef void (*dp_ps_build_fn)(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg);

/* Called for each matched reply; returns 0 or -1 with err (ends the wait).
 * It clears c->sh[i].done when the request's reply is not complete yet
 * (a pull in parts: more PARAMS follow). */
typedef int (*dp_ps_reply_fn)(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                              const dp_wire_frame_t *frames, int n_frames, void *arg, char *err);

/* Sends what must precede shard i's request (a push's parts before its
 * last) with dp_ps_send_only; again: the shard was said HELLO again (it
 * restarted or lost a reply), so all of it goes again. 0 or -1 with err. */
typedef int (*dp_ps_before_fn)(dp_ps_client_t *c, int i, int again, void *arg, char *err);

/* Has the wait what the caller needs for now (a pull in parts: the floats
 * the forward reads next)? The other replies are awaited by a later wait. */
typedef int (*dp_ps_enough_fn)(const dp_ps_client_t *c, void *arg);

/* One exchange: the same request type to shards [0, n_shards). */
typedef struct {
    int type;             /* DOWNPOUR__MSG_TYPE__* of every request */
    int n_shards;         /* c->n, or 1 to ask shard 0 only */
    dp_ps_before_fn before; /* NULL: the request goes alone */
    dp_ps_build_fn build; /* NULL: the request has no body */
    dp_ps_reply_fn on_reply; /* takes each shard's reply */
    dp_ps_enough_fn enough; /* NULL: the wait ends with every reply */
    void *arg;            /* handed to build, on_reply and enough */
} dp_ps_plan_t;

/* Send the plan's request to each of its shards, then wait for every reply.
 * On any failure the shards that did not answer get fresh sockets, so
 * nothing of this exchange is left queued or awaited; c->code says what
 * kind of failure it was. */
int dp_ps_exchange(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err);

/* The same exchange in halves, so the caller can work between them: send
 * puts every request out, wait takes replies until each is in or
 * plan->enough says so; wait may be called again (with the same plan, or
 * one whose enough asks for more) until every reply is in. A failure in
 * either ends the exchange as dp_ps_exchange's does. A new exchange
 * abandons one not waited out: its later replies only prove the shards
 * alive. */
int dp_ps_exchange_send(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err);
int dp_ps_exchange_wait(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err);

/* Send rq to shard i (its request id and session set here) without
 * awaiting a reply: a part of a push ahead of the one the exchange awaits.
 * Its reply, when it comes, only proves the shard alive. */
int dp_ps_send_only(dp_ps_client_t *c, int i, dp_ps_req_t *rq, char *err);

/* Shard i answered with an ERROR: its message into err, c->code REFUSED; -1. */
int dp_ps_refused(dp_ps_client_t *c, int i, const Downpour__Envelope *env, char *err);

/* A higher version reported by shard s. */
void dp_ps_seen(dp_ps_shard_t *s, uint64_t version);

#endif
