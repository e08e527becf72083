/* test_rows: the sparse row table (server/core/rows.h) and its per-row
 * optimizers (kernels/row_optim.h), driven call by call: each optimizer
 * against its formula in double over several pushes that touch different
 * rows (a row left out keeps its bits and its step count), reads of absent
 * keys, the seeded init and a replay bit for bit, admission at K - 1 and K
 * sightings and its bound, eviction at T and T + 1 idle versions and slot
 * reuse, growth past many chunks and map doublings with removal, the
 * request bounds (one error line, nothing changed), and the key sharding's
 * balance. */
#include "common/rng.h"
#include "server/core/rows.h"
#include "tests/test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the references, in double ------------------------------------------- */

#define RD 5 /* an awkward width: no vector multiple */

typedef struct {
    double w[RD], a[RD], b[RD]; /* weights; adagrad s / adam m / ftrl z; adam v / ftrl n */
    uint32_t t;                 /* steps */
} ref_row_t;

/* table_t: the table's push count including this one (sparse_adam's t) */
static void ref_step(const dp_row_optim_conf_t *c, ref_row_t *r, const float *g, uint32_t table_t)
{
    r->t++;
    double lr = c->lr;
    for (int i = 0; i < RD; i++) {
        double gi = g[i];
        switch (c->kind) {
        case DP_ROW_SGD: r->w[i] -= lr * gi; break;
        case DP_ROW_ADAGRAD:
            r->a[i] += gi * gi;
            r->w[i] -= lr * gi / (sqrt(r->a[i]) + c->eps);
            break;
        case DP_ROW_ADAM: {
            double b1 = c->beta1, b2 = c->beta2;
            r->a[i] = b1 * r->a[i] + (1 - b1) * gi;
            r->b[i] = b2 * r->b[i] + (1 - b2) * gi * gi;
            double mh = r->a[i] / (1 - pow(b1, r->t)), vh = r->b[i] / (1 - pow(b2, r->t));
            r->w[i] -= lr * mh / (sqrt(vh) + c->eps);
            break;
        }
        case DP_ROW_SPARSE_ADAM: { /* torch.optim.SparseAdam, the table's count */
            double b1 = c->beta1, b2 = c->beta2;
            r->a[i] += (gi - r->a[i]) * (1 - b1);
            r->b[i] += (gi * gi - r->b[i]) * (1 - b2);
            double size = lr * sqrt(1 - pow(b2, table_t)) / (1 - pow(b1, table_t));
            r->w[i] -= size * r->a[i] / (sqrt(r->b[i]) + c->eps);
            break;
        }
        case DP_ROW_FTRL: {
            double alpha = lr, n1 = r->b[i] + gi * gi;
            double sigma = (sqrt(n1) - sqrt(r->b[i])) / alpha;
            r->a[i] += gi - sigma * r->w[i];
            r->b[i] = n1;
            double z = r->a[i];
            r->w[i] = fabs(z) <= c->l1
                          ? 0
                          : -(z - (z > 0 ? 1 : -1) * c->l1) /
                                ((c->ftrl_beta + sqrt(n1)) / alpha + c->l2);
            break;
        }
        }
    }
}

static dp_rows_t *mk(const dp_rows_conf_t *c)
{
    char err[DP_ERR_LEN] = "";
    dp_rows_t *t = dp_rows_new(c, err);
    if (!t) fprintf(stderr, "  dp_rows_new: %s\n", err);
    return t;
}

static long push(dp_rows_t *t, uint64_t v, const uint64_t *keys, size_t n, const float *g)
{
    char err[DP_ERR_LEN] = "";
    long r = dp_rows_push(t, v, keys, n, dp_rows_width(t), g, err);
    if (r < 0) fprintf(stderr, "  push: %s\n", err);
    return r;
}

/* dp_rows_row, with an absent row read as a row of zeros and no steps,
 * so a check after a failed lookup fails instead of crashing. */
static int get_row(const dp_rows_t *t, uint64_t key, dp_rows_view_t *v)
{
    static const float zeros[3 * DP_ROWS_MAX_WIDTH];
    if (dp_rows_row(t, key, v) == 0) return 0;
    v->w = zeros;
    v->state = zeros + DP_ROWS_MAX_WIDTH;
    v->steps = 0;
    v->touched = 0;
    v->slot = UINT32_MAX;
    return -1;
}

static long pull(const dp_rows_t *t, const uint64_t *keys, size_t n, float *out)
{
    char err[DP_ERR_LEN] = "";
    long r = dp_rows_pull(t, keys, n, dp_rows_width(t), out, err);
    if (r < 0) fprintf(stderr, "  pull: %s\n", err);
    return r;
}

/* ---- the optimizers, lazily -------------------------------------------------- */

#define NK 4
static const uint64_t s_keys[NK] = {3, 1ull << 40, 7, UINT64_MAX - 1};

/* Six pushes at versions 1, 2, 4, 5, 7, 8; push p carries key k unless
 * (p + k) % 3 == 0, so every row is left out of some pushes and rows reach
 * different step counts. After each push: the rows pushed match the
 * reference; the others kept their bits, steps and version. */
