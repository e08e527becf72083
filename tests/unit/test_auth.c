/* test_auth: the worker-id binding and the chief's rules (server/auth.h)
 * without sockets: connections are byte strings, "live" is a table the test
 * sets, keys are made-up Z85 strings. The same rules over real sockets are
 * tests/integration/test_curve.sh and test_ps's raw-socket cases. */
#include <string.h>

#include "common/util.h"
#include "server/auth.h"
#include "tests/test.h"

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
    CHECK_EQ(s_check(&a, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, "B", NULL, &code), -1);
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
    dp_auth_fini(&a);
}

DP_TESTS(T(test_binding), T(test_claims), T(test_chief_token), T(test_curve_keys))
