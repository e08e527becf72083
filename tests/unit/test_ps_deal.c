/* test_ps_deal: shard 0 of an elastic crew (--workers 1:3) dealing its
 * batches, from raw peers on a real socket, as a hostile one would speak:
 *  - a stranger's HELLO first, under a free id and with a bogus plan (one
 *    batch of 64 from 64 samples), fixes nothing: the chief's HELLO sets
 *    the plan, the real workers train under it, and the stranger's pull is
 *    refused naming both plans (server/loop/ps_deal.c, "who sets the plan");
 *  - a worker that planned pushes a step it was dealt no batch for, on a
 *    shard that never restarted: applied and counted apart
 *    (deal_foreign), not refused as "dealt before shard 0 restarted";
 *  - a stranger's PULL without HELLO is a refused request, counted in
 *    requests_refused, not in rejected (which counts pushes);
 *  - a hoarder that takes 4 batches and never pushes, beating on (no
 *    heartbeat timeout here: only a lease can take them back), holds the
 *    chief's pull only till the lease runs out (its floor 2 s through
 *    DP_TEST_LEASE_FLOOR, far above the chief's own deal-to-push): the
 *    chief is dealt them and ends the epoch,
 *    and the hoarder's late push counts as repeated, not as a death. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/wire_zmq.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"

/* One reply as these cases read it. */
typedef struct {
    int type;
    int status;                /* an ACK's */
    int dealt, end;            /* a PARAMS's Deal */
    uint64_t epoch, index;
    uint64_t token;            /* a WELCOME's run token */
    uint64_t rejected, refused, foreign; /* a STATS's */
    uint64_t trained, repeated, after_death; /* a STATS's epoch 0 */
    char text[DP_ERR_LEN + 200];
} reply_t;

static reply_t s_recv(void *sock)
{
    reply_t r;
    memset(&r, 0, sizeof r);
    r.type = -1;
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    if (dp_wire_recv(sock, &rx, 0, err) != 0) return r;
    Downpour__Envelope *e = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    if (e) {
        r.type = e->type;
        if (e->ack) r.status = e->ack->status;
        if (e->params && e->params->deal) {
            r.dealt = 1;
            r.end = e->params->deal->end;
            r.epoch = e->params->deal->epoch;
            r.index = e->params->deal->index;
        }
        if (e->welcome) r.token = e->welcome->run_token;
        if (e->stats) {
            r.rejected = e->stats->rejected;
            r.refused = e->stats->requests_refused;
            r.foreign = e->stats->deal_foreign;
            if (e->stats->n_epoch_samples > 0) {
                r.trained = e->stats->epoch_samples[0]->trained;
                r.repeated = e->stats->epoch_samples[0]->repeated;
                r.after_death = e->stats->epoch_samples[0]->retrained_after_death;
            }
        }
        snprintf(r.text, sizeof r.text, "%s",
                 e->error ? e->error->message : e->ack && e->ack->reason ? e->ack->reason : "");
    }
    dp_wire_destroy(&e);
    dp_wire_rx_fini(&rx);
    return r;
}

/* env alone, or with one frame of len bytes. */
static int s_send(void *sock, const Downpour__Envelope *env, const void *data, size_t len)
{
    size_t n = downpour__envelope__get_packed_size(env);
    uint8_t *buf = dp_malloc(n ? n : 1);
    downpour__envelope__pack(env, buf);
    int rc = zmq_send(sock, buf, n, data ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
    free(buf);
    if (rc == 0 && data && zmq_send(sock, data, len, 0) < 0) rc = -1;
    return rc;
}

/* HELLO of worker wid with the plan samples / batch for one epoch (batch 0: none). */
static reply_t s_hello(void *sock, const dp_model_t *m, int wid, uint64_t samples, uint32_t batch)
{
    Downpour__Envelope env;
    Downpour__Hello h;
    raw_hello_init(&env, &h, m, wid, 1);
    Downpour__DealPlan p = DOWNPOUR__DEAL_PLAN__INIT;
    p.samples = samples;
    p.batch = batch;
    p.epochs = 1;
    if (batch) h.deal = &p;
    s_send(sock, &env, NULL, 0);
    return s_recv(sock);
}

/* PULL of worker wid asking the batch of its push step (sent; the reply
 * may be held). */
static void s_pull(void *sock, const dp_model_t *m, int wid, uint64_t req, uint64_t step)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PULL, req, wid, m->fingerprint);
    Downpour__Pull p = DOWNPOUR__PULL__INIT;
    p.no_checksum = 1;
    p.deal_step = step;
    env.pull = &p;
    s_send(sock, &env, NULL, 0);
}

