/* test_safetensors: round trips (bit-exact), metadata, the format's layout
 * (padded header), every rejected file leaving params unchanged, atomic
 * writes. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "deploy/launcher/commands.h"

#include "common/model.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "tests/test.h"

#define SPEC "conv3x3:4 relu maxpool2 fc:10 softmax"

static char s_dir[64];

static void s_tmpdir(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/dp_test_st.XXXXXX");
    if (!mkdtemp(s_dir)) {
        perror("mkdtemp");
        exit(1);
    }
}

/* Names in s_dir, space separated, sorted by readdir order; count returned. */
static int s_list(char *out, size_t cap)
{
    DIR *d = opendir(s_dir);
    int n = 0;
    out[0] = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        size_t k = strlen(out);
        snprintf(out + k, cap - k, "%s%s", n ? " " : "", e->d_name);
        n++;
    }
    if (d) closedir(d);
    return n;
}

static void s_cleanup(void)
{
    DIR *d = opendir(s_dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", s_dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(s_dir);
}

static const char *s_path(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", s_dir, name);
    return p[k];
}

static void s_model(dp_model_t *m, float **params)
{
    char err[DP_ERR_LEN];
    if (dp_model_parse(m, SPEC, 1, 8, 8, err) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    *params = dp_malloc(m->n_floats * sizeof(float));
    dp_model_init_params(m, *params, 42);
}

/* Raw file: 8-byte length (hlen_override when non-zero), header, data. */
static void s_write_raw(const char *path, const char *hdr, uint64_t hlen_override,
                        const void *data, size_t len)
{
    uint64_t hl = hlen_override ? hlen_override : strlen(hdr);
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(hl >> (8 * i));
    FILE *f = fopen(path, "wb");
    fwrite(lb, 1, 8, f);
    fwrite(hdr, 1, strlen(hdr), f);
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static void test_checkpoint_round_trip(void)
{
    s_tmpdir();
    dp_model_t m;
    float *p;
    s_model(&m, &p);
    /* A few special values survive bit-exactly. */
    p[0] = -0.0f;
    p[1] = 1e-40f; /* subnormal */
    p[2] = 3.4028235e38f;
    char err[DP_ERR_LEN] = "";
    const char *extra[] = {"optimizer", "adam", "note", "quote \" and \\ survive", NULL};
    CHECK_EQ(dp_checkpoint_save(s_path("m.safetensors"), &m, p, 1234, 99, extra, err), 0);
    float *q = dp_calloc(m.n_floats, sizeof(float));
    long step = -1, version = -1;
    CHECK_EQ(dp_checkpoint_load(s_path("m.safetensors"), &m, q, &step, &version, err), 0);
    CHECK(memcmp(p, q, m.n_floats * sizeof(float)) == 0);
    CHECK_EQ(step, 1234);
    CHECK_EQ(version, 99);
    CHECK_EQ(dp_checkpoint_load(s_path("m.safetensors"), &m, q, NULL, NULL, err), 0);

    char *v = dp_safetensors_read_meta(s_path("m.safetensors"), "format", err);
    CHECK_STR(v, "downpour");
    free(v);
    v = dp_safetensors_read_meta(s_path("m.safetensors"), "spec", err);
    CHECK_STR(v, m.spec);
    free(v);
    v = dp_safetensors_read_meta(s_path("m.safetensors"), "input", err);
    CHECK_STR(v, "1x8x8");
    free(v);
    v = dp_safetensors_read_meta(s_path("m.safetensors"), "note", err);
    CHECK_STR(v, "quote \" and \\ survive");
    free(v);
    v = dp_safetensors_read_meta(s_path("m.safetensors"), "optimizer", err);
    CHECK_STR(v, "adam");
    free(v);
    strcpy(err, "x");
    v = dp_safetensors_read_meta(s_path("m.safetensors"), "absent", err);
    CHECK(v == NULL);
    CHECK_STR(err, "");

    /* Individual tensors by name, e.g. what the server reads back. */
    const dp_param_t *fc = dp_model_find_param(&m, "fc1.weight");
    float *t = dp_malloc(fc->count * sizeof(float));
    CHECK_EQ(dp_safetensors_read_tensor(s_path("m.safetensors"), "fc1.weight", t, fc->count, err), 0);
    CHECK(memcmp(t, p + fc->offset, fc->count * sizeof(float)) == 0);
    CHECK_EQ(dp_safetensors_read_tensor(s_path("m.safetensors"), "fc1.weight", t, fc->count - 1, err), -1);
    CHECK(strstr(err, "elements") != NULL);
    CHECK_EQ(dp_safetensors_read_tensor(s_path("m.safetensors"), "fc9.weight", t, fc->count, err), -1);
    CHECK(strstr(err, "'fc9.weight' missing") != NULL);

    /* Layout: 8-byte length, header padded with spaces to a multiple of 8,
     * tensors in parameter order, contiguous. */
    uint8_t *raw;
    size_t len;
    CHECK_EQ(dp_read_file(s_path("m.safetensors"), &raw, &len, err), 0);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
    CHECK_EQ(hl % 8, 0);
    CHECK_EQ(len, 8 + hl + m.n_floats * sizeof(float));
    CHECK_EQ(raw[8], '{');
    size_t last = 8 + hl - 1;
    while (raw[last] == ' ') last--;
    CHECK_EQ(raw[last], '}');
    CHECK(memcmp(raw + 8 + hl, p, m.n_floats * sizeof(float)) == 0);
    CHECK(strstr((char *)raw + 8, "\"conv1.weight\":{\"dtype\":\"F32\",\"shape\":[4,1,3,3]") != NULL);
    free(raw);
    free(t);
    free(p);
    free(q);
    s_cleanup();
}

static void test_generic_write(void)
{
    s_tmpdir();
    char err[DP_ERR_LEN] = "";
    float a[6] = {1, 2, 3, 4, 5, 6}, s = 7, e = 0;
    int64_t sa[2] = {2, 3}, se[1] = {0};
    dp_st_tensor_t t[3] = {{"a", a, 2, sa}, {"scalar", &s, 0, NULL}, {"empty", &e, 1, se}};
    CHECK_EQ(dp_safetensors_write(s_path("g.safetensors"), t, 3, NULL, err), 0);
    float out[6] = {0}, so = 0;
    CHECK_EQ(dp_safetensors_read_tensor(s_path("g.safetensors"), "a", out, 6, err), 0);
    CHECK(memcmp(out, a, sizeof a) == 0);
    CHECK_EQ(dp_safetensors_read_tensor(s_path("g.safetensors"), "scalar", &so, 1, err), 0);
    CHECK_NEAR(so, 7, 0);
    CHECK_EQ(dp_safetensors_read_tensor(s_path("g.safetensors"), "empty", out, 0, err), 0);
    char *v = dp_safetensors_read_meta(s_path("g.safetensors"), "format", err);
    CHECK(v == NULL);
    CHECK_STR(err, "");

    /* Bad tensor lists fail before anything is written. */
    dp_st_tensor_t dup[2] = {{"a", a, 2, sa}, {"a", a, 2, sa}};
    CHECK_EQ(dp_safetensors_write(s_path("bad.safetensors"), dup, 2, NULL, err), -1);
    CHECK(strstr(err, "duplicate") != NULL);
    dp_st_tensor_t md[1] = {{"__metadata__", a, 2, sa}};
    CHECK_EQ(dp_safetensors_write(s_path("bad.safetensors"), md, 1, NULL, err), -1);
    const char *kv[] = {"k", "1", "k", "2", NULL};
    CHECK_EQ(dp_safetensors_write(s_path("bad.safetensors"), t, 1, kv, err), -1);
    CHECK(strstr(err, "'k' given twice") != NULL);
    char names[256];
    CHECK_EQ(s_list(names, sizeof names), 1);
    CHECK_STR(names, "g.safetensors");

    /* Optimizer state next to a model: extra tensors, ignored by load. */
    dp_model_t m;
    float *p;
    s_model(&m, &p);
    float *st = dp_malloc(2 * m.n_floats * sizeof(float));
    for (size_t i = 0; i < 2 * m.n_floats; i++) st[i] = (float)i;
    int64_t sh[1] = {(int64_t)(2 * m.n_floats)};
    dp_st_tensor_t ex[1] = {{"optim.state", st, 1, sh}};
    CHECK_EQ(dp_checkpoint_save_ex(s_path("ck.safetensors"), &m, p, 5, 6, ex, 1, NULL, err), 0);
    float *q = dp_calloc(m.n_floats, sizeof(float)), *st2 = dp_calloc(2 * m.n_floats, sizeof(float));
    CHECK_EQ(dp_checkpoint_load(s_path("ck.safetensors"), &m, q, NULL, NULL, err), 0);
    CHECK(memcmp(p, q, m.n_floats * sizeof(float)) == 0);
    CHECK_EQ(dp_safetensors_read_tensor(s_path("ck.safetensors"), "optim.state", st2, 2 * m.n_floats, err), 0);
    CHECK(memcmp(st, st2, 2 * m.n_floats * sizeof(float)) == 0);
    free(p);
    free(q);
    free(st);
    free(st2);
    s_cleanup();
}

/* Load path into a sentinel-filled buffer: expect -1, err containing want,
 * the buffer and step/version untouched. */
static void s_expect_reject(const dp_model_t *m, const char *path, const char *want)
{
    char err[DP_ERR_LEN] = "";
    float *q = dp_malloc(m->n_floats * sizeof(float));
    for (size_t i = 0; i < m->n_floats; i++) q[i] = 12345.0f;
    long step = -7, version = -8;
    CHECK_EQ(dp_checkpoint_load(path, m, q, &step, &version, err), -1);
    int same = 1;
    for (size_t i = 0; i < m->n_floats; i++) same &= q[i] == 12345.0f;
    CHECK(same);
    CHECK(step == -7 && version == -8);
    CHECK(strncmp(err, path, strlen(path)) == 0);
    CHECK(strchr(err, '\n') == NULL);
    fprintf(stderr, "  rejected: %s\n", err);
    if (!strstr(err, want)) {
        CHECK(strstr(err, want) != NULL);
        fprintf(stderr, "  error lacks \"%s\"\n", want);
    }
    free(q);
}

static void test_rejects_bad_files(void)
{
    s_tmpdir();
    char err[DP_ERR_LEN] = "";
    dp_model_t m, other;
    float *p, *po;
    s_model(&m, &p);
    CHECK_EQ(dp_model_parse(&other, "conv3x3:6 relu maxpool2 fc:10 softmax", 1, 8, 8, err), 0);
    po = dp_calloc(other.n_floats, sizeof(float));

    /* wrong shape: a checkpoint of another model */
    CHECK_EQ(dp_checkpoint_save(s_path("other.st"), &other, po, 0, 0, NULL, err), 0);
    s_expect_reject(&m, s_path("other.st"), "'conv1.weight' has shape [6, 1, 3, 3], expected [4, 1, 3, 3]");

    /* missing tensor */
    int64_t sh[4] = {4, 1, 3, 3};
    dp_st_tensor_t one[1] = {{"conv1.weight", p, 4, sh}};
    CHECK_EQ(dp_safetensors_write(s_path("missing.st"), one, 1, NULL, err), 0);
    s_expect_reject(&m, s_path("missing.st"), "tensor 'conv1.bias' missing");

    /* truncated data */
    CHECK_EQ(dp_checkpoint_save(s_path("good.st"), &m, p, 3, 4, NULL, err), 0);
    uint8_t *raw;
    size_t len;
    CHECK_EQ(dp_read_file(s_path("good.st"), &raw, &len, err), 0);
    FILE *f = fopen(s_path("trunc.st"), "wb");
    fwrite(raw, 1, len - 10, f);
    fclose(f);
    s_expect_reject(&m, s_path("trunc.st"), "truncated: tensor 'fc1.bias'");
    /* cut inside the header */
    f = fopen(s_path("trunc2.st"), "wb");
    fwrite(raw, 1, 40, f);
    fclose(f);
    s_expect_reject(&m, s_path("trunc2.st"), "bad header length");
    /* shorter than the length field */
    f = fopen(s_path("tiny.st"), "wb");
    fwrite(raw, 1, 5, f);
    fclose(f);
    s_expect_reject(&m, s_path("tiny.st"), "too short");
    free(raw);

    /* garbage header, header length larger than the file, absurd length */
    s_write_raw(s_path("garbage.st"), "{\"a\": [1, 2,, }xxxxxx", 0, NULL, 0);
    s_expect_reject(&m, s_path("garbage.st"), "not a JSON object");
    s_write_raw(s_path("notjson.st"), "PK\x03\x04 hello", 0, NULL, 0);
    s_expect_reject(&m, s_path("notjson.st"), "not a JSON object");
    s_write_raw(s_path("long.st"), "{}      ", 1000, NULL, 0);
    s_expect_reject(&m, s_path("long.st"), "bad header length 1000");
    s_write_raw(s_path("huge.st"), "{}      ", UINT64_MAX, NULL, 0);
    s_expect_reject(&m, s_path("huge.st"), "bad header length");
    s_write_raw(s_path("after.st"), "{} x      ", 0, NULL, 0);
    s_expect_reject(&m, s_path("after.st"), "garbage after the header JSON");
    s_write_raw(s_path("array.st"), "[1, 2]  ", 0, NULL, 0);
    s_expect_reject(&m, s_path("array.st"), "not a JSON object");

    /* malformed entries */
    float d[8] = {0};
    s_write_raw(s_path("dtype.st"), "{\"conv1.weight\":{\"dtype\":\"F16\",\"shape\":[4,1,3,3],\"data_offsets\":[0,72]}}", 0, d, 0);
    s_expect_reject(&m, s_path("dtype.st"), "truncated: tensor 'conv1.weight'");
    uint8_t zeros[200] = {0};
    s_write_raw(s_path("dtype2.st"), "{\"conv1.weight\":{\"dtype\":\"F16\",\"shape\":[4,1,3,3],\"data_offsets\":[0,72]}}", 0, zeros, 72);
    s_expect_reject(&m, s_path("dtype2.st"), "'conv1.weight' has dtype F16, expected F32");
    s_write_raw(s_path("dtype3.st"), "{\"x\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, zeros, 8);
    s_expect_reject(&m, s_path("dtype3.st"), "unknown dtype 'Q7'");
    s_write_raw(s_path("span.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, zeros, 16);
    s_expect_reject(&m, s_path("span.st"), "data_offsets span 8 bytes, its shape and dtype need 12");
    s_write_raw(s_path("overlap.st"),
                "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 0, zeros, 16);
    s_expect_reject(&m, s_path("overlap.st"), "overlap");
    s_write_raw(s_path("neg.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 0, zeros, 16);
    s_expect_reject(&m, s_path("neg.st"), "bad shape entry");
    s_write_raw(s_path("offs.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 0, zeros, 16);
    s_expect_reject(&m, s_path("offs.st"), "bad data_offsets");
    s_write_raw(s_path("frac.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 0, zeros, 16);
    s_expect_reject(&m, s_path("frac.st"), "bad shape entry");
    s_write_raw(s_path("dupe.st"),
                "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, zeros, 16);
    s_expect_reject(&m, s_path("dupe.st"), "names 'x' twice");
    s_write_raw(s_path("meta.st"), "{\"__metadata__\":{\"step\":5}}", 0, NULL, 0);
    s_expect_reject(&m, s_path("meta.st"), "metadata value of 'step' is not a string");
    s_write_raw(s_path("entry.st"), "{\"x\":7}", 0, NULL, 0);
    s_expect_reject(&m, s_path("entry.st"), "'x' is not an object");

    /* everything right but a bad step */
    const char *kv[] = {"step", "12abc", NULL};
    dp_st_tensor_t *t = dp_malloc((size_t)m.n_params * sizeof *t);
    int64_t shapes[DP_MAX_PARAMS][4];
    for (int i = 0; i < m.n_params; i++) {
        for (int k = 0; k < m.params[i].ndim; k++) shapes[i][k] = m.params[i].shape[k];
        t[i] = (dp_st_tensor_t){m.params[i].name, p + m.params[i].offset, m.params[i].ndim, shapes[i]};
    }
    CHECK_EQ(dp_safetensors_write(s_path("step.st"), t, m.n_params, kv, err), 0);
    s_expect_reject(&m, s_path("step.st"), "metadata 'step' is not an integer");
    /* ... and without metadata at all it loads, step 0 */
    CHECK_EQ(dp_safetensors_write(s_path("nometa.st"), t, m.n_params, NULL, err), 0);
    float *q = dp_malloc(m.n_floats * sizeof(float));
    long step = -1;
    CHECK_EQ(dp_checkpoint_load(s_path("nometa.st"), &m, q, &step, NULL, err), 0);
    CHECK_EQ(step, 0);
    CHECK(memcmp(p, q, m.n_floats * sizeof(float)) == 0);

    s_expect_reject(&m, s_path("nonexistent.st"), "cannot open");
    s_expect_reject(&m, s_dir, "not a regular file");
    free(q);
    free(t);
    free(p);
    free(po);
    s_cleanup();
}

static void test_atomic_write(void)
{
    s_tmpdir();
    char err[DP_ERR_LEN] = "", names[512];
    dp_model_t m;
    float *p;
    s_model(&m, &p);
    CHECK_EQ(dp_checkpoint_save(s_path("a.st"), &m, p, 1, 1, NULL, err), 0);
    CHECK_EQ(s_list(names, sizeof names), 1); /* no temp file left behind */
    CHECK_STR(names, "a.st");
    /* Overwrite: the new contents wholly replace the old. */
    p[0] = 77.0f;
    CHECK_EQ(dp_checkpoint_save(s_path("a.st"), &m, p, 2, 2, NULL, err), 0);
    CHECK_EQ(s_list(names, sizeof names), 1);
    float *q = dp_malloc(m.n_floats * sizeof(float));
    long step = 0;
    CHECK_EQ(dp_checkpoint_load(s_path("a.st"), &m, q, &step, NULL, err), 0);
    CHECK_EQ(step, 2);
    CHECK(q[0] == 77.0f);
    /* A failing save leaves the previous checkpoint intact. */
    const char *bad_kv[] = {"step", "dup", NULL};
    CHECK_EQ(dp_checkpoint_save(s_path("a.st"), &m, p, 3, 3, bad_kv, err), -1);
    CHECK(strstr(err, "'step' given twice") != NULL);
    CHECK_EQ(dp_checkpoint_load(s_path("a.st"), &m, q, &step, NULL, err), 0);
    CHECK_EQ(step, 2);
    CHECK_EQ(s_list(names, sizeof names), 1);
    /* A folder that cannot be made (a file in its way; missing folders that
     * can be made are, test_paths): a clean error naming the path, nothing
     * created. */
    char missing[256];
    snprintf(missing, sizeof missing, "%s/a.st/such/dir/m.st", s_dir);
    CHECK_EQ(dp_checkpoint_save(missing, &m, p, 1, 1, NULL, err), -1);
    CHECK(strstr(err, missing) != NULL);
    CHECK(strchr(err, '\n') == NULL);
    fprintf(stderr, "  missing dir: %s\n", err);
    CHECK_EQ(s_list(names, sizeof names), 1);
    /* A write over a directory fails at rename; the temp file is removed. */
    mkdir(s_path("adir"), 0755);
    CHECK_EQ(dp_checkpoint_save(s_path("adir"), &m, p, 1, 1, NULL, err), -1);
    CHECK_EQ(s_list(names, sizeof names), 2);
    rmdir(s_path("adir"));
    free(p);
    free(q);
    s_cleanup();
}

/* Overlap is checked against every earlier range, not only the neighbour:
 * [0,100) [50,50) [60,70) overlap though no two neighbours do. */
static void test_overlap_any_earlier_range(void)
{
    s_tmpdir();
    dp_model_t m;
    float *p;
    s_model(&m, &p);
    static uint8_t zeros[100];
    s_write_raw(s_path("o1.st"),
                "{\"a\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[50,50]},"
                "\"c\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[60,70]}}",
                0, zeros, 100);
    s_expect_reject(&m, s_path("o1.st"), "tensors overlap at data bytes [60, 70)");
    /* the same ranges in another order of the header */
    s_write_raw(s_path("o2.st"),
                "{\"c\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[60,70]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[50,50]}}",
                0, zeros, 100);
    s_expect_reject(&m, s_path("o2.st"), "tensors overlap at data bytes [60, 70)");
    /* empty ranges anywhere, and ranges that touch, are no overlap */
    char err[DP_ERR_LEN] = "";
    s_write_raw(s_path("ok.st"),
                "{\"a\":{\"dtype\":\"U8\",\"shape\":[50],\"data_offsets\":[0,50]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[20,20]},"
                "\"c\":{\"dtype\":\"U8\",\"shape\":[50],\"data_offsets\":[50,100]}}",
                0, zeros, 100);
    char *v = dp_safetensors_read_meta(s_path("ok.st"), "none", err);
    CHECK(v == NULL);
    CHECK_STR(err, ""); /* the file is valid: the key is just absent */
    /* a shape whose byte count wraps 64 bits: 2^32 x 2^32 x 4 bytes */
    s_write_raw(s_path("wrap.st"),
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                "\"data_offsets\":[0,0]}}", 0, zeros, 0);
    s_expect_reject(&m, s_path("wrap.st"), "shape is implausibly large");
    free(p);
    s_cleanup();
}

/* A header of many tensors is checked in O(n log n): 200,000 entries (the
 * names compared pairwise were 2 * 10^10 strcmp calls). A duplicate name,
 * first and last, is still found. */
static void test_many_tensors(void)
{
    s_tmpdir();
    dp_model_t m;
    float *p;
    s_model(&m, &p);
    enum { N = 200000 };
    size_t cap = (size_t)N * 80 + 64, k = 0;
    char *hdr = dp_malloc(cap);
    k += (size_t)snprintf(hdr + k, cap - k, "{");
    for (int i = 0; i < N; i++)
        k += (size_t)snprintf(hdr + k, cap - k, "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[1],"
                              "\"data_offsets\":[%d,%d]}", i ? "," : "", i, i, i + 1);
    snprintf(hdr + k, cap - k, "}");
    uint8_t *data = dp_calloc(N, 1);
    s_write_raw(s_path("many.st"), hdr, 0, data, N);
    char err[DP_ERR_LEN] = "x";
    char *v = dp_safetensors_read_meta(s_path("many.st"), "none", err);
    CHECK(v == NULL);
    CHECK_STR(err, "");
    /* rename the last one to the first one's name */
    char *last = strstr(hdr + k - 80, "\"t199999\"");
    CHECK(last != NULL);
    if (last) {
        memcpy(last, "\"t0\"     ", 9);
        s_write_raw(s_path("dup.st"), hdr, 0, data, N);
        s_expect_reject(&m, s_path("dup.st"), "header names 't0' twice");
    }
    free(hdr);
    free(data);
    free(p);
    s_cleanup();
}

/* Run main(argv) in a child with stderr to errpath; its exit status, or
 * 128 + the signal that killed it. */
static int s_run_main(int (*main_fn)(int, char **), char **argv, const char *errpath)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        int out = open("/dev/null", O_WRONLY);
        if (out >= 0) dup2(out, 1);
        int argc = 0;
        while (argv[argc]) argc++;
        _exit(main_fn(argc, argv));
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A checkpoint is untrusted input: `downpour eval` takes the model from its
 * metadata. A spec of exactly 2^62 floats made n_floats * 4 wrap to 0: eval
 * allocated 1 byte and read conv1.weight's 4369 floats into it (heap
 * overflow, SIGSEGV or an ASan report). Now: one line, exit status 1. */
static void test_eval_refuses_overflowing_spec(void)
{
    s_tmpdir();
    char err[DP_ERR_LEN] = "";
    const char *spec = "conv1x1:4369 maxpool28 conv1x1:2146500591 conv1x1:2147483647 "
                       "fc:978689 softmax";
    static float w[4369];
    for (int i = 0; i < 4369; i++) w[i] = (float)i;
    int64_t sh[4] = {4369, 1, 1, 1};
    dp_st_tensor_t t[1] = {{"conv1.weight", w, 4, sh}};
    const char *kv[] = {"format", "downpour", "spec", spec, "input", "1x28x28", NULL};
    CHECK_EQ(dp_safetensors_write(s_path("evil.st"), t, 1, kv, err), 0);
    /* one 28x28 test image and its label, plain IDX */
    uint8_t img[16 + 784] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};
    uint8_t lab[9] = {0, 0, 8, 1, 0, 0, 0, 1, 3};
    int fd = open(s_path("img"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, img, sizeof img) == (ssize_t)sizeof img && close(fd) == 0);
    fd = open(s_path("lab"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, lab, sizeof lab) == (ssize_t)sizeof lab && close(fd) == 0);
    char data[256], ckpt[256];
    snprintf(data, sizeof data, "idx:%s,%s", s_path("img"), s_path("lab"));
    snprintf(ckpt, sizeof ckpt, "%s", s_path("evil.st"));
    char *argv[] = {"eval", "--checkpoint", ckpt, "--data", data, NULL};
    int rc = s_run_main(dp_eval_main, argv, s_path("eval.err"));
    CHECK_EQ(rc, 1);
    uint8_t *out = NULL;
    size_t len = 0;
    CHECK_EQ(dp_read_file(s_path("eval.err"), &out, &len, err), 0);
    if (out) {
        fprintf(stderr, "  (expected) %s", (char *)out);
        int lines = 0;
        for (size_t i = 0; i < len; i++) lines += out[i] == '\n';
        CHECK_EQ(lines, 1);
        CHECK(strstr((char *)out, "downpour eval: model spec: 'conv1x1:2146500591' makes "
                                  "conv2.weight too large") != NULL);
    }
    free(out);
    s_cleanup();
}

/* A file holding rows (DP_ST_ROWS_KEYS / _WEIGHT, which a sparse model's
 * --save writes) refused as one line naming the path and the fault. */
static void s_rows_reject(const char *path, int d, const char *want)
{
    char err[DP_ERR_LEN] = "";
    uint64_t *k = (uint64_t *)&s_dir; /* a sentinel: must stay */
    float *w = (float *)&s_dir;
    size_t n = 77;
    CHECK_EQ(dp_safetensors_read_rows(path, d, &k, &w, &n, err), -1);
    if (!strstr(err, want) || !strstr(err, path) || strchr(err, '\n'))
        fprintf(stderr, "  got: %s\n  want: %s\n", err, want);
    CHECK(strstr(err, want) != NULL);
    CHECK(strstr(err, path) != NULL);
    CHECK(k == (uint64_t *)&s_dir && w == (float *)&s_dir && n == 77);
}

/* The rows tensors: written as U64 [n] and F32 [n, D] beside a sparse
 * model's dense layers, read back bit for bit (the dense layers still load
 * as a checkpoint); a table of no rows; and every crafted fault refused:
 * missing, wrong dtype, wrong width, counts that differ, keys unsorted or
 * twice, a value not finite. */
static void test_rows_tensors(void)
{
    s_tmpdir();
    char err[DP_ERR_LEN] = "";
    dp_model_t m;
    CHECK_EQ(dp_model_parse(&m, "embed:3 relu fc:2 softmax", 1, 1, 1, err), 0);
    float *p = dp_malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, p, 4);
    uint64_t keys[4] = {0, 7, 1ull << 40, UINT64_MAX};
    float rows[12];
    for (int i = 0; i < 12; i++) rows[i] = 0.25f * (float)i - 1.0f;
    CHECK_EQ(dp_checkpoint_save_rows(s_path("rows.st"), &m, p, 5, 5, keys, rows, 4, NULL, err), 0);
    uint64_t *k = NULL;
    float *w = NULL;
    size_t n = 0;
    CHECK_EQ(dp_safetensors_read_rows(s_path("rows.st"), 3, &k, &w, &n, err), 0);
    CHECK_EQ(n, 4);
    CHECK(k && memcmp(k, keys, sizeof keys) == 0);
    CHECK(w && memcmp(w, rows, sizeof rows) == 0);
    free(k), free(w);
    float *back = dp_calloc(m.n_floats, sizeof(float));
    CHECK_EQ(dp_checkpoint_load(s_path("rows.st"), &m, back, NULL, NULL, err), 0);
    CHECK(memcmp(back, p, m.n_floats * sizeof(float)) == 0);
    char *dt = NULL;
    uint8_t *raw = NULL;
    size_t len = 0;
    CHECK_EQ(dp_read_file(s_path("rows.st"), &raw, &len, err), 0);
    dt = raw ? strstr((char *)raw + 8, "\"embed.keys\":{\"dtype\":\"U64\"") : NULL;
    CHECK(dt != NULL);
    free(raw);
    /* no rows: n 0, no buffers */
    CHECK_EQ(dp_checkpoint_save_rows(s_path("empty.st"), &m, p, 5, 5, keys, rows, 0, NULL, err), 0);
    k = (uint64_t *)&s_dir;
    CHECK_EQ(dp_safetensors_read_rows(s_path("empty.st"), 3, &k, &w, &n, err), 0);
    CHECK(n == 0 && k == NULL && w == NULL);

    /* missing: a dense-only file */
    CHECK_EQ(dp_checkpoint_save(s_path("dense.st"), &m, p, 5, 5, NULL, err), 0);
    s_rows_reject(s_path("dense.st"), 3, "no tensor 'embed.keys': the file holds no row table");
    /* the model's width is not the file's */
    s_rows_reject(s_path("rows.st"), 4, "'embed.weight' is not [n, 4]");
    /* keys of the wrong dtype (I64, F32) */
    s_write_raw(s_path("i64.st"), "{\"embed.keys\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[1,3],\"data_offsets\":[8,20]}}", 0, rows, 20);
    s_rows_reject(s_path("i64.st"), 3, "'embed.keys' has dtype I64, expected U64");
    s_write_raw(s_path("f32k.st"), "{\"embed.keys\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]}}", 0, rows, 32);
    s_rows_reject(s_path("f32k.st"), 3, "'embed.keys' has dtype F32, expected U64");
    /* keys of two dimensions */
    s_write_raw(s_path("k2d.st"), "{\"embed.keys\":{\"dtype\":\"U64\",\"shape\":[1,1],\"data_offsets\":[0,8]},"
                "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[1,3],\"data_offsets\":[8,20]}}", 0, rows, 20);
    s_rows_reject(s_path("k2d.st"), 3, "'embed.keys' is not [n]");
    /* counts that differ */
    uint8_t buf[64] = {0};
    s_write_raw(s_path("count.st"), "{\"embed.keys\":{\"dtype\":\"U64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[1,3],\"data_offsets\":[16,28]}}", 0, buf, 28);
    s_rows_reject(s_path("count.st"), 3, "2 keys (embed.keys) but 1 rows");
    /* keys out of order, a key twice */
    uint64_t bad[4] = {0, 9, 8, 10};
    CHECK_EQ(dp_checkpoint_save_rows(s_path("unsorted.st"), &m, p, 5, 5, bad, rows, 4, NULL, err), 0);
    s_rows_reject(s_path("unsorted.st"), 3, "not in ascending order: key 8 at 2 after 9");
    bad[2] = 9;
    CHECK_EQ(dp_checkpoint_save_rows(s_path("twice.st"), &m, p, 5, 5, bad, rows, 4, NULL, err), 0);
    s_rows_reject(s_path("twice.st"), 3, "key 9 twice in embed.keys (at 1 and 2)");
    /* a value not finite */
    rows[7] = NAN;
    CHECK_EQ(dp_checkpoint_save_rows(s_path("nan.st"), &m, p, 5, 5, keys, rows, 4, NULL, err), 0);
    s_rows_reject(s_path("nan.st"), 3, "the row of key 1099511627776 (embed.weight) holds a value that is not finite");
    free(back);
    free(p);
    s_cleanup();
}

DP_TESTS(T(test_checkpoint_round_trip), T(test_generic_write), T(test_rejects_bad_files),
         T(test_atomic_write), T(test_eval_refuses_overflowing_spec),
         T(test_overlap_any_earlier_range), T(test_many_tensors), T(test_rows_tensors))
