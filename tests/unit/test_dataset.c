/* test_dataset: IDX (plain and gzip) and CIFAR-10 readers on small files
 * written here, every validation error, gather, and (when Debian's package
 * is installed) the real Fashion-MNIST. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "common/dataset.h"
#include "common/util.h"
#include "tests/test.h"

static char s_dir[64];

static const char *s_tmpdir(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/dp_test_dataset.XXXXXX");
    if (!mkdtemp(s_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    return s_dir;
}

static void s_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            s_rmtree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Write bytes to path, gzip-compressed when the name ends in .gz. */
static void s_write(const char *path, const uint8_t *data, size_t len)
{
    size_t pl = strlen(path);
    if (pl > 3 && strcmp(path + pl - 3, ".gz") == 0) {
        gzFile gz = gzopen(path, "wb");
        if (!gz || (len && gzwrite(gz, data, (unsigned)len) != (int)len) || gzclose(gz) != Z_OK) {
            fprintf(stderr, "cannot write %s\n", path);
            exit(1);
        }
        return;
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

static void s_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* IDX images: magic, n (header) and the first `items` images of r x c
 * (pixel = i*7 + j), plus `extra` trailing bytes. */
static void s_write_images(const char *path, uint32_t magic, uint32_t n, int r, int c,
                           uint32_t items, int extra)
{
    size_t len = 16 + (size_t)items * r * c + extra;
    uint8_t *b = dp_calloc(len, 1);
    s_be32(b, magic);
    s_be32(b + 4, n);
    s_be32(b + 8, (uint32_t)r);
    s_be32(b + 12, (uint32_t)c);
    for (size_t i = 0; i < (size_t)items * r * c; i++) b[16 + i] = (uint8_t)(i * 7 + i / 3);
    s_write(path, b, len);
    free(b);
}

/* IDX labels: magic, n, the first `items` labels (i % classes, first one
 * replaced by first_label when >= 0). */
static void s_write_labels(const char *path, uint32_t magic, uint32_t n, uint32_t items,
                           int first_label, int extra)
{
    size_t len = 8 + items + extra;
    uint8_t *b = dp_calloc(len, 1);
    s_be32(b, magic);
    s_be32(b + 4, n);
    for (uint32_t i = 0; i < items; i++) b[8 + i] = (uint8_t)(i % 10);
    if (items && first_label >= 0) b[8] = (uint8_t)first_label;
    s_write(path, b, len);
    free(b);
}

static char *s_path(const char *dir, const char *name)
{
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void test_idx_plain_and_gz(void)
{
    const char *d = s_tmpdir();
    char err[DP_ERR_LEN] = "", spec[600];
    /* train: gzip; test: plain, 4x3 images */
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, -1, 0);
    s_write_images(s_path(d, "t10k-images-idx3-ubyte"), 0x803, 3, 4, 3, 3, 0);
    s_write_labels(s_path(d, "t10k-labels-idx1-ubyte"), 0x801, 3, 3, 9, 0);
    snprintf(spec, sizeof spec, "mnist:%s", d);

    dp_dataset_t ds;
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err), 0);
    CHECK_STR(ds.name, "mnist");
    CHECK_EQ(ds.n, 5);
    CHECK_EQ(ds.c, 1);
    CHECK_EQ(ds.h, 4);
    CHECK_EQ(ds.w, 3);
    CHECK_EQ(ds.classes, 10);
    CHECK_EQ(ds.labels[4], 4);
    CHECK_EQ(ds.pixels[13], (uint8_t)(13 * 7 + 13 / 3));

    int idx[2] = {4, 1}, lab[2];
    float out[2 * 12];
    dp_dataset_gather(&ds, idx, 2, out, lab);
    CHECK_EQ(lab[0], 4);
    CHECK_EQ(lab[1], 1);
    int ok = 1;
    for (int i = 0; i < 12; i++) {
        ok &= out[i] == (float)ds.pixels[4 * 12 + i] / 255.0f;
        ok &= out[12 + i] == (float)ds.pixels[12 + i] / 255.0f;
    }
    CHECK(ok);
    dp_dataset_fini(&ds);
    dp_dataset_fini(&ds); /* safe twice */
    CHECK(ds.pixels == NULL && ds.n == 0);

    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TEST, err), 0);
    CHECK_EQ(ds.n, 3);
    CHECK_EQ(ds.labels[0], 9);
    dp_dataset_fini(&ds);

    /* FILE.gz is preferred over FILE. */
    s_write_images(s_path(d, "t10k-images-idx3-ubyte.gz"), 0x803, 2, 4, 3, 2, 0);
    s_write_labels(s_path(d, "t10k-labels-idx1-ubyte.gz"), 0x801, 2, 2, -1, 0);
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TEST, err), 0);
    CHECK_EQ(ds.n, 2);
    dp_dataset_fini(&ds);

    /* fashion-mnist:DIR reads the same names. */
    snprintf(spec, sizeof spec, "fashion-mnist:%s", d);
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err), 0);
    CHECK_STR(ds.name, "fashion-mnist");
    CHECK_EQ(ds.n, 5);
    dp_dataset_fini(&ds);

    /* idx:IMAGES,LABELS[,CLASSES], names given with or without .gz */
    snprintf(spec, sizeof spec, "idx:%s/train-images-idx3-ubyte,%s/train-labels-idx1-ubyte.gz,4",
             d, d);
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TEST, err), -1); /* label 4 >= 4 classes */
    CHECK(strstr(err, "label 4 of sample 4 is out of range (4 classes)") != NULL);
    snprintf(spec, sizeof spec, "idx:%s/train-images-idx3-ubyte,%s/train-labels-idx1-ubyte.gz",
             d, d);
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TEST, err), 0);
    CHECK_STR(ds.name, "idx");
    CHECK_EQ(ds.n, 5);
    dp_dataset_fini(&ds);
    s_rmtree(d);
}

