/* test_embed: the embedding stage (kernels/embed.h) —
 *  - the plan: distinct keys in order of first occurrence, each feature's
 *    slot and the occurrence lists, against the reference's linear search,
 *    on awkward batches (empty samples, an empty batch, one key everywhere,
 *    keys 0 and 2^64 - 1) and across many plans (the map's stamps);
 *  - forward and backward against the references, bit for bit, at D = 1, 3,
 *    17, 64, on one thread and on a team;
 *  - the backward against finite differences of a loss over the forward;
 *  - both against PyTorch's nn.EmbeddingBag(mode='sum', sparse=True) with
 *    per_sample_weights (tests/torch_embed.py, run with $TORCH_PY, default
 *    Debian's /usr/bin/python3; skipped when torch is not importable). */
#include <stdint.h>
#include <unistd.h>

#include "common/libsvm.h"
#include "common/rng.h"
#include "kernels/dropout_mask.h"
#include "kernels/embed.h"
#include "kernels/ops.h"
#include "tests/test.h"

/* A batch of B samples, sample s holding nnz[s] features whose keys are
 * drawn from pool[0..P) (a sample may repeat one, as the stage allows
 * though the reader does not) and whose values are in [-1, 1). */
static dp_libsvm_batch_t *s_batch(int B, const int *nnz, const uint64_t *pool, int P, uint64_t seed)
{
    size_t total = 0;
    for (int s = 0; s < B; s++) total += (size_t)nnz[s];
    dp_libsvm_batch_t *b = dp_libsvm_batch_new((size_t)B > 0 ? (size_t)B : 1, total > 0 ? total : 1);
    dp_rng_t r;
    dp_rng_seed(&r, seed);
    b->n = (size_t)B;
    b->offsets[0] = 0;
    for (int s = 0; s < B; s++) {
        size_t at = b->offsets[s];
        for (int j = 0; j < nnz[s]; j++) {
            b->keys[at + j] = pool[dp_rng_next(&r) % (uint64_t)P];
            b->values[at + j] = 2 * dp_rng_uniform(&r) - 1;
        }
        b->offsets[s + 1] = at + (size_t)nnz[s];
        b->labels[s] = (float)(s & 1);
    }
    return b;
}

static void s_fill(float *x, size_t n, uint64_t seed)
{
    dp_rng_t r;
    dp_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = 2 * dp_rng_uniform(&r) - 1;
}

/* The plan of b against the reference's: the same keys in the same order,
 * the same slots, and occurrence lists that list each feature once under
 * its key, ascending. */
static void s_check_plan(dp_embed_t *e, const dp_libsvm_batch_t *b)
{
    size_t nnz = b->offsets[b->n];
    uint64_t *uk = dp_malloc((nnz + 1) * sizeof *uk);
    uint32_t *slot = dp_malloc((nnz + 1) * sizeof *slot);
    size_t U = dp_embed_unique_ref(uk, slot, b->keys, nnz);
    CHECK_EQ(dp_embed_plan(e, b), U);
    CHECK_EQ(e->n_keys, U);
    CHECK(U == 0 || memcmp(e->keys, uk, U * sizeof *uk) == 0);
    CHECK(nnz == 0 || memcmp(e->slot, slot, nnz * sizeof *slot) == 0);
    int lists_ok = e->occ_start[0] == 0 && e->occ_start[U] == nnz;
    for (size_t u = 0; u < U && lists_ok; u++)
        for (uint32_t k = e->occ_start[u]; k < e->occ_start[u + 1]; k++) {
            uint32_t j = e->occ[k];
            if (e->slot[j] != u || (k > e->occ_start[u] && e->occ[k - 1] >= j)) lists_ok = 0;
            if (j < b->offsets[e->occ_sample[j]] || j >= b->offsets[e->occ_sample[j] + 1]) lists_ok = 0;
        }
    CHECK(lists_ok);
    free(uk);
    free(slot);
}