static void check_optim(dp_rows_conf_t *c)
{
    dp_rows_t *t = mk(c);
    CHECK(t != NULL);
    if (!t) return;
    ref_row_t ref[NK];
    memset(ref, 0, sizeof ref);
    uint64_t touched[NK] = {0};
    dp_rng_t rng;
    dp_rng_seed(&rng, 35);
    static const uint64_t versions[6] = {1, 2, 4, 5, 7, 8};
    for (int p = 0; p < 6; p++) {
        uint64_t keys[NK];
        float g[NK * RD], before[NK][RD];
        int in[NK] = {0}, n = 0;
        for (int k = 0; k < NK; k++) {
            dp_rows_view_t v;
            if (get_row(t, s_keys[k], &v) == 0) memcpy(before[k], v.w, sizeof before[k]);
            if ((p + k) % 3 == 0) continue;
            in[k] = 1;
            keys[n] = s_keys[k];
            for (int i = 0; i < RD; i++) g[n * RD + i] = 2.0f * dp_rng_uniform(&rng) - 1.0f;
            ref_step(&c->optim, &ref[k], g + n * RD, (uint32_t)p + 1);
            touched[k] = versions[p];
            n++;
        }
        CHECK_EQ(push(t, versions[p], keys, (size_t)n, g), n);
        for (int k = 0; k < NK; k++) {
            dp_rows_view_t v;
            if (ref[k].t == 0) {
                CHECK_EQ(get_row(t, s_keys[k], &v), -1);
                continue;
            }
            CHECK_EQ(get_row(t, s_keys[k], &v), 0);
            CHECK_EQ(v.steps, ref[k].t);
            CHECK_EQ(v.touched, touched[k]);
            if (!in[k]) {
                CHECK(memcmp(v.w, before[k], sizeof before[k]) == 0);
                continue;
            }
            float want[RD];
            for (int i = 0; i < RD; i++) want[i] = (float)ref[k].w[i];
            CHECK_CLOSE("w", v.w, want, RD, 1e-6, 1e-5);
        }
    }
    dp_rows_destroy(&t);
    CHECK(t == NULL);
}

static void test_sgd(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, RD, DP_ROW_SGD);
    c.optim.lr = 0.3f;
    check_optim(&c);
}

static void test_adagrad(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, RD, DP_ROW_ADAGRAD);
    c.optim.lr = 0.1f;
    check_optim(&c);
}

static void test_adam(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, RD, DP_ROW_ADAM);
    c.optim.lr = 0.01f;
    check_optim(&c);
}

/* SparseAdam: a row untouched by some pushes still counts them (the
 * reference's t is the push's number, not the row's steps). */
static void test_sparse_adam(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, RD, DP_ROW_SPARSE_ADAM);
    c.optim.lr = 0.01f;
    check_optim(&c);
}

/* FTRL with l1 large enough that some weights sit at exactly 0. */
static void test_ftrl(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, RD, DP_ROW_FTRL);
    c.optim.lr = 0.5f;
    c.optim.l1 = 0.6f;
    c.optim.l2 = 0.25f;
    c.optim.ftrl_beta = 1.0f;
    check_optim(&c);
    /* one row by hand: g = 1 then -3, alpha 0.5, beta 1, l1 0.6, l2 0.25 */
    dp_rows_t *t = mk(&c);
    if (!t) return;
    uint64_t k = 42;
    float g[RD] = {1, 0.5f, -0.25f, 0, 2};
    CHECK_EQ(push(t, 1, &k, 1, g), 1);
    dp_rows_view_t v;
    CHECK_EQ(get_row(t, k, &v), 0);
    /* z = g (w was 0), n = g^2: |z| <= 0.6 -> 0, else -(z - 0.6) / ((1 + |g|) / 0.5 + 0.25) */
    CHECK_NEAR(v.w[0], -(1 - 0.6) / ((1 + 1) / 0.5 + 0.25), 1e-7);
    CHECK(v.w[1] == 0 && v.w[2] == 0 && v.w[3] == 0);
    CHECK_NEAR(v.w[4], -(2 - 0.6) / ((1 + 2) / 0.5 + 0.25), 1e-7);
    dp_rows_destroy(&t);
}

/* ---- reads, init, replay --------------------------------------------------- */

/* Absent keys read as zeros and are not counted; a pull changes nothing. */
static void test_pull_absent(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 3, DP_ROW_SGD);
    c.optim.lr = 1;
    dp_rows_t *t = mk(&c);
    if (!t) return;
    uint64_t k[3] = {10, 11, 12};
    float g[3] = {1, 2, 3}, out[9];
    CHECK_EQ(push(t, 1, k + 1, 1, g), 1);
    uint64_t d0 = dp_rows_digest(t);
    memset(out, 0xff, sizeof out);
    CHECK_EQ(pull(t, k, 3, out), 1);
    float want[9] = {0, 0, 0, -1, -2, -3, 0, 0, 0};
    CHECK_CLOSE("pull", out, want, 9, 0, 0);
    CHECK_EQ(dp_rows_digest(t), d0);
    CHECK_EQ(pull(t, k, 0, out), 0);
    dp_rows_destroy(&t);
}

/* The seeded init: a function of (seed, key), read by a pull before the
 * row exists, the row's start once it does; zero init for ftrl only. */
static void test_init_seeded(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 7, DP_ROW_SGD);
    c.optim.lr = 0.5f;
    c.init = DP_ROWS_INIT_UNIFORM;
    c.init_scale = 0.1f;
    c.seed = 99;
    dp_rows_t *a = mk(&c), *b = mk(&c);
    c.seed = 100;
    dp_rows_t *other = mk(&c);
    if (!a || !b || !other) return;
    uint64_t k[2] = {5, 6};
    float ia[14], ib[14], io[14];
    CHECK_EQ(pull(a, k, 2, ia), 0);
    CHECK_EQ(pull(b, k, 2, ib), 0);
    CHECK_EQ(pull(other, k, 2, io), 0);
    CHECK(memcmp(ia, ib, sizeof ia) == 0);
    CHECK(memcmp(ia, io, sizeof ia) != 0);
    CHECK(memcmp(ia, ia + 7, 7 * sizeof *ia) != 0); /* keys differ */
    int in_range = 1;
    for (int i = 0; i < 14; i++) in_range &= ia[i] >= -0.1f && ia[i] < 0.1f && ia[i] != 0;
    CHECK(in_range);
    float g[7] = {1, -1, 2, -2, 0.5f, 0, 3};
    CHECK_EQ(push(a, 1, k, 1, g), 1);
    dp_rows_view_t v;
    CHECK_EQ(get_row(a, 5, &v), 0);
    float want[7];
    for (int i = 0; i < 7; i++) want[i] = ia[i] - 0.5f * g[i];
    CHECK_CLOSE("seeded start", v.w, want, 7, 0, 0);
    dp_rows_destroy(&a);
    dp_rows_destroy(&b);
    dp_rows_destroy(&other);
    char err[DP_ERR_LEN] = "";
    dp_rows_conf_default(&c, 7, DP_ROW_FTRL);
    c.init = DP_ROWS_INIT_UNIFORM;
    CHECK(dp_rows_new(&c, err) == NULL);
    CHECK(strstr(err, "ftrl rows start at zero") != NULL);
}