/* Write a train pair into a fresh dir with the given faults; load; expect an
 * error containing each of want[] (NULL-terminated). */
static void s_expect_error(const char *what, void (*make)(const char *dir), const char *const *want)
{
    const char *d = s_tmpdir();
    char err[DP_ERR_LEN] = "", spec[600];
    make(d);
    snprintf(spec, sizeof spec, "mnist:%s", d);
    dp_dataset_t ds;
    int rc = dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err);
    CHECK_EQ(rc, -1);
    CHECK(ds.pixels == NULL && ds.labels == NULL && ds.n == 0);
    CHECK(strchr(err, '\n') == NULL);
    fprintf(stderr, "  %-22s -> %s\n", what, err);
    for (int i = 0; want[i]; i++)
        if (!strstr(err, want[i])) {
            CHECK(strstr(err, want[i]) != NULL);
            fprintf(stderr, "  %s: error \"%s\" lacks \"%s\"\n", what, err, want[i]);
        }
    dp_dataset_fini(&ds);
    s_rmtree(d);
}

static void mk_bad_magic(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x801, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, -1, 0);
}
static void mk_bad_label_magic(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte"), 0x803, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte"), 0x12345678, 5, 5, -1, 0);
}
static void mk_trunc_images_gz(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 4, 5);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, -1, 0);
}
static void mk_trunc_images_plain(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte"), 0x803, 5, 4, 3, 2, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte"), 0x801, 5, 5, -1, 0);
}
static void mk_trunc_labels(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 3, -1, 0);
}
static void mk_trunc_header(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
    uint8_t b[6] = {0, 0, 8, 1, 0, 0};
    s_write(s_path(d, "train-labels-idx1-ubyte.gz"), b, sizeof b);
}
static void mk_trailing(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, -1, 2);
}
static void mk_count_mismatch(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 6, 6, -1, 0);
}
static void mk_label_range(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, 10, 0);
}
static void mk_missing_labels(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
}
static void mk_bad_dims(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 0, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, -1, 0);
}
static void mk_huge_count(const char *d)
{
    /* Header claims 2^31-1 images of 4096x4096: refused by the cap before
     * any data is read, not an attempt to allocate 32 PB. */
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 0x7fffffff, 4096, 4096, 0, 100);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, -1, 0);
}
static void mk_corrupt_gz(const char *d)
{
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 5, 4, 3, 5, 0);
    s_write_labels(s_path(d, "train-labels-idx1-ubyte.gz"), 0x801, 5, 5, -1, 0);
    /* Flip bytes inside the deflate stream of the image file. */
    FILE *f = fopen(s_path(d, "train-images-idx3-ubyte.gz"), "r+b");
    fseek(f, 12, SEEK_SET);
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
}
static void mk_gz_cut(const char *d)
{
    /* A gzip file cut short (download interrupted). */
    char p[512];
    snprintf(p, sizeof p, "%s", s_path(d, "train-labels-idx1-ubyte.gz"));
    s_write_images(s_path(d, "train-images-idx3-ubyte.gz"), 0x803, 4000, 4, 3, 4000, 0);
    uint8_t lab[8 + 4000];
    s_be32(lab, 0x801);
    s_be32(lab + 4, 4000);
    for (int i = 0; i < 4000; i++) lab[8 + i] = (uint8_t)((i * 2654435761u) >> 28) % 10;
    s_write(p, lab, sizeof lab);
    struct stat st;
    stat(p, &st);
    CHECK_EQ(truncate(p, st.st_size / 2), 0);
}

