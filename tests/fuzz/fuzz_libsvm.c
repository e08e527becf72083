/* fuzz_libsvm: bytes from a fuzzer, as a file, into the svmlight / libsvm
 * reader (common/libsvm.h), read whole in batches, counted, rewound and
 * read again.
 *
 * Input layout: byte 0 = the reader's shape: bits 0-2 the batch's samples
 * - 1 (1..8); bit 3: the rest is gzipped here first (the reader must see
 * the same text through zlib); bits 4-5: max_nnz = 2, 4, 8 or 16; bit 6:
 * max_line = 256 instead of 32. The rest = the file.
 * Whatever the bytes, the reader ends in one error line naming the file, or
 * at the end of the file with batches whose invariants hold: n <= cap, the
 * offsets rising to at most nnz_cap, at most max_nnz features a sample, no
 * key twice in one, labels 0 or 1, finite values, line numbers rising; then
 * the count agrees with what was read, and a second pass after a rewind
 * reads the same (or fails with the same line).
 *
 * `make fuzz` builds it with libFuzzer (see tests/fuzz/fuzz.h); built with
 * gcc, main() replays tests/fuzz/corpus/libsvm/ and mutations of it. */
#include <math.h>
#include <zlib.h>

#include "common/libsvm.h"
#include "tests/fuzz/fuzz.h"

#define S_NAME "fuzz_libsvm"

static void s_want(int ok, const char *what)
{
    if (!ok) fz_violation(S_NAME, what);
}

/* data gzipped (a gzip header and trailer, as gzip(1) writes); *len its size. */
static uint8_t *s_gzip(const uint8_t *data, size_t size, size_t *len)
{
    z_stream z = {0};
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
    size_t cap = deflateBound(&z, size) + 64;
    uint8_t *out = dp_malloc(cap);
    z.next_in = (uint8_t *)data, z.avail_in = (uInt)size;
    z.next_out = out, z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
    *len = z.total_out;
    deflateEnd(&z);
    return out;
}

/* One batch's invariants; returns its feature count. */
static size_t s_check_batch(const dp_libsvm_batch_t *b, size_t max_nnz, uint64_t *last_line)
{
    s_want(b->n <= b->cap, "more samples than the batch holds");
    s_want(b->offsets[0] == 0, "offsets[0] is not 0");
    for (size_t i = 0; i < b->n && i < b->cap; i++) {
        size_t lo = b->offsets[i], hi = b->offsets[i + 1];
        s_want(lo <= hi && hi <= b->nnz_cap, "offsets fall or pass nnz_cap");
        if (lo > hi || hi > b->nnz_cap) return 0;
        s_want(hi - lo <= max_nnz, "a sample with more than max_nnz features");
        s_want(b->labels[i] == 0 || b->labels[i] == 1, "a label other than 0 or 1");
        s_want(b->lines[i] > *last_line, "line numbers do not rise");
        *last_line = b->lines[i];
        for (size_t k = lo; k < hi; k++) {
            s_want(isfinite(b->values[k]), "a value that is not finite");
            for (size_t j = lo; j < k; j++) s_want(b->keys[j] != b->keys[k], "a key twice in one sample");
        }
    }
    return b->n <= b->cap ? b->offsets[b->n] : 0;
}

/* One pass from the top: 0 at the end (*samples, *nnz read), -1 with err. */
static int s_pass(dp_libsvm_t *r, dp_libsvm_batch_t *b, size_t max_nnz, uint64_t *samples,
                  uint64_t *nnz, char *err)
{
    uint64_t last = 0;
    long got;
    *samples = *nnz = 0;
    while ((got = dp_libsvm_next_batch(r, b, err)) > 0) {
        s_want((size_t)got == b->n, "the count returned is not b->n");
        *samples += b->n;
        *nnz += s_check_batch(b, max_nnz, &last);
    }
    if (got < 0) s_want(b->n == 0, "a failed batch is not empty");
    return got < 0 ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int shape = data[0];
    size_t cap = 1 + (size_t)(shape & 7), max_nnz = (size_t)2 << ((shape >> 4) & 3);
    size_t max_line = shape & 64 ? 256 : 32;
    data++, size--;
    uint8_t *gz = NULL;
    if (shape & 8) data = gz = s_gzip(data, size, &size);
    const char *path = fz_file(data, size);
    free(gz);
    dp_libsvm_t *r = NULL;
    char err[DP_ERR_LEN] = "", err2[DP_ERR_LEN] = "";
    if (dp_libsvm_open(&r, path, max_nnz, max_line, err) != 0) {
        s_want(0, "the reader did not open a file that is there");
        return 0;
    }
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(cap, cap * max_nnz);
    uint64_t n1, z1, n2, z2;
    int rc1 = s_pass(r, b, max_nnz, &n1, &z1, err);
    s_want(dp_libsvm_rewind(r, err2) == 0, "rewind failed");
    int rc2 = s_pass(r, b, max_nnz, &n2, &z2, err2);
    s_want(rc1 == rc2 && (rc1 != 0 || (n1 == n2 && z1 == z2)), "a second pass read something else");
    if (rc1 == 0) {
        fz_accepted++;
        uint64_t cn, cz;
        s_want(dp_libsvm_count(r, &cn, &cz, err) == 0 && cn == n1 && cz == z1,
               "the count disagrees with the samples read");
    } else {
        s_want(strcmp(err, err2) == 0, "a second pass failed with another error");
        s_want(strncmp(err, path, strlen(path)) == 0 && err[strlen(path)] == ':',
               "an error that does not name the file");
        s_want(!strchr(err, '\n'), "an error that is not one line");
    }
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
    dp_libsvm_close(&r); /* safe twice */
    return 0;
}

#ifndef DP_LIBFUZZER
int main(int argc, char **argv)
{
    return fz_main(argc, argv, "libsvm", 20000);
}
#endif
