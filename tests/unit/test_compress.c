/* test_compress: the codec of --compress (proto/compress.h) by hand — the
 * flags' texts, k of top-k, the selection on ties (lower index first) and
 * against a sort on random data full of ties, the sign's scale and bits,
 * error feedback's residual over two pushes, the byte counts the issue
 * promises (top-1 % <= 2.5 % of the float32 push, sign <= 1/32 of it plus
 * the scale), a slice too small for top-k, and each encoding through the
 * servers' wire check and expansion (frames at an odd address too). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "proto/compress.h"
#include "tests/test.h"

static void test_parse_and_name(void)
{
    char err[DP_ERR_LEN], name[48];
    dp_compress_conf_t c = {0};
    CHECK_EQ(dp_compress_parse("topk:0.01", &c, err), 0);
    CHECK_EQ(c.kind, DP_COMPRESS_TOPK);
    CHECK_NEAR(c.fraction, 0.01, 0);
    dp_compress_name(&c, name, sizeof name);
    CHECK_STR(name, "topk:0.01");
    CHECK_EQ(dp_compress_parse("sign", &c, err), 0);
    dp_compress_name(&c, name, sizeof name);
    CHECK_STR(name, "sign");
    CHECK_EQ(dp_compress_parse("none", &c, err), 0);
    CHECK_EQ(c.kind, DP_COMPRESS_NONE);
    const char *bad[] = {"topk:0", "topk:0.6", "topk:x", "topk:", "topk:0.1x", "gzip", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK_EQ(dp_compress_parse(bad[i], &c, err), -1);
        CHECK(strstr(err, "--compress") != NULL);
    }
    int on = 7;
    CHECK_EQ(dp_compress_ef_parse("off", &on, err), 0);
    CHECK_EQ(on, 0);
    CHECK_EQ(dp_compress_ef_parse("on", &on, err), 0);
    CHECK_EQ(on, 1);
    CHECK_EQ(dp_compress_ef_parse("yes", &on, err), -1);
    CHECK(strstr(err, "on or off") != NULL);
}

static void test_topk_k(void)
{
    CHECK_EQ(dp_compress_topk_k(0.01, 1000), 10);
    CHECK_EQ(dp_compress_topk_k(0.01, 1001), 11); /* rounded up */
    CHECK_EQ(dp_compress_topk_k(0.01, 10), 1);    /* at least one */
    CHECK_EQ(dp_compress_topk_k(0.5, 3), 1);      /* at most half */
    CHECK_EQ(dp_compress_topk_k(0.5, 1), 0);      /* dense */
}

static dp_compress_conf_t s_conf(dp_compress_kind_t kind, double f, int ef)
{
    return (dp_compress_conf_t){kind, f, ef};
}

/* Equal magnitudes: the lower index wins; -0 is 0; indices ascend. */
static void test_topk_ties(void)
{
    const float v[8] = {1, -3, 3, 2, -3, 0.5f, 3, -0.0f};
    dp_compressor_t z;
    dp_compress_conf_t c = s_conf(DP_COMPRESS_TOPK, 0.25, 1);
    dp_compressor_init(&z, &c, 8);
    CHECK_EQ(dp_compressor_encode(&z, v), 2 * 8);
    CHECK_EQ(z.k, 2);
    CHECK_EQ(z.idx[0], 1);
    CHECK_EQ(z.idx[1], 2);
    CHECK(z.val[0] == -3.0f && z.val[1] == 3.0f);
    float d[8];
    dp_compressor_expand(&z, d);
    const float want[8] = {0, -3, 3, 0, 0, 0, 0, 0};
    CHECK(memcmp(d, want, sizeof d) == 0);
    /* what was not sent: v = g + 0 (-0 + 0 is +0) with the two sent entries zeroed */
    const float resid[8] = {1, 0, 0, 2, -3, 0.5f, 3, 0.0f};
    CHECK(memcmp(z.resid, resid, sizeof resid) == 0);
    dp_compressor_fini(&z);
    dp_compressor_fini(&z); /* safe twice */
    CHECK(z.v == NULL);
}

/* The reference: sort (|v| descending, index ascending), take k. */
static const float *s_ref_v;
static int s_ref_cmp(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float x = fabsf(s_ref_v[i]), y = fabsf(s_ref_v[j]);
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}
static int s_u32_cmp(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    return i < j ? -1 : i > j;
}

/* The radix selection against a sort on 20000 values of 37 magnitudes
 * (ties everywhere, the threshold inside a run of them) and of spread-out
 * ones, at several k. */