static void test_idx_errors(void)
{
    s_expect_error("bad magic", mk_bad_magic,
                   (const char *[]){"train-images-idx3-ubyte.gz: ", "bad magic 0x00000801", NULL});
    s_expect_error("bad label magic", mk_bad_label_magic,
                   (const char *[]){"train-labels-idx1-ubyte: ", "bad magic 0x12345678", NULL});
    s_expect_error("truncated images gz", mk_trunc_images_gz,
                   (const char *[]){"train-images-idx3-ubyte.gz: ", "truncated: expected 5 images, got 4", NULL});
    s_expect_error("truncated images plain", mk_trunc_images_plain,
                   (const char *[]){"train-images-idx3-ubyte: ", "truncated: expected 5 images, got 2", NULL});
    s_expect_error("truncated labels", mk_trunc_labels,
                   (const char *[]){"train-labels-idx1-ubyte.gz: truncated: expected 5 labels, got 3", NULL});
    s_expect_error("truncated header", mk_trunc_header,
                   (const char *[]){"train-labels-idx1-ubyte.gz: truncated", "header", NULL});
    s_expect_error("trailing data", mk_trailing,
                   (const char *[]){"train-labels-idx1-ubyte.gz: trailing data", NULL});
    s_expect_error("count mismatch", mk_count_mismatch,
                   (const char *[]){"train-labels-idx1-ubyte.gz: 6 labels", "holds 5 images", NULL});
    s_expect_error("label range", mk_label_range,
                   (const char *[]){"train-labels-idx1-ubyte.gz: label 10 of sample 0 is out of range", NULL});
    s_expect_error("missing labels", mk_missing_labels,
                   (const char *[]){"train-labels-idx1-ubyte: not found", NULL});
    s_expect_error("bad dims", mk_bad_dims,
                   (const char *[]){"train-images-idx3-ubyte.gz: bad image size 0x3", NULL});
    s_expect_error("huge count", mk_huge_count,
                   (const char *[]){"train-images-idx3-ubyte.gz: the IDX header announces 2147483647 images of "
                                    "16777216 bytes, 36028797002186752 bytes in all: more than the "
                                    "4294967296 a data set may hold", NULL});
    s_expect_error("corrupt gzip", mk_corrupt_gz,
                   (const char *[]){"train-images-idx3-ubyte.gz: ", NULL});
    s_expect_error("gzip cut short", mk_gz_cut,
                   (const char *[]){"train-labels-idx1-ubyte.gz: truncated: expected 4000 labels, got ", NULL});
}

