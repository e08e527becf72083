/* test_auth: the worker-id binding and the chief's rules (server/loop/auth.h)
 * first without sockets (connections are byte strings, "live" is a table
 * the test sets, keys are made-up strings), then through a real server in a
 * thread (server/loop/ps.h) and the worker's client (worker/client/ps_client.h), plain
 * and under CURVE. The daemons themselves: tests/integration/test_curve.sh. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/curve.h"
#include "proto/wire_zmq.h"
#include "server/loop/auth.h"
#include "server/loop/ps_loop.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"
#include "worker/client/ps_socket.h"

/* The live table: which of the connections "A".."D" are still open. */
static int s_open[4];
static int s_asked; /* probes made */

static int s_live(void *arg, const void *conn, size_t len)
{
    (void)arg;
    s_asked++;
    int i = len == 1 ? ((const char *)conn)[0] - 'A' : -1;
    return i >= 0 && i < 4 && s_open[i];
}

static dp_auth_peer_t s_peer(const char *conn, const char *key)
{
    return (dp_auth_peer_t){conn, strlen(conn), key, 0};
}

static char s_msg[DP_ERR_LEN]; /* the last refusal's line */

/* HELLO as wid from conn with key, carrying session. */
static int s_claim_in(dp_auth_t *a, int wid, const char *conn, const char *key, uint64_t session)
{
    dp_auth_peer_t p = {conn, strlen(conn), key, session};
    s_msg[0] = 0;
    return dp_auth_claim(a, wid, &p, s_live, NULL, s_msg, sizeof s_msg);
}

static int s_claim(dp_auth_t *a, int wid, const char *conn, const char *key)
{
    return s_claim_in(a, wid, conn, key, 0);
}

/* A HEARTBEAT as wid from conn with key, carrying session; 0 when it
 * counts. */
static int s_beat(dp_auth_t *a, int wid, const char *conn, const char *key, uint64_t session)
{
    dp_auth_peer_t p = {conn, strlen(conn), key, session};
    int code = -1;
    s_msg[0] = 0;
    int type = DOWNPOUR__MSG_TYPE__HEARTBEAT;
    int rc = dp_auth_check(a, dp_ps_msg_of(type)->who, type, wid, 0, &p, &code, s_msg,
                           sizeof s_msg);
    if (rc != 0 && code != DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER) return -2;
    return rc;
}

static int s_check(dp_auth_t *a, int type, int wid, uint64_t token, const char *conn,
                   const char *key, int *code)
{
    char msg[DP_ERR_LEN];
    dp_auth_peer_t p = s_peer(conn, key);
    *code = -1;
    /* who may send it: the shard's message table says (server/loop/ps_msgs.c) */
    return dp_auth_check(a, dp_ps_msg_of(type)->who, type, wid, token, &p, code, msg, sizeof msg);
}

static void s_reset_live(void)
{
    memset(s_open, 0, sizeof s_open);
    s_asked = 0;
}

/* A request counts only on the connection its id is bound to. */
static void test_binding(void)
{
    s_reset_live();
    dp_auth_t a;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_auth_init(&a, 3, 0, err), 0);
    CHECK(a.run_token != 0);
    int code;
    /* Before HELLO: refused, "say HELLO". */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PUSH, 1, 0, "A", NULL, &code), -1);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER);
    CHECK_EQ(s_claim(&a, 1, "A", NULL), 0);
    CHECK_EQ(s_asked, 0); /* a free id needs no probe */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PUSH, 1, 0, "A", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 1, 0, "A", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, "A", NULL, &code), 0);
    /* Another connection pushing as 1, or A pushing as 2: refused. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PUSH, 1, 0, "B", NULL, &code), -1);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__BARRIER, 2, 0, "A", NULL, &code), -1);
    /* A HEARTBEAT for 1 from another connection, with no session: refused
     * (test_heartbeat_holder has the rules), and it binds nothing. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, "B", NULL, &code), -1);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PUSH, 1, 0, "B", NULL, &code), -1); /* still not bound */
    /* Tools (worker -1) may still ask a HEARTBEAT; out of range is left to the caller. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, -1, 0, "C", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PUSH, 7, 0, "C", NULL, &code), 0);
    CHECK_EQ(a.refused, 5);
    dp_auth_fini(&a);
    dp_auth_fini(&a); /* safe twice */
}

/* A second live claimant is refused; a dead holder's id is taken back; HELLO
 * again on the same connection is fine. */
static void test_claims(void)
{
    s_reset_live();
    dp_auth_t a;
    char err[DP_ERR_LEN], msg[DP_ERR_LEN];
    CHECK_EQ(dp_auth_init(&a, 2, 0, err), 0);
    CHECK_EQ(s_claim(&a, 0, "A", NULL), 0);
    s_open[0] = 1;
    CHECK_EQ(s_claim(&a, 0, "A", NULL), 0); /* re-HELLO, same connection */
    CHECK_EQ(s_asked, 0);
    dp_auth_peer_t b = s_peer("B", NULL);
    CHECK_EQ(dp_auth_claim(&a, 0, &b, s_live, NULL, msg, sizeof msg), -1); /* second chief */
    CHECK_EQ(s_asked, 1);
    CHECK(strstr(msg, "worker id 0 is taken") != NULL);
    CHECK(strstr(msg, "--task-index") != NULL);
    int code;
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 0, 0, "B", NULL, &code), -1); /* changed nothing */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 0, 0, "A", NULL, &code), 0);
    /* A killed and restarted: its old connection is closed, B takes the id. */
    s_open[0] = 0;
    CHECK_EQ(s_claim(&a, 0, "B", NULL), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 0, 0, "B", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 0, 0, "A", NULL, &code), -1);
    /* One connection may hold two ids only by saying HELLO for each. */
    CHECK_EQ(s_claim(&a, 1, "B", NULL), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 1, 0, "B", NULL, &code), 0);
    dp_auth_fini(&a);
}

