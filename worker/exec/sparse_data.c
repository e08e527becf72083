/* sparse_data: the libsvm files of an embedding model's run (see
 * sparse_data.h). */
#include "worker/exec/sparse_data.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/core/rows.h"

#define S_PREFIX "libsvm:"
#define S_NNZ_PER_SAMPLE 128

size_t dp_sparse_batch_nnz(int B)
{
    size_t n = (size_t)B * S_NNZ_PER_SAMPLE;
    if (n < DP_LIBSVM_MAX_NNZ_DEFAULT) n = DP_LIBSVM_MAX_NNZ_DEFAULT; /* a longest line fits */
    return n < DP_ROWS_MAX_KEYS ? n : DP_ROWS_MAX_KEYS; /* one push of the batch's keys */
}

int dp_sparse_data_is(const char *spec)
{
    return spec && strncmp(spec, S_PREFIX, strlen(S_PREFIX)) == 0;
}

/* Read r through in batches (every line checked), counting its samples
 * and batches, then rewind it. */
static int s_count(dp_libsvm_t *r, dp_libsvm_batch_t *b, uint64_t *samples, long *batches,
                   char *err)
{
    long k;
    *samples = 0;
    *batches = 0;
    while ((k = dp_libsvm_next_batch(r, b, err)) > 0) {
        *samples += (uint64_t)k;
        (*batches)++;
    }
    if (k < 0) return -1;
    return dp_libsvm_rewind(r, err);
}

int dp_sparse_data_open(dp_sparse_data_t *d, const char *spec, int B, char *err)
{
    memset(d, 0, sizeof *d);
    if (!dp_sparse_data_is(spec) || !spec[strlen(S_PREFIX)])
        return dp_err(err, "--data %s: expected libsvm:TRAIN[:TEST] (svmlight / libsvm files, "
                      "plain or gzip)", spec ? spec : "(none)");
    if (B < 1) return dp_err(err, "--batch must be at least 1 (got %d)", B);
    d->train_path = dp_strdup(spec + strlen(S_PREFIX));
    char *colon = strchr(d->train_path, ':');
    if (colon) {
        *colon = 0;
        d->test_path = dp_strdup(colon + 1);
        if (!d->train_path[0] || !d->test_path[0] || strchr(d->test_path, ':')) {
            dp_err(err, "--data %s: expected libsvm:TRAIN[:TEST] (two paths at most, neither "
                   "empty nor holding ':')", spec);
            goto fail;
        }
    }
    d->batch = dp_libsvm_batch_new((size_t)B, dp_sparse_batch_nnz(B));
    long test_batches = 0;
    if (dp_libsvm_open(&d->train, d->train_path, 0, 0, err) != 0 ||
        s_count(d->train, d->batch, &d->train_samples, &d->steps_per_epoch, err) != 0)
        goto fail;
    if (d->train_samples == 0) {
        dp_err(err, "%s: no samples (an empty training file)", d->train_path);
        goto fail;
    }
    if (d->test_path && (dp_libsvm_open(&d->test, d->test_path, 0, 0, err) != 0 ||
                         s_count(d->test, d->batch, &d->test_samples, &test_batches, err) != 0))
        goto fail;
    return 0;
fail:
    dp_sparse_data_close(d);
    return -1;
}

void dp_sparse_data_close(dp_sparse_data_t *d)
{
    dp_libsvm_close(&d->train);
    dp_libsvm_close(&d->test);
    dp_libsvm_batch_destroy(&d->batch);
    free(d->train_path);
    free(d->test_path);
    memset(d, 0, sizeof *d);
}

long dp_sparse_data_next(dp_sparse_data_t *d, char *err)
{
    long k = dp_libsvm_next_batch(d->train, d->batch, err);
    if (k == 0) { /* the epoch's end: the next one from the top */
        if (dp_libsvm_rewind(d->train, err) != 0) return -1;
        k = dp_libsvm_next_batch(d->train, d->batch, err);
    }
    if (k == 0) return dp_err(err, "%s: no samples on reading it again", d->train_path);
    if (k > 0) d->steps++;
    return k;
}

int dp_sparse_data_seek(dp_sparse_data_t *d, long g, char *err)
{
    if (g < 0) return dp_err(err, "batch %ld: no such batch", g);
    long spe = d->steps_per_epoch, at = d->steps % spe, want = g % spe;
    /* behind us in this epoch, or the last epoch read to its end: from the top */
    if (want < at || (at == 0 && d->steps > 0)) {
        if (dp_libsvm_rewind(d->train, err) != 0) return -1;
        at = 0;
    }
    for (; at < want; at++) {
        long k = dp_libsvm_next_batch(d->train, d->batch, err);
        if (k < 0) return -1;
        if (k == 0)
            return dp_err(err, "%s: shorter than when opened (did the file change?)", d->train_path);
    }
    d->steps = g;
    return 0;
}

int dp_sparse_data_rewind_test(dp_sparse_data_t *d, char *err)
{
    if (!d->test) return dp_err(err, "no test file (--data libsvm:TRAIN:TEST)");
    return dp_libsvm_rewind(d->test, err);
}

long dp_sparse_data_next_test(dp_sparse_data_t *d, char *err)
{
    return dp_libsvm_next_batch(d->test, d->batch, err);
}
