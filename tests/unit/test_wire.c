/* test_wire: the codec (proto/wire.h) — envelope round trips, multipart
 * framing over real ZeroMQ sockets (inproc), zero-copy release, and every
 * structural validation failure. */
#include <stdatomic.h>
#include <string.h>

#include "common/bf16.h"
#include "common/util.h"
#include "proto/wire_zmq.h"
#include "proto/zsock.h"
#include "tests/test.h"

#define N 100

static float s_data[N + 1];

/* A valid PUSH of s_data[0..n) at offset off, packed into buf. */
static size_t s_make_push(uint8_t *buf, size_t cap, size_t n, uint64_t off,
                          void (*mutate)(Downpour__Envelope *, Downpour__TensorDesc *))
{
    for (size_t i = 0; i < N; i++) s_data[i] = (float)i * 0.5f - 3.0f;
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, 42, 3, 0x1234abcdULL);
    Downpour__Push p = DOWNPOUR__PUSH__INIT;
    p.version = 7;
    p.loss = 2.5f;
    p.batch = 64;
    env.push = &p;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    dp_wire_desc_fill(&d, shape, "params", s_data, n, off, 0, 0);
    env.n_tensors = 1;
    env.tensors = dv;
    if (mutate) mutate(&env, &d);
    size_t len = downpour__envelope__get_packed_size(&env);
    if (len > cap) return 0;
    downpour__envelope__pack(&env, buf);
    return len;
}

/* Decode buf and check it against frames; returns the check's result. */
static int s_check(const uint8_t *buf, size_t len, const dp_wire_frame_t *fr, int nf, char *err)
{
    Downpour__Envelope *env = dp_wire_decode(buf, len, err);
    if (!env) return -1;
    int rc = dp_wire_check(env, fr, nf, err);
    dp_wire_destroy(&env);
    return rc;
}

static void test_roundtrip_envelope(void)
{
    uint8_t buf[4096];
    size_t len = s_make_push(buf, sizeof buf, N, 10, NULL);
    CHECK(len > 0);
    char err[DP_ERR_LEN] = "";
    Downpour__Envelope *env = dp_wire_decode(buf, len, err);
    CHECK(env != NULL);
    if (!env) return;
    CHECK_EQ(env->protocol_version, DP_PROTOCOL_VERSION);
    CHECK_EQ(env->type, DOWNPOUR__MSG_TYPE__PUSH);
    CHECK_EQ(env->request_id, 42);
    CHECK_EQ(env->worker_id, 3);
    CHECK(env->model_fingerprint == 0x1234abcdULL);
    CHECK(env->push != NULL);
    CHECK_EQ(env->push->version, 7);
    CHECK_NEAR(env->push->loss, 2.5, 0);
    CHECK_EQ(env->push->batch, 64);
    CHECK_EQ(env->n_tensors, 1);
    CHECK_STR(env->tensors[0]->key, "params");
    CHECK_EQ(env->tensors[0]->byte_length, N * 4);
    CHECK_EQ(env->tensors[0]->offset, 10);
    CHECK_EQ(env->tensors[0]->n_shape, 1);
    CHECK_EQ(env->tensors[0]->shape[0], N);
    CHECK(env->tensors[0]->crc32 == dp_wire_crc32(s_data, N * 4));
    dp_wire_frame_t fr = {s_data, N * 4};
    CHECK_EQ(dp_wire_check(env, &fr, 1, err), 0);
    CHECK_EQ(dp_wire_check_range(env, 10, 10 + N, err), 0);
    CHECK_EQ(dp_wire_check_finite(&fr, 1, err), 0);
    dp_wire_destroy(&env);
    dp_wire_destroy(NULL); /* safe */
}

static void test_mode_and_names(void)
{
    dp_mode_t m = 0;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_mode_parse("sync", &m, err), 0);
    CHECK_EQ(m, DP_MODE_SYNC);
    CHECK_EQ(dp_mode_parse("ssp", &m, err), 0);
    CHECK_EQ(m, DP_MODE_SSP);
    CHECK_EQ(dp_mode_parse("async", &m, err), 0);
    CHECK_STR(dp_mode_name(m), "async");
    CHECK_EQ(dp_mode_parse("hogwild", &m, err), -1);
    CHECK(strstr(err, "hogwild") != NULL);
    CHECK_STR(dp_wire_type_name(DOWNPOUR__MSG_TYPE__PULL), "PULL");
    CHECK_STR(dp_wire_type_name(99), "type 99");
    /* crc32 of "123456789" is the standard check value. */
    CHECK(dp_wire_crc32("123456789", 9) == 0xcbf43926u);
}

static atomic_int s_released;
static void s_release(void *data, void *hint)
{
    (void)data;
    (void)hint;
    atomic_fetch_add(&s_released, 1);
}

/* DEALER -> ROUTER -> DEALER over inproc: identity added and echoed,
 * tensor frames arrive intact, the sender's buffer is released exactly once. */