/* A worker's own client on a new connection (it reset its socket after an
 * interrupted request) says HELLO with the session of the HELLO that bound
 * the id: the id moves to the new connection although the old one still
 * looks open (its close may reach the server after the new HELLO: the
 * flake test_py_sigint met under the sanitizers). A peer that lies about the
 * id without that session, or with none, is still refused, and the moved
 * id's old connection speaks for nobody. */
static void test_claim_own_reconnect(void)
{
    s_reset_live();
    dp_auth_t a;
    char err[DP_ERR_LEN];
    const uint64_t S = 0x1234567890abcdefULL;
    CHECK_EQ(dp_auth_init(&a, 2, 0, err), 0);
    CHECK_EQ(s_claim_in(&a, 1, "A", NULL, S), 0);
    s_open[0] = 1; /* A is still open at the server */
    CHECK_EQ(s_claim_in(&a, 1, "B", NULL, S + 1), -1); /* another worker: taken */
    CHECK(strstr(s_msg, "worker id 1 is taken") != NULL);
    CHECK_EQ(s_claim_in(&a, 1, "B", NULL, 0), -1);
    int code;
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 1, 0, "A", NULL, &code), 0); /* unchanged */
    CHECK_EQ(s_claim_in(&a, 1, "C", NULL, S), 0); /* its own client, re-dialled */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 1, 0, "C", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 1, 0, "A", NULL, &code), -1);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER);
    CHECK_EQ(s_beat(&a, 1, "D", NULL, S), 0); /* its beats still count */
    /* A session binds its own id only: worker 0's HELLO with it is a claim
     * like any other (0 is free: granted). */
    CHECK_EQ(s_claim_in(&a, 0, "C", NULL, S), 0);
    CHECK_EQ(a.refused, 3);
    dp_auth_fini(&a);
}

/* Without CURVE, STATS / SHUTDOWN need the token worker 0 got. */
static void test_chief_token(void)
{
    s_reset_live();
    dp_auth_t a;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_auth_init(&a, 2, 0, err), 0);
    uint64_t tok = dp_auth_token_for(&a, 0);
    CHECK(tok != 0);
    CHECK_EQ(dp_auth_token_for(&a, 1), 0); /* only the chief is told */
    int code;
    /* No chief yet: nobody, even with the right number. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, -1, tok, "T", NULL, &code), -1);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_NOT_CHIEF);
    CHECK_EQ(s_claim(&a, 0, "A", NULL), 0);
    CHECK_EQ(s_claim(&a, 1, "B", NULL), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__STATS, 0, tok, "A", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, 0, tok, "A", NULL, &code), 0);
    /* The chief without its token, a worker, a tool: refused. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__STATS, 0, 0, "A", NULL, &code), -1);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_NOT_CHIEF);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, 1, tok + 1, "B", NULL, &code), -1);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_NOT_CHIEF);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, -1, 0, "T", NULL, &code), -1);
    /* A tool that holds the token may ask (the token is the proof here). */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__STATS, -1, tok, "T", NULL, &code), 0);
    CHECK_EQ(a.refused, 4);
    dp_auth_fini(&a);
}

/* Hole 5 of issue 19: a HEARTBEAT counts for an id only from whoever holds
 * it: on its HELLO's connection, or carrying that HELLO's session (the
 * worker's heartbeat thread). Before, any connection's beats kept any id
 * alive, a dead worker's too, so a sync run waited for it for ever. */