static void test_plan_awkward(void)
{
    char err[DP_ERR_LEN] = "";
    dp_embed_t e;
    CHECK_EQ(dp_embed_init(&e, 3, 64, err), 0);
    uint64_t edge[3] = {UINT64_MAX, 0, 1ULL << 63};
    int empty[4] = {0, 0, 0, 0};
    dp_libsvm_batch_t *b = s_batch(4, empty, edge, 3, 1); /* every sample empty */
    s_check_plan(&e, b);
    CHECK_EQ(e.n_keys, 0);
    dp_libsvm_batch_destroy(&b);
    b = s_batch(0, empty, edge, 3, 1); /* no sample at all */
    s_check_plan(&e, b);
    dp_libsvm_batch_destroy(&b);
    int one[5] = {4, 0, 7, 0, 1};
    uint64_t same = 42;
    b = s_batch(5, one, &same, 1, 2); /* one key, 12 times */
    s_check_plan(&e, b);
    CHECK_EQ(e.n_keys, 1);
    CHECK_EQ(e.occ_start[1], 12);
    dp_libsvm_batch_destroy(&b);
    int mixed[6] = {3, 0, 5, 1, 0, 9};
    b = s_batch(6, mixed, edge, 3, 3); /* the extreme keys, repeated */
    s_check_plan(&e, b);
    CHECK(e.n_keys >= 2 && e.n_keys <= 3);
    CHECK_EQ(e.keys[0], b->keys[0]);
    dp_libsvm_batch_destroy(&b);
    /* many plans in a row, each against the reference: an entry of an
     * earlier plan must never be taken for one of this plan's */
    uint64_t pool[40];
    for (int i = 0; i < 40; i++) pool[i] = (uint64_t)i * 0x100000001ULL;
    int ok_before = t_failures;
    for (int p = 0; p < 300; p++) {
        int nz[8];
        for (int s = 0; s < 8; s++) nz[s] = (p * 7 + s * 3) % 9;
        b = s_batch(8, nz, pool, 5 + p % 36, (uint64_t)p);
        s_check_plan(&e, b);
        dp_libsvm_batch_destroy(&b);
    }
    CHECK_EQ(t_failures, ok_before);
    /* the stamps wrapping clear the map: still the reference's plan */
    e.stamp = UINT32_MAX;
    b = s_batch(6, mixed, edge, 3, 3);
    s_check_plan(&e, b);
    CHECK_EQ(e.stamp, 1);
    dp_libsvm_batch_destroy(&b);
    dp_embed_fini(&e);
    dp_embed_fini(&e); /* safe twice */
    CHECK_EQ(dp_embed_init(&e, 0, 64, err), -1);
    CHECK(strstr(err, "width 0") != NULL);
    CHECK_EQ(dp_embed_init(&e, DP_EMBED_MAX_DIM + 1, 64, err), -1);
    CHECK_EQ(dp_embed_init(&e, 4, 0, err), -1);
}

/* One shape: forward and backward of the fast stage against the
 * references, exactly (the same sums in the same order). */
static void s_vs_ref(int B, const int *nnz, int P, int D, uint64_t seed)
{
    char err[DP_ERR_LEN] = "";
    uint64_t pool[512];
    for (int i = 0; i < P; i++) pool[i] = dp_mix64((uint64_t)i + 1); /* spread over the 64 bits */
    dp_libsvm_batch_t *b = s_batch(B, nnz, pool, P, seed);
    size_t n = b->offsets[b->n];
    dp_embed_t e;
    CHECK_EQ(dp_embed_init(&e, D, n > 0 ? n : 1, err), 0);
    size_t U = dp_embed_plan(&e, b);
    float *rows = dp_malloc((U + 1) * D * sizeof(float)), *dout = dp_malloc((size_t)B * D * sizeof(float) + 4);
    float *out = dp_malloc((size_t)B * D * sizeof(float) + 4), *want = dp_malloc((size_t)B * D * sizeof(float) + 4);
    float *g = dp_malloc((U + 1) * D * sizeof(float)), *gwant = dp_malloc((U + 1) * D * sizeof(float));
    s_fill(rows, U * D, seed + 1);
    s_fill(dout, (size_t)B * D, seed + 2);
    dp_embed_forward(&e, out, b, rows);
    dp_embed_forward_ref(want, rows, e.slot, b, D);
    char what[64];
    snprintf(what, sizeof what, "forward B=%d D=%d", B, D);
    CHECK_CLOSE(what, out, want, (size_t)B * D, 0, 0);
    dp_embed_backward(&e, g, b, dout);
    dp_embed_backward_ref(gwant, dout, e.slot, b, U, D);
    snprintf(what, sizeof what, "backward B=%d D=%d U=%zu", B, D, U);
    CHECK_CLOSE(what, g, gwant, U * D, 0, 0);
    dp_embed_fini(&e);
    dp_libsvm_batch_destroy(&b);
    free(rows), free(dout), free(out), free(want), free(g), free(gwant);
}

static void test_vs_reference(void)
{
    static const int dims[4] = {1, 3, 17, 64};
    int awkward[7] = {0, 5, 1, 0, 12, 3, 0}; /* empty samples first, between and last */
    int big[256];
    for (int s = 0; s < 256; s++) big[s] = s % 11 == 0 ? 0 : 1 + s % 37;
    for (int t = 1; t <= 2; t++) {
        dp_cpu_set_threads(t); /* the big batch at D 64 wakes the team */
        for (int k = 0; k < 4; k++) {
            s_vs_ref(7, awkward, 4, dims[k], 10 + (uint64_t)k);   /* few keys: many repeats */
            s_vs_ref(7, awkward, 1, dims[k], 20 + (uint64_t)k);   /* one key only */
            s_vs_ref(256, big, 500, dims[k], 30 + (uint64_t)k);
        }
    }
    dp_cpu_set_threads(0);
}

