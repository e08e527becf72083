/* test_curve: CURVE key files and the ZAP gate (proto/curve.h) over real TCP
 * sockets on loopback — an allowed key gets answers and its key as User-Id;
 * an unknown key and a plain client get nothing and are counted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/util.h"
#include "proto/curve.h"
#include "tests/test.h"

static char s_dir[256];

static void s_tmpdir(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/dp-test-curve-XXXXXX");
    if (!mkdtemp(s_dir)) abort();
}

static void s_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", s_dir, name);
}

static void test_keygen_files(void)
{
    s_tmpdir();
    char key[512], pub[600], err[DP_ERR_LEN] = "";
    s_path(key, sizeof key, "worker0");
    CHECK_EQ(dp_curve_keygen(key, err), 0);
    struct stat st;
    CHECK_EQ(stat(key, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    snprintf(pub, sizeof pub, "%s.pub", key);
    CHECK_EQ(stat(pub, &st), 0);
    CHECK_EQ(st.st_size, DP_CURVE_KEY_LEN + 1); /* one line */
    dp_curve_key_t sec, derived, read_pub;
    CHECK_EQ(dp_curve_read_secret(key, &sec, &derived, err), 0);
    CHECK_EQ(dp_curve_read_public(pub, &read_pub, err), 0);
    CHECK_STR(derived.z85, read_pub.z85);
    /* Never overwritten. */
    CHECK_EQ(dp_curve_keygen(key, err), -1);
    CHECK(strstr(err, "exists") != NULL);
    /* A secret that others can read is refused, naming the fix. */
    chmod(key, 0644);
    CHECK_EQ(dp_curve_read_secret(key, &sec, &derived, err), -1);
    CHECK(strstr(err, "chmod 600") != NULL);
    /* Not a key. */
    char bad[512];
    s_path(bad, sizeof bad, "bad.pub");
    CHECK_EQ(dp_write_file_atomic(bad, "hello\n", 6, err), 0);
    CHECK_EQ(dp_curve_read_public(bad, &read_pub, err), -1);
    CHECK(strstr(err, "not a CURVE key") != NULL);
    unlink(bad);
}

/* A client DEALER; curve: 0 plain, 1 with the given key pair. */
static void *s_client(void *ctx, int port, const dp_curve_key_t *server_pub, const char *key_path)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (key_path) {
        dp_curve_key_t sec, pub;
        char err[DP_ERR_LEN];
        if (dp_curve_read_secret(key_path, &sec, &pub, err) != 0 ||
            dp_curve_connect_as(s, server_pub, &sec, &pub, err) != 0) {
            fprintf(stderr, "client set-up: %s\n", err);
            abort();
        }
    }
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(s, ep);
    return s;
}

/* Sends "ping" from client; the server echoes with the User-Id it saw.
 * Returns 1 when the answer came within ms, filling user. */
static int s_ping(void *server, void *client, int ms, char *user, size_t user_n)
{
    zmq_send(client, "ping", 4, 0);
    zmq_pollitem_t it = {server, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0) return 0;
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    zmq_msg_recv(&id, server, 0);
    zmq_msg_recv(&body, server, 0);
    const char *u = zmq_msg_gets(&body, "User-Id");
    snprintf(user, user_n, "%s", u ? u : "");
    zmq_msg_send(&id, server, ZMQ_SNDMORE);
    zmq_send(server, "pong", 4, 0);
    zmq_msg_close(&body);
    char buf[8];
    it = (zmq_pollitem_t){client, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, ms) > 0 && zmq_recv(client, buf, sizeof buf, 0) == 4;
}