static void test_heartbeat_holder(void)
{
    s_reset_live();
    dp_auth_t a;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_auth_init(&a, 3, 0, err), 0);
    const uint64_t S = 0x1234567890abcdefULL, S2 = 0xfedcba0987654321ULL;
    /* Nobody holds 1 yet (a worker still starting): anyone could say HELLO
     * as 1 and beat on that connection, so the beats count. */
    CHECK_EQ(s_beat(&a, 1, "B", NULL, S), 0);
    CHECK_EQ(s_beat(&a, 1, "C", NULL, 0), 0);
    CHECK_EQ(s_claim_in(&a, 1, "A", NULL, S), 0);
    CHECK_EQ(s_beat(&a, 1, "A", NULL, 0), 0); /* the client itself, on its connection */
    CHECK_EQ(s_beat(&a, 1, "B", NULL, S), 0); /* its heartbeat thread: same session */
    CHECK_EQ(s_beat(&a, 1, "C", NULL, 0), -1); /* anyone else */
    CHECK(strstr(s_msg, "HEARTBEAT as worker 1 refused") != NULL);
    CHECK_EQ(s_beat(&a, 1, "C", NULL, S + 1), -1);
    /* Worker 1 dies: its id stays its session's, so no beat keeps it alive. */
    s_open[0] = 0;
    CHECK_EQ(s_beat(&a, 1, "C", NULL, 0), -1);
    CHECK_EQ(s_beat(&a, 1, "C", NULL, S2), -1);
    /* Restarted (a new process, a new session): its beats count, the old don't. */
    CHECK_EQ(s_claim_in(&a, 1, "D", NULL, S2), 0);
    CHECK_EQ(s_beat(&a, 1, "E", NULL, S2), 0);
    CHECK_EQ(s_beat(&a, 1, "B", NULL, S), -1);
    /* A HELLO without a session: beats count on its own connection only. */
    CHECK_EQ(s_claim_in(&a, 2, "F", NULL, 0), 0);
    CHECK_EQ(s_beat(&a, 2, "F", NULL, 0), 0);
    CHECK_EQ(s_beat(&a, 2, "G", NULL, 0), -1);
    /* A tool's ping (id -1) speaks for nobody and is answered. */
    CHECK_EQ(s_beat(&a, -1, "T", NULL, 0), 0);
    CHECK_EQ(a.refused, 6);
    dp_auth_fini(&a);
}

/* The allow list of test_curve_keys: the chief, worker 1, a key under
 * another name, and a key named for a task beyond --workers 3. */
static const dp_auth_key_t s_allow[] = {
    {"chief-key", "worker-0.pub"},
    {"worker-key", "worker-1.pub"},
    {"other-key", "laptop.pub"},
    {"stale-key", "worker-7.pub"},
};

/* Hole 1 of issue 19: under CURVE a key named after a task is that task's
 * from the start, whoever says HELLO first, and in a fresh server process
 * (a restart) too; only the chief's key is the chief. Before, the first key
 * to say HELLO as 0 was the chief. */
static void test_curve_keys(void)
{
    for (int start = 0; start < 2; start++) { /* a restart: the same list, fresh state */
        s_reset_live();
        dp_auth_t a;
        char err[DP_ERR_LEN];
        CHECK_EQ(dp_auth_init(&a, 3, 1, err), 0);
        CHECK_EQ(dp_auth_name_keys(&a, s_allow, 4, err), 0);
        CHECK_EQ(a.n_named, 3);
        /* Worker 1's key says HELLO as the chief before the chief: refused. */
        CHECK_EQ(s_claim(&a, 0, "B", "worker-key"), -1);
        CHECK(strstr(s_msg, "worker id 0 is taken: it belongs to the CURVE key worker-0.pub") != NULL);
        CHECK(strstr(s_msg, "this key is worker-1.pub's, so it may speak only as worker 1") != NULL);
        if (start == 0) fprintf(stderr, "  (expected) %s\n", s_msg);
        CHECK_EQ(s_claim(&a, 0, "C", "other-key"), -1); /* another name: never the chief */
        CHECK_EQ(s_claim(&a, 1, "C", "other-key"), -1); /* nor a named task's id */
        CHECK(strstr(s_msg, "belongs to the CURVE key worker-1.pub") != NULL);
        CHECK_EQ(s_claim(&a, 2, "D", "stale-key"), -1); /* named for no task of this run */
        CHECK(strstr(s_msg, "a task beyond --workers") != NULL);
        CHECK_EQ(s_claim(&a, 2, "B", "worker-key"), -1); /* a named key: its own id only */
        CHECK_EQ(s_claim(&a, 2, "C", "other-key"), 0); /* a free id: first come */
        CHECK_EQ(s_claim(&a, 0, "A", "chief-key"), 0);  /* the chief joins after all that */
        CHECK_EQ(s_claim(&a, 1, "B", "worker-key"), 0);
        int code;
        CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__STATS, 0, 0, "A", "chief-key", &code), 0);
        /* Another allowed key, even with the token: not the chief. */
        CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, 1, a.run_token, "B", "worker-key", &code), -1);
        CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_NOT_CHIEF);
        /* The chief's connection gone: still nobody else's; its own key back. */
        CHECK_EQ(s_claim(&a, 0, "E", "other-key"), -1);
        CHECK_EQ(s_claim(&a, 0, "E", "chief-key"), 0);
        CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, -1, 0, "T", "chief-key", &code), 0);
        /* Heartbeats: from a key that may be the id, on any connection. */
        CHECK_EQ(s_beat(&a, 1, "F", "worker-key", 0), 0);
        CHECK_EQ(s_beat(&a, 1, "F", "other-key", 0), -1);
        CHECK_EQ(s_beat(&a, 2, "F", "other-key", 0), 0);
        CHECK_EQ(s_beat(&a, 2, "F", "worker-key", 0), -1);
        CHECK_EQ(s_beat(&a, 0, "F", "stale-key", 0), -1);
        dp_auth_fini(&a);
    }
    /* Before any HELLO, a named id's beats come from its key alone. */
    dp_auth_t a;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_auth_init(&a, 3, 1, err), 0);
    CHECK_EQ(dp_auth_name_keys(&a, s_allow, 4, err), 0);
    CHECK_EQ(s_beat(&a, 1, "F", "worker-key", 0), 0);
    CHECK_EQ(s_beat(&a, 1, "F", "other-key", 0), -1);
    CHECK_EQ(s_beat(&a, 2, "F", "other-key", 0), 0); /* free: whoever could take it */
    dp_auth_fini(&a);
}