/* Two tables given the same calls (admission, eviction, adam, random
 * keys) hold the same bits after every call; one push's gradients off by
 * one ulp show in the digest. */
static void test_replay(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 4, DP_ROW_ADAM);
    c.admit_after = 2;
    c.evict_after = 3;
    c.chunk_rows = 16;
    c.sweep_per_push = 5;
    dp_rows_t *a = mk(&c), *b = mk(&c), *odd = mk(&c);
    if (!a || !b || !odd) return;
    dp_rng_t rng;
    dp_rng_seed(&rng, 7);
    int same = 1;
    for (uint64_t v = 1; v <= 60; v++) {
        uint64_t keys[20];
        float g[80];
        size_t n = 0;
        for (int i = 0; i < 20; i++) {
            uint64_t key = dp_rng_below(&rng, 60);
            int dup = 0;
            for (size_t j = 0; j < n; j++) dup |= keys[j] == key;
            if (!dup) keys[n++] = key;
        }
        for (size_t i = 0; i < n * 4; i++) g[i] = dp_rng_uniform(&rng) - 0.5f;
        CHECK(push(a, v, keys, n, g) >= 0);
        CHECK(push(b, v, keys, n, g) >= 0);
        if (v == 30)
            for (size_t i = 0; i < n * 4; i++) g[i] = nextafterf(g[i], 1.0f);
        CHECK(push(odd, v, keys, n, g) >= 0);
        same &= dp_rows_digest(a) == dp_rows_digest(b);
        if (v == 30) CHECK(dp_rows_digest(a) != dp_rows_digest(odd));
    }
    CHECK(same);
    dp_rows_stats_t st;
    dp_rows_stats(a, &st);
    CHECK(st.evicted > 0 && st.admitted > 0 && st.pending_expired > 0); /* all paths ran */
    dp_rows_destroy(&a);
    dp_rows_destroy(&b);
    dp_rows_destroy(&odd);
}

/* ---- save and load ------------------------------------------------------- */

/* One version's random push of up to 20 of 60 keys (width 4), as
 * test_replay's. */
static void random_push(dp_rng_t *rng, dp_rows_t *const *t, int nt, uint64_t v)
{
    uint64_t keys[20];
    float g[80];
    size_t n = 0;
    for (int i = 0; i < 20; i++) {
        uint64_t key = dp_rng_below(rng, 60);
        int dup = 0;
        for (size_t j = 0; j < n; j++) dup |= keys[j] == key;
        if (!dup) keys[n++] = key;
    }
    for (size_t i = 0; i < n * 4; i++) g[i] = dp_rng_uniform(rng) - 0.5f;
    for (int k = 0; k < nt; k++) CHECK(push(t[k], v, keys, n, g) >= 0);
}

#define SAVED_HEADER 160 /* the saved bytes before the slots (checked below) */
#define SLOT_BYTES(stride) (24 + 4 * (stride))

/* A table mid-run (admission, eviction, free slots, pending keys) saved
 * and loaded into a fresh one has its digest, and the two stay equal
 * through 30 more versions of pushes; an empty table too. */
static void test_save_load(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 4, DP_ROW_ADAM);
    c.admit_after = 2;
    c.evict_after = 3;
    c.chunk_rows = 16;
    c.sweep_per_push = 5;
    dp_rows_t *a = mk(&c), *b = mk(&c);
    if (!a || !b) return;
    size_t len;
    uint8_t *buf = dp_rows_save(a, &len);
    CHECK_EQ(len, SAVED_HEADER + 16 * 20); /* empty: the header and the 16-entry pending map */
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_rows_load(b, buf, len, err), 0);
    CHECK_EQ(dp_rows_digest(b), dp_rows_digest(a));
    free(buf);
    dp_rng_t rng;
    dp_rng_seed(&rng, 7);
    for (uint64_t v = 1; v <= 30; v++) random_push(&rng, &a, 1, v);
    dp_rows_stats_t st;
    dp_rows_stats(a, &st);
    CHECK(st.evicted > 0 && st.pending > 0); /* free slots and pending keys to carry */
    buf = dp_rows_save(a, &len);
    CHECK_EQ(dp_rows_load(b, buf, len, err), 0);
    CHECK_EQ(dp_rows_digest(b), dp_rows_digest(a));
    dp_rows_stats_t sb;
    dp_rows_stats(b, &sb);
    CHECK_EQ(sb.rows, st.rows);
    CHECK_EQ(sb.bytes, st.bytes); /* the same arena and map sizes */
    CHECK_EQ(sb.evicted, st.evicted);
    int same = 1;
    dp_rows_t *both[2] = {a, b};
    for (uint64_t v = 31; v <= 60; v++) {
        random_push(&rng, both, 2, v);
        same &= dp_rows_digest(a) == dp_rows_digest(b);
    }
    CHECK(same);
    free(buf);
    dp_rows_destroy(&a);
    dp_rows_destroy(&b);
}

