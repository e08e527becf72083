/* curve: key files, CURVE socket set-up and the ZAP gate (see curve.h).
 *
 * The gate is one thread per context with two sockets of its own: a REP bound
 * at ZeroMQ's fixed ZAP endpoint, which libzmq asks for every CURVE
 * handshake, and a PAIR reading the server socket's monitor events
 * (s_watch). It polls both with a 100 ms timeout so that destroy is
 * prompt. The allow list is read before the thread starts and again on
 * dp_zap_reload (SIGHUP), which swaps it under the lock the thread takes
 * to read it (mu). */
#include "proto/curve.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/util.h"

#define S_ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define S_ZAP_DOMAIN "downpour"
#define S_LOG_FIRST 10 /* refusals logged one by one; then one in S_LOG_EVERY */
#define S_LOG_EVERY 1000

/* One key of the allow list and the name of the file it came from (the
 * server ties keys named after a task to that task: server/loop/auth.h). */
typedef struct {
    dp_curve_key_t key;
    char file[DP_CURVE_NAME_LEN];
} s_allowed_t;

struct dp_zap {
    void *ctx;
    void *rep;              /* ZAP requests from libzmq */
    void *monitor;          /* the watched server socket's events, or NULL */
    char monitor_ep[64];
    s_allowed_t *allowed;   /* the list in force: the gate's thread reads it under mu */
    int n_allowed;
    s_allowed_t *previous;  /* the one before the last reload (dp_zap_rollback) */
    int n_previous;
    pthread_mutex_t mu;     /* the lists, between the gate's thread and a reload */
    char *allow;            /* --curve-allow as given, read again by dp_zap_reload */
    atomic_uint_fast64_t refused;
    atomic_int stop;
    pthread_t thread;
    int running;
};

/* ---- key files ---------------------------------------------------------- */

/* Reads one line of Z85 from path into key; the 32 bytes must decode. */
static int s_read_key(const char *path, dp_curve_key_t *key, char *err)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dp_read_file(path, &buf, &len, err) != 0) return -1;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
        len--;
    uint8_t raw[32];
    int ok = len == DP_CURVE_KEY_LEN;
    if (ok) {
        memcpy(key->z85, buf, DP_CURVE_KEY_LEN);
        key->z85[DP_CURVE_KEY_LEN] = '\0';
        ok = zmq_z85_decode(raw, key->z85) != NULL;
    }
    free(buf);
    if (!ok)
        return dp_err(err, "%s: not a CURVE key (expected one line of %d Z85 characters, as "
                           "`downpour keygen` writes)", path, DP_CURVE_KEY_LEN);
    return 0;
}

int dp_curve_keygen(const char *path, char *err)
{
    char pub_path[4096];
    if (snprintf(pub_path, sizeof pub_path, "%s.pub", path) >= (int)sizeof pub_path)
        return dp_err(err, "%s: path too long", path);
    struct stat st;
    if (stat(path, &st) == 0)
        return dp_err(err, "%s exists: remove it first or choose another name (keys are never "
                           "overwritten)", path);
    char pub[DP_CURVE_KEY_LEN + 2], sec[DP_CURVE_KEY_LEN + 2];
    if (zmq_curve_keypair(pub, sec) != 0)
        return dp_err(err, "keygen: this libzmq has no CURVE support (%s)", zmq_strerror(errno));
    strcat(pub, "\n");
    strcat(sec, "\n");
    if (dp_write_file_atomic_mode(path, sec, strlen(sec), 0600, err) != 0) return -1;
    if (dp_write_file_atomic(pub_path, pub, strlen(pub), err) != 0) {
        unlink(path);
        return -1;
    }
    return 0;
}