/* How the names map to ids, and the lists refused at start. */
static void test_curve_names(void)
{
    dp_auth_t a;
    char err[DP_ERR_LEN];
    /* With a chief-0.pub, worker-I.pub is worker I + 1 (TF_CONFIG's folding). */
    const dp_auth_key_t chief[] = {{"k-chief", "chief-0.pub"}, {"k-w0", "worker-0.pub"},
                                   {"k-w1", "worker-1.pub"}, {"k-01", "worker-01.pub"},
                                   {"k-chief", "chief-0.pub"}}; /* listed twice: fine */
    CHECK_EQ(dp_auth_init(&a, 3, 1, err), 0);
    CHECK_EQ(dp_auth_name_keys(&a, chief, 5, err), 0);
    CHECK_STR(a.w[0].key, "k-chief");
    CHECK_STR(a.w[1].key, "k-w0");
    CHECK_STR(a.w[2].key, "k-w1");
    CHECK_EQ(a.n_named, 3); /* "worker-01.pub" is not a task's name */
    dp_auth_fini(&a);
    struct {
        const char *what;
        dp_auth_key_t k[2];
        int n;
        const char *want;
    } bad[] = {
        {"no chief", {{"k1", "w0.pub"}, {"k2", "w1.pub"}}, 2, "no key is named for the chief"},
        {"chief-1", {{"k1", "chief-1.pub"}, {"k2", "worker-0.pub"}}, 2, "a run has one chief"},
        {"two keys, one task", {{"k1", "worker-0.pub"}, {"k2", "worker-0.pub"}}, 2,
         "two keys are named for worker 0"},
        {"one key, two tasks", {{"k1", "worker-0.pub"}, {"k1", "worker-1.pub"}}, 2,
         "one key is named both worker-0.pub and worker-1.pub"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(dp_auth_init(&a, 3, 1, err), 0);
        err[0] = 0;
        CHECK_EQ(dp_auth_name_keys(&a, bad[i].k, bad[i].n, err), -1);
        if (!strstr(err, bad[i].want)) {
            fprintf(stderr, "  %s: '%s' lacks '%s'\n", bad[i].what, err, bad[i].want);
            CHECK(0);
        }
        dp_auth_fini(&a);
    }
}

/* SIGHUP's new allow list: a bound id whose key stays keeps its binding
 * (and the chief its token); one whose key is gone, or whose id is now
 * named for another key, is dropped; a list named wrongly changes nothing. */
static void test_curve_rekey(void)
{
    dp_auth_t a;
    char err[DP_ERR_LEN];
    const dp_auth_key_t first[] = {{"k-w0", "worker-0.pub"}, {"k-w1", "worker-1.pub"}, {"k-x", "x.pub"}};
    CHECK_EQ(dp_auth_init(&a, 3, 1, err), 0);
    CHECK_EQ(dp_auth_name_keys(&a, first, 3, err), 0);
    CHECK_EQ(s_claim(&a, 0, "A", "k-w0"), 0);
    CHECK_EQ(s_claim(&a, 1, "B", "k-w1"), 0);
    CHECK_EQ(s_claim(&a, 2, "C", "k-x"), 0); /* an unnamed key: first come */
    uint64_t token = a.run_token;
    unsigned char dropped[3];
    const dp_auth_key_t wrong[] = {{"k-w1", "worker-1.pub"}}; /* no chief */
    CHECK_EQ(dp_auth_rekey(&a, wrong, 1, dropped, err), -1);
    CHECK(strstr(err, "no key is named for the chief") != NULL);
    CHECK_EQ(a.w[1].conn_len, 1); /* unchanged */
    /* worker 1's key removed, a new one named for worker 2 */
    const dp_auth_key_t next[] = {{"k-w0", "worker-0.pub"}, {"k-x", "x.pub"}, {"k-w2", "worker-2.pub"}};
    CHECK_EQ(dp_auth_rekey(&a, next, 3, dropped, err), 0);
    CHECK_EQ(dropped[0], 0);
    CHECK_EQ(dropped[1], 1);
    CHECK_EQ(dropped[2], 1); /* its id is worker-2.pub's now */
    CHECK_EQ(a.run_token, token);
    int code;
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 0, 0, "A", "k-w0", &code), 0);
    CHECK_EQ(a.w[1].conn_len, 0); /* free: B's requests as worker 1 are refused */
    CHECK(s_check(&a, DOWNPOUR__MSG_TYPE__PULL, 1, 0, "B", "k-w1", &code) != 0);
    CHECK(s_claim(&a, 2, "C", "k-x") != 0);   /* named for k-w2 */
    CHECK_EQ(s_claim(&a, 2, "D", "k-w2"), 0);
    dp_auth_fini(&a);
}

/* ---- through a server ------------------------------------------------ */

/* An async server for 2 workers of the small model on a free port; CURVE
 * when secret is given. 0 once listening. */
