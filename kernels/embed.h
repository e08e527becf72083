/* embed: the embedding stage of a sparse model (`embed:D`, common/model.h),
 * PyTorch's nn.EmbeddingBag(mode='sum') with per_sample_weights: each
 * sample's feature keys looked up in a row table of width D, weighted by the
 * features' values and summed.
 *
 * The stage owns no rows. The table lives elsewhere (standalone: the
 * worker's dp_rows_t; later: the servers), so a step is
 *   plan      the batch's distinct keys, in order of first occurrence
 *             (e->keys[0..U)), and each feature's index among them
 *   (caller)  the U rows of those keys, U x D floats, from the table
 *   forward   out[b, :] = sum over sample b's features j of
 *             value_j * rows[slot_j, :]                      (B x D)
 *   backward  row_grads[u, :] = sum over the features j with slot_j = u of
 *             value_j * dout[sample of j, :]                 (U x D)
 *   (caller)  the U row gradients to the table
 * Both sums run over the features in the batch's order, so the fast
 * versions give the references' bits whatever the thread count (no
 * float sum crosses threads: samples are split for the forward, keys for
 * the backward).
 *
 * Dimensions: B = samples in the batch, D = the row width, nnz = features
 * in the batch (offsets[B]), U = distinct keys (U <= nnz). Outputs come
 * first after the plan.
 *
 * Memory: fixed at init for batches of at most max_nnz features: keys,
 * slots and the occurrence lists (20 bytes a feature) and the key map
 * (8 bytes a slot, a power of two >= 2 max_nnz: at most half full).
 * Planning allocates nothing; the map is never cleared, its entries are
 * stamped with the plan they belong to. */
#ifndef DP_EMBED_H
#define DP_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "common/libsvm.h"

/* The widest row (DP_ROWS_MAX_WIDTH, server/core/rows.h, DP_MODEL_MAX_EMBED,
 * common/model.h: the same bound). */
#define DP_EMBED_MAX_DIM 4096
/* Features a plan takes at most: slots are 32-bit. */
#define DP_EMBED_MAX_NNZ ((size_t)1 << 30)

typedef struct {
    uint32_t stamp;  /* the plan that wrote it; any other: empty */
    uint32_t u;      /* the key's index in keys[] */
} dp_embed_entry_t;

typedef struct {
    int dim;                 /* D */
    size_t max_nnz;          /* features a batch may hold */
    size_t n_keys;           /* U of the last plan */
    uint64_t *keys;          /* [max_nnz]: the plan's distinct keys, first occurrence first */
    uint32_t *slot;          /* [max_nnz]: feature j's index into keys */
    uint32_t *occ_start;     /* [max_nnz + 1]: key u's features are occ[occ_start[u] ..
                              * occ_start[u + 1]) */
    uint32_t *occ;           /* [max_nnz]: feature indices grouped by key, ascending in each */
    uint32_t *occ_sample;    /* [max_nnz]: the sample of feature j (the backward's dout row) */
    dp_embed_entry_t *map;   /* key -> index, open addressing, map_cap slots */
    size_t map_cap;          /* a power of two */
    uint32_t stamp;          /* the current plan's stamp (never 0) */
} dp_embed_t;

/* A stage of width dim (1 .. DP_EMBED_MAX_DIM) for batches of at most
 * max_nnz features (1 .. DP_EMBED_MAX_NNZ). -1 with err on a bad bound. */
int dp_embed_init(dp_embed_t *e, int dim, size_t max_nnz, char *err);
/* Frees what init took; safe on a zeroed or finished e. */
void dp_embed_fini(dp_embed_t *e);

/* Plan batch b (b->offsets[b->n] <= max_nnz): its distinct keys into
 * e->keys, each feature's slot, the occurrence lists. Returns U. */
size_t dp_embed_plan(dp_embed_t *e, const dp_libsvm_batch_t *b);

/* out[B, D] from rows[U, D] of the planned batch b (an empty sample: zeros). */
void dp_embed_forward(const dp_embed_t *e, float *out, const dp_libsvm_batch_t *b,
                      const float *rows);
/* row_grads[U, D] from dout[B, D] (the loss's gradient wrt out) of the
 * planned batch b; every row is written (a key's sum over its features). */
void dp_embed_backward(const dp_embed_t *e, float *row_grads, const dp_libsvm_batch_t *b,
                       const float *dout);

/* The references, obvious loops (the tests hold the fast versions to them):
 * the distinct keys of keys[0..nnz) by a linear search each, into
 * ukeys[] (first occurrence first) and slot[nnz]; returns U. */
size_t dp_embed_unique_ref(uint64_t *ukeys, uint32_t *slot, const uint64_t *keys, size_t nnz);
/* out[B, D] = for each sample, sum of value_j * rows[slot_j]. */
void dp_embed_forward_ref(float *out, const float *rows, const uint32_t *slot,
                          const dp_libsvm_batch_t *b, int D);
/* row_grads[U, D] zeroed, then for each feature in order
 * row_grads[slot_j] += value_j * dout[its sample]. */
void dp_embed_backward_ref(float *row_grads, const float *dout, const uint32_t *slot,
                           const dp_libsvm_batch_t *b, size_t U, int D);

#endif
