/* test_auth: the worker-id binding and the chief's rules (server/auth.h)
 * first without sockets (connections are byte strings, "live" is a table
 * the test sets, keys are made-up strings), then through a real server in a
 * thread (server/ps.h) and the worker's client (worker/ps_client.h), plain
 * and under CURVE. The daemons themselves: tests/integration/test_curve.sh. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/curve.h"
#include "server/auth.h"
#include "server/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/ps_client.h"

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
    return (dp_auth_peer_t){conn, strlen(conn), key};
}

static int s_claim(dp_auth_t *a, int wid, const char *conn, const char *key)
{
    char msg[DP_ERR_LEN];
    dp_auth_peer_t p = s_peer(conn, key);
    return dp_auth_claim(a, wid, &p, s_live, NULL, msg, sizeof msg);
}

static int s_check(dp_auth_t *a, int type, int wid, uint64_t token, const char *conn,
                   const char *key, int *code)
{
    char msg[DP_ERR_LEN];
    dp_auth_peer_t p = s_peer(conn, key);
    *code = -1;
    return dp_auth_check(a, type, wid, token, &p, code, msg, sizeof msg);
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
    /* A HEARTBEAT only proves a worker alive: its heartbeat thread sends it
     * on a connection of its own, so any connection may (it binds nothing). */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, "B", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PUSH, 1, 0, "B", NULL, &code), -1); /* still not bound */
    /* Tools (worker -1) may still ask a HEARTBEAT; out of range is left to the caller. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, -1, 0, "C", NULL, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__PUSH, 7, 0, "C", NULL, &code), 0);
    CHECK_EQ(a.refused, 4);
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

/* Under CURVE: an id belongs to its first key; the chief is its key. */
static void test_curve_keys(void)
{
    s_reset_live();
    dp_auth_t a;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_auth_init(&a, 2, 1, err), 0);
    const char *k0 = "chief-key", *k1 = "worker-key", *k2 = "other-key";
    CHECK_EQ(s_claim(&a, 0, "A", k0), 0);
    CHECK_EQ(s_claim(&a, 1, "B", k1), 0);
    /* Worker 0's connection gone, but another key may not take its id. */
    CHECK_EQ(s_claim(&a, 0, "C", k2), -1);
    CHECK_EQ(s_claim(&a, 0, "C", k0), 0); /* its own key, restarted: fine */
    int code;
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__STATS, 0, 0, "C", k0, &code), 0);
    /* Another allowed key, even with a guessed token: not the chief. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, 1, a.run_token, "B", k1, &code), -1);
    CHECK_EQ(code, DOWNPOUR__ERROR_CODE__ERR_NOT_CHIEF);
    /* A tool holding the chief's key may stop the run. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__SHUTDOWN, -1, 0, "T", k0, &code), 0);
    /* Heartbeats for an id: from any connection of its key, not another key's. */
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, "D", k1, &code), 0);
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, "D", k2, &code), -1);
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
    const char *names[] = {"srv", "w0", "w1", "evil"};
    for (int i = 0; i < 4; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", s_dir, names[i]);
        if (dp_curve_keygen(path, err) != 0) abort();
    }
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
    dp_ps_curve_t k = {sec, srv};
    return dp_ps_client_new_curve(c, s->endpoint, &s_model, wid, tmo, name ? &k : NULL, NULL, err);
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
    usleep(200 * 1000);
    CHECK_EQ(s_client(&c1, &s, 1, NULL, 5, err), 0);
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
    snprintf(allow, sizeof allow, "%s/w0.pub,%s/w1.pub", s_dir, s_dir);
    srv_t s;
    CHECK_EQ(s_srv_start(&s, secret, allow), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c0 = NULL, *c1 = NULL, *bad = NULL;
    CHECK_EQ(s_client(&c0, &s, 0, "w0", 5, err), 0);
    CHECK_EQ(s_client(&c1, &s, 1, "w1", 5, err), 0);
    size_t n = s_model.n_floats;
    float *p0 = dp_malloc(n * 4), *p1 = dp_malloc(n * 4);
    if (c0) CHECK_EQ(dp_ps_client_pull(c0, p0, err), 0);
    CHECK_EQ(s_client(&bad, &s, 1, "evil", 1, err), -1);
    CHECK(strstr(err, "no reply in 1 s") != NULL);
    CHECK_EQ(s_client(&bad, &s, 1, NULL, 1, err), -1);
    CHECK(strstr(err, "no reply in 1 s") != NULL);
    CHECK_EQ(s_client(&bad, &s, 0, "w1", 5, err), -1); /* w1's key as the chief */
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

DP_TESTS(T(test_binding), T(test_claims), T(test_chief_token), T(test_curve_keys),
         T(test_server_plain), T(test_server_curve))