static int s_srv_start(srv_t *s, const char *secret, const char *allow)
{
    srv_init(s, DP_MODE_ASYNC, 2);
    if (secret) {
        snprintf(s->cfg.curve_secret, sizeof s->cfg.curve_secret, "%s", secret);
        snprintf(s->cfg.curve_allow, sizeof s->cfg.curve_allow, "%s", allow);
    }
    return srv_start(s);
}

/* Waits up to wait_s for the server to end by itself (a SHUTDOWN), then
 * stops it; 1 when it had ended by itself. */
static int s_srv_stop(srv_t *s, double wait_s)
{
    srv_stop_after(s, wait_s);
    return s->ended;
}

static dp_model_t s_model;
static char s_dir[64];

static void s_keys(void)
{
    char err[DP_ERR_LEN];
    if (dp_model_parse(&s_model, SRV_SMALL_SPEC, 1, 8, 8, err) != 0) abort();
    snprintf(s_dir, sizeof s_dir, "/tmp/dp-test-auth-XXXXXX");
    if (!mkdtemp(s_dir)) abort();
    const char *names[] = {"srv", "worker-0", "worker-1", "evil"};
    for (int i = 0; i < 4; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", s_dir, names[i]);
        if (dp_curve_keygen(path, err) != 0) abort();
    }
    /* The workers' public keys in a directory, as `downpour local --secure`
     * and the Kubernetes pods give them. */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir %s/allow && cp %s/worker-0.pub %s/worker-1.pub %s/allow/",
             s_dir, s_dir, s_dir, s_dir);
    if (system(cmd) != 0) abort();
}

static void s_rmkeys(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", s_dir);
}

/* A client as worker wid with key NAME (NULL: plain). */
static int s_client(dp_ps_client_t **c, const srv_t *s, int wid, const char *name, double tmo,
                    char *err)
{
    char sec[128], srv[128];
    snprintf(sec, sizeof sec, "%s/%s", s_dir, name ? name : "");
    snprintf(srv, sizeof srv, "%s/srv.pub", s_dir);
    dp_ps_client_opts_t o = {.timeout_s = tmo, .curve = {name ? sec : NULL, srv}};
    return dp_ps_client_new(c, s->endpoint, &s_model, wid, &o, NULL, err);
}

/* Plain server: a second claimant of a live id and a second chief are
 * refused with ERR_ID_TAKEN's line; a closed connection's id is taken back;
 * STATS / SHUTDOWN from a worker are refused, the chief's obeyed. */
static void test_server_plain(void)
{
    s_keys();
    srv_t s;
    CHECK_EQ(s_srv_start(&s, NULL, NULL), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c0 = NULL, *c1 = NULL, *dup = NULL;
    CHECK_EQ(s_client(&c0, &s, 0, NULL, 5, err), 0);
    CHECK_EQ(s_client(&c1, &s, 1, NULL, 5, err), 0);
    CHECK_EQ(s_client(&dup, &s, 0, NULL, 5, err), -1); /* a second chief */
    CHECK(strstr(err, "worker id 0 is taken") != NULL);
    CHECK(strstr(err, "--task-index") != NULL);
    fprintf(stderr, "  (expected) %s\n", err);
    CHECK_EQ(s_client(&dup, &s, 1, NULL, 5, err), -1); /* the same index twice */
    CHECK(strstr(err, "worker id 1 is taken") != NULL);
    dp_ps_stats_t st;
    if (c1) {
        CHECK_EQ(dp_ps_client_stats(c1, &st, err), -1);
        CHECK(strstr(err, "STATS refused: only the chief") != NULL);
        CHECK_EQ(dp_ps_client_shutdown_servers(c1, err), -1);
        CHECK(strstr(err, "SHUTDOWN refused: only the chief") != NULL);
    }
    /* Worker 1 killed and started again: its id comes back. */
    dp_ps_client_destroy(&c1);
    int rc;
    SRV_REJOIN(rc, err, s_client(&c1, &s, 1, NULL, 5, err));
    CHECK_EQ(rc, 0);
    if (c0) {
        CHECK_EQ(dp_ps_client_stats(c0, &st, err), 0);
        CHECK_EQ(dp_ps_client_shutdown_servers(c0, err), 0);
    }
    CHECK_EQ(s_srv_stop(&s, 5), 1); /* the chief's SHUTDOWN ended it */
    CHECK_EQ(s.rc, 0);
    dp_ps_client_destroy(&c0);
    dp_ps_client_destroy(&c1);
    s_rmkeys();
}

/* CURVE: allowed keys work; an unknown key and a plain client hear nothing
 * and change nothing; another allowed key is not the chief. */
static void test_server_curve(void)
{
    s_keys();
    char secret[128], allow[300];
    snprintf(secret, sizeof secret, "%s/srv", s_dir);
    snprintf(allow, sizeof allow, "%s/worker-0.pub,%s/worker-1.pub", s_dir, s_dir);
    srv_t s;
    CHECK_EQ(s_srv_start(&s, secret, allow), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c0 = NULL, *c1 = NULL, *bad = NULL;
    CHECK_EQ(s_client(&c0, &s, 0, "worker-0", 5, err), 0);
    CHECK_EQ(s_client(&c1, &s, 1, "worker-1", 5, err), 0);
    size_t n = s_model.n_floats;
    float *p0 = dp_malloc(n * 4), *p1 = dp_malloc(n * 4);
    if (c0) CHECK_EQ(dp_ps_client_pull(c0, p0, err), 0);
    CHECK_EQ(s_client(&bad, &s, 1, "evil", 1, err), -1);
    CHECK(strstr(err, "no reply in 1 s") != NULL);
    CHECK_EQ(s_client(&bad, &s, 1, NULL, 1, err), -1);
    CHECK(strstr(err, "no reply in 1 s") != NULL);
    CHECK_EQ(s_client(&bad, &s, 0, "worker-1", 5, err), -1); /* worker 1's key as the chief */
    CHECK(strstr(err, "worker id 0 is taken") != NULL);
    if (c1) {
        CHECK_EQ(dp_ps_client_shutdown_servers(c1, err), -1);
        CHECK(strstr(err, "only the chief (worker 0) may ask it, with its own CURVE key") != NULL);
    }
    if (c0) {
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c0, &st, err), 0);
        CHECK_EQ(st.applied, 0);
        CHECK_EQ(dp_ps_client_pull(c0, p1, err), 0);
        CHECK_CLOSE("weights unchanged", p1, p0, n, 0, 0);
        CHECK_EQ(dp_ps_client_shutdown_servers(c0, err), 0);
    }
    CHECK_EQ(s_srv_stop(&s, 5), 1);
    CHECK_EQ(s.rc, 0);
    free(p0), free(p1);
    dp_ps_client_destroy(&c0);
    dp_ps_client_destroy(&c1);
    s_rmkeys();
}

