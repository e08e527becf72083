/* gen_libsvm: `downpour gen-libsvm` — sparse data of known truth, written as
 * libsvm text (common/libsvm.h reads it back): a train and a test file
 * drawn from the planted sparse logistic model (deploy/lab/planted.h), and
 * the planted model's own test AUC, the best any model can reach on that
 * test file ("Bayes" AUC: its true probabilities as the scores).
 *
 * Streaming: one sample's buffers, allocated once, whatever --samples is;
 * the test file's logits and labels are kept (8 bytes a test sample) for
 * the exact AUC. Deterministic: the same flags write the same bytes (a
 * .gz name writes gzip, whose header zlib leaves without a time stamp).
 * Each file is written through common/util.h's atomic writer, and all are
 * put in place only once all are written: a failure leaves none behind. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/auc.h"
#include "common/opts.h"
#include "common/util.h"
#include "deploy/lab/planted.h"
#include "deploy/launcher/commands.h"

static const char s_synopsis[] =
    "usage: downpour gen-libsvm --out-train FILE --out-test FILE [--samples N] [--test-samples N]\n"
    "                           [--keys K] [--zipf S] [--nnz M] [--values binary|gauss]\n"
    "                           [--signal S] [--seed N] [--truth FILE]\n"
    "Writes sparse data of known truth as libsvm text (FILE.gz: gzip): labels 0/1 drawn\n"
    "from a planted logistic model over M distinct keys per sample. Keys have Zipf-like\n"
    "frequencies over K ranks, mapped by a seeded bijection onto the whole 64-bit range;\n"
    "each key's weight is a function of (seed, key). Prints the planted model's own AUC\n"
    "on the test file, the best reachable.\n"
    "\n";

typedef struct {
    const char *train, *test, *truth; /* the files */
    long samples, test_samples;       /* lines of each */
    uint64_t keys, seed;
    double zipf, signal;
    int nnz;
    int gauss;                        /* --values: 0 binary, 1 gauss */
} s_args_t;

/* One output file: an atomic replacement, gzip or plain through zlib. */
typedef struct {
    dp_atomic_t a;
    gzFile gz;
} s_out_t;

static int s_ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static int s_out_open(s_out_t *o, const char *path, char *err)
{
    o->gz = NULL;
    if (dp_atomic_open(&o->a, path, 0644, err) != 0) return -1;
    int fd = dup(o->a.fd);
    /* "T": zlib's transparent mode, plain bytes through the same calls. */
    if (fd >= 0) o->gz = gzdopen(fd, s_ends_with(path, ".gz") ? "wb6" : "wbT");
    if (!o->gz) {
        if (fd >= 0) close(fd);
        dp_atomic_abort(&o->a);
        return dp_err(err, "%s: cannot start writing", path);
    }
    gzbuffer(o->gz, 256 * 1024);
    return 0;
}

static int s_out_write(s_out_t *o, const char *data, size_t len, char *err)
{
    if (gzwrite(o->gz, data, (unsigned)len) == (int)len) return 0;
    int errnum;
    return dp_err(err, "%s: cannot write: %s", o->a.path, gzerror(o->gz, &errnum));
}

/* The zlib stream ended (gzip's trailer written); the file not yet in place. */
static int s_out_finish(s_out_t *o, char *err)
{
    int rc = gzclose(o->gz);
    o->gz = NULL;
    return rc == Z_OK ? 0 : dp_err(err, "%s: cannot write (zlib error %d)", o->a.path, rc);
}

static void s_out_abort(s_out_t *o)
{
    if (o->gz) gzclose(o->gz);
    o->gz = NULL;
    dp_atomic_abort(&o->a);
}