static void test_bad_specs(void)
{
    dp_dataset_t ds;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_dataset_init(&ds, "imagenet", DP_SPLIT_TRAIN, err), -1);
    CHECK(strstr(err, "unknown dataset 'imagenet'") != NULL);
    CHECK_EQ(dp_dataset_init(&ds, "mnist", DP_SPLIT_TRAIN, err), -1);
    CHECK(strstr(err, "mnist:DIR") != NULL);
    CHECK_EQ(dp_dataset_init(&ds, "cifar10", DP_SPLIT_TRAIN, err), -1);
    CHECK_EQ(dp_dataset_init(&ds, "mnist:", DP_SPLIT_TRAIN, err), -1);
    CHECK_EQ(dp_dataset_init(&ds, "idx:onlyone", DP_SPLIT_TRAIN, err), -1);
    CHECK(strstr(err, "IMAGES,LABELS") != NULL);
    CHECK_EQ(dp_dataset_init(&ds, "idx:a,b,0", DP_SPLIT_TRAIN, err), -1);
    CHECK(strstr(err, "class count") != NULL);
    CHECK_EQ(dp_dataset_init(&ds, "mnist:/nonexistent/dir", DP_SPLIT_TEST, err), -1);
    CHECK(strstr(err, "/nonexistent/dir/t10k-images-idx3-ubyte: not found") != NULL);
    CHECK(ds.n == 0 && ds.pixels == NULL);
}

/* CIFAR-10 record i: label i % 10, pixel j = (i + j) & 255. */
static void s_write_cifar(const char *path, int recs, int first, int bad_label, int cut)
{
    size_t len = (size_t)recs * 3073 - cut;
    uint8_t *b = dp_malloc(len + cut);
    for (int i = 0; i < recs; i++) {
        uint8_t *r = b + (size_t)i * 3073;
        r[0] = (uint8_t)((first + i) % 10);
        for (int j = 0; j < 3072; j++) r[1 + j] = (uint8_t)(first + i + j);
    }
    if (bad_label) b[3073] = 10;
    s_write(path, b, len);
    free(b);
}

static void test_cifar10(void)
{
    const char *d = s_tmpdir();
    char err[DP_ERR_LEN] = "", spec[600], sub[128];
    snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin", d);
    mkdir(sub, 0755);
    for (int f = 1; f <= 5; f++) {
        char name[32];
        snprintf(name, sizeof name, "data_batch_%d.bin", f);
        s_write_cifar(s_path(sub, name), 2, 2 * (f - 1), 0, 0);
    }
    s_write_cifar(s_path(sub, "test_batch.bin.gz"), 3, 100, 0, 0);
    dp_dataset_t ds;
    snprintf(spec, sizeof spec, "cifar10:%s", d); /* the tarball's parent dir works */
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err), 0);
    CHECK_STR(ds.name, "cifar10");
    CHECK_EQ(ds.n, 10);
    CHECK_EQ(ds.c, 3);
    CHECK_EQ(ds.h, 32);
    CHECK_EQ(ds.w, 32);
    CHECK_EQ(ds.classes, 10);
    int ok = 1;
    for (int i = 0; i < 10; i++) {
        ok &= ds.labels[i] == i % 10;
        for (int j = 0; j < 3072; j += 511) ok &= ds.pixels[(size_t)i * 3072 + j] == (uint8_t)(i + j);
    }
    CHECK(ok);
    int idx[1] = {7}, lab[1];
    float out[3072];
    dp_dataset_gather(&ds, idx, 1, out, lab);
    CHECK_EQ(lab[0], 7);
    CHECK(out[1024] == (float)(uint8_t)(7 + 1024) / 255.0f); /* G plane starts at 1024 */
    dp_dataset_fini(&ds);

    snprintf(spec, sizeof spec, "cifar10:%s", sub);
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TEST, err), 0);
    CHECK_EQ(ds.n, 3);
    CHECK_EQ(ds.labels[0], 0);
    dp_dataset_fini(&ds);

    s_write_cifar(s_path(sub, "data_batch_3.bin"), 2, 0, 0, 100);
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err), -1);
    CHECK(strstr(err, "data_batch_3.bin: truncated") != NULL);
    CHECK(ds.n == 0 && ds.pixels == NULL);
    s_write_cifar(s_path(sub, "data_batch_3.bin"), 2, 0, 1, 0);
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err), -1);
    CHECK(strstr(err, "data_batch_3.bin: label 10 of record 1 is out of range") != NULL);
    unlink(s_path(sub, "data_batch_3.bin"));
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err), -1);
    CHECK(strstr(err, "data_batch_3.bin: not found") != NULL);
    s_rmtree(d);
}