/* Saved bytes that lie: each refused with one line, the table unchanged. */
static void test_load_bad(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 2, DP_ROW_ADAGRAD);
    c.evict_after = 2;
    dp_rows_t *a = mk(&c), *t = mk(&c);
    if (!a || !t) return;
    uint64_t keys[3] = {5, 6, 7};
    float g[6] = {1, 2, 3, 4, 5, 6};
    CHECK_EQ(push(a, 1, keys, 3, g), 3);
    CHECK_EQ(push(a, 5, keys, 2, g), 2); /* 7 evicted: slot 2 free, slots 0 and 1 live */
    size_t len, stride = 2 * 2, slot = SLOT_BYTES(stride);
    uint8_t *good = dp_rows_save(a, &len), *buf = dp_malloc(len);
    CHECK_EQ(push(t, 1, keys + 2, 1, g), 1);
    uint64_t before = dp_rows_digest(t);
    struct {
        const char *what, *want;
        size_t at;       /* byte offset to overwrite (SIZE_MAX: truncate by one) */
        uint64_t value;
        int bytes;
    } cases[] = {
        {"truncated", "bytes", SIZE_MAX, 0, 0},
        {"magic", "not a saved row table", 0, 0x5858585858585858ull, 8},
        {"width", "width 3", 8, 3, 4},
        {"optimizer", "sgd rows", 12, DP_ROW_SGD, 4},
        {"hwm", "counts", 20, 1000, 4},
        {"a key twice", "key 5 twice", SAVED_HEADER + slot, 5, 8},
        {"a free link out of range", "links to", SAVED_HEADER + 2 * slot + 20, 99, 4},
        {"a free list cycle", "free list is broken", SAVED_HEADER + 2 * slot + 20, 2, 4},
        {"a free list into a live slot", "free list is broken", SAVED_HEADER + 2 * slot + 20, 0, 4},
        {"a value not finite", "not finite", SAVED_HEADER + 24, 0x7fc00000u, 4},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(buf, good, len);
        size_t n = len;
        if (cases[k].at == SIZE_MAX) n--;
        else memcpy(buf + cases[k].at, &cases[k].value, (size_t)cases[k].bytes);
        char err[DP_ERR_LEN] = "";
        CHECK_EQ(dp_rows_load(t, buf, n, err), -1);
        if (!strstr(err, cases[k].want) || strchr(err, '\n'))
            printf("  %s: '%s' (want '%s')\n", cases[k].what, err, cases[k].want);
        CHECK(strstr(err, cases[k].want) != NULL);
        CHECK_EQ(dp_rows_digest(t), before);
    }
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_rows_load(t, good, len, err), 0); /* the bytes themselves load */
    CHECK_EQ(dp_rows_digest(t), dp_rows_digest(a));
    free(good);
    free(buf);
    dp_rows_destroy(&a);
    dp_rows_destroy(&t);
}

/* ---- admission ---------------------------------------------------------- */

/* K = 3: two pushes leave the key pending (no row, reads zeros, gradient
 * dropped); the third makes the row and applies that push's gradient. */
static void test_admission(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 2, DP_ROW_SGD);
    c.optim.lr = 1;
    c.admit_after = 3;
    dp_rows_t *t = mk(&c);
    if (!t) return;
    uint64_t k = 77;
    float g1[2] = {1, 1}, g3[2] = {4, -8}, out[2];
    dp_rows_view_t v;
    for (uint64_t s = 1; s <= 2; s++) { /* K - 1 sightings */
        CHECK_EQ(push(t, s, &k, 1, g1), 0);
        CHECK_EQ(dp_rows_pending(t, k), s);
        CHECK_EQ(get_row(t, k, &v), -1);
        CHECK_EQ(pull(t, &k, 1, out), 0);
        CHECK(out[0] == 0 && out[1] == 0);
    }
    CHECK_EQ(push(t, 3, &k, 1, g3), 1); /* the K-th */
    CHECK_EQ(dp_rows_pending(t, k), 0);
    CHECK_EQ(get_row(t, k, &v), 0);
    CHECK_EQ(v.steps, 1);
    CHECK(v.w[0] == -4 && v.w[1] == 8);
    CHECK_EQ(pull(t, &k, 1, out), 1);
    dp_rows_stats_t st;
    dp_rows_stats(t, &st);
    CHECK_EQ(st.admitted, 1);
    CHECK_EQ(st.created, 1);
    CHECK_EQ(st.pending, 0);
    dp_rows_destroy(&t);
    /* K = 0 and 1: the first push makes the row */
    for (uint32_t kk = 0; kk <= 1; kk++) {
        c.admit_after = kk;
        t = mk(&c);
        if (!t) return;
        CHECK_EQ(push(t, 1, &k, 1, g1), 1);
        CHECK_EQ(get_row(t, k, &v), 0);
        dp_rows_stats(t, &st);
        CHECK_EQ(st.admitted, 0);
        dp_rows_destroy(&t);
    }
}

/* The pending table's bound: a new key's sighting while admit_max keys
 * are pending is not recorded and counted; expiry makes room. */
