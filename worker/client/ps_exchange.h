/* ps_exchange: the machinery under ps_client (not for other callers) —
 * the handles (dp_ps_shard_t: the connection to one shard and what it said
 * of itself), one exchange (a request to each shard, then every reply),
 * the liveness rules, a restarted shard's rejoin (HELLO, WELCOME, shared
 * memory), and the client's life (new, destroy). The requests (a pull:
 * ps_pull.c; a push: ps_push.c; stats, the end of a run: ps_client.c) each
 * keep their own state in a struct of their own and hand dp_ps_exchange a
 * plan with it.
 *
 * Every operation is one exchange, dp_ps_exchange(c, plan): a request to
 * each shard the plan names (all sent before any reply is awaited, so the
 * shards work in parallel), then the reply of each, matched by request id.
 * Anything else from a shard — a heartbeat answer, a late reply to an
 * abandoned request — only proves it alive. The plan says what is asked (a
 * message type and a builder for each shard's body) and what is done with
 * each reply, whose callback returns its outcome (dp_ps_reply_t: done,
 * more to come, again, failed); the exchange owns the liveness rules, the
 * stop flag and the clean-up after a failure, and is the only one to write
 * its per-shard state (dp_ps_await_t).
 *
 * A request may go out before its exchange (a push's parts, sent while the
 * backward runs): the plan's "before" sends those ahead of the awaited one,
 * and dp_ps_await_sent names an awaited one that went already. A reply
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
#include <stdbool.h>

#include "proto/compress.h"
#include "proto/devregion.h"
#include "proto/shm.h"
#include "proto/wire_zmq.h"
#include "worker/client/ps_client.h"
#include "worker/client/ps_socket.h"

/* The handle: the connection to one shard, and what it said of itself.
 * A request's own state (a pull's parts, a push's) lives in its request
 * (ps_pull.c, ps_push.c); the exchange's in dp_ps_await_t. */
typedef struct {
    void *sock;             /* DEALER; NULL after a reconnect failed (retried next exchange) */
    char endpoint[DP_ZSOCK_ENDPOINT_LEN]; /* tcp://HOST:PORT, as given */
    uint64_t lo, hi;        /* floats this shard owns */
    uint64_t version;       /* shard version of the last pull */
    uint64_t min_version;   /* sync: the next pull waits for this version */
    bool pulled;            /* a pull has completed */
    double last_heard;      /* dp_now() of its last message (or of our request) */
    double last_hb;         /* dp_now() of our last HEARTBEAT */
    dp_ps_info_t info;      /* from its WELCOME */
    uint64_t run_token;     /* from its WELCOME (the chief's only): its STATS / SHUTDOWN carry it */
    dp_curve_key_t server_key; /* CURVE: the shard's public key */
    void *mon;              /* a PAIR with sock's connect and handshake events, or NULL */
    int seen;               /* DP_PS_SEEN_* bits of those events since sock was opened */
    bool told_waiting;      /* "waiting for ps shard I at ..." was logged (once a client) */
    /* recovery */
    uint64_t incarnation;   /* from its WELCOME; 0: unknown (a server that sends none) */
    bool restarted;         /* a reply showed another incarnation, or ERR_UNKNOWN_WORKER, or a
                             * reply said "again" (DP_PS_REPLY_AGAIN): HELLO before the next
                             * request */
    bool reconnected;       /* its socket was replaced after a request that did not complete
                             * (a timeout, an interrupt): HELLO on the new connection before
                             * the next request (the server moves our id to it by session) */
    uint64_t seen_version;  /* highest version it reported (WELCOME, PARAMS, ACK) */
    uint64_t worker_step;   /* from its WELCOME: our last step it applied */
    bool crc;               /* tensors to and from it carry a CRC-32 (opts.crc) */
    /* shared memory (proto/shm.h): the shard's parameter slots and our
     * gradient slot, mapped when its WELCOME granted them */
    bool shm;               /* tensors go through the segments */
    dp_shm_t shm_params, shm_grad;
    /* the device region (proto/devregion.h, ps_devregion.c): mapped when
     * its WELCOME offered it; pulls and whole dense pushes go through it */
    bool devr;
    dp_devregion_worker_t devr_w;
    uint16_t *push16;       /* --wire bf16: this shard's gradient slice in bfloat16 (frames only) */
    dp_compressor_t *z;     /* --compress: this slice's encoder and error feedback (made on
                             * the first push); its last encoding is what the push sends */
    uint32_t push_parts;    /* from its WELCOME: the most parts it assembles a push from (0:
                             * an older shard, whole pushes only) */
} dp_ps_shard_t;