static void test_topk_against_sort(void)
{
    enum { N = 20000 };
    float *v = malloc(N * sizeof *v);
    uint32_t *ord = malloc(N * sizeof *ord);
    dp_rng_t r;
    dp_rng_seed(&r, 5);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N; i++) {
            float u = dp_rng_uniform(&r);
            v[i] = pass == 0 ? (float)((int)(u * 37) - 18) * 0.25f : (u - 0.5f) * 1e-3f * (float)(i % 97 + 1);
        }
        const double fr[] = {0.0001, 0.01, 0.1, 0.5};
        for (size_t t = 0; t < sizeof fr / sizeof fr[0]; t++) {
            dp_compress_conf_t c = s_conf(DP_COMPRESS_TOPK, fr[t], 0);
            dp_compressor_t z;
            dp_compressor_init(&z, &c, N);
            dp_compressor_encode(&z, v);
            size_t k = dp_compress_topk_k(fr[t], N);
            for (int i = 0; i < N; i++) ord[i] = (uint32_t)i;
            s_ref_v = v;
            qsort(ord, N, sizeof *ord, s_ref_cmp);
            qsort(ord, k, sizeof *ord, s_u32_cmp);
            CHECK_EQ(z.k, k);
            int same = z.k == k && memcmp(z.idx, ord, k * sizeof *ord) == 0;
            for (size_t j = 0; same && j < k; j++) same = z.val[j] == v[z.idx[j]];
            CHECK(same);
            if (!same) fprintf(stderr, "  pass %d fraction %g differs from the sort\n", pass, fr[t]);
            dp_compressor_fini(&z);
        }
    }
    free(v);
    free(ord);
}

/* scale = mean |v| (1.2 here); bit i = v[i] < 0, so 0 and -0 are +. */
static void test_sign_scale(void)
{
    const float v[5] = {1, -2, 0, -0.0f, 3};
    dp_compress_conf_t c = s_conf(DP_COMPRESS_SIGN, 0, 1);
    dp_compressor_t z;
    dp_compressor_init(&z, &c, 5);
    CHECK_EQ(dp_compressor_encode(&z, v), 1 + 4);
    CHECK(z.scale == (float)(6.0 / 5.0));
    CHECK_EQ(z.bits[0], 0x02);
    float d[5];
    dp_compressor_expand(&z, d);
    float s = z.scale;
    const float want[5] = {s, -s, s, s, s};
    CHECK(memcmp(d, want, sizeof d) == 0);
    const float resid[5] = {1 - s, -2 + s, 0 - s, 0.0f - s, 3 - s};
    CHECK(memcmp(z.resid, resid, sizeof resid) == 0);
    dp_compressor_fini(&z);
}

/* Error feedback over two pushes by hand, and the same without it. */
static void test_error_feedback(void)
{
    const float g1[4] = {0.5f, -1, 0.25f, 0.75f}, g2[4] = {0.5f, 0.1f, 0, -0.5f};
    dp_compress_conf_t on = s_conf(DP_COMPRESS_TOPK, 0.25, 1), off = on;
    off.error_feedback = 0;
    dp_compressor_t z, y;
    dp_compressor_init(&z, &on, 4);
    dp_compressor_init(&y, &off, 4);
    CHECK(y.resid == NULL);
    dp_compressor_encode(&z, g1);
    dp_compressor_encode(&y, g1);
    CHECK(z.k == 1 && z.idx[0] == 1 && z.val[0] == -1.0f);
    CHECK(y.k == 1 && y.idx[0] == 1 && y.val[0] == -1.0f);
    const float e1[4] = {0.5f, 0, 0.25f, 0.75f};
    CHECK(memcmp(z.resid, e1, sizeof e1) == 0);
    /* v = g2 + e1 = {1, 0.1, 0.25, 0.25}: entry 0 goes, the rest stays */
    dp_compressor_encode(&z, g2);
    CHECK(z.k == 1 && z.idx[0] == 0 && z.val[0] == 1.0f);
    const float e2[4] = {0, 0.1f, 0.25f, 0.25f};
    CHECK(memcmp(z.resid, e2, sizeof e2) == 0);
    /* without: g2 alone, |0.5| at 0 and 3 tie, the lower index goes */
    dp_compressor_encode(&y, g2);
    CHECK(y.k == 1 && y.idx[0] == 0 && y.val[0] == 0.5f);
    dp_compressor_fini(&z);
    dp_compressor_fini(&y);
}

/* The targets, as exact byte counts: top-1 % is 2 % of the float32
 * push (indices and values), sign 1/32 of it plus the 4-byte scale. */
static void test_bytes(void)
{
    enum { N = 100000 };
    float *g = malloc(N * sizeof *g);
    for (int i = 0; i < N; i++) g[i] = (float)((i * 7919) % 1000) - 500.0f;
    size_t dense = N * sizeof(float);
    dp_compress_conf_t t = s_conf(DP_COMPRESS_TOPK, 0.01, 1), s = s_conf(DP_COMPRESS_SIGN, 0, 1);
    dp_compressor_t z;
    dp_compressor_init(&z, &t, N);
    size_t b = dp_compressor_encode(&z, g);
    CHECK_EQ(b, 1000 * 8);
    CHECK(b * 1000 <= dense * 25);
    CHECK_EQ(dp_compressor_bytes(&z), b);
    dp_compressor_fini(&z);
    dp_compressor_init(&z, &s, N);
    b = dp_compressor_encode(&z, g);
    CHECK_EQ(b, N / 8 + 4);
    CHECK(b <= dense / 32 + 4);
    dp_compressor_fini(&z);
    free(g);
}

