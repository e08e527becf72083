/* test_libsvm: the streaming svmlight / libsvm reader (common/libsvm.h) —
 * every token form, both label conventions, CRLF, gzip, batches cut by
 * samples and by features, rewind, counting, each error with its exact
 * line, keys at 2^64 - 1 and 2^64, and memory that never grows. */
#include <ftw.h>
#include <malloc.h>
#include <unistd.h>
#include <zlib.h>

#include "common/libsvm.h"
#include "tests/test.h"

static char s_dir[64];

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* The files go when the program ends. */
__attribute__((destructor)) static void s_cleanup(void)
{
    if (s_dir[0]) nftw(s_dir, s_rm, 8, FTW_DEPTH | FTW_PHYS);
}

static const char *s_path(const char *name)
{
    static char path[2][128];
    static int which;
    if (!s_dir[0]) {
        snprintf(s_dir, sizeof s_dir, "/tmp/dp_test_libsvm.XXXXXX");
        if (!mkdtemp(s_dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    which ^= 1;
    snprintf(path[which], sizeof path[which], "%s/%s", s_dir, name);
    return path[which];
}

/* name's contents: text (len bytes, or strlen when len is 0); gzip when the
 * name ends in .gz. Returns the path. */
static const char *s_file(const char *name, const char *text, size_t len)
{
    const char *path = s_path(name);
    if (!len) len = strlen(text);
    size_t n = strlen(name);
    if (n > 3 && strcmp(name + n - 3, ".gz") == 0) {
        gzFile g = gzopen(path, "wb");
        if (!g || gzwrite(g, text, (unsigned)len) != (int)len || gzclose(g) != Z_OK) exit(1);
    } else {
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) exit(1);
    }
    return path;
}

/* The whole of path read with batches of cap samples: labels, keys,
 * values, line numbers and per-sample feature counts flattened; the
 * sample count, or -1 with err. */
typedef struct {
    float label[64];
    size_t nnz[64];
    uint64_t line[64];
    uint64_t key[256];
    float value[256];
} s_all_t;

static long s_read_all(const char *path, size_t cap, size_t nnz_cap, s_all_t *all, char *err)
{
    memset(all, 0, sizeof *all);
    dp_libsvm_t *r;
    if (dp_libsvm_open(&r, path, 8, 256, err) != 0) return -1;
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(cap, nnz_cap);
    long n = 0, got;
    size_t f = 0;
    while ((got = dp_libsvm_next_batch(r, b, err)) > 0) {
        for (size_t i = 0; i < b->n; i++, n++) {
            all->label[n] = b->labels[i];
            all->line[n] = b->lines[i];
            all->nnz[n] = b->offsets[i + 1] - b->offsets[i];
            for (size_t k = b->offsets[i]; k < b->offsets[i + 1]; k++, f++)
                all->key[f] = b->keys[k], all->value[f] = b->values[k];
        }
    }
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
    return got < 0 ? -1 : n;
}

/* Every token form: signs and exponents, qid, comments, tabs, a blank and a
 * comment-only line, a sample without features, no newline at the end. */
static const char s_forms[] =
    "+1 qid:3 1:0.5 7:-2e-3 # a comment 9:9\n"
    "\n"
    "   # only a comment\n"
    "-1\t3:1\t\t2:+.25   \n"
    "0 5:1.5E2#comment glued to a token\n"
    "1.0 18446744073709551615:1 0:-0\n"
    "1\n"
    "-1.0 4:1e-7";

static void s_check_forms(const s_all_t *a, long n)
{
    CHECK_EQ(n, 6);
    const float labels[] = {1, 0, 0, 1, 1, 0};
    const size_t nnz[] = {2, 2, 1, 2, 0, 1};
    const uint64_t lines[] = {1, 4, 5, 6, 7, 8};
    for (int i = 0; i < 6 && i < n; i++) {
        CHECK_EQ(a->label[i], labels[i]);
        CHECK_EQ(a->nnz[i], nnz[i]);
        CHECK_EQ(a->line[i], lines[i]);
    }
    const uint64_t keys[] = {1, 7, 3, 2, 5, UINT64_MAX, 0, 4};
    const float values[] = {0.5f, -2e-3f, 1, 0.25f, 150, 1, 0, 1e-7f};
    for (int i = 0; i < 8; i++) {
        CHECK(a->key[i] == keys[i]);
        CHECK(a->value[i] == values[i]);
    }
}

static void test_token_forms(void)
{
    char err[DP_ERR_LEN] = "";
    s_all_t a;
    long n = s_read_all(s_file("forms.svm", s_forms, 0), 64, 256, &a, err);
    CHECK_STR(err, "");
    s_check_forms(&a, n);
}

static void test_labels_both_conventions(void)
{
    char err[DP_ERR_LEN] = "";
    s_all_t a, b;
    long n01 = s_read_all(s_file("01.svm", "1 1:1\n0 1:1\n0 2:1\n1 2:1\n", 0), 64, 256, &a, err);
    long npm = s_read_all(s_file("pm.svm", "+1 1:1\n-1 1:1\n-1 2:1\n1 2:1\n", 0), 64, 256, &b, err);
    CHECK_EQ(n01, 4);
    CHECK_EQ(npm, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(a.label[i], b.label[i]);
    CHECK_EQ(a.label[0], 1);
    CHECK_EQ(a.label[1], 0);
}

/* CRLF line endings read as LF ones, blank CRLF lines skipped too. */
static void test_crlf(void)
{
    char err[DP_ERR_LEN] = "";
    s_all_t a;
    char crlf[sizeof s_forms * 2];
    size_t j = 0;
    for (const char *p = s_forms; *p; p++) {
        if (*p == '\n') crlf[j++] = '\r';
        crlf[j++] = *p;
    }
    crlf[j] = '\0';
    long n = s_read_all(s_file("crlf.svm", crlf, 0), 64, 256, &a, err);
    CHECK_STR(err, "");
    s_check_forms(&a, n);
}

static void test_gzip(void)
{
    char err[DP_ERR_LEN] = "";
    s_all_t a;
    long n = s_read_all(s_file("forms.svm.gz", s_forms, 0), 64, 256, &a, err);
    CHECK_STR(err, "");
    s_check_forms(&a, n);
}

/* Batches of 2 samples, or of 3 features: the same samples in the same
 * order, each batch as full as its bound allows, a sample never split. */
static void test_batch_boundaries(void)
{
    char err[DP_ERR_LEN] = "";
    s_all_t whole, by2;
    const char *path = s_file("forms.svm", s_forms, 0);
    long n = s_read_all(path, 64, 256, &whole, err);
    CHECK_EQ(s_read_all(path, 2, 256, &by2, err), n);
    CHECK(memcmp(&whole, &by2, sizeof whole) == 0);
    dp_libsvm_t *r;
    CHECK_EQ(dp_libsvm_open(&r, path, 3, 256, err), 0);
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(64, 3);
    /* features per sample 2 2 1 2 0 1: batches [2] [2 1] [2 0 1] */
    const long want[] = {1, 2, 3, 0};
    for (int i = 0; i < 4; i++) CHECK_EQ(dp_libsvm_next_batch(r, b, err), want[i]);
    dp_libsvm_batch_destroy(&b);
    /* A batch with room for fewer features than one line may hold: refused. */
    b = dp_libsvm_batch_new(64, 2);
    CHECK_EQ(dp_libsvm_rewind(r, err), 0);
    CHECK_EQ(dp_libsvm_next_batch(r, b, err), -1);
    CHECK(strstr(err, "fewer than the reader's 3 per line") != NULL);
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
}

static void test_rewind_and_count(void)
{
    char err[DP_ERR_LEN] = "";
    dp_libsvm_t *r;
    CHECK_EQ(dp_libsvm_open(&r, s_file("forms.svm.gz", s_forms, 0), 8, 256, err), 0);
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(4, 32);
    CHECK_EQ(dp_libsvm_next_batch(r, b, err), 4);
    uint64_t first = b->keys[0];
    uint64_t samples, nnz;
    CHECK_EQ(dp_libsvm_count(r, &samples, &nnz, err), 0);
    CHECK_EQ(samples, 6);
    CHECK_EQ(nnz, 8);
    /* count rewinds: the first batch again */
    CHECK_EQ(dp_libsvm_next_batch(r, b, err), 4);
    CHECK(b->keys[0] == first);
    CHECK_EQ(b->lines[0], 1);
    for (int epoch = 0; epoch < 3; epoch++) {
        CHECK_EQ(dp_libsvm_rewind(r, err), 0);
        CHECK_EQ(dp_libsvm_next_batch(r, b, err), 4);
        CHECK_EQ(dp_libsvm_next_batch(r, b, err), 2);
        CHECK_EQ(b->lines[1], 8);
        CHECK_EQ(dp_libsvm_next_batch(r, b, err), 0);
    }
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
}

/* One bad line each: the error names the file, the line and what is wrong;
 * the samples before it come out first, and the reader stays failed until
 * rewound. */
static void s_error(const char *name, const char *text, size_t len, const char *want)
{
    char err[DP_ERR_LEN] = "", expect[DP_ERR_LEN];
    const char *path = s_file(name, text, len);
    snprintf(expect, sizeof expect, "%s:%s", path, want);
    dp_libsvm_t *r;
    CHECK_EQ(dp_libsvm_open(&r, path, 4, 64, err), 0);
    if (!r) return;
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(1, 4);
    long got;
    while ((got = dp_libsvm_next_batch(r, b, err)) > 0) {}
    CHECK_EQ(got, -1);
    CHECK_EQ(b->n, 0);
    CHECK_STR(err, expect);
    err[0] = '\0';
    CHECK_EQ(dp_libsvm_next_batch(r, b, err), -1);
    CHECK_STR(err, expect);
    uint64_t s, z;
    CHECK_EQ(dp_libsvm_count(r, &s, &z, err), -1);
    CHECK_STR(err, expect);
    CHECK_EQ(dp_libsvm_rewind(r, err), 0);
    CHECK_EQ(dp_libsvm_next_batch(r, b, err), 1); /* every case's first line is good */
    CHECK_EQ(b->lines[0], 1);
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
}

static void test_errors(void)
{
    const char *ok = "1 1:1\n# fine\n\n0 2:1\n"; /* 4 lines */
    char text[1024];
#define BAD(line, want)                                                        \
    (snprintf(text, sizeof text, "%s%s", ok, line), s_error("bad.svm", text, 0, want))
    BAD("2 1:1\n", "5: label \"2\" is not 0/1 or -1/+1");
    BAD("yes 1:1\n", "5: label \"yes\" is not 0/1 or -1/+1");
    BAD("nan 1:1\n", "5: label \"nan\" is not 0/1 or -1/+1");
    BAD("1 1:1 7\n", "5: token \"7\" is not KEY:VALUE");
    BAD("1 12x:1\n", "5: key \"12x\" is not an unsigned integer");
    BAD("1 -3:1\n", "5: key \"-3\" is not an unsigned integer");
    BAD("1 :1\n", "5: key \"\" is not an unsigned integer");
    BAD("1 18446744073709551616:1\n", "5: key \"18446744073709551616\" is larger than 2^64 - 1");
    BAD("1 3:abc\n", "5: value \"abc\" of key 3 is not a number");
    BAD("1 3:\n", "5: value \"\" of key 3 is not a number");
    BAD("1 3:1:2\n", "5: value \"1:2\" of key 3 is not a number");
    BAD("1 3:nan\n", "5: value \"nan\" of key 3 is not a number");
    BAD("1 3:inf\n", "5: value \"inf\" of key 3 is not a number");
    BAD("1 3:1e39\n", "5: value \"1e39\" of key 3 is not a finite float");
    BAD("1 3:1 9:2 3:4\n", "5: key 3 appears twice");
    BAD("1 1:1 2:1 3:1 4:1 5:1\n", "5: more than 4 features (the reader's bound)");
    BAD("1 qid:x 1:1\n", "5: \"qid:x\": qid is not an unsigned integer");
    /* 64 bytes is the bound: 65 (a CR not counted) is too long, with or
     * without a newline at the end; 64 and a CR is not */
    char longl[600];
    memset(longl, ' ', sizeof longl);
    memcpy(longl, "1 1:1", 5);
    strcpy(longl + 65, "\r\n");
    BAD(longl, "5: line longer than 64 bytes (the reader's bound)");
    longl[65] = '\0';
    BAD(longl, "5: line longer than 64 bytes (the reader's bound)");
    strcpy(longl + 64, "\r\n1 2:1 7:x\n");
    BAD(longl, "6: value \"x\" of key 7 is not a number");
    /* far longer than the read window's line room */
    memset(longl, '1', sizeof longl - 1);
    longl[sizeof longl - 1] = '\0';
    BAD(longl, "5: line longer than 64 bytes (the reader's bound)");
    /* the error in the middle of a gzip file: the same line */
    snprintf(text, sizeof text, "%s1 2:x\n1 1:1\n", ok);
    s_error("bad.svm.gz", text, 0, "5: value \"x\" of key 2 is not a number");
    /* a NUL byte */
    s_error("nul.svm", "1 1:1\n1 2:\0\n", 11, "2: a NUL byte (not a text file?)");
#undef BAD
}

static void test_truncated_gzip(void)
{
    char err[DP_ERR_LEN] = "";
    const char *path = s_file("trunc.svm.gz", "1 1:1\n0 2:1\n1 3:1\n", 0);
    uint8_t *data;
    size_t len;
    CHECK_EQ(dp_read_file(path, &data, &len, err), 0);
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len - 6, f); /* the trailer's CRC and size cut */
    fclose(f);
    free(data);
    dp_libsvm_t *r;
    CHECK_EQ(dp_libsvm_open(&r, path, 4, 64, err), 0);
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(8, 8);
    long got;
    while ((got = dp_libsvm_next_batch(r, b, err)) > 0) {}
    CHECK_EQ(got, -1);
    CHECK(strstr(err, "trunc.svm.gz: read error after line 3: unexpected end of file") != NULL);
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
    /* a missing file */
    CHECK_EQ(dp_libsvm_open(&r, s_path("none.svm"), 4, 64, err), -1);
    CHECK(strstr(err, "none.svm: cannot open: No such file or directory") != NULL);
}

/* 2^64 - 1 is a key; 2^64 is refused (test_errors), and so is 2^64 + 5. */
static void test_key_range(void)
{
    char err[DP_ERR_LEN] = "";
    s_all_t a;
    CHECK_EQ(s_read_all(s_file("max.svm", "1 18446744073709551615:2.5 18446744073709551614:1\n", 0),
                        4, 8, &a, err), 1);
    CHECK(a.key[0] == UINT64_MAX);
    CHECK(a.key[1] == UINT64_MAX - 1);
    CHECK(a.value[0] == 2.5f);
    CHECK_EQ(s_read_all(s_file("over.svm", "1 1:1\n1 18446744073709551621:1\n", 0), 4, 8, &a, err), -1);
    CHECK(strstr(err, ":2: key \"18446744073709551621\" is larger than 2^64 - 1") != NULL);
}

/* 50,000 lines (5 MB) read in batches of 7: the reader's memory is what open
 * gave it, the batch's arrays stay where they were, and the heap does not
 * grow by a byte once reading has started (zlib's buffers come with the
 * first read). */
static void test_bounded_memory(void)
{
    char err[DP_ERR_LEN] = "";
    const char *path = s_path("many.svm");
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 50000; i++) {
        fprintf(f, "%d", i % 2);
        for (int k = 0; k < 1 + i % 8; k++) fprintf(f, " %d:%d.5", i * 8 + k, k);
        fputc('\n', f);
    }
    fclose(f);
    dp_libsvm_t *r;
    CHECK_EQ(dp_libsvm_open(&r, path, 8, 200, err), 0);
    size_t held = dp_libsvm_memory(r);
    /* the bound: the read window (a line, CR LF, 64 KiB) and three
     * arrays of 8 features, the struct and the path */
    CHECK(held <= 200 + 2 + 65536 + 8 * 20 + 8192 + strlen(path) + 1);
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(7, 7 * 8);
    const void *ptrs[5] = {b->labels, b->offsets, b->keys, b->values, b->lines};
    CHECK_EQ(dp_libsvm_next_batch(r, b, err), 7);
    size_t heap = mallinfo2().uordblks;
    long got, total = 7;
    uint64_t nnz = 0, want_nnz = 0;
    while ((got = dp_libsvm_next_batch(r, b, err)) > 0) {
        total += got;
        nnz += b->offsets[b->n];
        if (b->n > b->cap || b->offsets[b->n] > b->nnz_cap) CHECK(0);
    }
    CHECK_EQ(mallinfo2().uordblks, heap);
    CHECK_EQ(got, 0);
    CHECK_EQ(total, 50000);
    for (int i = 7; i < 50000; i++) want_nnz += 1 + i % 8;
    CHECK_EQ(nnz, want_nnz);
    CHECK_EQ(dp_libsvm_memory(r), held);
    const void *now[5] = {b->labels, b->offsets, b->keys, b->values, b->lines};
    CHECK(memcmp(ptrs, now, sizeof ptrs) == 0);
    /* another epoch: still not a byte more */
    CHECK_EQ(dp_libsvm_rewind(r, err), 0);
    while ((got = dp_libsvm_next_batch(r, b, err)) > 0) {}
    CHECK_EQ(mallinfo2().uordblks, heap);
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
}

/* dp_libsvm_sort against qsort on random keys with repeats, values along. */
static int s_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void test_sort(void)
{
    uint64_t keys[300], ref[300];
    float values[300];
    uint64_t x = 12345;
    for (size_t n = 0; n <= 300; n += n < 10 ? 1 : 37) {
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            keys[i] = ref[i] = (x >> 33) % (n + 3) * 0x9e3779b97f4a7c15ULL;
            values[i] = (float)(keys[i] >> 40);
        }
        qsort(ref, n, sizeof *ref, s_cmp_u64);
        dp_libsvm_sort(keys, values, n);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= keys[i] == ref[i] && values[i] == (float)(keys[i] >> 40);
        CHECK(same);
    }
}

