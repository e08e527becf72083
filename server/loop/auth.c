/* auth: the worker-id binding and the chief's rules (see auth.h). */
#include "server/loop/auth.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <zmq.h>

#include "common/util.h"
#include "proto/wire_zmq.h"

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
    free(a->named);
    a->w = NULL;
    a->named = NULL;
    a->n = a->n_named = 0;
}

/* "chief-0.pub" -> chief 1, index 0; "worker-12.pub" -> chief 0, index 12.
 * 0 when the name is not a task's (any other name, or digits that do not
 * make a plain number). */
static int s_task_of(const char *file, int *chief, long *index)
{
    const char *rest;
    if (strncmp(file, "chief-", 6) == 0) *chief = 1, rest = file + 6;
    else if (strncmp(file, "worker-", 7) == 0) *chief = 0, rest = file + 7;
    else return 0;
    size_t digits = strspn(rest, "0123456789");
    if (digits == 0 || digits > 6 || strcmp(rest + digits, ".pub") != 0) return 0;
    if (digits > 1 && rest[0] == '0') return 0; /* "worker-01": not how tasks are named */
    *index = strtol(rest, NULL, 10);
    return 1;
}

/* The named entry of key, or NULL: the key is not named after a task. */
static const dp_auth_named_t *s_named(const dp_auth_t *a, const char *key)
{
    for (int i = 0; key && i < a->n_named; i++)
        if (strcmp(a->named[i].key, key) == 0) return &a->named[i];
    return NULL;
}

int dp_auth_rekey(dp_auth_t *a, const dp_auth_key_t *keys, int n, unsigned char *dropped,
                  char *err)
{
    dp_auth_t b;
    if (dp_auth_init(&b, a->n, a->curve, err) != 0) return -1;
    if (dp_auth_name_keys(&b, keys, n, err) != 0) {
        dp_auth_fini(&b);
        return -1;
    }
    for (int i = 0; i < a->n; i++) {
        const dp_auth_slot_t *s = &a->w[i];
        dp_auth_slot_t *t = &b.w[i];
        dropped[i] = 0;
        if (s->conn_len == 0) continue; /* never bound: nothing held */
        int listed = 0;
        for (int k = 0; k < n && !listed; k++) listed = strcmp(keys[k].key, s->key) == 0;
        /* a key that stays, and (if the id is named now) is the one named */
        if (listed && (!t->named || strcmp(t->key, s->key) == 0)) {
            memcpy(t->conn, s->conn, s->conn_len);
            t->conn_len = s->conn_len;
            t->session = s->session;
            snprintf(t->key, sizeof t->key, "%s", s->key);
        } else {
            dropped[i] = 1;
        }
    }
    b.run_token = a->run_token; /* the chief keeps its token, the counts go on */
    b.refused = a->refused;
    dp_auth_fini(a);
    *a = b;
    return 0;
}

