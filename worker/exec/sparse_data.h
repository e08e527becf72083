/* sparse_data: `--data libsvm:TRAIN[:TEST]`, the sparse samples a model
 * with an embedding (embed:D) trains on: the training file read in
 * batches by the streaming reader (common/libsvm.h), an epoch a rewind,
 * and the test file read the same way for an evaluation.
 *
 * Order: the file's own (no shuffle: a file that is sorted by label or by
 * time is trained in that order; shuffle it first). Every sample of every
 * epoch is trained, the last batch of an epoch holding what is left.
 *
 * Memory is fixed at open, whatever the files' length: the two readers'
 * buffers and one batch of at most B samples and DP_SPARSE_NNZ(B)
 * features; a batch is cut short where its samples' features would pass
 * that (a dense file's batches hold fewer samples). Opening reads each
 * file once through (every line checked, so a bad line is one error naming
 * its file and line before any training, and the epoch's batches counted)
 * and rewinds it. */
#ifndef DP_SPARSE_DATA_H
#define DP_SPARSE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/libsvm.h"

/* Features a batch of B samples holds at most: 128 a sample on average
 * and at least one longest line, within the row table's keys per request. */
size_t dp_sparse_batch_nnz(int B);

typedef struct {
    char *train_path, *test_path;  /* from the spec; test_path NULL: no test file */
    dp_libsvm_t *train, *test;     /* the readers (test NULL without a test file) */
    dp_libsvm_batch_t *batch;      /* the batch every read fills (training or test) */
    uint64_t train_samples;        /* samples in the training file (one epoch) */
    uint64_t test_samples;         /* in the test file; 0 without one */
    long steps_per_epoch;          /* batches in one epoch */
    long steps;                    /* training batches handed out so far */
} dp_sparse_data_t;

/* 1 when spec names sparse data ("libsvm:..."). */
int dp_sparse_data_is(const char *spec);

/* Open "libsvm:TRAIN[:TEST]" (paths without ':') for batches of B samples:
 * both files checked and counted. -1 with err (one line: a bad spec, a file
 * that does not open, a bad line with its file and number, an empty
 * training file); d is then closed. */
int dp_sparse_data_open(dp_sparse_data_t *d, const char *spec, int B, char *err);
/* Frees everything; safe on a zeroed or closed d. */
void dp_sparse_data_close(dp_sparse_data_t *d);

/* The next training batch into d->batch (the next epoch's first after the
 * last): its samples, or -1 with err. */
long dp_sparse_data_next(dp_sparse_data_t *d, char *err);

/* Position the training file so that the next dp_sparse_data_next hands
 * out batch g (0, 1, ...: across epochs, g / steps_per_epoch the epoch):
 * the batches between are read and passed over (a worker of N trains
 * every N-th). 0, or -1 with err. */
int dp_sparse_data_seek(dp_sparse_data_t *d, long g, char *err);

/* The test file from its first line: dp_sparse_data_next_test then fills
 * d->batch with its batches in turn, returning 0 at its end (-1 with err). */
int dp_sparse_data_rewind_test(dp_sparse_data_t *d, char *err);
long dp_sparse_data_next_test(dp_sparse_data_t *d, char *err);

#endif