static void test_admission_bound(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 1, DP_ROW_SGD);
    c.admit_after = 2;
    c.admit_max = 4;
    c.evict_after = 2;
    dp_rows_t *t = mk(&c);
    if (!t) return;
    uint64_t keys[5] = {1, 2, 3, 4, 5};
    float g[5] = {1, 1, 1, 1, 1};
    CHECK_EQ(push(t, 1, keys, 5, g), 0);
    dp_rows_stats_t st;
    dp_rows_stats(t, &st);
    CHECK_EQ(st.pending, 4);
    CHECK_EQ(st.dropped_pending_full, 1);
    CHECK_EQ(dp_rows_pending(t, 5), 0);
    CHECK_EQ(push(t, 2, keys + 4, 1, g), 0); /* still full: still not counted */
    CHECK_EQ(dp_rows_pending(t, 5), 0);
    CHECK_EQ(push(t, 2, keys, 1, g), 1);     /* a pending key is admitted: room for one */
    CHECK_EQ(push(t, 2, keys + 4, 1, g), 0);
    CHECK_EQ(dp_rows_pending(t, 5), 1);
    dp_rows_stats(t, &st);
    CHECK_EQ(st.dropped_pending_full, 2);
    /* keys 2, 3, 4 last seen at 1: idle 2 at version 3 (kept), 3 at 4 (gone) */
    dp_rows_sweep(t, 3, 100);
    dp_rows_stats(t, &st);
    CHECK_EQ(st.pending, 4);
    dp_rows_sweep(t, 4, 100);
    dp_rows_stats(t, &st);
    CHECK_EQ(st.pending, 1);
    CHECK_EQ(st.pending_expired, 3);
    CHECK_EQ(dp_rows_pending(t, 5), 1);
    dp_rows_destroy(&t);
}

/* ---- eviction ------------------------------------------------------------- */

/* T = 3: a row last pushed at u stays at version u + 3 and goes at u + 4;
 * its slot is the next new row's; an evicted key comes back from zero. */
static void test_eviction(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 2, DP_ROW_ADAGRAD);
    c.evict_after = 3;
    dp_rows_t *t = mk(&c);
    if (!t) return;
    uint64_t a = 100, b = 200, n = 300;
    float g[2] = {1, -1}, out[2];
    CHECK_EQ(push(t, 1, &a, 1, g), 1);
    CHECK_EQ(push(t, 2, &b, 1, g), 1);
    CHECK_EQ(push(t, 2, &a, 1, g), 1); /* a: 2 steps, last at 2 */
    CHECK_EQ(push(t, 3, &b, 1, g), 1); /* b: last at 3 */
    dp_rows_view_t va, vb;
    CHECK_EQ(get_row(t, a, &va), 0);
    uint32_t slot_a = va.slot;
    CHECK_EQ(dp_rows_sweep(t, 5, 100), 0); /* a idle exactly T */
    CHECK_EQ(get_row(t, a, &va), 0);
    CHECK_EQ(dp_rows_sweep(t, 6, 100), 1); /* a idle T + 1, b exactly T */
    CHECK_EQ(get_row(t, a, &va), -1);
    CHECK_EQ(get_row(t, b, &vb), 0);
    CHECK_EQ(pull(t, &a, 1, out), 0);
    CHECK(out[0] == 0 && out[1] == 0);
    dp_rows_stats_t st;
    dp_rows_stats(t, &st);
    CHECK_EQ(st.evicted, 1);
    CHECK_EQ(st.rows, 1);
    CHECK_EQ(push(t, 6, &n, 1, g), 1); /* reuses a's slot, fresh */
    dp_rows_view_t vn;
    CHECK_EQ(get_row(t, n, &vn), 0);
    CHECK_EQ(vn.slot, slot_a);
    CHECK_EQ(vn.steps, 1);
    CHECK(vn.state[0] == 1 && vn.state[1] == 1); /* adagrad's s = g^2 of one step */
    CHECK_EQ(push(t, 7, &a, 1, g), 1); /* a again: a new row from zero */
    CHECK_EQ(get_row(t, a, &va), 0);
    CHECK_EQ(va.steps, 1);
    CHECK_EQ(get_row(t, b, &vb), -1); /* idle 4 at 7: the push's own sweep took it */
    /* a bounded sweep: one slot a call (b's free slot among the three) */
    CHECK_EQ(dp_rows_sweep(t, 100, 1) + dp_rows_sweep(t, 100, 1) + dp_rows_sweep(t, 100, 1), 2);
    dp_rows_stats(t, &st);
    CHECK_EQ(st.rows, 0);
    CHECK_EQ(st.evicted, 4);
    dp_rows_destroy(&t);
}

/* ---- growth --------------------------------------------------------------------- */

static uint64_t growth_key(uint32_t i)
{
    /* runs of sequential keys, strided keys and keys in the high bits */
    switch (i % 3) {
    case 0: return i;
    case 1: return (uint64_t)i << 20;
    default: return ((uint64_t)i << 40) | 1;
    }
}

/* 150 000 rows in chunks of 1024 (147 chunks, the map doubled 14 times):
 * every key's row found with its own value; then half evicted (removal
 * under load), the rest still found, the freed slots reused by new keys
 * without growing the arena. */