static void test_real_fashion_mnist(void)
{
    struct stat st;
    if (stat(DP_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", &st) != 0)
        SKIP(DP_FASHION_MNIST_DIR " not installed (Debian package dataset-fashion-mnist)");
    dp_dataset_t tr, te;
    char err[DP_ERR_LEN] = "";
    double t0 = dp_now();
    int rc = dp_dataset_init(&tr, "fashion-mnist", DP_SPLIT_TRAIN, err);
    double dt = dp_now() - t0;
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    fprintf(stderr, "  loaded 60000 training images in %.3f s\n", dt);
    CHECK(dt < 5.0); /* well under a second when the machine is idle */
    CHECK_EQ(tr.n, 60000);
    CHECK_EQ(tr.c * tr.h * tr.w, 784);
    /* The whole test split, whatever the suite's hook asks (below). */
    char *hook = getenv("DP_TEST_TEST_SAMPLES");
    hook = hook ? strdup(hook) : NULL;
    unsetenv("DP_TEST_TEST_SAMPLES");
    CHECK_EQ(dp_dataset_init(&te, "fashion-mnist", DP_SPLIT_TEST, err), 0);
    CHECK_EQ(te.n, 10000);
    /* The suite's hook keeps the test split's first N samples, and only the
     * test split's. */
    dp_dataset_t cut;
    setenv("DP_TEST_TEST_SAMPLES", "1000", 1);
    CHECK_EQ(dp_dataset_init(&cut, "fashion-mnist", DP_SPLIT_TEST, err), 0);
    CHECK_EQ(cut.n, 1000);
    CHECK_EQ(memcmp(cut.labels, te.labels, 1000 * sizeof *cut.labels), 0);
    dp_dataset_fini(&cut);
    CHECK_EQ(dp_dataset_init(&cut, "fashion-mnist", DP_SPLIT_TRAIN, err), 0);
    CHECK_EQ(cut.n, 60000);
    dp_dataset_fini(&cut);
    if (hook) setenv("DP_TEST_TEST_SAMPLES", hook, 1);
    else unsetenv("DP_TEST_TEST_SAMPLES");
    free(hook);
    /* Fashion-MNIST is balanced: 6000 / 1000 per class. */
    int ctr[10] = {0}, cte[10] = {0};
    for (int i = 0; i < tr.n; i++) ctr[tr.labels[i]]++;
    for (int i = 0; i < te.n; i++) cte[te.labels[i]]++;
    int bal = 1;
    for (int k = 0; k < 10; k++) bal &= ctr[k] == 6000 && cte[k] == 1000;
    CHECK(bal);
    /* First training label of Fashion-MNIST is 9 (ankle boot), first test label 9 too. */
    CHECK_EQ(tr.labels[0], 9);
    CHECK_EQ(te.labels[0], 9);
    dp_dataset_fini(&tr);
    dp_dataset_fini(&te);
}

/* Serve bytes[0..len) through the FIFO at path from a child process; the
 * child reports how many bytes the reader took (written before the reader
 * closed its end) through *report. Its pid. */
static pid_t s_serve_fifo(const char *path, const uint8_t *bytes, size_t len, int *report)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        signal(SIGPIPE, SIG_IGN); /* a reader that stops early: EPIPE */
        int fd = open(path, O_WRONLY);
        size_t sent = 0;
        while (fd >= 0 && sent < len) {
            size_t k = len - sent < 4096 ? len - sent : 4096;
            ssize_t w = write(fd, bytes + sent, k);
            if (w <= 0) break;
            sent += (size_t)w;
        }
        ssize_t ok = write(fds[1], &sent, sizeof sent);
        _exit(ok == (ssize_t)sizeof sent ? 0 : 1);
    }
    close(fds[1]);
    *report = fds[0];
    return pid;
}

