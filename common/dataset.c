/* dataset: IDX (plain or gzip) and CIFAR-10 binary readers into one
 * in-memory dp_dataset_t, plus the batch gather the trainers use.
 *
 * Everything goes through zlib's gz* calls, which read plain files as well
 * as gzip ones. Input files are untrusted: headers are checked before any
 * large allocation (and their implied size against DP_DATASET_MAX_BYTES),
 * buffers grow only as bytes actually arrive (so a lying header cannot make
 * us allocate gigabytes), decompression stops one byte past what the header
 * announces (so a truthful header bounds a gzip bomb), and the byte counts
 * must match the header exactly. Each error is one line "PATH: what is
 * wrong". */
#include "common/dataset.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "common/util.h"

#define S_IDX_IMAGES 0x00000803u   /* unsigned byte, 3 dims: n, rows, cols */
#define S_IDX_LABELS 0x00000801u   /* unsigned byte, 1 dim: n */
#define S_CHUNK ((size_t)16 << 20) /* first allocation / growth step cap */
#define S_MAX_SIDE 4096            /* larger image sides are surely garbage */
#define S_CIFAR_REC (1 + 3 * 32 * 32)

static int s_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* out = a + b (+ suffix); -1 with err when it does not fit. */
static int s_join(char *out, size_t cap, const char *a, const char *b, const char *suffix,
                  char *err)
{
    int k = snprintf(out, cap, "%s%s%s", a, b, suffix);
    if (k < 0 || (size_t)k >= cap) return dp_err(err, "%s%s: path too long", a, b);
    return 0;
}

/* out = DIR/NAME.gz if that exists, else DIR/NAME. */
static int s_resolve(char *out, size_t cap, const char *dir, const char *name, char *err)
{
    char d[4096];
    if (s_join(d, sizeof d, dir, "/", "", err) != 0) return -1;
    if (s_join(out, cap, d, name, ".gz", err) != 0) return -1;
    if (!s_exists(out)) return s_join(out, cap, d, name, "", err);
    return 0;
}