static void test_roundtrip_sockets(void)
{
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, tmo = 5000;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    CHECK_EQ(zmq_bind(router, "inproc://wire"), 0);
    CHECK_EQ(zmq_connect(dealer, "inproc://wire"), 0);
    char err[DP_ERR_LEN] = "";
    float *g = dp_malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) g[i] = (float)i;
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, 9, 1, 77);
    Downpour__Push p = DOWNPOUR__PUSH__INIT;
    env.push = &p;
    Downpour__TensorDesc d[2];
    Downpour__TensorDesc *dv[2] = {&d[0], &d[1]};
    int64_t sh0[1], sh1[1];
    dp_wire_desc_fill(&d[0], sh0, "a", g, 40, 0, 0, 0);
    dp_wire_desc_fill(&d[1], sh1, "b", g + 40, 60, 40, 0, 0);
    env.n_tensors = 2;
    env.tensors = dv;
    atomic_store(&s_released, 0);
    dp_wire_payload_t pl[2] = {{g, 160, s_release, NULL}, {g + 40, 240, s_release, NULL}};
    CHECK_EQ(dp_wire_send(dealer, NULL, &env, pl, 2, err), 0);
    dp_wire_rx_t rx;
    CHECK_EQ(dp_wire_recv(router, &rx, 0, err), 0);
    CHECK_EQ(rx.n_parts, 4); /* identity, envelope, 2 tensors */
    CHECK_EQ(rx.n_total, 4);
    Downpour__Envelope *e2 = dp_wire_decode(zmq_msg_data(&rx.parts[1]), zmq_msg_size(&rx.parts[1]), err);
    CHECK(e2 != NULL);
    dp_wire_frame_t fr[2] = {{zmq_msg_data(&rx.parts[2]), zmq_msg_size(&rx.parts[2])},
                             {zmq_msg_data(&rx.parts[3]), zmq_msg_size(&rx.parts[3])}};
    if (e2) {
        CHECK_EQ(dp_wire_check(e2, fr, 2, err), 0);
        CHECK_EQ(dp_wire_check_range(e2, 0, N, err), 0);
        CHECK_EQ(dp_wire_check_range(e2, 0, N + 1, err), -1);
        CHECK(memcmp(fr[1].data, g + 40, 240) == 0);
        /* Reply through the identity. */
        Downpour__Envelope rep;
        dp_wire_env_init(&rep, DOWNPOUR__MSG_TYPE__HEARTBEAT, e2->request_id, 1, 77);
        CHECK_EQ(dp_wire_send(router, &rx.parts[0], &rep, NULL, 0, err), 0);
        dp_wire_rx_t rx2;
        CHECK_EQ(dp_wire_recv(dealer, &rx2, 0, err), 0);
        CHECK_EQ(rx2.n_parts, 1);
        Downpour__Envelope *e3 = dp_wire_decode(zmq_msg_data(&rx2.parts[0]), zmq_msg_size(&rx2.parts[0]), err);
        CHECK(e3 && e3->request_id == 9 && e3->type == DOWNPOUR__MSG_TYPE__HEARTBEAT);
        CHECK_EQ(dp_wire_check(e3, NULL, 0, err), 0);
        dp_wire_destroy(&e3);
        dp_wire_rx_fini(&rx2);
    }
    dp_wire_destroy(&e2);
    dp_wire_rx_fini(&rx);
    /* Nothing waiting: DONTWAIT gives EAGAIN, not a hang. */
    CHECK_EQ(dp_wire_recv(router, &rx, ZMQ_DONTWAIT, err), -1);
    CHECK_EQ(errno, EAGAIN);
    zmq_close(router);
    zmq_close(dealer);
    zmq_ctx_term(ctx);
    CHECK_EQ(atomic_load(&s_released), 2);
    free(g);
}

/* A PAIR over inproc for the receive tests; *a sends, *b receives. */
static void *s_pair(void **a, void **b, const char *ep)
{
    void *ctx = zmq_ctx_new();
    *a = zmq_socket(ctx, ZMQ_PAIR);
    *b = zmq_socket(ctx, ZMQ_PAIR);
    int tmo = 5000;
    zmq_setsockopt(*b, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    CHECK_EQ(zmq_bind(*b, ep), 0);
    CHECK_EQ(zmq_connect(*a, ep), 0);
    return ctx;
}

/* Too many frames: the message is cut (only its small first part kept), the
 * rest drained and counted; the next message arrives whole. */
static void test_recv_too_many_frames(void)
{
    void *a, *b;
    void *ctx = s_pair(&a, &b, "inproc://many");
    int total = DP_WIRE_MAX_PARTS + 10;
    for (int i = 0; i < total; i++) zmq_send(a, "x", 1, i + 1 < total ? ZMQ_SNDMORE : 0);
    zmq_send(a, "next", 4, 0);
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_wire_recv(b, &rx, 0, err), 0);
    CHECK_EQ(rx.n_parts, 1);
    CHECK_EQ(rx.n_total, total);
    CHECK_EQ(rx.n_bytes, total);
    dp_wire_rx_fini(&rx);
    CHECK_EQ(dp_wire_recv(b, &rx, 0, err), 0); /* the next message is whole */
    CHECK_EQ(rx.n_total, 1);
    CHECK_EQ(rx.n_parts, 1);
    CHECK_EQ(zmq_msg_size(&rx.parts[0]), 4);
    dp_wire_rx_fini(&rx);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}