/* Decimal digits of v at p; returns the end. */
static char *s_u64(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do tmp[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

/* One sample's line: "LABEL KEY:VALUE ...\n" into line (room: 48 bytes a
 * feature and 8 more); its length. */
static size_t s_format(char *line, int label, const uint64_t *keys, const float *values, int n,
                       int gauss)
{
    char *p = line;
    *p++ = label ? '1' : '0';
    for (int i = 0; i < n; i++) {
        *p++ = ' ';
        p = s_u64(p, keys[i]);
        *p++ = ':';
        if (gauss) p += sprintf(p, "%.9g", (double)values[i]); /* a float's round trip */
        else *p++ = '1';
    }
    *p++ = '\n';
    return (size_t)(p - line);
}

/* One file's n samples from rng into o (finished, not committed). logit /
 * label (may be NULL): each sample's, for the AUC. *positives: labels 1. */
static int s_write(dp_planted_t *p, dp_rng_t *rng, s_out_t *o, long n, float *logit, float *label,
                   long *positives, char *err)
{
    uint64_t *keys = dp_malloc((size_t)p->nnz * sizeof *keys);
    float *values = dp_malloc((size_t)p->nnz * sizeof *values);
    char *line = dp_malloc((size_t)p->nnz * 48 + 8);
    int rc = -1;
    *positives = 0;
    for (long i = 0; i < n; i++) {
        double z;
        int y;
        if (dp_planted_sample(p, rng, keys, values, &z, &y, err) != 0) goto done;
        size_t len = s_format(line, y, keys, values, p->nnz, p->gauss);
        if (s_out_write(o, line, len, err) != 0) goto done;
        *positives += y;
        if (logit) logit[i] = (float)z, label[i] = (float)y;
    }
    rc = s_out_finish(o, err);
done:
    free(keys), free(values), free(line);
    return rc;
}

static int s_write_truth(dp_atomic_t *out, const s_args_t *a, const dp_planted_t *p, int have_auc,
                         double auc, long pos_train, long pos_test, char *err)
{
    cJSON *j = cJSON_CreateObject();
    if (have_auc) cJSON_AddNumberToObject(j, "planted_test_auc", auc);
    else cJSON_AddNullToObject(j, "planted_test_auc");
    cJSON_AddNumberToObject(j, "samples", (double)a->samples);
    cJSON_AddNumberToObject(j, "test_samples", (double)a->test_samples);
    cJSON_AddNumberToObject(j, "train_positives", (double)pos_train);
    cJSON_AddNumberToObject(j, "test_positives", (double)pos_test);
    cJSON_AddNumberToObject(j, "keys", (double)a->keys);
    cJSON_AddNumberToObject(j, "nnz", a->nnz);
    cJSON_AddNumberToObject(j, "zipf", a->zipf);
    cJSON_AddStringToObject(j, "values", a->gauss ? "gauss" : "binary");
    cJSON_AddNumberToObject(j, "signal", a->signal);
    cJSON_AddNumberToObject(j, "weight_sigma", p->sigma);
    cJSON_AddNumberToObject(j, "bias", p->bias);
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->seed); /* a string: 2^53 < seeds */
    cJSON_AddStringToObject(j, "seed", seed);
    cJSON_AddStringToObject(j, "train", a->train);
    cJSON_AddStringToObject(j, "test", a->test);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    size_t len = strlen(text);
    text = dp_realloc(text, len + 2);
    text[len] = '\n', text[len + 1] = '\0';
    int rc = dp_atomic_write(out, text, len + 1, err);
    free(text);
    return rc;
}

/* The command line into a; DP_OPTS_PARSED, or what dp_opts_exit_status takes. */
static dp_opts_result_t s_parse(s_args_t *a, int argc, char **argv, char *err)
{
    const dp_opts_flag_t t[] = {
        DP_FLAG_STR("out-train", "FILE", &a->train, 0, "the training file (required; .gz: gzip)"),
        DP_FLAG_STR("out-test", "FILE", &a->test, 0, "the test file (required; .gz: gzip)"),
        DP_FLAG_NUM("samples", DP_OPTS_LONG, "N", &a->samples, 1, 1e12, 0,
                    "training samples (default 10000)"),
        DP_FLAG_NUM("test-samples", DP_OPTS_LONG, "N", &a->test_samples, 1, 1e8, 0,
                    "test samples (default 10000; 8 bytes each held for the AUC)"),
        {.name = "keys", .kind = DP_OPTS_SEED, .target = &a->keys, .meta = "K",
         .help = "the key space's size: ranks 1..K, any K < 2^64 (default 1048576)"},
        DP_FLAG_NUM("zipf", DP_OPTS_DOUBLE, "S", &a->zipf, 0, 10, 0,
                    "rank r drawn with probability ~ r^-S (default 1.1; 0: uniform)"),
        DP_FLAG_NUM("nnz", DP_OPTS_INT, "M", &a->nnz, 1, 100000, 0,
                    "distinct features per sample (default 16)"),
        DP_FLAG_CHOICE("values", "binary|gauss", &a->gauss, 0, "each feature's value: 1 or N(0, 1) (default binary)"),
        DP_FLAG_NUM("signal", DP_OPTS_DOUBLE, "S", &a->signal, 0, 100, 0,
                    "standard deviation of w.x: higher, easier (default 3)"),
        DP_FLAG_SEED("seed", &a->seed, 0, "the weights, bias, keys and samples (default 1)"),
        DP_FLAG_STR("truth", "FILE", &a->truth, 0, "also write the truth as JSON (planted_test_auc, ...)"),
    };
    dp_opts_t o;
    dp_opts_init(&o, "downpour gen-libsvm", s_synopsis, NULL);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    dp_opts_result_t r = dp_opts_parse(&o, argc, argv, err);
    if (r != DP_OPTS_PARSED) return r;
    if (!a->train || !a->test)
        return dp_err(err, "--out-train FILE and --out-test FILE are required (see downpour gen-libsvm --help)");
    if (strcmp(a->train, a->test) == 0)
        return dp_err(err, "--out-train and --out-test name the same file '%s'", a->train);
    if (a->keys == 0) return dp_err(err, "--keys '0': expected an integer in [1, 2^64 - 1]");
    if ((uint64_t)a->nnz > a->keys)
        return dp_err(err, "--nnz '%d': more than --keys (%llu) distinct features", a->nnz,
                      (unsigned long long)a->keys);
    return DP_OPTS_PARSED;
}

int dp_gen_libsvm_main(int argc, char **argv)
{
    s_args_t a = {.samples = 10000, .test_samples = 10000, .keys = 1u << 20, .seed = 1,
                  .zipf = 1.1, .signal = 3, .nnz = 16};
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t r = s_parse(&a, argc, argv, err);
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour gen-libsvm", r, err);
    dp_planted_t p;
    if (dp_planted_init(&p, a.seed, a.keys, a.zipf, a.nnz, a.gauss, a.signal, err) != 0)
        return dp_opts_exit_status("downpour gen-libsvm", DP_OPTS_BAD, err);
    /* The two files' own streams: the test file does not depend on --samples. */
    dp_rng_t train_rng, test_rng;
    dp_rng_seed(&train_rng, dp_planted_mix(a.seed ^ 0x7472616900000004ULL));
    dp_rng_seed(&test_rng, dp_planted_mix(a.seed ^ 0x7465737400000005ULL));
    /* Every file opened first (a bad path fails at once) and put in place
     * only once all are written: a failure leaves none of them behind. */
    s_out_t out[2] = {{.a = {.fd = -1}}, {.a = {.fd = -1}}};
    dp_atomic_t truth = {.fd = -1};
    float *logit = dp_malloc((size_t)a.test_samples * sizeof *logit);
    float *label = dp_malloc((size_t)a.test_samples * sizeof *label);
    long pos_train = 0, pos_test = 0;
    double auc = 0;
    int rc = 1, have_auc = 0;
    if (s_out_open(&out[0], a.train, err) != 0 || s_out_open(&out[1], a.test, err) != 0 ||
        (a.truth && dp_atomic_open(&truth, a.truth, 0644, err) != 0))
        goto done;
    if (s_write(&p, &train_rng, &out[0], a.samples, NULL, NULL, &pos_train, err) != 0 ||
        s_write(&p, &test_rng, &out[1], a.test_samples, logit, label, &pos_test, err) != 0)
        goto done;
    char why[DP_ERR_LEN];
    have_auc = dp_auc(logit, label, (size_t)a.test_samples, &auc, why) == 0;
    if (a.truth && s_write_truth(&truth, &a, &p, have_auc, auc, pos_train, pos_test, err) != 0) goto done;
    if (dp_atomic_commit(&out[0].a, err) != 0 || dp_atomic_commit(&out[1].a, err) != 0 ||
        (a.truth && dp_atomic_commit(&truth, err) != 0))
        goto done;
    printf("wrote %s (%ld samples, %ld positive) and %s (%ld samples, %ld positive)\n", a.train,
           a.samples, pos_train, a.test, a.test_samples, pos_test);
    if (have_auc) printf("planted test AUC %.6f\n", auc);
    else printf("planted test AUC undefined: the test file has one class only\n");
    rc = 0;
done:
    if (rc != 0) fprintf(stderr, "downpour gen-libsvm: %s\n", err);
    s_out_abort(&out[0]), s_out_abort(&out[1]), dp_atomic_abort(&truth); /* none after a commit */
    free(logit), free(label);
    dp_planted_fini(&p);
    return rc;
}
