/* embed: the embedding stage (see embed.h). The fast versions differ from
 * the references in three ways only: the distinct keys come from a hash
 * map in one pass (the reference searches the list so far, O(nnz U)); the
 * backward gathers each key's features from its occurrence list instead of
 * scattering into every row, so keys split over threads without two
 * threads writing one row; and samples (forward) or keys (backward) split
 * over our threads when the work pays for waking them. Every output is
 * the same sum in the same order as the reference's, hence the same bits. */
#include "kernels/embed.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/dropout_mask.h"

int dp_embed_init(dp_embed_t *e, int dim, size_t max_nnz, char *err)
{
    memset(e, 0, sizeof *e);
    if (dim < 1 || dim > DP_EMBED_MAX_DIM)
        return dp_err(err, "embedding width %d out of range (1..%d)", dim, DP_EMBED_MAX_DIM);
    if (max_nnz < 1 || max_nnz > DP_EMBED_MAX_NNZ)
        return dp_err(err, "embedding: %zu features a batch out of range (1..%zu)", max_nnz,
                      DP_EMBED_MAX_NNZ);
    e->dim = dim;
    e->max_nnz = max_nnz;
    e->keys = dp_malloc(max_nnz * sizeof *e->keys);
    e->slot = dp_malloc(max_nnz * sizeof *e->slot);
    e->occ_start = dp_malloc((max_nnz + 1) * sizeof *e->occ_start);
    e->occ = dp_malloc(max_nnz * sizeof *e->occ);
    e->occ_sample = dp_malloc(max_nnz * sizeof *e->occ_sample);
    e->map_cap = 16;
    while (e->map_cap < 2 * max_nnz) e->map_cap *= 2; /* at most half full: short probes */
    e->map = dp_calloc(e->map_cap, sizeof *e->map);
    e->stamp = 0;
    return 0;
}

void dp_embed_fini(dp_embed_t *e)
{
    free(e->keys);
    free(e->slot);
    free(e->occ_start);
    free(e->occ);
    free(e->occ_sample);
    free(e->map);
    memset(e, 0, sizeof *e);
}

/* key's index among the plan's keys, added as the next one when new. */
static uint32_t s_lookup(dp_embed_t *e, uint64_t key)
{
    size_t mask = e->map_cap - 1;
    size_t i = (size_t)dp_mix64(key + 0x9e3779b97f4a7c15ULL) & mask;
    for (;; i = (i + 1) & mask) {
        dp_embed_entry_t *s = &e->map[i];
        if (s->stamp != e->stamp) { /* empty in this plan: the key is new */
            s->stamp = e->stamp;
            s->u = (uint32_t)e->n_keys;
            e->keys[e->n_keys++] = key;
            return s->u;
        }
        if (e->keys[s->u] == key) return s->u;
    }
}

size_t dp_embed_plan(dp_embed_t *e, const dp_libsvm_batch_t *b)
{
    size_t nnz = b->offsets[b->n];
    if (++e->stamp == 0) { /* the stamps wrapped: every entry may look current */
        memset(e->map, 0, e->map_cap * sizeof *e->map);
        e->stamp = 1;
    }
    e->n_keys = 0;
    for (size_t s = 0; s < b->n; s++)
        for (size_t j = b->offsets[s]; j < b->offsets[s + 1]; j++) {
            e->slot[j] = s_lookup(e, b->keys[j]);
            e->occ_sample[j] = (uint32_t)s;
        }
    /* the occurrence lists by a counting sort: ascending j within each key */
    size_t U = e->n_keys;
    memset(e->occ_start, 0, (U + 1) * sizeof *e->occ_start);
    for (size_t j = 0; j < nnz; j++) e->occ_start[e->slot[j] + 1]++;
    for (size_t u = 0; u < U; u++) e->occ_start[u + 1] += e->occ_start[u];
    for (size_t j = 0; j < nnz; j++) e->occ[e->occ_start[e->slot[j]]++] = (uint32_t)j;
    /* the fill moved each start to its end: shift them back */
    for (size_t u = U; u > 0; u--) e->occ_start[u] = e->occ_start[u - 1];
    e->occ_start[0] = 0;
    return U;
}

/* dst[0, D) = the sum over k in [lo, hi) of value_j * src[row_of[j], :],
 * j = feat[k] (feat NULL: j = k), in that order: one bag of the forward (a
 * sample's features) or one key's gradient in the backward (its
 * occurrences). */
static inline void s_bag(float *dst, int D, const float *src, const uint32_t *row_of,
                         const float *values, const uint32_t *feat, size_t lo, size_t hi)
{
    memset(dst, 0, (size_t)D * sizeof *dst);
    for (size_t k = lo; k < hi; k++) {
        size_t j = feat ? feat[k] : k;
        const float v = values[j], *r = src + (size_t)row_of[j] * D;
        for (int d = 0; d < D; d++) dst[d] += v * r[d];
    }
}

void dp_embed_forward(const dp_embed_t *e, float *out, const dp_libsvm_batch_t *b,
                      const float *rows)
{
    const int D = e->dim, nt = dp_cpu_team((double)b->offsets[b->n] * D);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (long s = 0; s < (long)b->n; s++)
        s_bag(out + (size_t)s * D, D, rows, e->slot, b->values, NULL, b->offsets[s], b->offsets[s + 1]);
}

void dp_embed_backward(const dp_embed_t *e, float *row_grads, const dp_libsvm_batch_t *b,
                       const float *dout)
{
    const int D = e->dim, nt = dp_cpu_team((double)b->offsets[b->n] * D);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (long u = 0; u < (long)e->n_keys; u++)
        s_bag(row_grads + (size_t)u * D, D, dout, e->occ_sample, b->values, e->occ,
              e->occ_start[u], e->occ_start[u + 1]);
}

size_t dp_embed_unique_ref(uint64_t *ukeys, uint32_t *slot, const uint64_t *keys, size_t nnz)
{
    size_t U = 0;
    for (size_t j = 0; j < nnz; j++) {
        size_t u = 0;
        while (u < U && ukeys[u] != keys[j]) u++;
        if (u == U) ukeys[U++] = keys[j];
        slot[j] = (uint32_t)u;
    }
    return U;
}

void dp_embed_forward_ref(float *out, const float *rows, const uint32_t *slot,
                          const dp_libsvm_batch_t *b, int D)
{
    for (size_t s = 0; s < b->n; s++)
        for (int d = 0; d < D; d++) {
            float acc = 0;
            for (size_t j = b->offsets[s]; j < b->offsets[s + 1]; j++)
                acc += b->values[j] * rows[(size_t)slot[j] * D + d];
            out[s * D + d] = acc;
        }
}

void dp_embed_backward_ref(float *row_grads, const float *dout, const uint32_t *slot,
                           const dp_libsvm_batch_t *b, size_t U, int D)
{
    memset(row_grads, 0, U * (size_t)D * sizeof *row_grads);
    for (size_t s = 0; s < b->n; s++)
        for (size_t j = b->offsets[s]; j < b->offsets[s + 1]; j++)
            for (int d = 0; d < D; d++)
                row_grads[(size_t)slot[j] * D + d] += b->values[j] * dout[s * D + d];
}