/* The byte limit covers the whole multipart: a few frames each well under
 * it but over it together are cut, keeping only the small first part (a
 * ROUTER's identity, to answer); a large first part is not kept either. A
 * message of exactly the limit is whole. */
static void test_recv_byte_limit(void)
{
    void *a, *b;
    void *ctx = s_pair(&a, &b, "inproc://bytes");
    static char big[4000];
    memset(big, 7, sizeof big);
    const size_t limit = 10000;
    zmq_send(a, "id", 2, ZMQ_SNDMORE); /* 2 + 3 * 4000 > limit */
    for (int i = 0; i < 3; i++) zmq_send(a, big, sizeof big, i < 2 ? ZMQ_SNDMORE : 0);
    zmq_send(a, big, 2000, ZMQ_SNDMORE); /* 2000 + 4000 + 4000 == limit */
    zmq_send(a, big, 4000, ZMQ_SNDMORE);
    zmq_send(a, big, 4000, 0);
    zmq_send(a, big, 300, ZMQ_SNDMORE); /* a first part larger than an identity */
    zmq_send(a, big, 4000, ZMQ_SNDMORE);
    zmq_send(a, big, 4000, ZMQ_SNDMORE);
    zmq_send(a, big, 4000, 0);
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_wire_recv_bounded(b, &rx, 0, limit, err), 0);
    CHECK_EQ(rx.n_total, 4);
    CHECK_EQ(rx.n_parts, 1);
    CHECK_EQ(rx.n_bytes, 2 + 3 * sizeof big);
    CHECK(rx.n_parts == 1 && zmq_msg_size(&rx.parts[0]) == 2 &&
          memcmp(zmq_msg_data(&rx.parts[0]), "id", 2) == 0);
    dp_wire_rx_fini(&rx);
    CHECK_EQ(dp_wire_recv_bounded(b, &rx, 0, limit, err), 0);
    CHECK_EQ(rx.n_total, 3);
    CHECK_EQ(rx.n_parts, 3);
    CHECK_EQ(rx.n_bytes, limit);
    dp_wire_rx_fini(&rx);
    CHECK_EQ(dp_wire_recv_bounded(b, &rx, 0, limit, err), 0);
    CHECK_EQ(rx.n_total, 4);
    CHECK_EQ(rx.n_parts, 0);
    dp_wire_rx_fini(&rx);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}

static void m_version(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)d; e->protocol_version = 2; }
static void m_type(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)d; e->type = 77; }
static void m_type0(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)d; e->type = 0; }
static void m_nobody(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)d; e->push = NULL; }
static void m_tensors_on_pull(Downpour__Envelope *e, Downpour__TensorDesc *d)
{
    static Downpour__Pull p = DOWNPOUR__PULL__INIT;
    (void)d;
    e->type = DOWNPOUR__MSG_TYPE__PULL;
    e->pull = &p;
}
static void m_dtype(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)e; d->dtype = DOWNPOUR__DTYPE__FLOAT16; }
static void m_shape(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)e; d->shape[0] = N - 1; }
static void m_bytelen(Downpour__Envelope *e, Downpour__TensorDesc *d)
{
    (void)e;
    d->byte_length = (N - 1) * 4;
    d->shape[0] = N - 1;
}
static void m_crc(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)e; d->crc32 ^= 1; }
static void m_key(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)e; d->key = ""; }
static void m_negshape(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)e; d->shape[0] = -N; }