int dp_curve_read_secret(const char *path, dp_curve_key_t *secret, dp_curve_key_t *pub,
                         char *err)
{
    struct stat st;
    if (stat(path, &st) != 0) return dp_err(err, "%s: %s", path, strerror(errno));
    if (st.st_mode & 077)
        return dp_err(err, "%s: secret key is readable by others (mode %03o); chmod 600 %s",
                      path, (unsigned)(st.st_mode & 0777), path);
    if (s_read_key(path, secret, err) != 0) return -1;
    if (zmq_curve_public(pub->z85, secret->z85) != 0)
        return dp_err(err, "%s: cannot derive the public key: %s", path, zmq_strerror(errno));
    return 0;
}

int dp_curve_read_public(const char *path, dp_curve_key_t *pub, char *err)
{
    return s_read_key(path, pub, err);
}

/* ---- sockets ------------------------------------------------------------ */

static int s_setopt(void *sock, int opt, const void *val, size_t len, const char *name, char *err)
{
    if (zmq_setsockopt(sock, opt, val, len) != 0)
        return dp_err(err, "zmq_setsockopt(%s): %s", name, zmq_strerror(errno));
    return 0;
}

int dp_curve_serve(void *sock, const dp_curve_key_t *secret, char *err)
{
    int one = 1;
    if (s_setopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "CURVE_SERVER", err) != 0 ||
        s_setopt(sock, ZMQ_CURVE_SECRETKEY, secret->z85, DP_CURVE_KEY_LEN, "CURVE_SECRETKEY", err) != 0 ||
        s_setopt(sock, ZMQ_ZAP_DOMAIN, S_ZAP_DOMAIN, strlen(S_ZAP_DOMAIN), "ZAP_DOMAIN", err) != 0)
        return -1;
    return 0;
}

int dp_curve_connect_as(void *sock, const dp_curve_key_t *server_pub,
                        const dp_curve_key_t *secret, const dp_curve_key_t *pub, char *err)
{
    if (s_setopt(sock, ZMQ_CURVE_SERVERKEY, server_pub->z85, DP_CURVE_KEY_LEN, "CURVE_SERVERKEY", err) != 0 ||
        s_setopt(sock, ZMQ_CURVE_PUBLICKEY, pub->z85, DP_CURVE_KEY_LEN, "CURVE_PUBLICKEY", err) != 0 ||
        s_setopt(sock, ZMQ_CURVE_SECRETKEY, secret->z85, DP_CURVE_KEY_LEN, "CURVE_SECRETKEY", err) != 0)
        return -1;
    return 0;
}

/* ---- the allow list ----------------------------------------------------- */

static int s_allow_add(dp_zap_t *z, const char *path, char *err)
{
    s_allowed_t a;
    if (dp_curve_read_public(path, &a.key, err) != 0) return -1;
    const char *slash = strrchr(path, '/');
    snprintf(a.file, sizeof a.file, "%s", slash ? slash + 1 : path);
    z->allowed = dp_realloc(z->allowed, (size_t)(z->n_allowed + 1) * sizeof *z->allowed);
    z->allowed[z->n_allowed++] = a;
    return 0;
}

static int s_ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n > t && strcmp(s + n - t, tail) == 0;
}

static int s_allow_dir(dp_zap_t *z, const char *dir, char *err)
{
    DIR *d = opendir(dir);
    if (!d) return dp_err(err, "--curve-allow %s: %s", dir, strerror(errno));
    struct dirent *e;
    char path[4096];
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (!s_ends_with(e->d_name, ".pub")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        rc = s_allow_add(z, path, err);
    }
    closedir(d);
    return rc;
}

static int s_allow_load(dp_zap_t *z, const char *allow, char *err)
{
    struct stat st;
    if (stat(allow, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (s_allow_dir(z, allow, err) != 0) return -1;
    } else {
        char *list = strdup(allow), *save = NULL;
        int rc = 0;
        for (char *p = strtok_r(list, ",", &save); p && rc == 0; p = strtok_r(NULL, ",", &save))
            rc = s_allow_add(z, p, err);
        free(list);
        if (rc != 0) return -1;
    }
    if (z->n_allowed == 0)
        return dp_err(err, "--curve-allow %s: no public keys (*.pub) found; nobody could connect",
                      allow);
    return 0;
}

/* ---- the gate's thread -------------------------------------------------- */

static void s_count_refusal(dp_zap_t *z, const char *why, const char *who)
{
    uint64_t n = atomic_fetch_add(&z->refused, 1) + 1;
    if (n <= S_LOG_FIRST || n % S_LOG_EVERY == 0)
        dp_log_warn("curve: refused %s (%s); %llu refused so far", who, why,
                    (unsigned long long)n);
}

/* Receives the rest of a multipart into parts (at most max; the rest drained). */
static int s_recv_parts(void *sock, zmq_msg_t *parts, int max)
{
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < max) parts[n++] = m;
        else zmq_msg_close(&m);
    }
    return n;
}