static void test_growth(void)
{
    enum { N = 150000, B = 4096 };
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 3, DP_ROW_SGD);
    c.optim.lr = 1;
    c.chunk_rows = 1024;
    c.evict_after = 1;
    dp_rows_t *t = mk(&c);
    if (!t) return;
    static uint64_t keys[B];
    static float g[B * 3], out[B * 3];
    for (uint32_t s = 0; s < N; s += B) {
        size_t n = N - s < B ? N - s : B;
        for (size_t i = 0; i < n; i++) {
            keys[i] = growth_key(s + (uint32_t)i);
            for (int j = 0; j < 3; j++) g[i * 3 + j] = (float)(s + i) + 0.25f * (float)j;
        }
        CHECK_EQ(push(t, 1, keys, n, g), (long)n);
    }
    dp_rows_stats_t st;
    dp_rows_stats(t, &st);
    CHECK_EQ(st.rows, N);
    int found = 1;
    for (uint32_t i = 0; i < N; i++) {
        dp_rows_view_t v;
        found &= get_row(t, growth_key(i), &v) == 0 && v.w[0] == -(float)i &&
                 v.w[2] == -((float)i + 0.5f);
    }
    CHECK(found);
    /* the odd ones pushed at version 2, the even ones swept out at 3 */
    for (uint32_t s = 1, n = 0; s < N; s += 2) {
        keys[n] = growth_key(s);
        g[n * 3] = g[n * 3 + 1] = g[n * 3 + 2] = 1;
        if (++n == B || s + 2 >= N) {
            CHECK_EQ(push(t, 2, keys, n, g), (long)n);
            n = 0;
        }
    }
    dp_rows_sweep(t, 3, N);
    dp_rows_stats(t, &st);
    CHECK_EQ(st.rows, N / 2);
    CHECK_EQ(st.evicted, N / 2);
    found = 1;
    for (uint32_t i = 0; i < N; i++) {
        dp_rows_view_t v;
        int has = get_row(t, growth_key(i), &v) == 0;
        found &= (i % 2) ? has && v.w[0] == -(float)i - 1 && v.steps == 2 : !has;
    }
    CHECK(found);
    uint64_t bytes = st.bytes;
    for (uint32_t s = 0; s < N / 2; s += B) { /* new keys fill the freed slots */
        size_t n = N / 2 - s < B ? N / 2 - s : B;
        for (size_t i = 0; i < n; i++) keys[i] = (1ull << 63) + s + i;
        CHECK_EQ(push(t, 3, keys, n, g), (long)n);
    }
    dp_rows_stats(t, &st);
    CHECK_EQ(st.rows, N);
    CHECK_EQ(st.bytes, bytes);
    CHECK_EQ(pull(t, keys, B, out), B);
    dp_rows_destroy(&t);
}

/* max_rows: new keys past it get no row (counted); with admission the key
 * stays pending at K - 1 and is admitted once there is room. */
static void test_max_rows(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 1, DP_ROW_SGD);
    c.max_rows = 3;
    c.evict_after = 1;
    dp_rows_t *t = mk(&c);
    if (!t) return;
    uint64_t keys[5] = {1, 2, 3, 4, 5};
    float g[5] = {1, 1, 1, 1, 1}, out[5];
    CHECK_EQ(push(t, 1, keys, 5, g), 3);
    dp_rows_stats_t st;
    dp_rows_stats(t, &st);
    CHECK_EQ(st.rows, 3);
    CHECK_EQ(st.dropped_full, 2);
    CHECK_EQ(pull(t, keys, 5, out), 3);
    dp_rows_destroy(&t);
    c.admit_after = 2;
    t = mk(&c);
    if (!t) return;
    CHECK_EQ(push(t, 1, keys, 4, g), 0);
    CHECK_EQ(push(t, 1, keys, 4, g), 3); /* key 4 reaches K with no room */
    CHECK_EQ(dp_rows_pending(t, 4), 1);
    CHECK_EQ(push(t, 2, keys + 3, 1, g), 0); /* still no room; seen at 2 */
    dp_rows_sweep(t, 3, 10);             /* keys 1..3 idle 2 > T: gone; 4 idle 1 stays */
    CHECK_EQ(dp_rows_pending(t, 4), 1);
    CHECK_EQ(push(t, 3, keys + 3, 1, g), 1);
    dp_rows_stats(t, &st);
    CHECK_EQ(st.admitted, 4);
    CHECK_EQ(st.dropped_full, 2);
    dp_rows_destroy(&t);
}

/* ---- bad input ------------------------------------------------------------- */

/* Each bad push: -1, one line naming what is wrong, the table unchanged
 * bit for bit (digest) and only `rejected` counted. The bad row is last,
 * after new keys, pending keys and live rows that a partial apply would
 * have touched. */
static void test_bad_push(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 2, DP_ROW_ADAM);
    c.max_keys = 8;
    c.admit_after = 2;
    c.evict_after = 5;
    dp_rows_t *t = mk(&c);
    if (!t) return;
    uint64_t keys[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float g[18];
    for (int i = 0; i < 18; i++) g[i] = 0.1f * (float)(i + 1);
    CHECK_EQ(push(t, 3, keys, 2, g), 0);
    CHECK_EQ(push(t, 4, keys, 3, g), 2); /* keys 1, 2 rows; 3 pending */
    dp_rows_stats_t st0, st;
    dp_rows_stats(t, &st0);
    uint64_t d0 = dp_rows_digest(t);
    char err[DP_ERR_LEN];
    struct {
        uint64_t version;
        size_t n;
        int d;
        int bad;          /* g[bad] is made non-finite, -1: none */
        float value;
        uint64_t dup_key; /* keys[n - 1] set to it, 0: none */
        const char *want;
    } cases[] = {
        {5, 9, 2, -1, 0, 0, "push of 9 keys: at most 8 a request"},
        {5, 4, 3, -1, 0, 0, "push of rows of width 3: this table's rows have 2 floats"},
        {5, 4, 2, 7, NAN, 0, "the gradient of key 4 (row 3) holds nan at 1: nothing applied"},
        {5, 4, 2, 6, INFINITY, 0, "the gradient of key 4 (row 3) holds inf at 0"},
        {5, 4, 2, 0, -INFINITY, 0, "the gradient of key 1 (row 0) holds -inf at 0"},
        {5, 4, 2, -1, 0, 2, "key 2 appears twice: nothing applied"},
        {3, 4, 2, -1, 0, 0, "push at version 3: the row table is at version 4"},
        {UINT64_MAX, 4, 2, -1, 0, 0, "push at version 18446744073709551615"},
    };
    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n_cases; i++) {
        float gg[18];
        uint64_t kk[9];
        memcpy(gg, g, sizeof gg);
        memcpy(kk, keys, sizeof kk);
        if (cases[i].bad >= 0) gg[cases[i].bad] = cases[i].value;
        if (cases[i].dup_key) kk[cases[i].n - 1] = cases[i].dup_key;
        err[0] = 0;
        CHECK_EQ(dp_rows_push(t, cases[i].version, kk, cases[i].n, cases[i].d, gg, err), -1);
        if (!strstr(err, cases[i].want)) fprintf(stderr, "  case %d: \"%s\"\n", i, err);
        CHECK(strstr(err, cases[i].want) != NULL);
        CHECK(strchr(err, '\n') == NULL);
        CHECK_EQ(dp_rows_digest(t), d0);
        dp_rows_stats(t, &st);
        CHECK_EQ(st.rejected, (uint64_t)i + 1);
        st.rejected = st0.rejected;
        CHECK(memcmp(&st, &st0, sizeof st) == 0);
    }
    /* a pull's bounds: an error, nothing written */
    float out[18];
    memset(out, 0x5a, sizeof out);
    CHECK_EQ(dp_rows_pull(t, keys, 9, 2, out, err), -1);
    CHECK(strstr(err, "pull of 9 keys: at most 8 a request") != NULL);
    CHECK_EQ(dp_rows_pull(t, keys, 2, 1, out, err), -1);
    CHECK(strstr(err, "pull of rows of width 1: this table's rows have 2 floats") != NULL);
    int untouched = 1;
    for (size_t i = 0; i < sizeof out; i++) untouched &= ((unsigned char *)out)[i] == 0x5a;
    CHECK(untouched);
    /* and the table still takes a good push */
    CHECK_EQ(push(t, 5, keys, 4, g), 3);
    dp_rows_destroy(&t);
}