/* Load idx:FIFO,LABELS while a child feeds the FIFO the gzip of raw[0..len);
 * the bytes of that stream the reader consumed (of *total). */
static size_t s_load_through_fifo(const char *d, const uint8_t *raw, size_t len, size_t *total,
                                  char *err)
{
    char fifo[600], spec[1300];
    snprintf(fifo, sizeof fifo, "%s", s_path(d, "images.fifo"));
    s_write(s_path(d, "bomb.gz"), raw, len);
    uint8_t *gz = NULL;
    size_t gz_len = 0;
    if (dp_read_file(s_path(d, "bomb.gz"), &gz, &gz_len, err) != 0 || mkfifo(fifo, 0600) != 0)
        return (size_t)-1;
    int report = -1;
    pid_t pid = s_serve_fifo(fifo, gz, gz_len, &report);
    snprintf(spec, sizeof spec, "idx:%s,%s", fifo, s_path(d, "labels"));
    dp_dataset_t ds;
    CHECK_EQ(dp_dataset_init(&ds, spec, DP_SPLIT_TRAIN, err), -1);
    /* Unblock a writer still waiting for a reader, then take its count. */
    int fd = open(fifo, O_RDONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
    size_t sent = (size_t)-1;
    if (read(report, &sent, sizeof sent) != (ssize_t)sizeof sent) sent = (size_t)-1;
    close(report);
    waitpid(pid, NULL, 0);
    unlink(fifo);
    free(gz);
    *total = gz_len;
    return sent;
}

/* A gzip bomb costs what its IDX header announces, never more: a header
 * past DP_DATASET_MAX_BYTES is refused before its data is decompressed
 * (the reader takes what zlib's input buffers hold, 832 KiB here with the
 * FIFO's 64 KiB, of a 16 MiB stream; before, it decompressed the stream to
 * its end), and a stream
 * longer than its header is refused one byte past what the header says.
 * Measured by the compressed bytes the reader took from a FIFO. The data is
 * incompressible so that consumed bytes are produced bytes; a stream of
 * zeros would produce 1000 times as many. */
static void test_gzip_bomb_is_bounded(void)
{
    const char *d = s_tmpdir();
    char err[DP_ERR_LEN] = "";
    s_write_labels(s_path(d, "labels"), 0x801, 10, 10, -1, 0);
    size_t len = (size_t)16 << 20, total = 0;
    uint8_t *raw = dp_malloc(len);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift: does not compress */
        raw[i] = (uint8_t)(x >> 32);
    }
    /* 2,000,000 images of 64x64: 8.2 GB announced, over the cap */
    s_be32(raw, 0x803);
    s_be32(raw + 4, 2000000);
    s_be32(raw + 8, 64);
    s_be32(raw + 12, 64);
    size_t took = s_load_through_fifo(d, raw, len, &total, err);
    fprintf(stderr, "  over the cap: took %zu of %zu bytes: %s\n", took, total, err);
    CHECK(strstr(err, "the IDX header announces 2000000 images of 4096 bytes, 8192000000 bytes "
                      "in all: more than the 4294967296 a data set may hold") != NULL);
    CHECK(took <= (size_t)2 << 20);
    CHECK(total > (size_t)15 << 20);
    /* 10 images of 28x28, then 16 MiB more: refused as trailing data */
    s_be32(raw + 4, 10);
    s_be32(raw + 8, 28);
    s_be32(raw + 12, 28);
    took = s_load_through_fifo(d, raw, len, &total, err);
    fprintf(stderr, "  longer stream: took %zu of %zu bytes: %s\n", took, total, err);
    CHECK(strstr(err, "trailing data after the 10 images the header announces") != NULL);
    CHECK(took <= (size_t)2 << 20);
    free(raw);
    s_rmtree(d);
}

