/* test_ps_msgs: the shard's message table (server/loop/ps_msgs.c) — one
 * row per request type of proto/downpour.proto, none for a reply, each
 * with the who that admission and server/loop/auth.h follow and its
 * handler; and over a real socket, a stranger gets what each row's who
 * says (a WORKER's request: ERR_UNKNOWN_WORKER; the chief's: ERR_NOT_CHIEF;
 * a HEARTBEAT: answered; a HELLO: WELCOME), a type without a row the
 * "is a reply, not a request" ERROR, each counted as today. */
#include <string.h>
#include <zmq.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/wire.h"
#include "server/loop/ps_loop.h"
#include "tests/ps_harness.h"
#include "tests/test.h"

/* The contract, written out once more: a row that moves to another who or
 * handler, or a request type without its row, fails here. */
static const dp_ps_msg_t s_want[] = {
    {DOWNPOUR__MSG_TYPE__HELLO, DP_AUTH_ANYONE, dp_ps_on_hello},
    {DOWNPOUR__MSG_TYPE__PULL, DP_AUTH_WORKER, dp_ps_on_pull},
    {DOWNPOUR__MSG_TYPE__PUSH, DP_AUTH_WORKER, dp_ps_on_push},
    {DOWNPOUR__MSG_TYPE__BARRIER, DP_AUTH_WORKER, dp_ps_on_barrier},
    {DOWNPOUR__MSG_TYPE__ROWS_PULL, DP_AUTH_WORKER, dp_ps_on_rows_pull},
    {DOWNPOUR__MSG_TYPE__ROWS_PUSH, DP_AUTH_WORKER, dp_ps_on_rows_push},
    {DOWNPOUR__MSG_TYPE__HEARTBEAT, DP_AUTH_BEAT, dp_ps_on_heartbeat},
    {DOWNPOUR__MSG_TYPE__STATS, DP_AUTH_CHIEF, dp_ps_on_stats},
    {DOWNPOUR__MSG_TYPE__SHUTDOWN, DP_AUTH_CHIEF, dp_ps_on_shutdown},
};
#define N_WANT (sizeof s_want / sizeof s_want[0])

static const dp_ps_msg_t *s_wanted(int type)
{
    for (size_t i = 0; i < N_WANT; i++)
        if (s_want[i].type == type) return &s_want[i];
    return NULL;
}

/* Every type the protocol names: a request has exactly one row, as
 * wanted; a reply (and MSG_NONE) none; the table holds nothing else. */
static void test_table(void)
{
    const ProtobufCEnumDescriptor *d = &downpour__msg_type__descriptor;
    size_t n_rows;
    const dp_ps_msg_t *rows = dp_ps_msgs(&n_rows);
    size_t found = 0;
    for (unsigned i = 0; i < d->n_values; i++) {
        int type = d->values[i].value;
        size_t times = 0;
        for (size_t k = 0; k < n_rows; k++) times += rows[k].type == type;
        const dp_ps_msg_t *m = dp_ps_msg_of(type), *w = s_wanted(type);
        if ((w ? times != 1 : times != 0) || (m != NULL) != (w != NULL) ||
            (m && (m->type != type || m->who != w->who || m->on != w->on))) {
            fprintf(stderr, "  %s: %zu rows, %s\n", d->values[i].name, times,
                    w ? "wanted one as listed" : "a reply: wanted none");
            CHECK(0);
        }
        found += times;
    }
    CHECK_EQ(found, n_rows); /* no row of a type the protocol does not name */
    CHECK_EQ(n_rows, N_WANT);
    CHECK(dp_ps_msg_of(99) == NULL);
}

/* A stranger's envelope of type from worker wid with fingerprint fp (and
 * body, the caller's): the reply, its Error.code into *code. */
static raw_reply_t s_ask(void *sock, Downpour__Envelope *env, int *code)
{
    Downpour__Envelope *rep = NULL;
    raw_reply_t r = {raw_request(sock, env, &rep), 0, 0, ""};
    *code = rep && rep->error ? (int)rep->error->code : -1;
    if (rep && rep->error) snprintf(r.text, sizeof r.text, "%s", rep->error->message);
    dp_wire_destroy(&rep);
    return r;
}

static void test_wire(void)
{
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    dp_model_t m;
    srv_small_model(&m);
    void *ctx = zmq_ctx_new(), *sock = raw_dealer(ctx, s.endpoint, 5000);
    Downpour__Envelope env;
    int code;
    /* WORKER: a PULL from a worker id nobody said HELLO as */
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PULL, 1, 1, m.fingerprint);
    Downpour__Pull pull = DOWNPOUR__PULL__INIT;
    env.pull = &pull;
    raw_reply_t r = s_ask(sock, &env, &code);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER);
    CHECK(strstr(r.text, "has not said HELLO") != NULL);
    /* CHIEF: a tool's SHUTDOWN without the run token */
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__SHUTDOWN, 2, -1, 0);
    r = s_ask(sock, &env, &code);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_NOT_CHIEF);
    /* BEAT: a tool's HEARTBEAT speaks for nobody and is answered */
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, 3, -1, 0);
    CHECK_EQ(s_ask(sock, &env, &code).type, DOWNPOUR__MSG_TYPE__HEARTBEAT);
    /* a type without a row: refused as a reply, whatever its sender */
    int replies[] = {DOWNPOUR__MSG_TYPE__ACK, DOWNPOUR__MSG_TYPE__ERROR, DOWNPOUR__MSG_TYPE__WELCOME};
    Downpour__Ack ack = DOWNPOUR__ACK__INIT;
    Downpour__Error e = DOWNPOUR__ERROR__INIT;
    Downpour__Welcome wl = DOWNPOUR__WELCOME__INIT;
    e.message = "hi";
    for (size_t i = 0; i < sizeof replies / sizeof replies[0]; i++) {
        dp_wire_env_init(&env, replies[i], 4 + i, 0, m.fingerprint);
        env.ack = &ack, env.error = &e, env.welcome = &wl;
        r = s_ask(sock, &env, &code);
        CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
        CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_NONE);
        CHECK(strstr(r.text, "is a reply, not a request") != NULL);
    }
    /* ANYONE: a HELLO, then the chief's STATS counts what came before */
    Downpour__Hello h;
    raw_hello_init(&env, &h, &m, 0, 10);
    Downpour__Envelope *rep = NULL;
    CHECK_EQ(raw_request(sock, &env, &rep), DOWNPOUR__MSG_TYPE__WELCOME);
    uint64_t token = rep && rep->welcome ? rep->welcome->run_token : 0;
    dp_wire_destroy(&rep);
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__STATS, 11, 0, m.fingerprint);
    env.run_token = token;
    CHECK_EQ(raw_request(sock, &env, &rep), DOWNPOUR__MSG_TYPE__STATS);
    if (rep && rep->stats) {
        /* the PULL, the SHUTDOWN and the three replies; the beat is not a refusal */
        CHECK_EQ(rep->stats->requests_refused, 5);
        CHECK_EQ(rep->stats->malformed, 5);
        CHECK_EQ(rep->stats->applied, 0);
    }
    dp_wire_destroy(&rep);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);
}

DP_TESTS(T(test_table), T(test_wire))
