/* test_ps_compress: compressed PUSHes (--compress, proto/compress.h) against
 * a real server (tests/ps_harness.h) over loopback:
 *  - from the hostile side, a raw DEALER speaking the wire with the
 *    project's codec: top-k indices out of the slice, unsorted, duplicated,
 *    too many (more bytes than the dense push), as many values as indices
 *    or not, NaN values; a sign frame of the wrong number of bits, a frame
 *    shorter than its descriptor, padding bits set, a negative scale; the
 *    compressed dtypes in a dense push, an unknown compression, one said to
 *    be in shared memory, indices of the wrong dtype — each refused with
 *    one line naming it, the model unchanged (bit for bit, version 0);
 *  - a valid top-k and sign push from the same peer is applied as its
 *    expansion;
 *  - the worker's client with --compress topk / sign and error feedback:
 *    the server's weights are those a replica of the worker's compressor
 *    predicts, push after push, and each push's bytes are the encoding's. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/compress.h"
#include "server/core/shard.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0

static dp_model_t s_m;

static void s_setup(void)
{
    if (!s_m.n_floats) srv_small_model(&s_m);
}

/* A raw PUSH: nd frames (dtype, key, element count, bytes) on a compressed
 * envelope; the descriptors' byte_length is the frame's unless blen says
 * otherwise. */
typedef struct {
    int dtype;
    const char *key;
    size_t count;
    const void *data;
    size_t len;
    uint64_t offset;
} s_frame_t;

typedef raw_reply_t s_reply_t;

static s_reply_t s_raw_push(void *sock, int compression, float scale, int shm, const s_frame_t *f,
                            int nd)
{
    static uint64_t req = 100;
    s_reply_t r = {-1, 0, 0, ""};
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, ++req, 1, s_m.fingerprint);
    Downpour__Push p = DOWNPOUR__PUSH__INIT;
    p.compression = (Downpour__Compression)compression;
    p.scale = scale;
    env.push = &p;
    env.shm = shm;
    Downpour__TensorDesc d[2], *dv[2] = {&d[0], &d[1]};
    int64_t shape[2];
    for (int i = 0; i < nd; i++) {
        dp_wire_desc_fill(&d[i], &shape[i], f[i].key, NULL, f[i].count, f[i].offset, 1,
                          dp_wire_crc32(f[i].data, f[i].len));
        d[i].dtype = (Downpour__DType)f[i].dtype;
        d[i].byte_length = f[i].dtype == DOWNPOUR__DTYPE__BIT ? (f[i].count + 7) / 8
                                                              : f[i].count * 4;
    }
    env.n_tensors = (size_t)nd;
    env.tensors = dv;
    dp_wire_payload_t pl[2];
    for (int i = 0; i < nd; i++) pl[i] = (dp_wire_payload_t){f[i].data, f[i].len, NULL, NULL};
    char err[DP_ERR_LEN];
    if (dp_wire_send(sock, NULL, &env, shm ? NULL : pl, shm ? 0 : nd, err) != 0) return r;
    return raw_reply(sock);
}


/* A refusal: one line with want in it, nothing applied. */
#define CHECK_REFUSED(r, want, c, w0, w)                                         \
    do {                                                                         \
        CHECK((r).type == DOWNPOUR__MSG_TYPE__ERROR ||                           \
              ((r).type == DOWNPOUR__MSG_TYPE__ACK && (r).status == DOWNPOUR__ACK_STATUS__REJECTED)); \
        CHECK(strstr((r).text, want) != NULL);                                   \
        CHECK(strchr((r).text, '\n') == NULL);                                   \
        if (!strstr((r).text, want)) fprintf(stderr, "  got: %s\n", (r).text);   \
        CHECK_EQ(srv_weights(c, w), 0);                                            \
        CHECK(memcmp(w, w0, s_m.n_floats * sizeof(float)) == 0);                 \
    } while (0)