static void test_gate(void)
{
    char err[DP_ERR_LEN] = "";
    char srv[512], good[512], evil[512], allow[600];
    s_path(srv, sizeof srv, "server");
    s_path(good, sizeof good, "good");
    s_path(evil, sizeof evil, "evil");
    CHECK_EQ(dp_curve_keygen(srv, err), 0);
    CHECK_EQ(dp_curve_keygen(good, err), 0);
    CHECK_EQ(dp_curve_keygen(evil, err), 0);
    snprintf(allow, sizeof allow, "%s.pub", good);

    void *ctx = zmq_ctx_new();
    void *server = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(server, ZMQ_LINGER, &zero, sizeof zero);
    dp_curve_key_t ssec, spub;
    CHECK_EQ(dp_curve_read_secret(srv, &ssec, &spub, err), 0);
    CHECK_EQ(dp_curve_serve(server, &ssec, err), 0);
    dp_zap_t *zap = NULL;
    CHECK_EQ(dp_zap_new(&zap, ctx, server, allow, err), 0);
    if (!zap) {
        fprintf(stderr, "gate: %s\n", err);
        return;
    }
    CHECK_EQ(dp_zap_allowed(zap), 1);
    CHECK_EQ(zmq_bind(server, "tcp://127.0.0.1:*"), 0);
    char ep[64];
    size_t ep_n = sizeof ep;
    zmq_getsockopt(server, ZMQ_LAST_ENDPOINT, ep, &ep_n);
    int port = atoi(strrchr(ep, ':') + 1);

    char user[64] = "";
    void *c_good = s_client(ctx, port, &spub, good);
    CHECK(s_ping(server, c_good, 3000, user, sizeof user));
    dp_curve_key_t gsec, gpub;
    dp_curve_read_secret(good, &gsec, &gpub, err);
    CHECK_STR(user, gpub.z85); /* the server learns which key spoke */
    CHECK_EQ(dp_zap_refused(zap), 0);

    void *c_evil = s_client(ctx, port, &spub, evil);
    CHECK(!s_ping(server, c_evil, 500, user, sizeof user));
    void *c_plain = s_client(ctx, port, NULL, NULL);
    CHECK(!s_ping(server, c_plain, 500, user, sizeof user));
    /* Both refusals are counted (the handshake events arrive asynchronously). */
    for (int i = 0; i < 30 && dp_zap_refused(zap) < 2; i++) usleep(100 * 1000);
    CHECK(dp_zap_refused(zap) >= 2);
    /* The allowed client still works after the refusals. */
    CHECK(s_ping(server, c_good, 3000, user, sizeof user));

    zmq_close(c_good);
    zmq_close(c_evil);
    zmq_close(c_plain);
    zmq_close(server);
    dp_zap_destroy(&zap);
    dp_zap_destroy(&zap); /* safe twice */
    CHECK(zap == NULL);
    zmq_ctx_term(ctx);
}

static void test_allow_list(void)
{
    char err[DP_ERR_LEN] = "";
    void *ctx = zmq_ctx_new();
    dp_zap_t *zap = NULL;
    /* A directory: every *.pub in it (good, evil, server from the tests above). */
    CHECK_EQ(dp_zap_new(&zap, ctx, NULL, s_dir, err), 0);
    if (zap) CHECK_EQ(dp_zap_allowed(zap), 4); /* worker0, server, good, evil */
    dp_zap_destroy(&zap);
    /* Nothing to allow is an error, not an open door. */
    char empty[512];
    s_path(empty, sizeof empty, "empty");
    mkdir(empty, 0755);
    CHECK_EQ(dp_zap_new(&zap, ctx, NULL, empty, err), -1);
    CHECK(strstr(err, "no public keys") != NULL);
    CHECK_EQ(dp_zap_new(&zap, ctx, NULL, "/nonexistent.pub", err), -1);
    /* SIGHUP's reload: a key added is in, one removed is out; a list that
     * cannot be read or names none leaves the old one; rollback restores
     * the list before the last reload. */
    char extra[512], key[512], pub[520];
    s_path(extra, sizeof extra, "reload");
    mkdir(extra, 0755);
    s_path(key, sizeof key, "reload/worker-0");
    CHECK_EQ(dp_curve_keygen(key, err), 0);
    snprintf(pub, sizeof pub, "%s.pub", key);
    dp_curve_key_t k0, k1;
    CHECK_EQ(dp_curve_read_public(pub, &k0, err), 0);
    CHECK_EQ(dp_zap_new(&zap, ctx, NULL, extra, err), 0);
    CHECK(dp_zap_allows(zap, k0.z85));
    s_path(key, sizeof key, "reload/worker-1");
    CHECK_EQ(dp_curve_keygen(key, err), 0);
    snprintf(pub, sizeof pub, "%s.pub", key);
    CHECK_EQ(dp_curve_read_public(pub, &k1, err), 0);
    CHECK(!dp_zap_allows(zap, k1.z85)); /* not until the list is read again */
    CHECK_EQ(dp_zap_reload(zap, err), 0);
    CHECK(dp_zap_allows(zap, k1.z85));
    CHECK_EQ(dp_zap_allowed(zap), 2);
    dp_zap_rollback(zap);
    CHECK(!dp_zap_allows(zap, k1.z85));
    CHECK(dp_zap_allows(zap, k0.z85));
    CHECK_EQ(dp_zap_reload(zap, err), 0);
    CHECK_EQ(unlink(pub), 0); /* removed: out at the next reload */
    CHECK_EQ(dp_zap_reload(zap, err), 0);
    CHECK(!dp_zap_allows(zap, k1.z85));
    FILE *f = fopen(pub, "w"); /* a key file that is not a key */
    if (f) {
        fputs("not a key\n", f);
        fclose(f);
    }
    CHECK_EQ(dp_zap_reload(zap, err), -1);
    CHECK(strstr(err, "worker-1.pub") != NULL);
    CHECK(dp_zap_allows(zap, k0.z85)); /* the old list stays */
    CHECK_EQ(dp_zap_allowed(zap), 1);
    dp_zap_destroy(&zap);
    zmq_ctx_term(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    CHECK_EQ(system(cmd), 0);
}

DP_TESTS(T(test_keygen_files), T(test_gate), T(test_allow_list))
