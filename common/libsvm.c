/* libsvm: the streaming svmlight / libsvm reader (libsvm.h).
 *
 * Invariants: the reader's buffers are allocated once, at open, from its
 * bounds (the read window: max_line + 2 + S_CHUNK bytes; three arrays of
 * max_nnz for one parsed line); reading only moves bytes within them. A
 * parsed line that does not fit in the caller's batch waits in the reader
 * (pending) and opens the next batch, so no sample is lost or read twice. */
#include "common/libsvm.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/util.h"

/* Bytes asked of zlib per read: big enough that gzread's own buffering
 * (and the call) is amortised, small next to any line bound. */
#define S_CHUNK (64 * 1024)

struct dp_libsvm {
    gzFile f;               /* plain or gzip, zlib tells them apart */
    char *path;             /* as given: names the file in every error */
    size_t max_nnz;         /* features per line, at most */
    size_t max_line;        /* bytes per line (newline and a CR before it excluded) */
    char *buf;              /* the read window [pos, end), cap bytes */
    size_t cap, pos, end;   /* one byte past end is always free (a NUL for the last line) */
    int eof;                /* zlib has nothing more */
    uint64_t line_no;       /* lines consumed (the last one read is this number) */
    int pending;            /* a parsed sample waits in keys/vals for the next batch */
    float p_label;          /* its label */
    size_t p_nnz;           /* its feature count */
    uint64_t p_line;        /* its line number */
    uint64_t *keys;         /* [max_nnz] the line's keys, in the file's order */
    float *vals;            /* [max_nnz] their values */
    uint64_t *sorted;       /* [max_nnz] scratch: the keys sorted, for duplicates */
    int failed;             /* a bad line or read error: every call fails until rewind */
    char failure[DP_ERR_LEN]; /* what it was */
};

/* ---- sorting without allocation ---------------------------------------- */

static void s_sift(uint64_t *k, float *v, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && k[child + 1] > k[child]) child++;
        if (k[root] >= k[child]) return;
        uint64_t tk = k[root];
        k[root] = k[child], k[child] = tk;
        if (v) {
            float tv = v[root];
            v[root] = v[child], v[child] = tv;
        }
        root = child;
    }
}

void dp_libsvm_sort(uint64_t *keys, float *values, size_t n)
{
    if (n < 2) return;
    for (size_t i = n / 2; i-- > 0;) s_sift(keys, values, i, n);
    for (size_t end = n - 1; end > 0; end--) {
        uint64_t tk = keys[0];
        keys[0] = keys[end], keys[end] = tk;
        if (values) {
            float tv = values[0];
            values[0] = values[end], values[end] = tv;
        }
        s_sift(keys, values, 0, end);
    }
}

/* ---- batches ------------------------------------------------------------ */

dp_libsvm_batch_t *dp_libsvm_batch_new(size_t cap, size_t nnz_cap)
{
    dp_libsvm_batch_t *b = dp_calloc(1, sizeof *b);
    b->cap = cap;
    b->nnz_cap = nnz_cap;
    b->labels = dp_malloc((cap ? cap : 1) * sizeof *b->labels);
    b->offsets = dp_calloc(cap + 1, sizeof *b->offsets);
    b->keys = dp_malloc((nnz_cap ? nnz_cap : 1) * sizeof *b->keys);
    b->values = dp_malloc((nnz_cap ? nnz_cap : 1) * sizeof *b->values);
    b->lines = dp_malloc((cap ? cap : 1) * sizeof *b->lines);
    return b;
}

void dp_libsvm_batch_destroy(dp_libsvm_batch_t **bp)
{
    if (!bp || !*bp) return;
    dp_libsvm_batch_t *b = *bp;
    free(b->labels), free(b->offsets), free(b->keys), free(b->values), free(b->lines);
    free(b);
    *bp = NULL;
}

/* ---- the reader ---------------------------------------------------------- */