/* A bad configuration: NULL and a line naming the field and its bound. */
static void bad_conf_set(dp_rows_conf_t *c, int i)
{
    switch (i) {
    case 0: c->width = 0; break;
    case 1: c->width = 4097; break;
    case 2: c->optim.lr = 0; break;
    case 3: c->optim.beta2 = 1; break;
    case 4: c->optim.l1 = -1; break;
    case 5: c->chunk_rows = 1000; break;
    case 6: c->max_keys = DP_ROWS_MAX_KEYS + 1; break;
    case 7: c->admit_after = DP_ROWS_MAX_ADMIT + 1; break;
    case 8: c->admit_max = DP_ROWS_MAX_PENDING + 1; break;
    case 9: c->max_rows = DP_ROWS_MAX_ROWS + 1; break;
    default: c->init = DP_ROWS_INIT_UNIFORM; c->init_scale = NAN; break;
    }
}

static void test_bad_conf(void)
{
    static const char *const want[] = {
        "row table width 0: 1 .. 4096",
        "row table width 4097: 1 .. 4096",
        "row optimizer lr 0: a finite number > 0",
        "each in [0, 1)",
        "ftrl l1 -1, l2 0",
        "row table chunk of 1000 rows: a power of two",
        "row table max keys 1048577: at most 1048576",
        "admission after 1000001 sightings",
        "admission table of 67108865 keys",
        "row table max rows 2147483649",
        "init scale nan",
    };
    for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
        dp_rows_conf_t c;
        char err[DP_ERR_LEN] = "";
        dp_rows_conf_default(&c, 4, DP_ROW_ADAM);
        bad_conf_set(&c, i);
        CHECK(dp_rows_new(&c, err) == NULL);
        if (!strstr(err, want[i])) fprintf(stderr, "  case %d: \"%s\"\n", i, err);
        CHECK(strstr(err, want[i]) != NULL);
    }
    dp_row_optim_kind_t k;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_row_optim_parse_kind("ftrl", &k, err), 0);
    CHECK_EQ(k, DP_ROW_FTRL);
    CHECK_EQ(dp_row_optim_parse_kind("lamb", &k, err), -1);
    CHECK(strstr(err, "row optimizer 'lamb': sgd, adagrad, adam, sparse_adam or ftrl") != NULL);
}

/* ---- sharding ----------------------------------------------------------------- */

/* Every shard's share within 3 % of n / K. */
static int balanced(const uint64_t *keys, size_t n, uint32_t k, const char *what)
{
    size_t count[8] = {0};
    for (size_t i = 0; i < n; i++) count[dp_rows_shard_of(keys[i], k)]++;
    double fair = (double)n / k;
    int ok = 1;
    for (uint32_t s = 0; s < k; s++)
        if (fabs((double)count[s] - fair) > 0.03 * fair) {
            fprintf(stderr, "  %s, K = %u: shard %u holds %zu of %zu\n", what, k, s, count[s], n);
            ok = 0;
        }
    return ok;
}

/* Sequential, strided and high-bit keys, and the distinct keys of 400 000
 * Zipf(1.05) draws over 2^20 ids (small ids far more often), spread over
 * K = 2, 3, 8 within 3 %; the keys of one shard still fill the key map's
 * low bits evenly (the map and the sharding use different hash bits). */