/* PUSH of worker wid's step on version 0: a small gradient of the whole model. */
static reply_t s_push(void *sock, const dp_model_t *m, int wid, uint64_t req, uint64_t step)
{
    float *g = dp_calloc(m->n_floats, sizeof *g);
    g[0] = 0.01f;
    raw_push_t r;
    raw_push_init(&r, m, wid, req, step, 0, 0, 0, g, m->n_floats, 0);
    s_send(sock, &r.env, g, m->n_floats * sizeof *g);
    free(g);
    return s_recv(sock);
}

static reply_t s_stats(void *sock, uint64_t token)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__STATS, 9, 0, 0);
    env.run_token = token;
    s_send(sock, &env, NULL, 0);
    return s_recv(sock);
}

/* An elastic shard 0 of 1:3 workers, started, and its model. */
static void s_elastic(srv_t *s, dp_model_t *m)
{
    srv_init(s, DP_MODE_ASYNC, 3);
    s->cfg.min_workers = 1;
    s->cfg.heartbeat_timeout = 0; /* nobody goes gone: a death cannot return a batch */
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(m, s->cfg.model_spec, 1, 8, 8, err), 0);
    CHECK_EQ(srv_start(s), 0);
}

/* The run: a stranger's plan first, then the chief's and a second
 * real worker's; the real ones are dealt the real plan's batches. */
static void test_stranger_plan_first(void)
{
    srv_t s;
    dp_model_t m;
    s_elastic(&s, &m);
    void *ctx = zmq_ctx_new();
    void *x = raw_dealer(ctx, s.endpoint, 5000), *c = raw_dealer(ctx, s.endpoint, 5000),
         *w = raw_dealer(ctx, s.endpoint, 5000);
    reply_t r = s_hello(x, &m, 1, 64, 64); /* a plan of its own: kept, fixes nothing */
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__WELCOME);
    s_pull(x, &m, 1, 2, 1); /* held: the chief's plan has not come */
    r = s_hello(c, &m, 0, 60000, 500);
    if (r.type != DOWNPOUR__MSG_TYPE__WELCOME) printf("  chief's HELLO: %s\n", r.text);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__WELCOME);
    r = s_recv(x); /* the stranger's held pull, now answered */
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "data plan mismatch: the servers deal 120 batches of 500 from 60000 "
                         "samples; this worker's is 1 of 64 from 64") != NULL);
    r = s_hello(w, &m, 2, 60000, 500);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__WELCOME);
    s_pull(c, &m, 0, 2, 1);
    r = s_recv(c);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__PARAMS);
    CHECK(r.dealt && !r.end);
    CHECK_EQ(r.index, 0);
    s_pull(w, &m, 2, 2, 1);
    r = s_recv(w);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__PARAMS);
    CHECK(r.dealt && !r.end);
    CHECK_EQ(r.index, 1);
    CHECK_EQ(s_push(c, &m, 0, 3, 1).status, DOWNPOUR__ACK_STATUS__APPLIED);
    /* the stranger's HELLO again, the plan now set: refused there */
    r = s_hello(x, &m, 1, 64, 64);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "data plan mismatch") != NULL);
    zmq_close(x);
    zmq_close(c);
    zmq_close(w);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);
}