/* A file from outside (tests/integration/test_gen_libsvm.sh, on what
 * `downpour gen-libsvm` wrote): DP_TEST_LIBSVM names it,
 * DP_TEST_LIBSVM_SAMPLES and DP_TEST_LIBSVM_NNZ say what it must hold. Read
 * whole with batches of 100, then counted: the same samples, each with
 * exactly NNZ features, keys strictly ascending, labels 0/1. */
static void test_file_from_env(void)
{
    const char *path = getenv("DP_TEST_LIBSVM"), *samples = getenv("DP_TEST_LIBSVM_SAMPLES"),
               *nnz = getenv("DP_TEST_LIBSVM_NNZ");
    if (!path || !samples || !nnz) SKIP("DP_TEST_LIBSVM, _SAMPLES and _NNZ unset (test_gen_libsvm.sh sets them)");
    char err[DP_ERR_LEN] = "";
    long want_n = atol(samples), want_nnz = atol(nnz);
    dp_libsvm_t *r;
    CHECK_EQ(dp_libsvm_open(&r, path, (size_t)want_nnz, 0, err), 0);
    if (!r) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    dp_libsvm_batch_t *b = dp_libsvm_batch_new(100, 100 * (size_t)want_nnz);
    long n = 0, got, positives = 0;
    int shape = 1;
    while ((got = dp_libsvm_next_batch(r, b, err)) > 0) {
        for (size_t i = 0; i < b->n; i++, n++) {
            shape &= (long)(b->offsets[i + 1] - b->offsets[i]) == want_nnz;
            shape &= b->labels[i] == 0 || b->labels[i] == 1;
            positives += b->labels[i] == 1;
            for (size_t k = b->offsets[i] + 1; k < b->offsets[i + 1]; k++) shape &= b->keys[k] > b->keys[k - 1];
        }
    }
    CHECK_STR(err, "");
    CHECK_EQ(got, 0);
    CHECK_EQ(n, want_n);
    CHECK(shape);
    CHECK(positives > 0 && positives < n);
    uint64_t count, total;
    CHECK_EQ(dp_libsvm_count(r, &count, &total, err), 0);
    CHECK_EQ(count, want_n);
    CHECK_EQ(total, (uint64_t)want_n * (uint64_t)want_nnz);
    dp_libsvm_batch_destroy(&b);
    dp_libsvm_close(&r);
}

DP_TESTS(T(test_token_forms), T(test_labels_both_conventions), T(test_crlf), T(test_gzip),
         T(test_batch_boundaries), T(test_rewind_and_count), T(test_errors), T(test_truncated_gzip),
         T(test_key_range), T(test_bounded_memory), T(test_sort), T(test_file_from_env))