static void test_validation_failures(void)
{
    struct {
        const char *name;
        void (*mutate)(Downpour__Envelope *, Downpour__TensorDesc *);
        const char *want; /* substring of the error */
    } cases[] = {
        {"version", m_version, "protocol version 2"},
        {"unknown type", m_type, "unknown message type 77"},
        {"type 0", m_type0, "unknown message type 0"},
        {"missing body", m_nobody, "without its 'push' body"},
        {"tensors on PULL", m_tensors_on_pull, "takes none"},
        {"dtype", m_dtype, "dtype 2 unsupported"},
        {"shape vs bytes", m_shape, "byte_length"},
        {"byte length vs frame", m_bytelen, "frame has 400 bytes"},
        {"checksum", m_crc, "checksum"},
        {"empty key", m_key, "key"},
        {"negative shape", m_negshape, "dimension 0 is -100"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint8_t buf[4096];
        size_t len = s_make_push(buf, sizeof buf, N, 0, cases[k].mutate);
        dp_wire_frame_t fr = {s_data, N * 4};
        char err[DP_ERR_LEN] = "";
        int rc = s_check(buf, len, &fr, 1, err);
        CHECK_EQ(rc, -1);
        if (!strstr(err, cases[k].want) || strncmp(err, "malformed: ", 11) != 0) {
            fprintf(stderr, "  case %s: error '%s' lacks '%s'\n", cases[k].name, err, cases[k].want);
            CHECK(0);
        }
    }
}

static void test_frame_count_and_garbage(void)
{
    uint8_t buf[4096];
    size_t len = s_make_push(buf, sizeof buf, N, 0, NULL);
    dp_wire_frame_t fr[2] = {{s_data, N * 4}, {s_data, N * 4}};
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(s_check(buf, len, fr, 1, err), 0);
    CHECK_EQ(s_check(buf, len, fr, 0, err), -1);
    CHECK(strstr(err, "1 tensor descriptors but 0 tensor frames") != NULL);
    CHECK_EQ(s_check(buf, len, fr, 2, err), -1);
    CHECK(strstr(err, "but 2 tensor frames") != NULL);
    /* A flipped payload bit is caught by the checksum. */
    float copy[N];
    memcpy(copy, s_data, sizeof copy);
    ((uint8_t *)copy)[17] ^= 0x10;
    dp_wire_frame_t bad = {copy, N * 4};
    CHECK_EQ(s_check(buf, len, &bad, 1, err), -1);
    CHECK(strstr(err, "checksum") != NULL);
    /* Garbage and truncation do not parse (and do not crash). */
    const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x34};
    CHECK(dp_wire_decode(garbage, sizeof garbage, err) == NULL);
    CHECK(strstr(err, "does not parse") != NULL);
    CHECK(dp_wire_decode(buf, len - 3, err) == NULL);
    CHECK(dp_wire_decode(buf, 0, err) == NULL);
    CHECK(strstr(err, "empty") != NULL);
    uint8_t *big = dp_calloc(DP_WIRE_MAX_ENVELOPE + 1, 1);
    CHECK(dp_wire_decode(big, DP_WIRE_MAX_ENVELOPE + 1, err) == NULL);
    CHECK(strstr(err, "limit") != NULL);
    free(big);
}

static void test_range(void)
{
    char err[DP_ERR_LEN] = "";
    uint8_t buf[4096];
    size_t len = s_make_push(buf, sizeof buf, N, 50, NULL);
    Downpour__Envelope *env = dp_wire_decode(buf, len, err);
    CHECK(env != NULL);
    if (!env) return;
    CHECK_EQ(dp_wire_check_range(env, 50, 150, err), 0);
    CHECK_EQ(dp_wire_check_range(env, 0, 100, err), -1); /* wrong shard */
    CHECK(strstr(err, "[50, 150)") != NULL && strstr(err, "[0, 100)") != NULL);
    CHECK_EQ(dp_wire_check_range(env, 50, 149, err), -1); /* too long */
    CHECK_EQ(dp_wire_check_range(env, 50, 151, err), -1); /* too short */
    CHECK(strstr(err, "cover") != NULL);
    dp_wire_destroy(&env);
}

static void test_finite(void)
{
    char err[DP_ERR_LEN] = "";
    /* Misaligned on purpose: the received frame may start anywhere. */
    uint8_t raw[4 * 8 + 1];
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    memcpy(raw + 1, v, sizeof v);
    dp_wire_frame_t fr = {raw + 1, sizeof v};
    CHECK_EQ(dp_wire_check_finite(&fr, 1, err), 0);
    v[5] = NAN;
    memcpy(raw + 1, v, sizeof v);
    CHECK_EQ(dp_wire_check_finite(&fr, 1, err), -1);
    CHECK(strstr(err, "element 5") && strstr(err, "NaN"));
    v[5] = 6;
    v[2] = -INFINITY;
    memcpy(raw + 1, v, sizeof v);
    CHECK_EQ(dp_wire_check_finite(&fr, 1, err), -1);
    CHECK(strstr(err, "element 2") && strstr(err, "-Inf"));
    v[2] = 3;
    v[7] = 3.4e38f * 10.0f; /* overflows to +Inf */
    memcpy(raw + 1, v, sizeof v);
    CHECK_EQ(dp_wire_check_finite(&fr, 1, err), -1);
    CHECK(strstr(err, "+Inf") != NULL);
    v[7] = 3.4e38f; /* large but finite */
    memcpy(raw + 1, v, sizeof v);
    CHECK_EQ(dp_wire_check_finite(&fr, 1, err), 0);
}

/* The vectorised check over every length up to 80 floats, every byte
 * alignment and every position of one bad float (the blocks, the two
 * accumulators and the tail all see one); the copy-and-check too. */