/* One float: top-k cannot halve it, the slice goes dense (residual 0). */
static void test_tiny_slice_dense(void)
{
    const float g[1] = {0.25f};
    dp_compress_conf_t c = s_conf(DP_COMPRESS_TOPK, 0.5, 1);
    dp_compressor_t z;
    dp_compressor_init(&z, &c, 1);
    CHECK_EQ(dp_compressor_encode(&z, g), 4);
    CHECK_EQ(z.kind, DP_COMPRESS_NONE);
    float d;
    dp_compressor_expand(&z, &d);
    CHECK(d == 0.25f && z.resid[0] == 0.0f);
    dp_compressor_fini(&z);
}

/* The last encoding as a PUSH's envelope and frames (an odd address each,
 * as ZeroMQ may hand them over), for dp_wire_check and the expansion. */
typedef struct {
    Downpour__Envelope env;
    Downpour__Push push;
    Downpour__TensorDesc d[2];
    Downpour__TensorDesc *dp[2];
    int64_t shape[2];
    unsigned char *buf[2];
    dp_wire_frame_t f[2];
} s_msg_t;

static void s_frame(s_msg_t *m, int i, const char *key, int dtype, size_t count, const void *data,
                    size_t len, uint64_t lo)
{
    dp_wire_desc_fill(&m->d[i], &m->shape[i], key, NULL, count, lo, 1, 0);
    m->d[i].dtype = (Downpour__DType)dtype;
    m->d[i].byte_length = len;
    m->buf[i] = malloc(len + 1);
    memcpy(m->buf[i] + 1, data, len);
    m->d[i].crc32 = dp_wire_crc32(m->buf[i] + 1, len);
    m->f[i] = (dp_wire_frame_t){m->buf[i] + 1, len};
    m->dp[i] = &m->d[i];
}

static int s_msg(s_msg_t *m, const dp_compressor_t *z, uint64_t lo)
{
    memset(m, 0, sizeof *m);
    dp_wire_env_init(&m->env, DOWNPOUR__MSG_TYPE__PUSH, 1, 0, 0);
    m->push = (Downpour__Push)DOWNPOUR__PUSH__INIT;
    m->env.push = &m->push;
    m->env.tensors = m->dp;
    if (z->kind == DP_COMPRESS_TOPK) {
        m->push.compression = DOWNPOUR__COMPRESSION__TOPK;
        s_frame(m, 0, "indices", DOWNPOUR__DTYPE__UINT32, z->k, z->idx, z->k * 4, lo);
        s_frame(m, 1, "values", DOWNPOUR__DTYPE__FLOAT32, z->k, z->val, z->k * 4, lo);
        m->env.n_tensors = 2;
    } else {
        m->push.compression = DOWNPOUR__COMPRESSION__SIGN;
        m->push.scale = z->scale;
        s_frame(m, 0, "signs", DOWNPOUR__DTYPE__BIT, z->n, z->bits, (z->n + 7) / 8, lo);
        m->env.n_tensors = 1;
    }
    return (int)m->env.n_tensors;
}

static void s_msg_fini(s_msg_t *m)
{
    free(m->buf[0]);
    free(m->buf[1]);
}

static void test_wire_round_trip(void)
{
    enum { N = 1003, LO = 500 }; /* not a multiple of 8: the sign frame has padding */
    float g[N], want[N], got[N];
    dp_rng_t r;
    dp_rng_seed(&r, 9);
    for (int i = 0; i < N; i++) g[i] = dp_rng_uniform(&r) - 0.5f;
    dp_compress_conf_t confs[2] = {s_conf(DP_COMPRESS_TOPK, 0.05, 1), s_conf(DP_COMPRESS_SIGN, 0, 1)};
    for (int t = 0; t < 2; t++) {
        dp_compressor_t z;
        dp_compressor_init(&z, &confs[t], N);
        dp_compressor_encode(&z, g);
        dp_compressor_expand(&z, want);
        s_msg_t m;
        int nf = s_msg(&m, &z, LO);
        char err[DP_ERR_LEN] = "";
        CHECK_EQ(dp_wire_check(&m.env, m.f, nf, err), 0);
        if (err[0]) fprintf(stderr, "  %s\n", err);
        memset(got, 0xff, sizeof got);
        CHECK_EQ(dp_compress_expand_wire(&m.env, m.f, nf, LO, LO + N, got, err), 0);
        CHECK(memcmp(got, want, sizeof got) == 0);
        /* another shard's range: refused, with the offsets named */
        CHECK_EQ(dp_compress_expand_wire(&m.env, m.f, nf, LO + 1, LO + 1 + N, got, err), -1);
        CHECK(strstr(err, "malformed: compressed PUSH") != NULL);
        s_msg_fini(&m);
        dp_compressor_fini(&z);
    }
}

DP_TESTS(T(test_parse_and_name), T(test_topk_k), T(test_topk_ties), T(test_topk_against_sort),
         T(test_sign_scale), T(test_error_feedback), T(test_bytes), T(test_tiny_slice_dense),
         T(test_wire_round_trip))