static int s_open(gzFile *gz, const char *path, const char *hint, char *err)
{
    if (!s_exists(path))
        return dp_err(err, "%s: not found%s", path, hint ? hint : "");
    *gz = gzopen(path, "rb");
    if (!*gz) return dp_err(err, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
    gzbuffer(*gz, 1 << 18);
    return 0;
}

/* Read up to want bytes into buf (*buf grows from *cap as data arrives).
 * *got is the count read; a short count means the file ended (a truncated
 * gzip stream counts as ended: the caller reports the shortfall). */
static int s_read(gzFile gz, const char *path, uint8_t **buf, size_t *cap, size_t want,
                  size_t *got, char *err)
{
    size_t n = 0;
    while (n < want) {
        if (n == *cap) {
            size_t grow = *cap < S_CHUNK ? (*cap ? *cap : 4096) : S_CHUNK * 4;
            *cap = want - n < grow ? want : *cap + grow;
            *buf = dp_realloc(*buf, *cap);
        }
        size_t ask = *cap - n;
        if (ask > (1u << 30)) ask = 1u << 30;
        int r = gzread(gz, *buf + n, (unsigned)ask);
        if (r <= 0) break;
        n += (size_t)r;
    }
    int errnum = Z_OK;
    const char *msg = gzerror(gz, &errnum);
    if (errnum == Z_ERRNO) return dp_err(err, "%s: read error: %s", path, strerror(errno));
    if (errnum != Z_OK && errnum != Z_BUF_ERROR) {
        /* zlib's message already starts with "PATH: ". */
        size_t pl = strlen(path);
        if (strncmp(msg, path, pl) == 0 && strncmp(msg + pl, ": ", 2) == 0) msg += pl + 2;
        return dp_err(err, "%s: corrupt gzip data: %s", path, msg);
    }
    *got = n;
    return 0;
}

/* 1 if any byte is left to read (trailing garbage), 0 if at the end. */
static int s_has_more(gzFile gz)
{
    uint8_t b;
    return gzread(gz, &b, 1) > 0;
}

static uint32_t s_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Read one IDX unsigned-byte file with the given magic. Images: dims n, rows,
 * cols (item = rows*cols bytes); labels: n (item = 1 byte). expect_n > 0:
 * the count must be that (the labels of images already read), checked
 * before the data is decompressed. */
static int s_read_idx(const char *path, const char *hint, uint32_t magic, const char *what,
                      int expect_n, const char *expect_of, uint8_t **data, int *n_out,
                      int *rows, int *cols, char *err)
{
    gzFile gz = NULL;
    uint8_t *buf = NULL;
    int rc = -1;
    if (s_open(&gz, path, hint, err) != 0) return -1;

    int ndim = magic == S_IDX_IMAGES ? 3 : 1;
    uint8_t hdr[16];
    size_t hlen = 4 + 4 * (size_t)ndim, cap = 0, got = 0;
    uint8_t *hp = NULL;
    int hr = s_read(gz, path, &hp, &cap, hlen, &got, err);
    if (hr == 0) memcpy(hdr, hp, got);
    free(hp);
    if (hr != 0) goto out;
    if (got >= 4 && s_be32(hdr) != magic) {
        uint32_t m = s_be32(hdr);
        const char *is = m == S_IDX_IMAGES ? " (an IDX image file)"
                         : m == S_IDX_LABELS ? " (an IDX label file)" : "";
        dp_err(err, "%s: bad magic 0x%08x%s, expected 0x%08x for IDX %s", path, m, is, magic, what);
        goto out;
    }
    if (got < hlen) {
        dp_err(err, "%s: truncated: only %zu bytes, an IDX %s header needs %zu", path, got, what,
               hlen);
        goto out;
    }
    uint32_t n = s_be32(hdr + 4), r = 1, c = 1;
    if (ndim == 3) {
        r = s_be32(hdr + 8);
        c = s_be32(hdr + 12);
        if (r < 1 || c < 1 || r > S_MAX_SIDE || c > S_MAX_SIDE) {
            dp_err(err, "%s: bad image size %ux%u in the IDX header", path, r, c);
            goto out;
        }
    }
    if (n < 1 || n > INT_MAX) {
        dp_err(err, "%s: bad %s count %u in the IDX header", path, what, n);
        goto out;
    }
    if (expect_n > 0 && n != (uint32_t)expect_n) {
        dp_err(err, "%s: %u %s, but %s holds %d images", path, n, what, expect_of, expect_n);
        goto out;
    }
    size_t item = (size_t)r * c, want = (size_t)n * item; /* < 2^31 * 2^24: no wrap */
    if (want > DP_DATASET_MAX_BYTES) {
        dp_err(err, "%s: the IDX header announces %u %s of %zu bytes, %zu bytes in all: more "
               "than the %zu a data set may hold (a forged or foreign header?)", path, n, what,
               item, want, DP_DATASET_MAX_BYTES);
        goto out;
    }
    cap = want < S_CHUNK ? want : S_CHUNK;
    buf = dp_malloc(cap);
    if (s_read(gz, path, &buf, &cap, want, &got, err) != 0) goto out;
    if (got < want) {
        dp_err(err, "%s: truncated: expected %u %s, got %zu%s", path, n, what, got / item,
               got % item ? " and part of one more" : "");
        goto out;
    }
    if (s_has_more(gz)) {
        dp_err(err, "%s: trailing data after the %u %s the header announces", path, n, what);
        goto out;
    }
    *data = buf;
    buf = NULL;
    *n_out = (int)n;
    if (rows) *rows = (int)r;
    if (cols) *cols = (int)c;
    rc = 0;
out:
    free(buf);
    gzclose(gz);
    return rc;
}

static int s_load_idx(dp_dataset_t *ds, const char *img_path, const char *lab_path,
                      const char *hint, int classes, char *err)
{
    int ni = 0, nl = 0, r = 0, c = 0;
    if (s_read_idx(img_path, hint, S_IDX_IMAGES, "images", 0, NULL, &ds->pixels, &ni, &r, &c,
                   err) != 0)
        return -1;
    if (s_read_idx(lab_path, hint, S_IDX_LABELS, "labels", ni, img_path, &ds->labels, &nl, NULL,
                   NULL, err) != 0)
        return -1;
    if (ni != nl)
        return dp_err(err, "%s: %d labels, but %s holds %d images", lab_path, nl, img_path, ni);
    for (int i = 0; i < nl; i++)
        if (ds->labels[i] >= classes)
            return dp_err(err, "%s: label %d of sample %d is out of range (%d classes)", lab_path,
                          ds->labels[i], i, classes);
    ds->n = ni;
    ds->c = 1;
    ds->h = r;
    ds->w = c;
    ds->classes = classes;
    return 0;
}

static int s_load_mnist(dp_dataset_t *ds, const char *dir, dp_split_t split, const char *hint,
                        char *err)
{
    const char *pre = split == DP_SPLIT_TRAIN ? "train" : "t10k";
    char names[2][64], img[4096], lab[4096];
    snprintf(names[0], sizeof names[0], "%s-images-idx3-ubyte", pre);
    snprintf(names[1], sizeof names[1], "%s-labels-idx1-ubyte", pre);
    if (s_resolve(img, sizeof img, dir, names[0], err) != 0 ||
        s_resolve(lab, sizeof lab, dir, names[1], err) != 0)
        return -1;
    return s_load_idx(ds, img, lab, hint, 10, err);
}

/* CIFAR-10 binary: records of 1 label byte + 3072 pixel bytes (R, G, B
 * planes of 32x32), any number of records per file. */
static int s_load_cifar(dp_dataset_t *ds, const char *dir_in, dp_split_t split, char *err)
{
    char dir[4096], path[4096], first[4096], sub[4096];
    const char *first_name = split == DP_SPLIT_TRAIN ? "data_batch_1.bin" : "test_batch.bin";
    if (s_join(dir, sizeof dir, dir_in, "", "", err) != 0 ||
        s_join(sub, sizeof sub, dir_in, "/cifar-10-batches-bin", "", err) != 0 ||
        s_resolve(first, sizeof first, dir, first_name, err) != 0)
        return -1;
    /* The official tarball unpacks into cifar-10-batches-bin/: accept its parent. */
    if (!s_exists(first)) {
        if (s_resolve(first, sizeof first, sub, first_name, err) != 0) return -1;
        if (s_exists(first)) memcpy(dir, sub, sizeof dir);
    }
    int n_files = split == DP_SPLIT_TRAIN ? 5 : 1;
    size_t n = 0, cap_n = 0;
    for (int f = 0; f < n_files; f++) {
        char name[32];
        if (split == DP_SPLIT_TRAIN)
            snprintf(name, sizeof name, "data_batch_%d.bin", f + 1);
        else
            snprintf(name, sizeof name, "test_batch.bin");
        gzFile gz = NULL;
        if (s_resolve(path, sizeof path, dir, name, err) != 0 || s_open(&gz, path, NULL, err) != 0)
            return -1;
        uint8_t *buf = NULL;
        size_t cap = 0, got = 0;
        /* The records the data set may still hold bound what a (garbage)
         * file can make us decompress and keep. */
        size_t limit = (DP_DATASET_MAX_BYTES / (S_CIFAR_REC - 1) - n) * S_CIFAR_REC;
        int rc = s_read(gz, path, &buf, &cap, limit, &got, err);
        int more = rc == 0 && got == limit && s_has_more(gz);
        gzclose(gz);
        if (rc != 0 || more || got == 0 || got % S_CIFAR_REC != 0) {
            if (rc == 0 && more)
                dp_err(err, "%s: too large: the data set would pass the %zu bytes of pixels it "
                       "may hold", path, DP_DATASET_MAX_BYTES);
            else if (rc == 0 && got == 0) dp_err(err, "%s: empty", path);
            else if (rc == 0)
                dp_err(err, "%s: truncated: %zu bytes is not a whole number of %d-byte records "
                       "(1 label + 3x32x32 pixels)", path, got, S_CIFAR_REC);
            free(buf);
            return -1;
        }
        size_t recs = got / S_CIFAR_REC;
        if (n + recs > INT_MAX) {
            free(buf);
            return dp_err(err, "%s: too many samples", path);
        }
        if (n + recs > cap_n) {
            cap_n = n + recs;
            if (f + 1 < n_files) cap_n += recs * (size_t)(n_files - f - 1); /* guess: equal batches */
            ds->pixels = dp_realloc(ds->pixels, cap_n * (S_CIFAR_REC - 1));
            ds->labels = dp_realloc(ds->labels, cap_n);
        }
        for (size_t i = 0; i < recs; i++) {
            const uint8_t *rec = buf + i * S_CIFAR_REC;
            if (rec[0] >= 10) {
                dp_err(err, "%s: label %d of record %zu is out of range (10 classes)", path, rec[0], i);
                free(buf);
                return -1;
            }
            ds->labels[n + i] = rec[0];
            memcpy(ds->pixels + (n + i) * (S_CIFAR_REC - 1), rec + 1, S_CIFAR_REC - 1);
        }
        n += recs;
        free(buf);
    }
    ds->n = (int)n;
    ds->c = 3;
    ds->h = 32;
    ds->w = 32;
    ds->classes = 10;
    return 0;
}

/* "IMAGES,LABELS[,CLASSES]" */
static int s_load_idx_pair(dp_dataset_t *ds, const char *arg, char *err)
{
    char buf[4096], img[4096], lab[4096];
    if (s_join(buf, sizeof buf, arg, "", "", err) != 0) return -1;
    char *comma = strchr(buf, ',');
    if (!comma || comma == buf || comma[1] == 0)
        return dp_err(err, "dataset 'idx:%s': expected idx:IMAGES,LABELS[,CLASSES]", arg);
    *comma = 0;
    char *labels = comma + 1, *cls = strchr(labels, ',');
    int classes = 10;
    if (cls) {
        *cls++ = 0;
        char *end = NULL;
        long v = strtol(cls, &end, 10);
        if (end == cls || *end || v < 1 || v > 256)
            return dp_err(err, "dataset 'idx:%s': bad class count '%s' (1..256)", arg, cls);
        classes = (int)v;
    }
    /* An explicit name is used as given when it exists, else NAME.gz. */
    if (s_join(img, sizeof img, buf, "", s_exists(buf) ? "" : ".gz", err) != 0 ||
        s_join(lab, sizeof lab, labels, "", s_exists(labels) ? "" : ".gz", err) != 0)
        return -1;
    if (!s_exists(img)) memcpy(img, buf, strlen(buf) + 1);
    if (!s_exists(lab)) memcpy(lab, labels, strlen(labels) + 1);
    return s_load_idx(ds, img, lab, NULL, classes, err);
}

/* Test hook, read here only: DP_TEST_TEST_SAMPLES=N keeps the first N
 * samples of a test split, in every program that loads one (the worker,
 * eval, the lab), so the suite's hundreds of short runs score 1,000 images
 * at their end instead of 10,000 (four seconds of every dense run's five
 * here). The suite's accuracy bars are judged on those 1,000 (the
 * same ones every run); DP_TEST_TEST_SAMPLES=
 * (empty) scores a split whole. */
static void s_test_hook_limit(dp_dataset_t *ds)
{
    const char *v = getenv("DP_TEST_TEST_SAMPLES");
    if (v && *v) dp_dataset_limit(ds, atoi(v));
}

int dp_dataset_init(dp_dataset_t *ds, const char *spec, dp_split_t split, char *err)
{
    memset(ds, 0, sizeof *ds);
    const char *colon = strchr(spec, ':');
    size_t kind_len = colon ? (size_t)(colon - spec) : strlen(spec);
    const char *arg = colon ? colon + 1 : NULL;
    int rc;
    if (colon && *arg == 0)
        return dp_err(err, "dataset '%s': empty directory after ':'", spec);
    if (kind_len == 13 && strncmp(spec, "fashion-mnist", 13) == 0) {
        snprintf(ds->name, sizeof ds->name, "fashion-mnist");
        rc = s_load_mnist(ds, arg ? arg : DP_FASHION_MNIST_DIR, split,
                          arg ? NULL : " (install Debian's dataset-fashion-mnist: make deps)", err);
    } else if (kind_len == 5 && strncmp(spec, "mnist", 5) == 0) {
        if (!arg) return dp_err(err, "dataset 'mnist' needs its directory: mnist:DIR");
        snprintf(ds->name, sizeof ds->name, "mnist");
        rc = s_load_mnist(ds, arg, split, NULL, err);
    } else if (kind_len == 7 && strncmp(spec, "cifar10", 7) == 0) {
        if (!arg) return dp_err(err, "dataset 'cifar10' needs its directory: cifar10:DIR");
        snprintf(ds->name, sizeof ds->name, "cifar10");
        rc = s_load_cifar(ds, arg, split, err);
    } else if (kind_len == 3 && strncmp(spec, "idx", 3) == 0 && arg) {
        snprintf(ds->name, sizeof ds->name, "idx");
        rc = s_load_idx_pair(ds, arg, err);
    } else if (kind_len == 6 && strncmp(spec, "libsvm", 6) == 0) {
        /* sparse samples are no images: worker/exec/sparse_data.h reads them */
        return dp_err(err, "dataset '%s': libsvm data trains a model that starts with embed:D, "
                      "in downpour-worker and downpour local only for now", spec);
    } else {
        return dp_err(err, "unknown dataset '%s' (expected fashion-mnist[:DIR], mnist:DIR, "
                      "cifar10:DIR or idx:IMAGES,LABELS)", spec);
    }
    if (rc != 0) dp_dataset_fini(ds);
    else if (split == DP_SPLIT_TEST) s_test_hook_limit(ds);
    return rc;
}

void dp_dataset_fini(dp_dataset_t *ds)
{
    if (!ds) return;
    free(ds->pixels);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

void dp_dataset_limit(dp_dataset_t *ds, int n)
{
    if (n > 0 && n < ds->n) ds->n = n;
}

void dp_dataset_gather(const dp_dataset_t *ds, const int *idx, int B, float *out, int *labels)
{
    size_t sz = (size_t)dp_dataset_sample_size(ds);
    size_t hw = (size_t)ds->h * (size_t)ds->w;
    for (int b = 0; b < B; b++) {
        /* idx comes from our own samplers: a bad one is a bug, not input. */
        if (idx[b] < 0 || idx[b] >= ds->n) {
            fprintf(stderr, "dp_dataset_gather: index %d out of range [0, %d)\n", idx[b], ds->n);
            abort();
        }
        const uint8_t *src = ds->pixels + (size_t)idx[b] * sz;
        float *dst = out + (size_t)b * sz;
        /* Division, not multiplication by 1/255: bit-identical to torch's x/255. */
        for (size_t i = 0; i < sz; i++) dst[i] = (float)src[i] / 255.0f;
        /* then Normalize's (x - mean) / std, its two roundings */
        for (int c = 0; ds->normalized && c < ds->c; c++)
            for (size_t i = (size_t)c * hw; i < (size_t)(c + 1) * hw; i++)
                dst[i] = (dst[i] - ds->mean[c]) / ds->std[c];
        if (labels) labels[b] = ds->labels[idx[b]];
    }
}

void dp_dataset_channel_stats(const dp_dataset_t *ds, float *mean, float *std)
{
    size_t hw = (size_t)ds->h * (size_t)ds->w, sz = (size_t)dp_dataset_sample_size(ds);
    for (int c = 0; c < ds->c; c++) {
        uint64_t count[256] = {0};
        for (size_t s = 0; s < (size_t)ds->n; s++) {
            const uint8_t *p = ds->pixels + s * sz + (size_t)c * hw;
            for (size_t i = 0; i < hw; i++) count[p[i]]++;
        }
        double total = (double)ds->n * (double)hw, m = 0, v = 0;
        for (int k = 0; k < 256; k++) m += (double)count[k] * (k / 255.0);
        m /= total;
        for (int k = 0; k < 256; k++) v += (double)count[k] * (k / 255.0 - m) * (k / 255.0 - m);
        mean[c] = (float)m;
        std[c] = (float)sqrt(v / total);
    }
}

int dp_dataset_set_normalize(dp_dataset_t *ds, const float *mean, const float *std, char *err)
{
    if (ds->c > DP_DATASET_MAX_C)
        return dp_err(err, "--normalize: %s has %d channels, at most %d are normalised", ds->name, ds->c,
                      DP_DATASET_MAX_C);
    for (int c = 0; c < ds->c; c++) {
        if (!isfinite(mean[c]) || !isfinite(std[c]) || !(std[c] > 0))
            return dp_err(err, "--normalize: channel %d's mean %g / std %g: expected finite numbers, std "
                          "above 0 (a constant channel has std 0: give the values)", c, mean[c], std[c]);
        ds->mean[c] = mean[c];
        ds->std[c] = std[c];
    }
    ds->normalized = 1;
    return 0;
}

/* n comma-separated floats of text[0, len) into v. */
static int s_floats(const char *text, size_t len, int n, float *v, const char *what, char *err)
{
    char buf[DP_DATASET_NORM_LEN + 1];
    if (len >= sizeof buf) return dp_err(err, "--normalize: the %s list is too long", what);
    memcpy(buf, text, len);
    buf[len] = 0;
    char *p = buf;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        double d = strtod(p, &end);
        if (end == p || errno || !isfinite(d) || fabs(d) > 1e30)
            return dp_err(err, "--normalize: %s %d is not a number in '%s'", what, i, buf);
        v[i] = (float)d;
        p = end;
        if (i + 1 < n && *p++ != ',')
            return dp_err(err, "--normalize: %d %s values expected (one per channel), '%s'", n, what, buf);
    }
    return *p ? dp_err(err, "--normalize: %d %s values expected (one per channel), '%s'", n, what, buf) : 0;
}

int dp_dataset_parse_normalize(const char *text, int c, float *mean, float *std, char *err)
{
    const char *slash = strchr(text, '/');
    if (c < 1 || c > DP_DATASET_MAX_C)
        return dp_err(err, "--normalize: %d channels (at most %d)", c, DP_DATASET_MAX_C);
    if (!slash) return dp_err(err, "--normalize '%s': expected train or MEAN,.../STD,... (one per channel)", text);
    if (s_floats(text, (size_t)(slash - text), c, mean, "mean", err) != 0 ||
        s_floats(slash + 1, strlen(slash + 1), c, std, "std", err) != 0)
        return -1;
    for (int i = 0; i < c; i++)
        if (!(std[i] > 0)) return dp_err(err, "--normalize: std %d is %g: expected above 0", i, std[i]);
    return 0;
}

void dp_dataset_normalize_text(const dp_dataset_t *ds, char *out, size_t n)
{
    size_t used = 0;
    out[0] = 0;
    if (!ds->normalized) return;
    for (int k = 0; k < 2 * ds->c && used < n; k++) {
        float v = k < ds->c ? ds->mean[k] : ds->std[k - ds->c];
        const char *sep = k == 0 ? "" : k == ds->c ? "/" : ",";
        used += (size_t)snprintf(out + used, n - used, "%s%.9g", sep, v);
    }
}

float dp_dataset_zero(const dp_dataset_t *ds, int ch)
{
    return ds->normalized ? (0.0f - ds->mean[ch]) / ds->std[ch] : 0.0f;
}