/* --normalize: the per-channel figures of a small 2-channel set are the
 * exact mean and population std of pixel/255 (from byte histograms); the
 * gather applies (x - mean) / std per channel, bit for bit as the two float
 * ops; the text form round-trips the floats; bad lists, std 0 and NaN are
 * refused with one line naming what is wrong. */
static void test_normalize(void)
{
    dp_dataset_t ds = {0};
    snprintf(ds.name, sizeof ds.name, "synthetic");
    ds.n = 3, ds.c = 2, ds.h = 2, ds.w = 2, ds.classes = 10;
    ds.pixels = dp_malloc(3 * 8);
    ds.labels = dp_calloc(3, 1);
    for (int i = 0; i < 24; i++) ds.pixels[i] = (uint8_t)(i * 37 % 256);
    float mean[2], std[2];
    dp_dataset_channel_stats(&ds, mean, std);
    for (int c = 0; c < 2; c++) {
        double m = 0, v = 0;
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 4; i++) m += ds.pixels[s * 8 + c * 4 + i] / 255.0;
        m /= 12;
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 4; i++) v += pow(ds.pixels[s * 8 + c * 4 + i] / 255.0 - m, 2);
        CHECK_NEAR(mean[c], m, 1e-7);
        CHECK_NEAR(std[c], sqrt(v / 12), 1e-7);
    }
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_dataset_set_normalize(&ds, mean, std, err), 0);
    int idx[2] = {2, 0};
    float out[16];
    dp_dataset_gather(&ds, idx, 2, out, NULL);
    int ok = 1;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 8; i++)
            ok &= out[b * 8 + i] == ((float)ds.pixels[idx[b] * 8 + i] / 255.0f - mean[i / 4]) / std[i / 4];
    CHECK(ok);
    CHECK(dp_dataset_zero(&ds, 1) == (0.0f - mean[1]) / std[1]);
    char text[DP_DATASET_NORM_LEN];
    dp_dataset_normalize_text(&ds, text, sizeof text);
    float m2[2], s2[2];
    CHECK_EQ(dp_dataset_parse_normalize(text, 2, m2, s2, err), 0);
    CHECK(m2[0] == mean[0] && m2[1] == mean[1] && s2[0] == std[0] && s2[1] == std[1]);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"0.5,0.5", "expected train or MEAN"},    {"0.5/0.2,0.2", "2 mean values expected"},
        {"0.5,0.5/0.2", "2 std values expected"}, {"0.5,0.5/0.2,0", "std 1 is 0"},
        {"0.5,x/0.2,0.2", "mean 1 is not a number"}, {"0.5,0.5/0.2,nan", "std 1 is not a number"},
        {"0.5,0.5,0.5/0.2,0.2", "2 mean values expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK_EQ(dp_dataset_parse_normalize(bad[i].text, 2, m2, s2, err), -1);
        if (!strstr(err, bad[i].want)) fprintf(stderr, "  '%s': %s\n", bad[i].text, err);
        CHECK(strstr(err, bad[i].want) != NULL && !strchr(err, '\n'));
    }
    float zero[2] = {0.5f, 0.5f}, none[2] = {0.2f, 0.0f};
    CHECK_EQ(dp_dataset_set_normalize(&ds, zero, none, err), -1);
    CHECK(strstr(err, "channel 1") != NULL);
    dp_dataset_fini(&ds);
}

DP_TESTS(T(test_idx_plain_and_gz), T(test_idx_errors), T(test_bad_specs), T(test_cifar10),
         T(test_real_fashion_mnist), T(test_gzip_bomb_is_bounded),
         T(test_normalize))