int dp_auth_name_keys(dp_auth_t *a, const dp_auth_key_t *keys, int n, char *err)
{
    int has_chief = 0, chief;
    long index;
    for (int i = 0; i < n; i++)
        if (s_task_of(keys[i].file, &chief, &index) && chief) {
            if (index != 0)
                return dp_err(err, "--curve-allow: %s: a run has one chief, chief-0.pub (it is worker 0)",
                              keys[i].file);
            has_chief = 1;
        }
    free(a->named);
    a->named = dp_calloc((size_t)n + 1, sizeof *a->named);
    a->n_named = 0;
    for (int i = 0; i < n; i++) {
        if (!s_task_of(keys[i].file, &chief, &index)) continue;
        long id = chief ? 0 : index + has_chief;
        const dp_auth_named_t *same = s_named(a, keys[i].key);
        if (same && same->id == (id < a->n ? id : -1)) continue; /* the same key listed twice */
        if (same)
            return dp_err(err, "--curve-allow: one key is named both %s and %s: each task needs "
                               "its own key (downpour keygen)", same->file, keys[i].file);
        if (id < a->n && a->w[id].named)
            return dp_err(err, "--curve-allow: two keys are named for worker %ld (%s and %s)", id,
                          s_named(a, a->w[id].key)->file, keys[i].file);
        dp_auth_named_t *e = &a->named[a->n_named++];
        snprintf(e->key, sizeof e->key, "%s", keys[i].key);
        snprintf(e->file, sizeof e->file, "%s", keys[i].file);
        e->id = id < a->n ? (int)id : -1;
        if (e->id < 0) {
            dp_log_warn("--curve-allow: %s names worker %ld, but this run has %d workers: that key "
                        "may speak as no worker", keys[i].file, id, a->n);
            continue;
        }
        snprintf(a->w[id].key, sizeof a->w[id].key, "%s", keys[i].key);
        a->w[id].named = 1;
    }
    if (a->n > 0 && !a->w[0].named)
        return dp_err(err, "--curve-allow: no key is named for the chief (chief-0.pub, or "
                           "worker-0.pub when there is no chief); name each worker's public key "
                           "file after its task (worker-I.pub) so that only the chief's key can "
                           "stop the run");
    return 0;
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

/* CURVE: may this key be worker wid? Its own id if it is named; an id that
 * is its already (first come); else a free one no named key owns, not the
 * chief's. */
static int s_key_may_be(const dp_auth_t *a, int wid, const char *key)
{
    const dp_auth_slot_t *s = &a->w[wid];
    if (!key) return 0;
    if (s->key[0]) return strcmp(s->key, key) == 0;
    return wid != 0 && !s_named(a, key);
}

/* CURVE: why key may not be worker wid, into msg. */
static int s_refuse_key(dp_auth_t *a, int wid, const char *key, char *msg, size_t n)
{
    const dp_auth_slot_t *s = &a->w[wid];
    const dp_auth_named_t *own = s_named(a, key);
    char mine[DP_CURVE_NAME_LEN + 96] = "";
    if (own && own->id >= 0)
        snprintf(mine, sizeof mine, "; this key is %s's, so it may speak only as worker %d "
                 "(--task-index %d)", own->file, own->id, own->id);
    else if (own)
        snprintf(mine, sizeof mine, "; this key is %s's, a task beyond --workers", own->file);
    a->refused++;
    if (s->named)
        snprintf(msg, n, "worker id %d is taken: it belongs to the CURVE key %s in --curve-allow%s",
                 wid, s_named(a, s->key)->file, mine);
    else if (s->key[0])
        snprintf(msg, n, "worker id %d is taken: it belongs to another CURVE key at this server "
                 "(each worker needs its own --task-index; is another worker started as %d?)%s",
                 wid, wid, mine);
    else if (own)
        snprintf(msg, n, "worker id %d refused%s", wid, mine);
    else
        snprintf(msg, n, "worker id %d refused: it is the chief's, and only the key named for the "
                 "chief in --curve-allow may be the chief", wid);
    return -1;
}

int dp_auth_claim(dp_auth_t *a, int wid, const dp_auth_peer_t *p, dp_auth_live_fn live,
                  void *arg, char *msg, size_t msg_len)
{
    dp_auth_slot_t *s = &a->w[wid];
    if (p->conn_len == 0 || p->conn_len > DP_AUTH_CONN_MAX)
        return s_refuse(a, msg, msg_len, "worker id %d: no connection identity (%d)", wid);
    if (a->curve && !s_key_may_be(a, wid, p->key)) return s_refuse_key(a, wid, p->key, msg, msg_len);
    if (s->conn_len && s_same_conn(s, p)) { /* HELLO again on its own connection */
        s->session = p->session;
        return 0;
    }
    /* The holder's own client on a new connection (it reset its socket after
     * an interrupted or timed-out request): the old one is taken over even
     * while this server still sees it open, which it may for a while. */
    bool own = s->conn_len && s->session != 0 && p->session == s->session;
    if (s->conn_len && !own && live(arg, s->conn, s->conn_len))
        return s_refuse(a, msg, msg_len,
                        "worker id %d is taken: another live connection said HELLO as worker %d "
                        "(two workers started without --task-index, or the same --task-index twice?)",
                        wid);
    memcpy(s->conn, p->conn, p->conn_len);
    s->conn_len = p->conn_len;
    s->session = p->session;
    if (a->curve && !s->key[0]) snprintf(s->key, sizeof s->key, "%s", p->key);
    return 0;
}

/* Does this HEARTBEAT come from whoever holds worker wid (auth.h)? */
static int s_beat_ok(const dp_auth_t *a, int wid, const dp_auth_peer_t *p)
{
    const dp_auth_slot_t *s = &a->w[wid];
    if (a->curve) return s_key_may_be(a, wid, p->key);
    if (!s->conn_len) return 1; /* nobody holds it yet: anyone could say HELLO as it */
    return s_same_conn(s, p) || (s->session != 0 && p->session == s->session);
}

/* STATS / SHUTDOWN: from the chief's key (CURVE), else with its token. */
static int s_is_chief(const dp_auth_t *a, uint64_t token, const dp_auth_peer_t *p)
{
    if (a->n < 1 || !a->w[0].conn_len) return 0; /* no chief yet: nobody */
    if (a->curve) return a->w[0].key[0] && p->key && strcmp(a->w[0].key, p->key) == 0;
    return token == a->run_token;
}

int dp_auth_check(dp_auth_t *a, dp_auth_who_t who, int type, int wid, uint64_t token,
                  const dp_auth_peer_t *p, int *code, char *msg, size_t msg_len)
{
    /* A HEARTBEAT only says "worker wid is alive" and binds nothing.
     * Workers send it from a thread with connections of its own
     * (worker/client/ps_beat), so it may come on another connection than the
     * HELLO's, but only from the same holder (s_beat_ok). A tool's (id -1)
     * speaks for nobody. */
    if (who == DP_AUTH_BEAT) {
        if (wid < 0 || wid >= a->n || s_beat_ok(a, wid, p)) return 0;
        *code = DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER;
        return s_refuse(a, msg, msg_len,
                        a->curve ? "HEARTBEAT as worker %d refused: it comes from a CURVE key that "
                                   "may not be worker %d"
                                 : "HEARTBEAT as worker %d refused: it comes neither on the "
                                   "connection that said HELLO as worker %d nor from its process",
                        wid);
    }
    if (wid >= 0 && wid < a->n && !(a->w[wid].conn_len && s_same_conn(&a->w[wid], p))) {
        *code = DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER;
        return s_refuse(a, msg, msg_len,
                        "worker %d has not said HELLO to this shard on this connection (say HELLO "
                        "as worker %d first)",
                        wid);
    }
    if (who == DP_AUTH_CHIEF && !s_is_chief(a, token, p)) {
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