/* Hole 1 of issue 19, through a server: worker 1's key says HELLO as the
 * chief before the chief, at a fresh server and again at one restarted on
 * the same port with the same allow list: refused (ERR_ID_TAKEN, naming
 * whose id it is); the real chief then joins and its STATS and SHUTDOWN are
 * obeyed. An allow list that names no chief stops the server at start. */
static void test_server_chief_key(void)
{
    s_keys();
    char secret[128], allow[128], err[DP_ERR_LEN] = "";
    snprintf(secret, sizeof secret, "%s/srv", s_dir);
    snprintf(allow, sizeof allow, "%s/allow", s_dir);
    char endpoint[256] = "";
    for (int start = 0; start < 2; start++) {
        srv_t s;
        srv_init(&s, DP_MODE_ASYNC, 2);
        snprintf(s.cfg.curve_secret, sizeof s.cfg.curve_secret, "%s", secret);
        snprintf(s.cfg.curve_allow, sizeof s.cfg.curve_allow, "%s", allow);
        if (start) snprintf(s.cfg.bind, sizeof s.cfg.bind, "%s", endpoint); /* the restart */
        CHECK_EQ(srv_start(&s), 0);
        snprintf(endpoint, sizeof endpoint, "%s", s.endpoint);
        dp_ps_client_t *bad = NULL, *c0 = NULL;
        CHECK_EQ(s_client(&bad, &s, 0, "worker-1", 5, err), -1);
        CHECK(strstr(err, "worker id 0 is taken: it belongs to the CURVE key worker-0.pub") != NULL);
        CHECK(strstr(err, "may speak only as worker 1") != NULL);
        if (start == 0) fprintf(stderr, "  (expected) %s\n", err);
        CHECK_EQ(s_client(&c0, &s, 0, "worker-0", 5, err), 0);
        if (c0) {
            dp_ps_stats_t st;
            CHECK_EQ(dp_ps_client_stats(c0, &st, err), 0);
            if (start) CHECK_EQ(dp_ps_client_shutdown_servers(c0, err), 0);
        }
        CHECK_EQ(srv_stop_after(&s, start ? 5 : 0), 0);
        if (start) CHECK_EQ(s.ended, 1); /* the chief's SHUTDOWN ended it */
        dp_ps_client_destroy(&c0);
    }
    /* Keys under other names only: nobody could be the chief. */
    char dir[160], cmd[1024];
    snprintf(dir, sizeof dir, "%s/unnamed", s_dir);
    snprintf(cmd, sizeof cmd, "mkdir %s && cp %s/worker-0.pub %s/w0.pub && cp %s/worker-1.pub %s/w1.pub",
             dir, s_dir, dir, s_dir, dir);
    CHECK_EQ(system(cmd), 0);
    srv_t s;
    CHECK_EQ(s_srv_start(&s, secret, dir), -1);
    CHECK(strstr(s.err, "--curve-allow: no key is named for the chief") != NULL);
    fprintf(stderr, "  (expected) %s\n", s.err);
    CHECK_EQ(srv_stop(&s), -1);
    s_rmkeys();
}

/* The spoofer of test_server_spoofed_beats: a raw DEALER that never says
 * HELLO and sends HEARTBEATs as worker 1 (no session, or a guessed one)
 * every 20 ms until told to stop; counts what came back. */
typedef struct {
    const char *endpoint;
    atomic_int stop, first; /* first: one reply is in */
    int accepted, refused, other;
} spoofer_t;