static void test_hostile_frames(void)
{
    s_setup();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN];
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats;
    float *w0 = malloc(n * sizeof *w0), *w = malloc(n * sizeof *w);
    CHECK_EQ(srv_weights(c, w0), 0);
    void *ctx = zmq_ctx_new();
    void *sock = raw_dealer(ctx, s.endpoint, (int)(TMO * 1000));
    Downpour__Envelope he;
    Downpour__Hello h;
    raw_hello_init(&he, &h, &s_m, 1, 1);
    CHECK_EQ(raw_request(sock, &he, NULL), DOWNPOUR__MSG_TYPE__WELCOME);

    const int TOPK = DOWNPOUR__COMPRESSION__TOPK, SIGN = DOWNPOUR__COMPRESSION__SIGN;
    const int U32 = DOWNPOUR__DTYPE__UINT32, F32 = DOWNPOUR__DTYPE__FLOAT32, BIT = DOWNPOUR__DTYPE__BIT;
    uint32_t *idx = calloc(n, sizeof *idx);
    float *val = calloc(n, sizeof *val);
    for (size_t j = 0; j < n; j++) {
        idx[j] = (uint32_t)j;
        val[j] = 0.5f;
    }
    s_reply_t r;
#define TK(k, iv) {{U32, "indices", (k), (iv), (k) * 4, 0}, {F32, "values", (k), val, (k) * 4, 0}}
    { /* out of the slice */
        uint32_t bad[2] = {0, (uint32_t)n};
        s_frame_t f[2] = TK(2, bad);
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_REFUSED(r, "out of this shard's slice", c, w0, w);
    }
    { /* unsorted */
        uint32_t bad[2] = {5, 3};
        s_frame_t f[2] = TK(2, bad);
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_REFUSED(r, "strictly increasing", c, w0, w);
    }
    { /* duplicated */
        uint32_t bad[2] = {3, 3};
        s_frame_t f[2] = TK(2, bad);
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_REFUSED(r, "strictly increasing", c, w0, w);
    }
    { /* too many: more bytes than the dense slice */
        s_frame_t f[2] = TK(n / 2 + 1, idx);
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_REFUSED(r, "never more bytes than the dense push", c, w0, w);
    }
    { /* three values for two indices */
        s_frame_t f[2] = {{U32, "indices", 2, idx, 8, 0}, {F32, "values", 3, val, 12, 0}};
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_REFUSED(r, "2 indices but 3 values", c, w0, w);
    }
    { /* NaN among the values: refused as a dense gradient's would be */
        float nan_val[2] = {0.5f, NAN};
        s_frame_t f[2] = {{U32, "indices", 2, idx, 8, 0}, {F32, "values", 2, nan_val, 8, 0}};
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_REFUSED(r, "non-finite gradient", c, w0, w);
    }
    { /* indices sent as floats */
        s_frame_t f[2] = {{F32, "indices", 2, val, 8, 0}, {F32, "values", 2, val, 8, 0}};
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_REFUSED(r, "must be the indices", c, w0, w);
    }
    uint8_t *bits = calloc(n / 8 + 2, 1);
    { /* a bit frame for 8 floats fewer than the slice */
        s_frame_t f[1] = {{BIT, "signs", n - 8, bits, (n - 8 + 7) / 8, 0}};
        r = s_raw_push(sock, SIGN, 0.5f, 0, f, 1);
        CHECK_REFUSED(r, "sign PUSH of", c, w0, w);
    }
    { /* a frame a byte shorter than its descriptor says */
        s_frame_t f[1] = {{BIT, "signs", n, bits, (n + 7) / 8 - 1, 0}};
        r = s_raw_push(sock, SIGN, 0.5f, 0, f, 1);
        CHECK_REFUSED(r, "bytes, descriptor says", c, w0, w);
    }
    if (n % 8) { /* bits past the slice set */
        bits[n / 8] = 0x80;
        s_frame_t f[1] = {{BIT, "signs", n, bits, (n + 7) / 8, 0}};
        r = s_raw_push(sock, SIGN, 0.5f, 0, f, 1);
        CHECK_REFUSED(r, "unused bits", c, w0, w);
        bits[n / 8] = 0;
    }
    { /* a negative scale */
        s_frame_t f[1] = {{BIT, "signs", n, bits, (n + 7) / 8, 0}};
        r = s_raw_push(sock, SIGN, -1.0f, 0, f, 1);
        CHECK_REFUSED(r, "scale -1", c, w0, w);
    }
    { /* a compressed dtype in a dense push */
        s_frame_t f[1] = {{U32, "params", n, idx, n * 4, 0}};
        r = s_raw_push(sock, DOWNPOUR__COMPRESSION__COMPRESS_NONE, 0, 0, f, 1);
        CHECK_REFUSED(r, "dtype 4 unsupported", c, w0, w);
    }
    { /* an unknown compression */
        s_frame_t f[1] = {{BIT, "signs", n, bits, (n + 7) / 8, 0}};
        r = s_raw_push(sock, 9, 0.5f, 0, f, 1);
        CHECK_REFUSED(r, "unknown compression 9", c, w0, w);
    }
    { /* said to be in shared memory */
        s_frame_t f[1] = {{BIT, "signs", n, bits, (n + 7) / 8, 0}};
        r = s_raw_push(sock, SIGN, 0.5f, 1, f, 1);
        CHECK_REFUSED(r, "travels in frames", c, w0, w);
    }

    /* valid ones are applied as their expansion (SGD lr 0.1) */
    {
        uint32_t good[3] = {1, 7, (uint32_t)n - 1};
        float gv[3] = {1.0f, -2.0f, 0.25f};
        s_frame_t f[2] = {{U32, "indices", 3, good, 12, 0}, {F32, "values", 3, gv, 12, 0}};
        r = s_raw_push(sock, TOPK, 0, 0, f, 2);
        CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ACK);
        CHECK_EQ(r.status, DOWNPOUR__ACK_STATUS__APPLIED);
        CHECK_EQ(srv_weights(c, w), 1);
        float *want = malloc(n * sizeof *want);
        memcpy(want, w0, n * sizeof *want);
        for (int j = 0; j < 3; j++) want[good[j]] = w0[good[j]] - 0.1f * gv[j];
        CHECK_CLOSE("top-k applied", w, want, n, 1e-7, 1e-6);
        int untouched = 1; /* every other weight exactly as it was */
        for (size_t i = 0; i < n; i++)
            if (i != 1 && i != 7 && i != n - 1 && w[i] != w0[i]) untouched = 0;
        CHECK(untouched);
        /* sign: bit i set for every third float */
        for (size_t i = 0; i < n; i += 3) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
        memcpy(w0, w, n * sizeof *w);
        s_frame_t fs[1] = {{BIT, "signs", n, bits, (n + 7) / 8, 0}};
        r = s_raw_push(sock, SIGN, 0.5f, 0, fs, 1);
        CHECK_EQ(r.status, DOWNPOUR__ACK_STATUS__APPLIED);
        CHECK_EQ(srv_weights(c, w), 2);
        for (size_t i = 0; i < n; i++) want[i] = w0[i] - 0.1f * (i % 3 == 0 ? -0.5f : 0.5f);
        CHECK_CLOSE("sign applied", w, want, n, 1e-7, 1e-6);
        free(want);
    }