static void test_finite_vector(void)
{
    enum { M = 80 };
    static uint8_t raw[4 * M + 4];
    float v[M], out[M];
    const float bad[] = {NAN, INFINITY, -INFINITY};
    int missed = 0, false_alarm = 0;
    for (size_t n = 1; n <= M; n++)
        for (int a = 0; a < 4; a++) {
            for (size_t i = 0; i < n; i++) v[i] = (i % 3 == 0) ? 3.4e38f : -1e-40f * (float)i;
            memcpy(raw + a, v, n * 4);
            false_alarm += dp_wire_any_nonfinite(raw + a, n) != 0;
            for (size_t pos = 0; pos < n; pos++) {
                float keep = v[pos];
                v[pos] = bad[pos % 3];
                memcpy(raw + a, v, n * 4);
                missed += dp_wire_any_nonfinite(raw + a, n) == 0;
                v[pos] = keep;
            }
        }
    CHECK_EQ(missed, 0);
    CHECK_EQ(false_alarm, 0);
    char err[DP_ERR_LEN] = "";
    for (size_t i = 0; i < M; i++) v[i] = (float)i;
    memcpy(raw + 3, v, sizeof v);
    CHECK_EQ(dp_wire_copy_finite(out, raw + 3, M, err), 0);
    CHECK(memcmp(out, v, sizeof v) == 0);
    v[77] = NAN;
    memcpy(raw + 3, v, sizeof v);
    CHECK_EQ(dp_wire_copy_finite(out, raw + 3, M, err), -1);
    CHECK(strstr(err, "element 77") && strstr(err, "NaN"));
}

static void m_no_crc(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)e; dp_wire_desc_no_checksum(d); }
static void m_crc_kind(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)e; d->checksum = 7; }
static void m_shm(Downpour__Envelope *e, Downpour__TensorDesc *d) { (void)d; e->shm = 1; }

/* A descriptor may say NO_CHECKSUM (then a flipped bit is not the
 * validator's to see); an unknown checksum kind is refused; a message whose
 * tensors are in shared memory has no frames. */
static void test_checksum_kinds(void)
{
    uint8_t buf[4096];
    char err[DP_ERR_LEN] = "";
    size_t len = s_make_push(buf, sizeof buf, N, 0, m_no_crc);
    float copy[N];
    memcpy(copy, s_data, sizeof copy);
    ((uint8_t *)copy)[17] ^= 0x10;
    dp_wire_frame_t fr = {copy, N * 4};
    CHECK_EQ(s_check(buf, len, &fr, 1, err), 0);
    fr.len = N * 4 - 4; /* the length is still checked */
    CHECK_EQ(s_check(buf, len, &fr, 1, err), -1);
    CHECK(strstr(err, "frame has") != NULL);
    len = s_make_push(buf, sizeof buf, N, 0, m_crc_kind);
    fr.len = N * 4;
    CHECK_EQ(s_check(buf, len, &fr, 1, err), -1);
    CHECK(strstr(err, "unknown checksum kind 7") != NULL);
    len = s_make_push(buf, sizeof buf, N, 0, m_shm);
    CHECK_EQ(s_check(buf, len, &fr, 1, err), -1);
    CHECK(strstr(err, "shared memory but has 1 frames") != NULL);
    CHECK_EQ(s_check(buf, len, NULL, 0, err), 0);
}

/* One answer to "only this host?" for the server (CURVE warning) and the
 * client (CRC, shared memory) alike. */
static void test_local_endpoint(void)
{
    CHECK(dp_zsock_local_endpoint("tcp://127.0.0.1:5555"));
    CHECK(dp_zsock_local_endpoint("tcp://127.1.2.3:5555"));
    CHECK(dp_zsock_local_endpoint("tcp://localhost:5555"));
    CHECK(dp_zsock_local_endpoint("tcp://[::1]:5"));
    CHECK(dp_zsock_local_endpoint("ipc:///tmp/x"));
    CHECK(dp_zsock_local_endpoint("inproc://x"));
    CHECK(!dp_zsock_local_endpoint("tcp://10.0.0.1:5555"));
    CHECK(!dp_zsock_local_endpoint("tcp://0.0.0.0:5555")); /* bound on every interface */
    CHECK(!dp_zsock_local_endpoint("tcp://127example.com:1"));
    CHECK(!dp_zsock_local_endpoint("tcp://localhost.example.com:1"));
}

/* Endpoint and key lists: one parser, an empty entry is an error. */
static void test_split(void)
{
    char items[3][16], err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_zsock_split("", items[0], 16, 3, err), 0);
    CHECK_EQ(dp_zsock_split("a", items[0], 16, 3, err), 1);
    CHECK_STR(items[0], "a");
    CHECK_EQ(dp_zsock_split("tcp://h:1,ipc:///x", items[0], 16, 3, err), 2);
    CHECK_STR(items[1], "ipc:///x");
    CHECK_EQ(dp_zsock_split("a,,b", items[0], 16, 3, err), -1);
    CHECK_STR(err, "entry 2 is empty");
    CHECK_EQ(dp_zsock_split(",a", items[0], 16, 3, err), -1);
    CHECK_STR(err, "entry 1 is empty");
    CHECK_EQ(dp_zsock_split("a,", items[0], 16, 3, err), -1);
    CHECK_STR(err, "entry 2 is empty");
    CHECK_EQ(dp_zsock_split("a,b,c,d", items[0], 16, 3, err), -1);
    CHECK_STR(err, "more than 3 entries");
    CHECK_EQ(dp_zsock_split("a,0123456789abcdef", items[0], 16, 3, err), -1);
    CHECK_STR(err, "entry 2 is longer than 15 bytes");
}