static void test_shard_balance(void)
{
    enum { N = 200000, M = 1 << 20, DRAWS = 400000 };
    uint64_t *keys = dp_malloc(N * sizeof *keys);
    static const uint32_t ks[3] = {2, 3, 8};
    for (int pattern = 0; pattern < 3; pattern++) {
        for (size_t i = 0; i < N; i++)
            keys[i] = pattern == 0 ? i : pattern == 1 ? i * 4096 : (uint64_t)i << 44;
        for (int j = 0; j < 3; j++)
            CHECK(balanced(keys, N, ks[j], pattern == 0 ? "sequential" : pattern == 1 ? "strided"
                                                                                      : "high bits"));
    }
    /* Zipf draws by the inverse of the CDF */
    double *cdf = dp_malloc(M * sizeof *cdf), sum = 0;
    for (size_t r = 0; r < M; r++) cdf[r] = (sum += pow((double)(r + 1), -1.05));
    unsigned char *seen = dp_calloc(M, 1);
    dp_rng_t rng;
    dp_rng_seed(&rng, 35);
    size_t n = 0;
    for (int d = 0; d < DRAWS; d++) {
        double u = (double)(dp_rng_next(&rng) >> 11) * 0x1p-53 * sum;
        size_t lo = 0, hi = M - 1;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (cdf[mid] < u) lo = mid + 1;
            else hi = mid;
        }
        if (!seen[lo]) {
            seen[lo] = 1;
            keys[n++] = lo;
        }
    }
    CHECK(n > 50000); /* enough distinct keys to measure */
    for (int j = 0; j < 3; j++) CHECK(balanced(keys, n, ks[j], "zipf"));
    /* shard 0 of 2's sequential keys over 16 map buckets of the low bits */
    size_t bucket[16] = {0}, m0 = 0;
    for (uint64_t key = 0; key < N; key++)
        if (dp_rows_shard_of(key, 2) == 0) {
            bucket[dp_rows_hash(key) & 15]++;
            m0++;
        }
    int even = 1;
    for (int b = 0; b < 16; b++) even &= fabs((double)bucket[b] - m0 / 16.0) < 0.05 * (m0 / 16.0);
    CHECK(even);
    CHECK_EQ(dp_rows_shard_of(12345, 1), 0);
    free(cdf);
    free(seen);
    free(keys);
}

/* The table in key order, page by page (a model file's rows): every row
 * once, ascending, whatever the slots' order, evicted and pending keys
 * not listed; then put back into a fresh table, which pulls the same
 * rows, and put's refusals. */
static void test_keys_from_put(void)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 4, DP_ROW_ADAGRAD);
    c.admit_after = 2;
    c.evict_after = 3;
    c.chunk_rows = 16;
    c.sweep_per_push = 5;
    dp_rows_t *a = mk(&c);
    if (!a) return;
    dp_rng_t rng;
    dp_rng_seed(&rng, 11);
    for (uint64_t v = 1; v <= 30; v++) random_push(&rng, &a, 1, v);
    dp_rows_stats_t st;
    dp_rows_stats(a, &st);
    CHECK(st.evicted > 0 && st.pending > 0 && st.rows > 7);
    uint64_t all[64], page[7];
    size_t n = 0, got;
    uint64_t from = 0;
    do { /* pages of 7 */
        got = dp_rows_keys_from(a, from, 7, page);
        for (size_t i = 0; i < got && n < 64; i++) all[n++] = page[i];
        if (got) from = page[got - 1] + 1;
    } while (got == 7);
    CHECK_EQ(n, st.rows);
    int ascending = 1, held = 1;
    dp_rows_view_t v;
    for (size_t i = 0; i < n; i++) {
        if (i) ascending &= all[i] > all[i - 1];
        held &= dp_rows_row(a, all[i], &v) == 0;
    }
    CHECK(ascending);
    CHECK(held);
    CHECK_EQ(dp_rows_keys_from(a, UINT64_MAX, 7, page), 0);
    CHECK_EQ(dp_rows_keys_from(a, 0, 0, page), 0);
    /* put back: the same rows read, absent keys as before */
    float w[64 * 4], w2[64 * 4];
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_rows_pull(a, all, n, 4, w, err), (long)n);
    dp_rows_conf_t cb;
    dp_rows_conf_default(&cb, 4, DP_ROW_ADAGRAD);
    dp_rows_t *b = mk(&cb);
    if (!b) return;
    CHECK_EQ(dp_rows_put(b, all, n, 4, w, err), 0);
    CHECK_EQ(dp_rows_pull(b, all, n, 4, w2, err), (long)n);
    CHECK(memcmp(w, w2, n * 4 * sizeof(float)) == 0);
    dp_rows_stats_t sb;
    dp_rows_stats(b, &sb);
    CHECK_EQ(sb.rows, n);
    /* refusals, nothing changed */
    CHECK_EQ(dp_rows_put(b, all, 1, 3, w, err), -1);
    CHECK(strstr(err, "width 3") != NULL);
    float bad[4] = {0, 1, NAN, 2};
    uint64_t k = 999;
    CHECK_EQ(dp_rows_put(b, &k, 1, 4, bad, err), -1);
    CHECK(strstr(err, "not finite") != NULL);
    CHECK_EQ(dp_rows_row(b, 999, &v), -1);
    dp_rows_conf_t cc;
    dp_rows_conf_default(&cc, 4, DP_ROW_SGD);
    cc.max_rows = 2;
    dp_rows_t *small = mk(&cc);
    if (small) {
        CHECK_EQ(dp_rows_put(small, all, 3, 4, w, err), -1);
        CHECK(strstr(err, "at most 2") != NULL);
        dp_rows_stats(small, &sb);
        CHECK_EQ(sb.rows, 0);
    }
    dp_rows_destroy(&small);
    dp_rows_destroy(&a);
    dp_rows_destroy(&b);
}

DP_TESTS(T(test_sgd), T(test_adagrad), T(test_adam), T(test_sparse_adam), T(test_ftrl), T(test_pull_absent),
         T(test_save_load), T(test_load_bad), T(test_keys_from_put),
         T(test_init_seeded), T(test_replay), T(test_admission), T(test_admission_bound),
         T(test_eviction), T(test_growth), T(test_max_rows), T(test_bad_push), T(test_bad_conf),
         T(test_shard_balance))