int dp_libsvm_open(dp_libsvm_t **out, const char *path, size_t max_nnz, size_t max_line,
                   char *err)
{
    *out = NULL;
    if (!max_nnz) max_nnz = DP_LIBSVM_MAX_NNZ_DEFAULT;
    if (!max_line) max_line = DP_LIBSVM_MAX_LINE_DEFAULT;
    /* A bound past a few GiB is a mistake, not a plan: refuse before allocating. */
    if (max_nnz > ((size_t)1 << 28) || max_line > ((size_t)1 << 30))
        return dp_err(err, "%s: reader bounds too large (%zu features, %zu bytes per line)", path,
                      max_nnz, max_line);
    gzFile f = gzopen(path, "rb");
    if (!f) return dp_err(err, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    gzbuffer(f, 128 * 1024);
    dp_libsvm_t *r = dp_calloc(1, sizeof *r);
    r->f = f;
    r->path = dp_strdup(path);
    r->max_nnz = max_nnz;
    r->max_line = max_line;
    r->cap = max_line + 2 + S_CHUNK;
    r->buf = dp_malloc(r->cap);
    r->keys = dp_malloc(max_nnz * sizeof *r->keys);
    r->vals = dp_malloc(max_nnz * sizeof *r->vals);
    r->sorted = dp_malloc(max_nnz * sizeof *r->sorted);
    *out = r;
    return 0;
}

size_t dp_libsvm_memory(const dp_libsvm_t *r)
{
    return sizeof *r + strlen(r->path) + 1 + r->cap +
           r->max_nnz * (sizeof *r->keys + sizeof *r->vals + sizeof *r->sorted);
}

void dp_libsvm_close(dp_libsvm_t **rp)
{
    if (!rp || !*rp) return;
    dp_libsvm_t *r = *rp;
    if (r->f) gzclose(r->f);
    free(r->path), free(r->buf), free(r->keys), free(r->vals), free(r->sorted);
    free(r);
    *rp = NULL;
}

/* Fail: the line's message in err and kept for later calls. */
static int s_fail(dp_libsvm_t *r, char *err)
{
    r->failed = 1;
    snprintf(r->failure, sizeof r->failure, "%s", err);
    return -1;
}

/* The next physical line, NUL-terminated, its newline (and a CR before it)
 * cut: 1, 0 at the end of the file, -1 with err. */
static int s_next_line(dp_libsvm_t *r, char **line, size_t *len, char *err)
{
    for (;;) {
        char *at = r->buf + r->pos;
        char *nl = memchr(at, '\n', r->end - r->pos);
        if (nl || (r->eof && r->end > r->pos)) {
            *line = at;
            *len = nl ? (size_t)(nl - at) : r->end - r->pos;
            r->pos = nl ? (size_t)(nl + 1 - r->buf) : r->end;
            r->line_no++;
            break;
        }
        if (r->eof) return 0;
        /* No newline within a whole line's room: the line is too long. */
        if (r->end - r->pos > r->max_line + 1) {
            dp_err(err, "%s:%" PRIu64 ": line longer than %zu bytes (the reader's bound)", r->path,
                   r->line_no + 1, r->max_line);
            return -1;
        }
        memmove(r->buf, at, r->end - r->pos);
        r->end -= r->pos;
        r->pos = 0;
        int n = gzread(r->f, r->buf + r->end, (unsigned)(r->cap - 1 - r->end));
        int errnum = Z_OK;
        const char *why = gzerror(r->f, &errnum);
        /* zlib reports a truncated gzip stream (Z_BUF_ERROR) only through gzerror. */
        if (n < 0 || (n == 0 && errnum != Z_OK)) {
            size_t plen = strlen(r->path); /* zlib's message starts "PATH: " */
            if (strncmp(why, r->path, plen) == 0 && strncmp(why + plen, ": ", 2) == 0) why += plen + 2;
            return dp_err(err, "%s: read error after line %" PRIu64 ": %s", r->path, r->line_no,
                          errnum == Z_ERRNO ? strerror(errno) : why);
        }
        if (n == 0) r->eof = 1;
        r->end += (size_t)n;
    }
    if (*len && (*line)[*len - 1] == '\r') (*len)--;
    if (*len > r->max_line)
        return dp_err(err, "%s:%" PRIu64 ": line longer than %zu bytes (the reader's bound)",
                      r->path, r->line_no, r->max_line);
    if (memchr(*line, '\0', *len))
        return dp_err(err, "%s:%" PRIu64 ": a NUL byte (not a text file?)", r->path, r->line_no);
    (*line)[*len] = '\0';
    return 1;
}

/* Only the characters of a plain decimal number: no "nan", "inf", hex,
 * blanks (strtod takes all of them). */
static int s_decimal(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (!strchr("+-.0123456789eE", *s)) return 0;
    return 1;
}

static int s_digits(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

static const char s_blanks[] = " \t\r\v\f";

/* One KEY:VALUE token (tok NUL-terminated, non-empty, no '#') into the
 * line's arrays; -1 with err ("what is wrong", the caller adds where). */
static int s_parse_feature(dp_libsvm_t *r, char *tok, char *err)
{
    char *colon = strchr(tok, ':');
    if (!colon) return dp_err(err, "token \"%.64s\" is not KEY:VALUE", tok);
    *colon = '\0';
    const char *key = tok, *val = colon + 1;
    if (!s_digits(key)) return dp_err(err, "key \"%.64s\" is not an unsigned integer", key);
    errno = 0;
    unsigned long long k = strtoull(key, NULL, 10);
    if (errno == ERANGE) return dp_err(err, "key \"%.64s\" is larger than 2^64 - 1", key);
    if (!s_decimal(val)) return dp_err(err, "value \"%.64s\" of key %s is not a number", val, key);
    char *end;
    double v = strtod(val, &end);
    if (*end) return dp_err(err, "value \"%.64s\" of key %s is not a number", val, key);
    if (!(fabs(v) <= FLT_MAX))
        return dp_err(err, "value \"%.64s\" of key %s is not a finite float", val, key);
    if (r->p_nnz == r->max_nnz)
        return dp_err(err, "more than %zu features (the reader's bound)", r->max_nnz);
    r->keys[r->p_nnz] = (uint64_t)k;
    r->vals[r->p_nnz] = (float)v;
    r->p_nnz++;
    return 0;
}

/* One line's sample into p_label / keys / vals / p_nnz: 1, 0 for a blank or
 * comment-only line, -1 with err naming the file and line. */
static int s_parse_line(dp_libsvm_t *r, char *line, char *err)
{
    char why[DP_ERR_LEN];
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *save = NULL;
    char *tok = strtok_r(line, s_blanks, &save);
    if (!tok) return 0;
    char *end = tok;
    double label = s_decimal(tok) ? strtod(tok, &end) : 2;
    if (*end || (label != 0 && label != 1 && label != -1)) {
        dp_err(why, "label \"%.64s\" is not 0/1 or -1/+1", tok);
        goto bad;
    }
    r->p_label = label == 1 ? 1.0f : 0.0f;
    r->p_nnz = 0;
    while ((tok = strtok_r(NULL, s_blanks, &save))) {
        if (strncmp(tok, "qid:", 4) == 0) {
            if (!s_digits(tok + 4)) {
                dp_err(why, "\"%.64s\": qid is not an unsigned integer", tok);
                goto bad;
            }
            continue;
        }
        if (s_parse_feature(r, tok, why) != 0) goto bad;
    }
    /* Duplicates: the keys sorted in scratch, neighbours compared. */
    memcpy(r->sorted, r->keys, r->p_nnz * sizeof *r->sorted);
    dp_libsvm_sort(r->sorted, NULL, r->p_nnz);
    for (size_t i = 1; i < r->p_nnz; i++)
        if (r->sorted[i] == r->sorted[i - 1]) {
            dp_err(why, "key %" PRIu64 " appears twice", r->sorted[i]);
            goto bad;
        }
    r->p_line = r->line_no;
    return 1;
bad:
    return dp_err(err, "%s:%" PRIu64 ": %s", r->path, r->line_no, why);
}

/* The next sample, parsed and pending: 1, 0 at the end, -1 with err. */
static int s_read_sample(dp_libsvm_t *r, char *err)
{
    for (;;) {
        char *line = NULL;
        size_t len = 0;
        int rc = s_next_line(r, &line, &len, err);
        if (rc <= 0) return rc;
        rc = s_parse_line(r, line, err);
        if (rc < 0) return -1;
        if (rc == 1) {
            r->pending = 1;
            return 1;
        }
    }
}

long dp_libsvm_next_batch(dp_libsvm_t *r, dp_libsvm_batch_t *b, char *err)
{
    b->n = 0;
    b->offsets[0] = 0;
    if (r->failed) return dp_err(err, "%s", r->failure);
    if (b->nnz_cap < r->max_nnz)
        return dp_err(err, "%s: the batch holds %zu features, fewer than the reader's %zu per line",
                      r->path, b->nnz_cap, r->max_nnz);
    while (b->n < b->cap) {
        if (!r->pending) {
            int rc = s_read_sample(r, err);
            if (rc < 0) {
                b->n = 0;
                return s_fail(r, err);
            }
            if (rc == 0) break;
        }
        size_t at = b->offsets[b->n];
        if (r->p_nnz > b->nnz_cap - at) break; /* it opens the next batch */
        memcpy(b->keys + at, r->keys, r->p_nnz * sizeof *b->keys);
        memcpy(b->values + at, r->vals, r->p_nnz * sizeof *b->values);
        b->labels[b->n] = r->p_label;
        b->lines[b->n] = r->p_line;
        b->offsets[++b->n] = at + r->p_nnz;
        r->pending = 0;
    }
    return (long)b->n;
}

int dp_libsvm_rewind(dp_libsvm_t *r, char *err)
{
    r->pos = r->end = 0;
    r->eof = 0;
    r->line_no = 0;
    r->pending = 0;
    r->failed = 0;
    if (gzrewind(r->f) != 0) {
        int errnum;
        return s_fail(r, (dp_err(err, "%s: cannot rewind: %s", r->path, gzerror(r->f, &errnum)), err));
    }
    return 0;
}

int dp_libsvm_count(dp_libsvm_t *r, uint64_t *samples, uint64_t *nnz, char *err)
{
    *samples = *nnz = 0;
    if (dp_libsvm_rewind(r, err) != 0) return -1;
    int rc;
    while ((rc = s_read_sample(r, err)) == 1) {
        (*samples)++;
        *nnz += r->p_nnz;
        r->pending = 0;
    }
    if (rc < 0) return s_fail(r, err);
    return dp_libsvm_rewind(r, err);
}