static void *s_spoof(void *arg)
{
    spoofer_t *sp = arg;
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, tmo = 2000;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_connect(sock, sp->endpoint);
    for (uint64_t req = 1; !atomic_load(&sp->stop); req++) {
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, req, 1, s_model.fingerprint);
        env.session = req % 2 ? 0 : req * 0x9e3779b97f4a7c15ULL; /* none, or a guess */
        char err[DP_ERR_LEN];
        dp_wire_rx_t rx;
        if (dp_wire_send(sock, NULL, &env, NULL, 0, err) != 0 || dp_wire_recv(sock, &rx, 0, err) != 0) {
            sp->other++;
            continue;
        }
        Downpour__Envelope *rep = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
        if (rep && rep->type == DOWNPOUR__MSG_TYPE__HEARTBEAT) sp->accepted++;
        else if (rep && rep->type == DOWNPOUR__MSG_TYPE__ERROR &&
                 rep->error->code == DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER)
            sp->refused++;
        else sp->other++;
        dp_wire_destroy(&rep);
        dp_wire_rx_fini(&rx);
        atomic_store(&sp->first, 1);
        usleep(20 * 1000);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return NULL;
}

/* Hole 5 of issue 19, through a server: sync, 2 workers, heartbeat timeout
 * 0.5 s. Worker 1 joins and dies; a connection that never said HELLO keeps
 * sending HEARTBEATs as worker 1. Worker 0's pull after its push is held
 * until worker 1 stops counting: it must come back (version 1), every
 * spoofed beat answered ERR_UNKNOWN_WORKER. Before, the beats kept worker 1
 * counted and the pull was held until the client gave up (20 timeouts). */
static void test_server_spoofed_beats(void)
{
    s_keys();
    srv_t s;
    srv_init(&s, DP_MODE_SYNC, 2);
    s.cfg.heartbeat_timeout = 0.5;
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c0 = NULL, *c1 = NULL;
    const uint64_t S1 = dp_ps_session_new(); /* worker 1's */
    CHECK_EQ(s_client(&c0, &s, 0, NULL, 1, err), 0);
    dp_ps_client_opts_t o1 = {.timeout_s = 1, .session = S1};
    CHECK_EQ(dp_ps_client_new(&c1, s.endpoint, &s_model, 1, &o1, NULL, err), 0);
    dp_ps_client_destroy(&c1); /* worker 1 dies */
    spoofer_t sp = {.endpoint = s.endpoint};
    atomic_init(&sp.stop, 0);
    atomic_init(&sp.first, 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, s_spoof, &sp), 0);
    for (int i = 0; i < 500 && !atomic_load(&sp.first); i++) usleep(10 * 1000);
    CHECK(atomic_load(&sp.first)); /* beats are flowing before worker 0 waits */
    if (c0) {
        size_t n = s_model.n_floats;
        float *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        srv_fill(g, n, 3);
        CHECK_EQ(dp_ps_client_pull(c0, p, err), 0);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c0, PS_PUSH(g, 1, 8), &r, err), 0);
        double t0 = dp_now();
        int rc = dp_ps_client_pull(c0, p, err); /* held until worker 1 stops counting */
        CHECK_EQ(rc, 0);
        if (rc != 0) fprintf(stderr, "  pull: %s\n", err);
        CHECK_EQ(dp_ps_client_version(c0), 1);
        fprintf(stderr, "  worker 0's held pull came back %.1f s after its push, under spoofed "
                "heartbeats for worker 1\n", dp_now() - t0);
        free(p), free(g);
    }
    atomic_store(&sp.stop, 1);
    pthread_join(th, NULL);
    fprintf(stderr, "  spoofed beats: %d refused, %d accepted, %d other\n", sp.refused, sp.accepted,
            sp.other);
    CHECK(sp.refused > 0);
    CHECK_EQ(sp.accepted, 0);
    CHECK_EQ(sp.other, 0);
    /* Worker 1's own session (its heartbeat thread's) still counts. */
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, tmo = 5000;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_connect(sock, s.endpoint);
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, 7, 1, 0);
    env.session = S1;
    dp_wire_rx_t rx;
    CHECK_EQ(dp_wire_send(sock, NULL, &env, NULL, 0, err), 0);
    CHECK_EQ(dp_wire_recv(sock, &rx, 0, err), 0);
    Downpour__Envelope *rep = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    CHECK(rep && rep->type == DOWNPOUR__MSG_TYPE__HEARTBEAT);
    dp_wire_destroy(&rep);
    dp_wire_rx_fini(&rx);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    dp_ps_client_destroy(&c0);
    CHECK_EQ(srv_stop(&s), 0);
    s_rmkeys();
}

/* test_claim_own_reconnect through a server: worker 1's first connection
 * (a raw DEALER, left open) said HELLO with session S; a HELLO as 1 on a
 * second connection with another session is refused (ERR_ID_TAKEN), with S
 * welcomed, after which the first connection speaks for nobody. Then the
 * story that needs it, in sync with 2 workers: worker 1's client is
 * interrupted in a pull the server holds (its stop flag), resets its socket
 * and leaves on the new connection; the server counts it gone, so worker
 * 0's next pull is answered at once, not after the 60 s timeout. */