/* A planned worker's push of a step it was dealt no batch for, on a shard
 * that never restarted: applied, counted in deal_foreign; and a stranger's
 * PULL without HELLO counts in requests_refused, not in rejected. */
static void test_undealt_push_and_counts(void)
{
    srv_t s;
    dp_model_t m;
    s_elastic(&s, &m);
    void *ctx = zmq_ctx_new();
    void *c = raw_dealer(ctx, s.endpoint, 5000), *x = raw_dealer(ctx, s.endpoint, 5000);
    reply_t r = s_hello(c, &m, 0, 60000, 500);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__WELCOME);
    uint64_t token = r.token;
    r = s_push(c, &m, 0, 2, 1); /* step 1, never asked */
    if (r.status != DOWNPOUR__ACK_STATUS__APPLIED) printf("  push: %s\n", r.text);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ACK);
    CHECK_EQ(r.status, DOWNPOUR__ACK_STATUS__APPLIED);
    for (uint64_t k = 0; k < 3; k++) { /* a stranger's pulls, no HELLO */
        s_pull(x, &m, 2, 10 + k, 1);
        r = s_recv(x);
        CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    }
    r = s_stats(c, token);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__STATS);
    CHECK_EQ(r.rejected, 0);
    CHECK_EQ(r.refused, 3);
    CHECK_EQ(r.foreign, 1);
    zmq_close(x);
    zmq_close(c);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);
}

/* Worker 1 hoards; the chief's held pull is answered once the lease ran
 * out, with the hoarder's batches, and the epoch ends. */
static void test_hoarder_lease(void)
{
    setenv("DP_TEST_LEASE_FLOOR", "2", 1);
    srv_t s;
    dp_model_t m;
    s_elastic(&s, &m);
    void *ctx = zmq_ctx_new();
    /* the chief waits out the lease once: 2 s, or 10 of its turnarounds */
    void *c = raw_dealer(ctx, s.endpoint, 15000), *x = raw_dealer(ctx, s.endpoint, 5000);
    reply_t r = s_hello(c, &m, 0, 320, 64); /* 5 batches */
    uint64_t token = r.token;
    s_pull(c, &m, 0, 2, 1);
    CHECK_EQ(s_recv(c).index, 0);
    CHECK_EQ(s_push(c, &m, 0, 3, 1).status, DOWNPOUR__ACK_STATUS__APPLIED); /* a turnaround */
    CHECK_EQ(s_hello(x, &m, 1, 320, 64).type, DOWNPOUR__MSG_TYPE__WELCOME);
    for (uint64_t k = 1; k <= 4; k++) {
        s_pull(x, &m, 1, 10 + k, k);
        r = s_recv(x);
        CHECK(r.dealt && !r.end);
        CHECK_EQ(r.index, k);
    }
    uint64_t req = 20;
    for (uint64_t step = 2; step <= 5; step++) { /* the first one waits out the lease */
        s_pull(c, &m, 0, req++, step);
        r = s_recv(c);
        CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__PARAMS);
        CHECK(r.dealt && !r.end);
        CHECK_EQ(r.index, step - 1);
        CHECK_EQ(s_push(c, &m, 0, req++, step).status, DOWNPOUR__ACK_STATUS__APPLIED);
    }
    s_pull(c, &m, 0, req++, 6);
    r = s_recv(c);
    CHECK(r.dealt && r.end);
    /* the hoarder's late push of its step 1 (batch 1): applied, trained twice */
    CHECK_EQ(s_push(x, &m, 1, 30, 1).status, DOWNPOUR__ACK_STATUS__APPLIED);
    r = s_stats(c, token);
    CHECK_EQ(r.trained, 320);
    CHECK_EQ(r.repeated, 64);
    CHECK_EQ(r.after_death, 0);
    CHECK_EQ(r.foreign, 0);
    zmq_close(x);
    zmq_close(c);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);
    unsetenv("DP_TEST_LEASE_FLOOR");
}

DP_TESTS(T(test_stranger_plan_first), T(test_undealt_push_and_counts), T(test_hoarder_lease))
