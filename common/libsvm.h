/* libsvm: a streaming reader of svmlight / libsvm text, the format public
 * sparse data sets ship in (plain or gzip: zlib reads both):
 *
 *   LABEL [qid:N] KEY:VALUE KEY:VALUE ...   # a comment to the end of the line
 *
 * One sample per line; blank and comment-only lines are skipped (but
 * counted, so that an error names the file's own line number). LABEL is 0/1
 * or -1/+1 (also written 1.0, -1.0), read as 0 or 1; anything else is an
 * error. KEY is an unsigned decimal integer up to 2^64 - 1 (hashed features
 * use the whole range); keys need not be sorted, but a key twice on one
 * line is an error. VALUE is a finite float in decimal notation. A line may
 * end in CRLF. A qid:N token is checked and skipped.
 *
 * Memory is bounded and fixed when the reader is opened: a line longer than
 * max_line bytes, or with more than max_nnz features, is an error naming
 * its line number rather than a reason to grow. The caller pulls samples
 * into a batch it owns (dp_libsvm_batch_t: CSR-like, fixed capacity), and
 * reading never allocates. Every error is one line:
 *   "train.svm:1234: key "12x" is not an unsigned integer". */
#ifndef DP_LIBSVM_H
#define DP_LIBSVM_H

#include <stddef.h>
#include <stdint.h>

/* Bounds a reader is opened with. */
#define DP_LIBSVM_MAX_NNZ_DEFAULT 4096   /* features per line */
#define DP_LIBSVM_MAX_LINE_DEFAULT (1 << 20) /* bytes per line, its newline excluded */

/* A batch of up to cap samples in CSR form: sample i has label labels[i]
 * and features keys[offsets[i] .. offsets[i + 1]) with the same values,
 * in the file's order. Allocated once by dp_libsvm_batch_new; the reader
 * only fills it. */
typedef struct {
    size_t cap;        /* samples it holds at most (B) */
    size_t nnz_cap;    /* features it holds at most, over all its samples */
    size_t n;          /* samples in it now */
    float *labels;     /* [cap]: 0 or 1 */
    size_t *offsets;   /* [cap + 1]: offsets[0] == 0, offsets[n] == features in it */
    uint64_t *keys;    /* [nnz_cap] */
    float *values;     /* [nnz_cap] */
    uint64_t *lines;   /* [cap]: each sample's line number in its file (1-based) */
} dp_libsvm_batch_t;

/* A batch of cap samples and nnz_cap features in all (nnz_cap must be at
 * least the reader's max_nnz, or a longest line could never fit). */
dp_libsvm_batch_t *dp_libsvm_batch_new(size_t cap, size_t nnz_cap);
void dp_libsvm_batch_destroy(dp_libsvm_batch_t **b);

typedef struct dp_libsvm dp_libsvm_t;

/* Open path (plain or gzip) with at most max_nnz features and max_line
 * bytes per line (0: the defaults above). -1 with err when it does not
 * open or the bounds are absurd. */
int dp_libsvm_open(dp_libsvm_t **out, const char *path, size_t max_nnz, size_t max_line,
                   char *err);
/* Fill b with the next samples: as many as fit (b->cap samples, b->nnz_cap
 * features; a line that does not fit starts the next batch). Returns the
 * count (b->n), 0 at the end of the file, -1 with err on a bad line or a
 * read error; b->n is then 0 and every later call fails the same way until
 * dp_libsvm_rewind. */
long dp_libsvm_next_batch(dp_libsvm_t *r, dp_libsvm_batch_t *b, char *err);
/* Back to the first line, for the next epoch (and out of a failed state). */
int dp_libsvm_rewind(dp_libsvm_t *r, char *err);
/* Every sample of the file checked and counted in one pass (from the top;
 * the reader is rewound after): *samples and *nnz (features in all). */
int dp_libsvm_count(dp_libsvm_t *r, uint64_t *samples, uint64_t *nnz, char *err);
/* Bytes the reader holds (its buffers; zlib's own state aside): fixed at
 * open. */
size_t dp_libsvm_memory(const dp_libsvm_t *r);
void dp_libsvm_close(dp_libsvm_t **r);

/* Sort keys[0..n) ascending, values (may be NULL) along: in place, no
 * allocation (a heapsort; the reader's duplicate check and the generator's
 * lines). */
void dp_libsvm_sort(uint64_t *keys, float *values, size_t n);

#endif