/* The loss L = sum over the batch of w . out (w fixed), so dL/dout = w:
 * each row's gradient from the backward against central differences of L
 * in the row's elements (L is linear in them: the differences are exact
 * but for rounding). */
static void test_finite_differences(void)
{
    char err[DP_ERR_LEN] = "";
    int nnz[5] = {3, 0, 4, 4, 1};
    uint64_t pool[3] = {7, 8, 9};
    dp_libsvm_batch_t *b = s_batch(5, nnz, pool, 3, 5);
    int D = 3, B = 5;
    dp_embed_t e;
    CHECK_EQ(dp_embed_init(&e, D, 12, err), 0);
    size_t U = dp_embed_plan(&e, b);
    float rows[3 * 3], w[5 * 3], out[5 * 3], g[3 * 3];
    s_fill(rows, U * D, 6);
    s_fill(w, (size_t)B * D, 7);
    dp_embed_backward(&e, g, b, w);
    double worst = 0;
    for (size_t i = 0; i < U * (size_t)D; i++) {
        const float h = 1e-2f, keep = rows[i];
        double L[2];
        for (int side = 0; side < 2; side++) {
            rows[i] = keep + (side ? -h : h);
            dp_embed_forward(&e, out, b, rows);
            L[side] = 0;
            for (int k = 0; k < B * D; k++) L[side] += (double)w[k] * out[k];
        }
        rows[i] = keep;
        double fd = (L[0] - L[1]) / (2.0 * h), diff = fabs(fd - g[i]);
        if (diff > worst) worst = diff;
        CHECK_NEAR(g[i], fd, 1e-4 * (1 + fabs(fd)));
    }
    fprintf(stderr, "  worst |backward - finite difference| %.3g\n", worst);
    dp_embed_fini(&e);
    dp_libsvm_batch_destroy(&b);
}

/* The same batch through PyTorch's EmbeddingBag (tests/torch_embed.py):
 * the bag's input is each feature's slot, its weight the U rows. */
static void test_matches_pytorch(void)
{
    char cmd[1024], path[256], err[DP_ERR_LEN] = "";
    const char *py = t_torch_py();
    if (!py) SKIP("no python3-torch ($TORCH_PY)");
    int nnz[9] = {0, 6, 2, 0, 9, 1, 5, 0, 3};
    uint64_t pool[7];
    for (int i = 0; i < 7; i++) pool[i] = UINT64_MAX - (uint64_t)i * 977;
    const int B = 9, D = 17;
    dp_libsvm_batch_t *b = s_batch(B, nnz, pool, 7, 11);
    size_t n = b->offsets[b->n];
    dp_embed_t e;
    CHECK_EQ(dp_embed_init(&e, D, n, err), 0);
    size_t U = dp_embed_plan(&e, b);
    float *rows = dp_malloc(U * D * sizeof(float)), *dout = dp_malloc((size_t)B * D * sizeof(float));
    float *out = dp_malloc((size_t)B * D * sizeof(float)), *g = dp_malloc(U * D * sizeof(float));
    s_fill(rows, U * D, 12);
    s_fill(dout, (size_t)B * D, 13);
    dp_embed_forward(&e, out, b, rows);
    dp_embed_backward(&e, g, b, dout);
    snprintf(path, sizeof path, "/tmp/dp-test-embed-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "%d %d %zu %zu\n", B, D, U, n);
    for (int s = 0; s < B; s++) fprintf(f, "%zu ", b->offsets[s]);
    fprintf(f, "\n");
    for (size_t j = 0; j < n; j++) fprintf(f, "%u ", e.slot[j]);
    fprintf(f, "\n");
    const float *arrays[5] = {b->values, rows, dout, out, g};
    size_t lens[5] = {n, U * D, (size_t)B * D, (size_t)B * D, U * D};
    for (int a = 0; a < 5; a++) {
        for (size_t i = 0; i < lens[a]; i++) fprintf(f, "%.9g ", arrays[a][i]);
        fprintf(f, "\n");
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' tests/torch_embed.py %s >&2", py, path);
    int rc = system(cmd);
    unlink(path);
    CHECK_EQ(rc, 0);
    dp_embed_fini(&e);
    dp_libsvm_batch_destroy(&b);
    free(rows), free(dout), free(out), free(g);
}

DP_TESTS(T(test_plan_awkward), T(test_vs_reference), T(test_finite_differences),
         T(test_matches_pytorch))