static void s_send_text(void *sock, const void *data, size_t len, int more)
{
    if (zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0) < 0)
        dp_log_warn("curve: cannot answer an authentication request: %s", zmq_strerror(errno));
}

/* One ZAP request: frames version, request id, domain, address, identity,
 * mechanism, credentials (CURVE: the client's 32-byte public key). */
static void s_answer_zap(dp_zap_t *z)
{
    zmq_msg_t f[7];
    int n = s_recv_parts(z->rep, f, 7);
    const char *status = "400", *text = "not allowed";
    char user[DP_CURVE_KEY_LEN + 1] = "", who[128] = "a client";
    if (n == 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&f[6]) == 32) {
        zmq_z85_encode(user, zmq_msg_data(&f[6]), 32);
        if (dp_zap_allows(z, user)) status = "200", text = "OK";
        snprintf(who, sizeof who, "key %s from %.*s", user, (int)zmq_msg_size(&f[3]),
                 (const char *)zmq_msg_data(&f[3]));
    }
    if (strcmp(status, "200") != 0) {
        s_count_refusal(z, "not in the allow list", who);
        user[0] = '\0';
    }
    s_send_text(z->rep, "1.0", 3, 1);
    s_send_text(z->rep, n > 1 ? zmq_msg_data(&f[1]) : "", n > 1 ? zmq_msg_size(&f[1]) : 0, 1);
    s_send_text(z->rep, status, 3, 1);
    s_send_text(z->rep, text, strlen(text), 1);
    s_send_text(z->rep, user, strlen(user), 1);
    s_send_text(z->rep, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

/* One monitor event: frame 1 = uint16 event + uint32 value, frame 2 = address. */
static void s_read_event(dp_zap_t *z)
{
    zmq_msg_t f[2];
    int n = s_recv_parts(z->monitor, f, 2);
    if (n == 2 && zmq_msg_size(&f[0]) >= 2) {
        uint16_t ev;
        memcpy(&ev, zmq_msg_data(&f[0]), 2);
        char who[128];
        snprintf(who, sizeof who, "a client at %.*s", (int)zmq_msg_size(&f[1]),
                 (const char *)zmq_msg_data(&f[1]));
        s_count_refusal(z, "handshake failed: not a CURVE client of this server", who);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *s_gate_main(void *arg)
{
    dp_zap_t *z = arg;
    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t items[2] = {{z->rep, 0, ZMQ_POLLIN, 0}, {z->monitor, 0, ZMQ_POLLIN, 0}};
        int n = zmq_poll(items, z->monitor ? 2 : 1, 100);
        if (n < 0) {
            if (errno == EINTR) continue;
            break; /* the context is going away */
        }
        if (items[0].revents & ZMQ_POLLIN) s_answer_zap(z);
        if (z->monitor && (items[1].revents & ZMQ_POLLIN)) s_read_event(z);
    }
    return NULL;
}

/* ---- the gate's lifecycle ----------------------------------------------- */

/* The monitor PAIR reads server_sock's failed handshakes (plain clients, a
 * wrong server key); ZAP refusals are counted by s_answer_zap instead. */
static int s_watch(dp_zap_t *z, void *server_sock, char *err)
{
    snprintf(z->monitor_ep, sizeof z->monitor_ep, "inproc://dp-curve-monitor-%p", (void *)z);
    int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;
    if (zmq_socket_monitor(server_sock, z->monitor_ep, events) != 0)
        return dp_err(err, "zmq_socket_monitor: %s", zmq_strerror(errno));
    z->monitor = zmq_socket(z->ctx, ZMQ_PAIR);
    if (!z->monitor || zmq_connect(z->monitor, z->monitor_ep) != 0)
        return dp_err(err, "cannot read the server socket's events: %s", zmq_strerror(errno));
    return 0;
}

int dp_zap_new(dp_zap_t **out, void *ctx, void *server_sock, const char *allow, char *err)
{
    *out = NULL;
    dp_zap_t *z = dp_calloc(1, sizeof *z);
    z->ctx = ctx;
    pthread_mutex_init(&z->mu, NULL);
    z->allow = dp_strdup(allow);
    if (s_allow_load(z, allow, err) != 0) goto fail;
    z->rep = zmq_socket(ctx, ZMQ_REP);
    if (!z->rep) {
        dp_err(err, "zmq_socket(REP) for the CURVE gate: %s", zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(z->rep, S_ZAP_ENDPOINT) != 0) {
        dp_err(err, "bind %s: %s (one gate per context)", S_ZAP_ENDPOINT, zmq_strerror(errno));
        goto fail;
    }
    if (server_sock && s_watch(z, server_sock, err) != 0) goto fail;
    if (pthread_create(&z->thread, NULL, s_gate_main, z) != 0) {
        dp_err(err, "cannot start the CURVE gate's thread");
        goto fail;
    }
    z->running = 1;
    *out = z;
    return 0;
fail:
    dp_zap_destroy(&z);
    return -1;
}

void dp_zap_destroy(dp_zap_t **zap_p)
{
    dp_zap_t *z = zap_p ? *zap_p : NULL;
    if (!z) return;
    if (z->running) {
        atomic_store(&z->stop, 1);
        pthread_join(z->thread, NULL);
    }
    int zero = 0;
    if (z->rep) {
        zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(z->rep);
    }
    if (z->monitor) {
        zmq_setsockopt(z->monitor, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(z->monitor);
    }
    free(z->allowed);
    free(z->previous);
    free(z->allow);
    pthread_mutex_destroy(&z->mu);
    free(z);
    *zap_p = NULL;
}

int dp_zap_reload(dp_zap_t *z, char *err)
{
    dp_zap_t fresh = {0}; /* s_allow_load fills its list only */
    if (s_allow_load(&fresh, z->allow, err) != 0) {
        free(fresh.allowed);
        return -1;
    }
    pthread_mutex_lock(&z->mu);
    free(z->previous);
    z->previous = z->allowed;
    z->n_previous = z->n_allowed;
    z->allowed = fresh.allowed;
    z->n_allowed = fresh.n_allowed;
    pthread_mutex_unlock(&z->mu);
    return 0;
}

void dp_zap_rollback(dp_zap_t *z)
{
    if (!z->previous) return;
    pthread_mutex_lock(&z->mu);
    free(z->allowed);
    z->allowed = z->previous;
    z->n_allowed = z->n_previous;
    z->previous = NULL;
    z->n_previous = 0;
    pthread_mutex_unlock(&z->mu);
}

int dp_zap_allows(dp_zap_t *z, const char *z85)
{
    int yes = 0;
    pthread_mutex_lock(&z->mu);
    for (int i = 0; i < z->n_allowed && !yes; i++) yes = strcmp(z->allowed[i].key.z85, z85) == 0;
    pthread_mutex_unlock(&z->mu);
    return yes;
}

int dp_zap_allowed(const dp_zap_t *zap)
{
    return zap->n_allowed;
}

const dp_curve_key_t *dp_zap_key(const dp_zap_t *zap, int i, const char **file)
{
    *file = zap->allowed[i].file;
    return &zap->allowed[i].key;
}

uint64_t dp_zap_refused(const dp_zap_t *zap)
{
    return atomic_load(&((dp_zap_t *)zap)->refused);
}