/* dp_ps_shard_t.seen: what the socket's events said, which names why a
 * HELLO gets no reply. */
enum {
    DP_PS_SEEN_CONNECTED = 1, /* a TCP connection was made */
    DP_PS_SEEN_RETRIED = 2,   /* a dial failed (nothing listens there) and is retried */
    DP_PS_SEEN_AUTH = 4,      /* the server's ZAP refused our CURVE key */
    DP_PS_SEEN_HANDSHAKE = 8, /* the handshake failed otherwise (key or mechanism) */
};

/* The exchange in progress, one shard's side (ps_exchange.c's only). */
typedef struct {
    uint64_t want_req;      /* request awaited in the current exchange, 0 = none */
    bool done;              /* its reply arrived (all of it) */
    double sent_at;         /* dp_now() when the awaited request went out */
    int repeats;            /* times the awaited request was repeated */
    uint64_t early_req;     /* the request the next exchange awaits went out already
                             * (dp_ps_await_sent): its id, 0 none; the exchange awaits it
                             * instead of sending it (but after a rejoin) */
} dp_ps_await_t;

typedef struct dp_ps_pull_req dp_ps_pull_req_t; /* ps_pull.c */
typedef struct dp_ps_push_req dp_ps_push_req_t; /* ps_push.c */
typedef struct dp_ps_rows_req dp_ps_rows_req_t; /* ps_rows.c */

struct dp_ps_client {
    void *ctx;              /* ZeroMQ context, owned */
    int n;                  /* shards */
    dp_ps_shard_t *sh;      /* [DP_ZSOCK_MAX_SHARDS], the first n used */
    dp_ps_await_t *aw;      /* [DP_ZSOCK_MAX_SHARDS]: the exchange's, shard by shard */
    const dp_model_t *m;    /* the caller's, outlives the client */
    int worker_id;
    uint64_t session;       /* in every request: what ties a new connection and the
                             * heartbeats to our HELLO (opts.session) */
    double timeout_s;       /* silence allowed to a shard owing a reply */
    uint64_t next_req;      /* last request id used */
    dp_ps_info_t info;      /* shard 0's WELCOME (every shard agrees) */
    bool finished;          /* BARRIER finished sent and answered */
    volatile sig_atomic_t *stop; /* non-zero: blocked calls give up; NULL: never */
    atomic_int inflight;    /* push frames ZeroMQ has not released yet */
    bool curve;             /* connect with CURVE: our key pair and each shard's key */
    dp_curve_key_t secret, pub;
    uint64_t updates_lost;  /* versions the shards went back by when they restarted */
    dp_ps_transport_t transport; /* how tensors travel (opts) */
    const dp_devmem_ops_t *devmem; /* the device region's provider (dp_ps_devmem), NULL: none */
    bool bf16;              /* tensors in frames as bfloat16 (opts.wire) */
    dp_compress_conf_t compress; /* pushes compressed per shard slice (opts.compress) */
    uint64_t bytes_pushed;  /* every push's gradient bytes (dp_push_result_t.bytes) */
    dp_ps_err_t code;       /* the kind of the last failure (dp_ps_client_error) */
    float *landing;         /* m->n_floats, made on first use: a sink's tensors that cannot
                             * be lent as received (bfloat16, misaligned, shared memory) */
    dp_ps_pull_req_t *pulling; /* the pull in parts in progress (pull_begin's), NULL: none */
    dp_ps_pull_req_t *pull_room; /* where it lies, made on the first pull_begin */
    dp_ps_push_req_t *pushing; /* the push in progress (push_begin's), NULL: none */
    dp_ps_push_req_t *push_room; /* where it lies, made on the first push */
    uint32_t pulls_parts;   /* the last pull's PARAMS messages, all shards */
    Downpour__DealPlan deal_plan; /* opts.deal, in every HELLO when has_plan */
    bool has_plan;
    uint64_t deal_step;     /* pulls ask shard 0 for the batch of this push step (0: none) */
    dp_ps_dealt_t dealt;    /* what the last pull's shard 0 dealt, */
    bool dealt_got;         /* ... if it has */
    dp_ps_rows_req_t *rows; /* the row requests' buffers (ps_rows.c), made on first use */
    uint64_t bytes_pulled;  /* every pull's tensor bytes received: PARAMS (frames or
                             * shared memory, a torn read not counted) and ROWS */
    float *grad_lent;       /* dp_ps_client_push_buffer's last answer (NULL: none) */
    dp_shm_t grad_kept;     /* the gradient segment it lies in, once a new WELCOME replaced
                             * it: mapped until that answer is given up */
    dp_ps_shm_hook_fn shm_hook; /* told of each segment mapped and before each unmap; NULL */
    void *shm_hook_arg;
    const dp_ps_device_t *dev; /* a device worker's copies to and from the regions; NULL: none */
    float *grads_host;      /* m->n_floats, made on first use: a device push's slices that
                             * go through shared memory or frames (dev->grads_out's) */
    uint64_t dev_pulls, dev_pushes; /* dp_ps_client_device_counts */
};