#undef TK
    free(bits);
    free(idx);
    free(val);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    dp_ps_client_destroy(&c);
    free(w0);
    free(w);
    CHECK_EQ(srv_stop(&s), 0);
}

/* The worker's client compressing with error feedback: what the server
 * holds after each push is w - lr * expand(encoding) of a replica of the
 * client's compressor, and each push's bytes are the encoding's. */
static void s_client_case(dp_compress_kind_t kind, double fraction, int shards)
{
    s_setup();
    srv_t s[2];
    char eps[600] = "";
    for (int k = 0; k < shards; k++) {
        srv_init(&s[k], DP_MODE_ASYNC, 1);
        s[k].cfg.shard_index = k;
        s[k].cfg.shard_count = shards;
        CHECK_EQ(srv_start(&s[k]), 0);
        snprintf(eps + strlen(eps), sizeof eps - strlen(eps), "%s%s", k ? "," : "", s[k].endpoint);
    }
    dp_compress_conf_t cc = {kind, fraction, 1};
    dp_ps_client_opts_t o = {.timeout_s = TMO, .compress = cc};
    char err[DP_ERR_LEN];
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, eps, &s_m, 0, &o, NULL, err), 0);
    size_t n = s_m.n_floats;
    float *w = malloc(n * sizeof *w), *want = malloc(n * sizeof *want), *g = malloc(n * sizeof *g);
    float *d = malloc(n * sizeof *d);
    CHECK_EQ(dp_ps_client_pull(c, want, err), 0);
    /* the replica: one compressor per shard slice, as the client keeps */
    size_t lo[2] = {0, 0}, cnt[2] = {n, 0};
    if (shards == 2) {
        dp_shard_t probe;
        dp_optim_conf_t oc;
        dp_optim_conf_default(&oc);
        CHECK_EQ(dp_shard_init(&probe, &s_m, 1, 2, 7, &oc, err), 0);
        lo[1] = probe.lo;
        cnt[0] = probe.lo;
        cnt[1] = n - probe.lo;
        dp_shard_fini(&probe);
    }
    dp_compressor_t z[2];
    for (int k = 0; k < shards; k++) dp_compressor_init(&z[k], &cc, cnt[k]);
    uint64_t total = 0;
    for (int step = 1; step <= 3; step++) {
        srv_fill(g, n, (uint64_t)step);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, shards);
        uint64_t bytes = 0;
        for (int k = 0; k < shards; k++) {
            bytes += dp_compressor_encode(&z[k], g + lo[k]);
            dp_compressor_expand(&z[k], d + lo[k]);
        }
        CHECK_EQ(r.bytes, bytes);
        total += bytes;
        for (size_t i = 0; i < n; i++) want[i] -= 0.1f * d[i];
        CHECK_EQ(dp_ps_client_pull(c, w, err), 0);
        CHECK_CLOSE("the servers' weights", w, want, n, 1e-6, 1e-5);
        memcpy(want, w, n * sizeof *w); /* the next step from the servers' own floats */
    }
    CHECK_EQ(dp_ps_client_bytes_pushed(c), total);
    size_t dense = n * sizeof(float);
    /* (the ratios of the issue need large slices: test_compress test_bytes) */
    if (kind == DP_COMPRESS_TOPK) CHECK(total <= 3 * dense / 2);
    if (kind == DP_COMPRESS_SIGN) CHECK(total <= 3 * (dense / 32 + (size_t)shards * (4 + 1)));
    for (int k = 0; k < shards; k++) dp_compressor_fini(&z[k]);
    dp_ps_client_destroy(&c);
    free(w);
    free(want);
    free(g);
    free(d);
    for (int k = 0; k < shards; k++) CHECK_EQ(srv_stop(&s[k]), 0);
}

static void test_client_topk(void) { s_client_case(DP_COMPRESS_TOPK, 0.01, 1); }
static void test_client_sign_two_shards(void) { s_client_case(DP_COMPRESS_SIGN, 0, 2); }
static void test_client_topk_two_shards(void) { s_client_case(DP_COMPRESS_TOPK, 0.1, 2); }

DP_TESTS(T(test_hostile_frames), T(test_client_topk), T(test_client_sign_two_shards),
         T(test_client_topk_two_shards))
