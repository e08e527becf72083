/* auth: the worker-id binding and the chief's rules (see auth.h). */
#include "server/auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <zmq.h>

#include "common/util.h"

int dp_auth_init(dp_auth_t *a, int n, int curve, char *err)
{
    memset(a, 0, sizeof *a);
    a->n = n;
    a->curve = curve;
    a->w = dp_calloc((size_t)n, sizeof *a->w);
    while (a->run_token == 0)
        if (getrandom(&a->run_token, sizeof a->run_token, 0) != (ssize_t)sizeof a->run_token &&
            errno != EINTR) {
            dp_auth_fini(a);
            return dp_err(err, "no random run token: %s", strerror(errno));
        }
    return 0;
}

void dp_auth_fini(dp_auth_t *a)
{
    free(a->w);
    a->w = NULL;
    a->n = 0;
}

static int s_same_conn(const dp_auth_slot_t *s, const dp_auth_peer_t *p)
{
    return s->conn_len == p->conn_len && memcmp(s->conn, p->conn, p->conn_len) == 0;
}

static int s_refuse(dp_auth_t *a, char *msg, size_t n, const char *fmt, int wid)
{
    a->refused++;
    snprintf(msg, n, fmt, wid, wid);
    return -1;
}

int dp_auth_claim(dp_auth_t *a, int wid, const dp_auth_peer_t *p, dp_auth_live_fn live,
                  void *arg, char *msg, size_t msg_len)
{
    dp_auth_slot_t *s = &a->w[wid];
    if (p->conn_len == 0 || p->conn_len > DP_AUTH_CONN_MAX)
        return s_refuse(a, msg, msg_len, "worker id %d: no connection identity (%d)", wid);
    if (s->conn_len && s_same_conn(s, p)) return 0; /* HELLO again on its own connection */
    if (a->curve && s->key[0] && strcmp(s->key, p->key ? p->key : "") != 0)
        return s_refuse(a, msg, msg_len,
                        "worker id %d is taken: it belongs to another CURVE key at this server "
                        "(each worker needs its own --task-index; is another worker started as %d?)",
                        wid);
    if (s->conn_len && live(arg, s->conn, s->conn_len))
        return s_refuse(a, msg, msg_len,
                        "worker id %d is taken: another live connection said HELLO as worker %d "
                        "(two workers started without --task-index, or the same --task-index twice?)",
                        wid);
    memcpy(s->conn, p->conn, p->conn_len);
    s->conn_len = p->conn_len;
    if (a->curve && !s->key[0] && p->key) snprintf(s->key, sizeof s->key, "%s", p->key);
    return 0;
}

/* STATS / SHUTDOWN: from the chief's key (CURVE), else with its token. */
static int s_is_chief(const dp_auth_t *a, uint64_t token, const dp_auth_peer_t *p)
{
    if (a->n < 1 || !a->w[0].conn_len) return 0; /* no chief yet: nobody */
    if (a->curve) return a->w[0].key[0] && p->key && strcmp(a->w[0].key, p->key) == 0;
    return token == a->run_token;
}

int dp_auth_check(dp_auth_t *a, int type, int wid, uint64_t token, const dp_auth_peer_t *p,
                  int *code, char *msg, size_t msg_len)
{
    /* A HEARTBEAT only says "worker wid is alive". Workers send it from a
     * thread with connections of its own (worker/ps_beat), from before
     * their HELLO, so it comes on any connection; it never binds an id and
     * changes nothing else. Under CURVE it must come from the id's key. */
    if (type == DOWNPOUR__MSG_TYPE__HEARTBEAT) {
        if (a->curve && wid >= 0 && wid < a->n && a->w[wid].key[0] &&
            !(p->key && strcmp(a->w[wid].key, p->key) == 0)) {
            *code = DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER;
            return s_refuse(a, msg, msg_len, "HEARTBEAT as worker %d from another key refused", wid);
        }
        return 0;
    }
    if (wid >= 0 && wid < a->n && !(a->w[wid].conn_len && s_same_conn(&a->w[wid], p))) {
        *code = DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER;
        return s_refuse(a, msg, msg_len,
                        "worker %d has not said HELLO to this shard on this connection (say HELLO "
                        "as worker %d first)",
                        wid);
    }
    if ((type == DOWNPOUR__MSG_TYPE__STATS || type == DOWNPOUR__MSG_TYPE__SHUTDOWN) &&
        !s_is_chief(a, token, p)) {
        *code = DOWNPOUR__ERROR_CODE__ERR_NOT_CHIEF;
        a->refused++;
        snprintf(msg, msg_len, "%s refused: only the chief (worker 0) may ask it, %s",
                 dp_wire_type_name(type),
                 a->curve ? "with its own CURVE key" : "with the run token it got at HELLO");
        return -1;
    }
    return 0;
}

uint64_t dp_auth_token_for(const dp_auth_t *a, int wid)
{
    return wid == 0 ? a->run_token : 0;
}

int dp_auth_router_has_peer(void *sock, const void *conn, size_t conn_len,
                            const Downpour__Envelope *env)
{
    /* ZMQ_ROUTER_MANDATORY makes a send to an unknown routing id fail
     * (EHOSTUNREACH) instead of vanishing; it is on only for this probe.
     * DONTWAIT: a peer whose queue is full counts as live, nothing blocks. */
    int on = 1, off = 0, live = 1;
    if (zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &on, sizeof on) != 0) {
        dp_log_warn("probing worker connection: %s", zmq_strerror(errno));
        return 1; /* cannot tell: keep the binding */
    }
    if (zmq_send(sock, conn, conn_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        live = errno != EHOSTUNREACH;
    } else {
        char err[DP_ERR_LEN]; /* the rest of the message, now bound to go */
        if (dp_wire_send(sock, NULL, env, NULL, 0, err) != 0)
            dp_log_warn("probing worker connection: %s", err);
    }
    if (zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &off, sizeof off) != 0)
        dp_log_warn("probing worker connection: %s", zmq_strerror(errno));
    return live;
}