/* Storage one request points into until it is sent. */
typedef struct {
    Downpour__Envelope env;
    union {
        Downpour__Hello hello;
        Downpour__Pull pull;
        Downpour__Push push;
        Downpour__Barrier barrier;
        Downpour__RowsPull rows_pull;
        Downpour__RowsPush rows_push;
    } body;                         /* the sub-message env points at, if any */
    Downpour__TensorDesc desc[2];   /* PUSH: the gradient slice (top-k: indices, values) */
    Downpour__TensorDesc *descs[2]; /* env.tensors */
    int64_t shape[2];               /* desc[i].shape */
    int64_t row_shape[2][2];        /* desc[i].shape of a row message (2-D rows) */
    dp_wire_payload_t payload[2];   /* PUSH: the slice's bytes */
    int n_payloads;                 /* 0 to 2 */
} dp_ps_req_t;

/* Fills shard i's request: rq->env is already initialised with the plan's
 * type; the builder sets the body (and payload) it needs. */
typedef void (*dp_ps_build_fn)(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg);

/* What a reply callback says of shard i's reply (FAILED is -1, so a
 * callback may return dp_err's or dp_ps_refused's -1 as it is). */
typedef enum {
    DP_PS_REPLY_FAILED = -1, /* err says why; the exchange fails */
    DP_PS_REPLY_DONE = 0,    /* the request is answered */
    DP_PS_REPLY_MORE,        /* more replies to it follow (a pull's parts) */
    DP_PS_REPLY_AGAIN,       /* ask again after a new HELLO (the shard lacks a push's parts) */
} dp_ps_reply_t;

/* Called for each matched reply. */
typedef dp_ps_reply_t (*dp_ps_reply_fn)(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                                        const dp_wire_frame_t *frames, int n_frames, void *arg,
                                        char *err);

/* Sends what must precede shard i's request (a push's parts before its
 * last) with dp_ps_send_only; again: the shard was said HELLO again (it
 * restarted or lost a reply), so all of it goes again. 0 or -1 with err. */
typedef int (*dp_ps_before_fn)(dp_ps_client_t *c, int i, bool again, void *arg, char *err);

