/* lab/sparse: the engine's side of a model whose first layer is embed:D
 * (deploy/lab/engine.h), for `downpour replay` of a sparse run's record
 * and `downpour sim` of such a model:
 * each shard's row table behind the shard's own row rules
 * (server/core/ps_rows.h: dp_ps_rows_pull / dp_ps_rows_push and the dense
 * step's hooks, the code downpour-ps runs), the workers' libsvm batches
 * as the embed kind's cluster loop takes them (worker i of N: batches i, i + N,
 * ...; DP_LAB_SPARSE_READERS readers at most), the stage
 * (kernels/embed.h) in front of the session's dense net, and the chief's
 * evaluation (worker/train/embed_train.h's dp_embed_evaluate) on the shards'
 * tables.
 *
 * A worker's step is a dp_lab_batch_t: its batch and distinct keys (made
 * at its first row pull), the rows each shard answered at its pull (its
 * part of the keys, split as the client splits them: worker/client/ps_rows.c's
 * stable grouping by dp_rows_shard_of), then the row gradients its
 * compute gave, each shard pushed its part in the same order. So a
 * replay reads each shard's table where the record says the worker read
 * it, which in async is between dense versions. */
#ifndef DP_LAB_SPARSE_H
#define DP_LAB_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/libsvm.h"
#include "kernels/embed.h"
#include "server/core/policy.h"
#include "server/core/ps_rows.h"
#include "worker/exec/sparse_data.h"

/* Readers at most: worker w reads through reader w mod this (a worker's
 * steps come in order, so its own reader only moves forward; workers
 * sharing one cost rewinds, not memory: each reader holds a line buffer
 * of 1 MiB and a batch). */
#define DP_LAB_SPARSE_READERS 8

typedef struct {
    dp_sparse_data_t *data;    /* [readers]: the workers' libsvm readers (above) */
    int readers;
    dp_embed_t stage;          /* the plan, forward and backward of one batch at a time */
    dp_ps_rows_t *rows;        /* [shards]: each shard's table and row rules */
    int dim;                   /* D */
    size_t max_nnz;            /* features a batch holds at most */
    float *x, *dx;             /* the net's input and its gradient: [B x D] */
    int *y;                    /* [B] */
    uint64_t *part_keys;       /* one shard's part of a batch's keys [max_nnz], */
    size_t *part_pos;          /* ... where each stands in the batch's keys, */
    float *part_rows;          /* ... and their rows or gradients [max_nnz x D] */
    float *row_w, *scores, *labels; /* the evaluation's: a batch's rows; the test file's */
} dp_lab_sparse_t;

/* One worker's step (see above); zeroed: nothing loaded. */
typedef struct {
    dp_libsvm_batch_t *batch;  /* its batch (a copy: the reader moves on) */
    uint64_t *keys;            /* [n_keys]: the batch's distinct keys, first occurrence first */
    size_t n_keys;
    float *rows, *grads;       /* [n_keys x D]: the rows its worker read, their gradients */
} dp_lab_batch_t;

void dp_lab_batch_free(dp_lab_batch_t *j);

#endif