/* bfloat16: round to nearest even (ties to the even 16-bit value), NaN and
 * Inf kept, past the largest bf16 to Inf; widening is exact; the vector
 * path (8 at a time) and the tail agree, at any alignment. */
static void test_bf16(void)
{
    uint32_t in[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,
                     0x7fc00001u, 0x7f800001u, 0xff800000u, 0x7f7fffffu, 0x80000000u, 0x00010000u};
    uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x3f80, 0x7fc0, 0x7fc0, 0xff80, 0x7f80, 0x8000, 0x0001};
    enum { K = sizeof in / sizeof in[0] };
    float src[3 * K];
    uint16_t out[3 * K];
    for (int r = 0; r < 3; r++) memcpy(src + r * K, in, sizeof in); /* vector blocks and a tail */
    dp_wire_to_bf16(out, src, 3 * K);
    int bad = 0;
    for (int i = 0; i < 3 * K; i++) {
        uint16_t w = want[i % K];
        int is_nan = (w & 0x7f80) == 0x7f80 && (w & 0x7f);
        bad += is_nan ? !((out[i] & 0x7f80) == 0x7f80 && (out[i] & 0x7f)) : out[i] != w;
    }
    CHECK_EQ(bad, 0);
    uint8_t raw[2 * 3 * K + 1];
    memcpy(raw + 1, out, sizeof out);
    float back[3 * K];
    dp_wire_from_bf16(back, raw + 1, 3 * K);
    for (int i = 0; i < 3 * K; i++) {
        uint32_t u;
        memcpy(&u, back + i, 4);
        bad += u != (uint32_t)out[i] << 16;
    }
    CHECK_EQ(bad, 0);
    /* The vector form is common/bf16.h's rule, on every kind of bit
     * pattern (random ones hit NaNs of both signs, subnormals, ties). */
    enum { R = 4099 };
    static float rnd[R];
    static uint16_t vec[R];
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < R; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t u = (uint32_t)(x >> 32);
        if (i % 5 == 0) u = (u & 0xffff0000u) | 0x8000u; /* a tie */
        memcpy(rnd + i, &u, 4);
    }
    dp_wire_to_bf16(vec, rnd, R);
    for (int i = 0; i < R; i++) bad += vec[i] != dp_bf16_from_f32(rnd[i]);
    CHECK_EQ(bad, 0);
}

static void m_bf16(Downpour__Envelope *e, Downpour__TensorDesc *d)
{
    (void)e;
    d->dtype = DOWNPOUR__DTYPE__BFLOAT16;
    d->byte_length = N * 2;
    dp_wire_desc_no_checksum(d);
}

/* A BFLOAT16 descriptor holds 2 bytes an element: a frame of N * 2 bytes,
 * N elements for the range; not in shared memory. */
static void test_bf16_descriptor(void)
{
    uint8_t buf[4096];
    char err[DP_ERR_LEN] = "";
    size_t len = s_make_push(buf, sizeof buf, N, 10, m_bf16);
    dp_wire_frame_t fr = {s_data, N * 2};
    CHECK_EQ(s_check(buf, len, &fr, 1, err), 0);
    fr.len = N * 4;
    CHECK_EQ(s_check(buf, len, &fr, 1, err), -1);
    Downpour__Envelope *env = dp_wire_decode(buf, len, err);
    CHECK(env != NULL);
    if (env) {
        CHECK_EQ(dp_wire_desc_count(env->tensors[0]), N);
        CHECK_EQ(dp_wire_check_range(env, 10, 10 + N, err), 0);
        env->shm = 1;
        CHECK_EQ(dp_wire_check(env, NULL, 0, err), -1);
        CHECK(strstr(err, "dtype 3 unsupported") != NULL);
        dp_wire_destroy(&env);
    }
}

/* A PARAMS reply in parts: its part below its parts, at most
 * DP_WIRE_MAX_PULL_PARTS of them (a shard queues them at once). */