static void test_server_own_reconnect(void)
{
    s_keys();
    srv_t s;
    srv_init(&s, DP_MODE_SYNC, 2);
    s.cfg.heartbeat_timeout = 60;
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    void *ctx = zmq_ctx_new();
    void *a = raw_dealer(ctx, s.endpoint, 5000), *b = raw_dealer(ctx, s.endpoint, 5000);
    const uint64_t S = dp_ps_session_new();
    Downpour__Envelope env;
    Downpour__Hello h;
    raw_hello_init(&env, &h, &s_model, 1, 1);
    env.session = S;
    CHECK_EQ(raw_request(a, &env, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
    Downpour__Envelope *rep = NULL;
    env.session = S ^ 1;
    CHECK_EQ(raw_request(b, &env, &rep), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(rep && rep->error->code == DOWNPOUR__ERROR_CODE__ERR_ID_TAKEN);
    dp_wire_destroy(&rep);
    /* the server asked the ROUTER whether a is live by sending it a HEARTBEAT */
    CHECK_EQ(raw_reply(a).type, DOWNPOUR__MSG_TYPE__HEARTBEAT);
    env.session = S;
    CHECK_EQ(raw_request(b, &env, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
    Downpour__Envelope fin;
    dp_wire_env_init(&fin, DOWNPOUR__MSG_TYPE__BARRIER, 2, 1, s_model.fingerprint);
    Downpour__Barrier bar = DOWNPOUR__BARRIER__INIT;
    bar.finished = 1;
    fin.barrier = &bar;
    CHECK_EQ(raw_request(a, &fin, &rep), DOWNPOUR__MSG_TYPE__ERROR); /* the old one: nobody */
    CHECK(rep && rep->error->code == DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER);
    dp_wire_destroy(&rep);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);

    srv_init(&s, DP_MODE_SYNC, 2);
    s.cfg.heartbeat_timeout = 60;
    CHECK_EQ(srv_start(&s), 0);
    volatile sig_atomic_t stop1 = 0;
    dp_ps_client_t *c0 = NULL, *c1 = NULL;
    dp_ps_client_opts_t o1 = {.timeout_s = 60, .stop = &stop1};
    CHECK_EQ(s_client(&c0, &s, 0, NULL, 60, err), 0);
    CHECK_EQ(dp_ps_client_new(&c1, s.endpoint, &s_model, 1, &o1, NULL, err), 0);
    size_t n = s_model.n_floats;
    float *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    srv_fill(g, n, 5);
    if (c0 && c1) {
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_pull(c1, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c1, PS_PUSH(g, 1, 8), &r, err), 0);
        stop1 = 1; /* the held pull gives up at once */
        CHECK_EQ(dp_ps_client_pull(c1, p, err), -1);
        CHECK_EQ(dp_ps_client_error(c1), DP_PS_ERR_INTERRUPTED);
        stop1 = 0;
        err[0] = 0;
        CHECK_EQ(dp_ps_client_leave(c1, err), 0); /* on its new connection */
        if (err[0]) fprintf(stderr, "  leave: %s\n", err);
        double t0 = dp_now();
        CHECK_EQ(dp_ps_client_pull(c0, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c0, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(dp_ps_client_pull(c0, p, err), 0); /* version 1: without worker 1 */
        CHECK_EQ(dp_ps_client_version(c0), 1);
        CHECK(dp_now() - t0 < 30);
    }
    free(p), free(g);
    dp_ps_client_destroy(&c0);
    dp_ps_client_destroy(&c1);
    CHECK_EQ(srv_stop(&s), 0);
    s_rmkeys();
}

/* The heartbeat thread's beats carry its worker id and the session it was
 * given, the one its client's HELLOs carry (what ties them together at
 * the server): read by a ROUTER standing in for a shard. Sessions drawn
 * twice differ (two clients in one process are two workers). */
static void test_beat_session(void)
{
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0, tmo = 5000;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    CHECK_EQ(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t len = sizeof ep;
    CHECK_EQ(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_beat_t *b = NULL;
    const uint64_t S = dp_ps_session_new();
    CHECK(S != 0);
    CHECK(dp_ps_session_new() != S);
    CHECK_EQ(dp_ps_beat_new(&b, ep, 1, S, NULL, err), 0);
    dp_wire_rx_t rx;
    CHECK_EQ(dp_wire_recv(router, &rx, 0, err), 0); /* [identity] [envelope] */
    Downpour__Envelope *env = rx.n_parts == 2 ? dp_wire_decode(zmq_msg_data(&rx.parts[1]),
                                                               zmq_msg_size(&rx.parts[1]), err)
                                              : NULL;
    CHECK(env != NULL);
    if (env) {
        CHECK_EQ(env->type, DOWNPOUR__MSG_TYPE__HEARTBEAT);
        CHECK_EQ(env->worker_id, 1);
        CHECK(env->session != 0);
        CHECK(env->session == S);
    }
    dp_wire_destroy(&env);
    dp_wire_rx_fini(&rx);
    dp_ps_beat_destroy(&b);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

DP_TESTS(T(test_binding), T(test_claims), T(test_claim_own_reconnect), T(test_chief_token), T(test_heartbeat_holder),
         T(test_curve_rekey),
         T(test_curve_keys), T(test_curve_names), T(test_server_plain), T(test_server_curve),
         T(test_server_chief_key), T(test_server_spoofed_beats), T(test_server_own_reconnect), T(test_beat_session))