/* Has the wait what the caller needs for now (a pull in parts: the floats
 * the forward reads next)? The other replies are awaited by a later wait. */
typedef bool (*dp_ps_enough_fn)(const dp_ps_client_t *c, void *arg);

/* Is shard i left out of this exchange (nothing sent, nothing awaited)? */
typedef bool (*dp_ps_skip_fn)(const dp_ps_client_t *c, int i, void *arg);

/* One exchange: the same request type to shards [0, n_shards). */
typedef struct {
    int type;             /* DOWNPOUR__MSG_TYPE__* of every request */
    int n_shards;         /* c->n, or 1 to ask shard 0 only */
    dp_ps_skip_fn skip;   /* NULL: each of them is asked (a scan: the shards read to the end are not) */
    dp_ps_before_fn before; /* NULL: the request goes alone */
    dp_ps_build_fn build; /* NULL: the request has no body */
    dp_ps_reply_fn on_reply; /* takes each shard's reply */
    dp_ps_enough_fn enough; /* NULL: the wait ends with every reply */
    void *arg;            /* handed to before, build, on_reply and enough: the request */
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

/* The request the next exchange awaits from shard i went out already
 * (request id req, by dp_ps_send_only: a push's last part): the exchange
 * awaits it instead of sending its own, unless the shard is said HELLO
 * first. */
void dp_ps_await_sent(dp_ps_client_t *c, int i, uint64_t req);

/* A request frame's free callback (hint: &c->inflight, counted up by the
 * builder before the send): the caller's bytes, handed to ZeroMQ without a
 * copy, are its own again once every one came back. */
void dp_ps_frame_released(void *data, void *hint);
/* Wait (bounded by timeout_s) until ZeroMQ has let go of every such frame;
 * -1 with err when it has not. */
int dp_ps_wait_released(dp_ps_client_t *c, char *err);
/* The row requests' buffers (ps_rows.c), freed with the client. */
void dp_ps_rows_req_free(dp_ps_rows_req_t *r);

/* Sleep s seconds. */
void dp_ps_sleep(double s);

/* Shard i answered with an ERROR: its message into err, c->code REFUSED; -1. */
int dp_ps_refused(dp_ps_client_t *c, int i, const Downpour__Envelope *env, char *err);

/* A higher version reported by shard s. */
void dp_ps_seen(dp_ps_shard_t *s, uint64_t version);

/* ---- the device region (ps_devregion.c) ---- */

/* What shard i's WELCOME says of the device region: map (or re-map, a new
 * generation) what it offers, else unmap; a region that does not map is
 * logged and left (shared memory or frames as before). */
/* The provider this client maps a region with: the test hook's stand-in,
 * else opts.devmem (a GPU worker's CUDA IPC) unless the hook says off;
 * NULL: it asks for none. */
const dp_devmem_ops_t *dp_ps_devmem(const dp_ps_client_t *c);
void dp_ps_devr_welcome(dp_ps_client_t *c, int i, const Downpour__Welcome *w);
void dp_ps_devr_close(dp_ps_shard_t *s);
/* Shard s's floats of the newest version, which must be version, into dst
 * (s->hi - s->lo floats): 0, or -1 when the region says otherwise (retired,
 * a newer version, none): the pull goes again (and then in frames). */
int dp_ps_devr_read(dp_ps_shard_t *s, uint64_t version, float *dst);
/* The same, device to device: the pinned entry handed to dev->weights_in,
 * unpinned once it returns (the copy done). */
int dp_ps_devr_read_device(dp_ps_shard_t *s, uint64_t version, const dp_ps_device_t *dev);
/* The whole slice's gradient into our slot, then the count: 0, or -1 when
 * the slot is not ours to write (the last push not taken): frames then.
 * slice NULL: the device's gradient (from: the push's buffer of it, NULL the
 * network's), copied in by dev->grads_out. */
int dp_ps_devr_write(dp_ps_shard_t *s, const float *slice, const float *from, size_t n,
                     const dp_ps_device_t *dev);

#endif