static void test_params_parts(void)
{
    struct {
        uint32_t part, parts;
        const char *want; /* NULL: valid */
    } cases[] = {
        {0, 0, NULL}, {2, 3, NULL}, {7, 8, NULL},
        {3, 3, "malformed: PARAMS part 3 of 3"},
        {1, 0, "malformed: PARAMS part 1 of 1"},
        {0, 9, "malformed: PARAMS in 9 parts (limit 8)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PARAMS, 1, 0, 0);
        Downpour__Params p = DOWNPOUR__PARAMS__INIT;
        p.part = cases[k].part;
        p.parts = cases[k].parts;
        env.params = &p;
        Downpour__TensorDesc d;
        Downpour__TensorDesc *dv[1] = {&d};
        int64_t shape[1];
        dp_wire_desc_fill(&d, shape, "params", s_data, N, 0, 0, 0);
        env.n_tensors = 1;
        env.tensors = dv;
        dp_wire_frame_t fr = {s_data, N * 4};
        char err[DP_ERR_LEN] = "";
        int rc = dp_wire_check(&env, &fr, 1, err);
        CHECK_EQ(rc, cases[k].want ? -1 : 0);
        if (cases[k].want && !strstr(err, cases[k].want)) {
            fprintf(stderr, "  part %u of %u: error '%s' lacks '%s'\n", cases[k].part,
                    cases[k].parts, err, cases[k].want);
            CHECK(0);
        }
    }
}

/* Each message type's row: its body's text limit (DP_WIRE_MAX_TEXT bytes
 * accepted, one more refused), held wherever that body travels, and the
 * order of the checks (texts before the envelope's tensors, structures
 * after them) that picks which fault a message with two is refused for. */
static void test_body_rules(void)
{
    static char text[DP_WIRE_MAX_TEXT + 2];
    memset(text, 'x', DP_WIRE_MAX_TEXT + 1);
    Downpour__Hello hello = DOWNPOUR__HELLO__INIT;
    Downpour__Error error = DOWNPOUR__ERROR__INIT;
    Downpour__Ack ack = DOWNPOUR__ACK__INIT;
    Downpour__Pull pull = DOWNPOUR__PULL__INIT;
    Downpour__Push push = DOWNPOUR__PUSH__INIT;
    hello.model_spec = error.message = ack.reason = text;
    struct {
        int type;
        int over;      /* the text is DP_WIRE_MAX_TEXT + 1 bytes, else DP_WIRE_MAX_TEXT */
        int bad_push;  /* a push body in 3 parts, part 5, rides along */
        int tensors;   /* one descriptor (and frame) */
        const char *want; /* NULL: valid */
    } cases[] = {
        {DOWNPOUR__MSG_TYPE__HELLO, 0, 0, 0, NULL},
        {DOWNPOUR__MSG_TYPE__HELLO, 1, 0, 0, "malformed: model spec longer than 4096 bytes"},
        {DOWNPOUR__MSG_TYPE__ERROR, 0, 0, 0, NULL},
        {DOWNPOUR__MSG_TYPE__ERROR, 1, 0, 0, "malformed: error text longer than 4096 bytes"},
        {DOWNPOUR__MSG_TYPE__ACK, 0, 0, 0, NULL},
        {DOWNPOUR__MSG_TYPE__ACK, 1, 0, 0, "malformed: ack reason longer than 4096 bytes"},
        /* a body besides the type's own is held to its rules too */
        {DOWNPOUR__MSG_TYPE__PULL, 1, 0, 0, "malformed: model spec longer than 4096 bytes"},
        {DOWNPOUR__MSG_TYPE__PULL, 0, 1, 0, "malformed: PUSH part 5 of 3"},
        /* two faults: a text before the tensors, the tensors before a structure */
        {DOWNPOUR__MSG_TYPE__HELLO, 1, 0, 1, "malformed: model spec longer than 4096 bytes"},
        {DOWNPOUR__MSG_TYPE__PULL, 0, 1, 1, "malformed: PULL carries 1 tensor descriptors"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        text[DP_WIRE_MAX_TEXT] = cases[k].over ? 'x' : '\0';
        Downpour__Envelope env;
        int t = cases[k].type;
        dp_wire_env_init(&env, t, 1, 0, 0);
        /* a PULL carries a hello body only to have its text refused */
        env.hello = t == DOWNPOUR__MSG_TYPE__HELLO || (t == DOWNPOUR__MSG_TYPE__PULL && cases[k].over)
                        ? &hello
                        : NULL;
        env.error = t == DOWNPOUR__MSG_TYPE__ERROR ? &error : NULL;
        env.ack = t == DOWNPOUR__MSG_TYPE__ACK ? &ack : NULL;
        env.pull = &pull;
        push.part = 5;
        push.parts = 3;
        env.push = cases[k].bad_push ? &push : NULL;
        Downpour__TensorDesc d;
        Downpour__TensorDesc *dv[1] = {&d};
        int64_t shape[1];
        dp_wire_desc_fill(&d, shape, "w", s_data, N, 0, 0, 0);
        env.n_tensors = (size_t)cases[k].tensors;
        env.tensors = dv;
        dp_wire_frame_t fr = {s_data, N * 4};
        char err[DP_ERR_LEN] = "";
        int rc = dp_wire_check(&env, &fr, cases[k].tensors, err);
        CHECK_EQ(rc, cases[k].want ? -1 : 0);
        if (cases[k].want && !strstr(err, cases[k].want)) {
            fprintf(stderr, "  case %zu: error '%s' lacks '%s'\n", k, err, cases[k].want);
            CHECK(0);
        }
    }
}

/* A scan (RowsPull.scan) and its page (ROWS with keys): a page's size
 * within 1 .. DP_WIRE_MAX_ROW_KEYS, no keys asked; a page's keys and rows
 * as many, and only a page listing a key says more follow. */
static void test_rows_scan(void)
{
    static uint64_t keys[4] = {3, 5, 8, 13};
    static float rows[4 * 2];
    struct {
        int reply;       /* a ROWS page, else a ROWS_PULL scan */
        uint32_t max;    /* the scan's max_keys */
        int tensors;     /* the scan's keys tensor; the page's tensors (1: rows alone) */
        int n_rows;      /* the page's rows */
        int keys_n;      /* the page's keys */
        int more;
        const char *want; /* NULL: valid */
    } cases[] = {
        {0, 1, 0, 0, 0, 0, NULL},
        {0, DP_WIRE_MAX_ROW_KEYS, 0, 0, 0, 0, NULL},
        {0, 0, 0, 0, 0, 0, "malformed: ROWS_PULL scan of 0 keys a page (1 to 1048576)"},
        {0, DP_WIRE_MAX_ROW_KEYS + 1, 0, 0, 0, 0, "malformed: ROWS_PULL scan of 1048577 keys a page"},
        {0, 4, 1, 0, 0, 0, "malformed: ROWS_PULL carries 1 tensors (it takes none: a scan names no keys)"},
        {1, 0, 2, 4, 4, 1, NULL},
        {1, 0, 2, 0, 0, 0, NULL},  /* the empty page past the end */
        {1, 0, 2, 3, 4, 0, "malformed: a scan's ROWS of 4 keys has rows [3, 2]"},
        {1, 0, 2, 0, 0, 1, "malformed: a scan's ROWS says more follow but lists no key"},
        {1, 0, 1, 4, 0, 0, NULL},  /* a keyed pull's reply */
        {1, 0, 1, 4, 0, 1, "malformed: ROWS without keys says more follow"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Downpour__Envelope env;
        Downpour__RowsPull rp = DOWNPOUR__ROWS_PULL__INIT;
        Downpour__RowsScan scan = DOWNPOUR__ROWS_SCAN__INIT;
        Downpour__Rows body = DOWNPOUR__ROWS__INIT;
        Downpour__TensorDesc d[2];
        Downpour__TensorDesc *dv[2] = {&d[0], &d[1]};
        int64_t shape[2][2];
        dp_wire_frame_t fr[2];
        int nf = 0;
        if (cases[k].reply) {
            dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ROWS, 1, 0, 0);
            body.more = cases[k].more;
            env.rows = &body;
            if (cases[k].tensors == 2) {
                dp_wire_desc_keyed(&d[nf], shape[nf], "keys", DOWNPOUR__DTYPE__UINT64, keys,
                                   (size_t)cases[k].keys_n, 0);
                fr[nf] = (dp_wire_frame_t){keys, (size_t)cases[k].keys_n * 8};
                nf++;
            }
            dp_wire_desc_keyed(&d[nf], shape[nf], "rows", DOWNPOUR__DTYPE__FLOAT32, rows,
                               (size_t)cases[k].n_rows, 2);
            fr[nf] = (dp_wire_frame_t){rows, (size_t)cases[k].n_rows * 8};
            nf++;
        } else {
            dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ROWS_PULL, 1, 0, 0);
            scan.max_keys = cases[k].max;
            rp.width = 2;
            rp.scan = &scan;
            env.rows_pull = &rp;
            if (cases[k].tensors) {
                dp_wire_desc_keyed(&d[0], shape[0], "keys", DOWNPOUR__DTYPE__UINT64, keys, 1, 0);
                fr[0] = (dp_wire_frame_t){keys, 8};
                nf = 1;
            }
        }
        env.n_tensors = (size_t)nf;
        env.tensors = dv;
        char err[DP_ERR_LEN] = "";
        int rc = dp_wire_check(&env, fr, nf, err);
        CHECK_EQ(rc, cases[k].want ? -1 : 0);
        if (cases[k].want ? !strstr(err, cases[k].want) : rc != 0) {
            fprintf(stderr, "  case %zu: error '%s', want '%s'\n", k, err,
                    cases[k].want ? cases[k].want : "none");
            CHECK(0);
        }
    }
}

DP_TESTS(T(test_roundtrip_envelope), T(test_mode_and_names), T(test_roundtrip_sockets),
         T(test_recv_too_many_frames), T(test_recv_byte_limit), T(test_validation_failures),
         T(test_frame_count_and_garbage), T(test_range), T(test_finite),
         T(test_finite_vector), T(test_checksum_kinds), T(test_bf16), T(test_bf16_descriptor),
         T(test_local_endpoint), T(test_split), T(test_params_parts), T(test_body_rules),
         T(test_rows_scan))
