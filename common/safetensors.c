/* safetensors: writer (F32) and validating reader of the safetensors format,
 * and the model checkpoint layer on top (see safetensors.h).
 *
 * Reading: s_open() reads and validates the whole header — length bounded by
 * the file, JSON that is an object followed only by padding, every tensor
 * entry well formed with its byte range inside the data section and no two
 * ranges overlapping — so later lookups only need name/dtype/shape checks.
 * Tensor bytes are read into a scratch buffer and copied to the caller's
 * memory only once everything succeeded: callers' buffers never see a
 * half-read or rejected file. */
#include "common/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes host floats as little-endian: a little-endian host is assumed"
#endif

#define S_MAX_INT ((double)((uint64_t)1 << 53)) /* exact in a JSON double */

typedef struct {
    uint64_t begin, end;
} s_range_t;

typedef struct {
    FILE *f;
    const char *path;
    uint64_t data_start;   /* 8 + header length */
    uint64_t data_len;     /* bytes after the header */
    cJSON *root;           /* parsed header, validated */
} s_file_t;

static const struct {
    const char *name;
    int size;
} s_dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
    {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2}, {"U8", 1},
    {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

static int s_dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof s_dtypes / sizeof s_dtypes[0]; i++)
        if (strcmp(s_dtypes[i].name, name) == 0) return s_dtypes[i].size;
    return 0;
}

/* A JSON number that is a non-negative integer exactly representable. */
static int s_json_uint(const cJSON *j, uint64_t *v)
{
    if (!cJSON_IsNumber(j)) return 0;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= S_MAX_INT) || d != (double)(uint64_t)d) return 0;
    *v = (uint64_t)d;
    return 1;
}

static int s_range_cmp(const void *a, const void *b)
{
    const s_range_t *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int s_name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validate one tensor entry; fills its byte range. */
static int s_check_entry(const s_file_t *sf, const cJSON *e, s_range_t *r, char *err)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return dp_err(err, "%s: header entry '%s' is not an object", sf->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
        return dp_err(err, "%s: tensor '%s' lacks dtype, shape or data_offsets", sf->path, name);
    int dsize = s_dtype_size(dt->valuestring);
    if (!dsize)
        return dp_err(err, "%s: tensor '%s' has unknown dtype '%.16s'", sf->path, name,
                      dt->valuestring);
    uint64_t count = 1, v, need = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh)
    {
        if (!s_json_uint(d, &v))
            return dp_err(err, "%s: tensor '%s' has a bad shape entry", sf->path, name);
        if (__builtin_mul_overflow(count, v, &count))
            return dp_err(err, "%s: tensor '%s' shape is implausibly large", sf->path, name);
    }
    if (__builtin_mul_overflow(count, (uint64_t)dsize, &need))
        return dp_err(err, "%s: tensor '%s' shape is implausibly large", sf->path, name);
    if (cJSON_GetArraySize(off) != 2 || !s_json_uint(off->child, &r->begin) ||
        !s_json_uint(off->child->next, &r->end) || r->begin > r->end)
        return dp_err(err, "%s: tensor '%s' has bad data_offsets", sf->path, name);
    if (r->end > sf->data_len)
        return dp_err(err, "%s: truncated: tensor '%s' needs data bytes [%" PRIu64 ", %" PRIu64
                      ") but the file holds %" PRIu64, sf->path, name, r->begin, r->end,
                      sf->data_len);
    if (r->end - r->begin != need)
        return dp_err(err, "%s: tensor '%s': data_offsets span %" PRIu64 " bytes, its shape "
                      "and dtype need %" PRIu64, sf->path, name, r->end - r->begin, need);
    return 0;
}

/* Every entry valid, no name twice, no two byte ranges overlapping: in
 * O(n log n) for n entries (a header may hold millions), by sorting the
 * names once and the ranges once. */
static int s_check_header(s_file_t *sf, char *err)
{
    const cJSON *root = sf->root;
    int n = cJSON_GetArraySize(root);
    s_range_t *rs = dp_malloc((size_t)(n ? n : 1) * sizeof *rs);
    const char **names = dp_malloc((size_t)(n ? n : 1) * sizeof *names);
    int nr = 0, nn = 0, rc = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        names[nn++] = e->string;
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                dp_err(err, "%s: __metadata__ is not an object", sf->path);
                goto out;
            }
            const cJSON *kv;
            cJSON_ArrayForEach(kv, e)
            {
                if (!cJSON_IsString(kv)) {
                    dp_err(err, "%s: metadata value of '%s' is not a string", sf->path,
                           kv->string);
                    goto out;
                }
            }
            continue;
        }
        if (s_check_entry(sf, e, &rs[nr], err) != 0) goto out;
        nr++;
    }
    qsort(names, (size_t)nn, sizeof *names, s_name_cmp);
    for (int i = 1; i < nn; i++)
        if (strcmp(names[i], names[i - 1]) == 0) {
            dp_err(err, "%s: header names '%s' twice", sf->path, names[i]);
            goto out;
        }
    /* Sorted by start, a range overlaps an earlier one exactly when it
     * starts before the furthest end seen so far (not only its neighbour's:
     * [0,100) [50,50) [60,70) overlap). Empty ranges hold no byte. */
    qsort(rs, (size_t)nr, sizeof *rs, s_range_cmp);
    uint64_t max_end = 0;
    for (int i = 0; i < nr; i++) {
        if (rs[i].begin == rs[i].end) continue;
        if (rs[i].begin < max_end) {
            dp_err(err, "%s: tensors overlap at data bytes [%" PRIu64 ", %" PRIu64 ")", sf->path,
                   rs[i].begin, max_end < rs[i].end ? max_end : rs[i].end);
            goto out;
        }
        max_end = rs[i].end;
    }
    rc = 0;
out:
    free(names);
    free(rs);
    return rc;
}

static void s_close(s_file_t *sf)
{
    if (sf->f) fclose(sf->f);
    cJSON_Delete(sf->root);
    memset(sf, 0, sizeof *sf);
}

static int s_open(s_file_t *sf, const char *path, char *err)
{
    memset(sf, 0, sizeof *sf);
    sf->path = path;
    char *hdr = NULL;
    sf->f = fopen(path, "rb");
    if (!sf->f) return dp_err(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(sf->f), &st) != 0 || !S_ISREG(st.st_mode)) {
        dp_err(err, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t lb[8];
    if (size < 8 || fread(lb, 1, 8, sf->f) != 8) {
        dp_err(err, "%s: truncated: %" PRIu64 " bytes, too short for a safetensors file", path, size);
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | lb[i];
    if (n < 2 || n > size - 8 || n > DP_ST_MAX_HEADER) {
        dp_err(err, "%s: bad header length %" PRIu64 " (file has %" PRIu64 " bytes after the "
               "length; not a safetensors file, or truncated)", path, n, size - 8);
        goto fail;
    }
    hdr = dp_malloc((size_t)n + 1);
    if (fread(hdr, 1, (size_t)n, sf->f) != (size_t)n) {
        dp_err(err, "%s: read error in the header", path);
        goto fail;
    }
    hdr[n] = 0;
    const char *end = NULL;
    if (hdr[0] != '{' || !(sf->root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end, 0)) ||
        !cJSON_IsObject(sf->root)) {
        dp_err(err, "%s: header is not a JSON object%s", path,
               hdr[0] != '{' ? " (does not start with '{')" : "");
        goto fail;
    }
    for (const char *p = end; p < hdr + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            dp_err(err, "%s: garbage after the header JSON at byte %td", path, p - hdr + 8);
            goto fail;
        }
    sf->data_start = 8 + n;
    sf->data_len = size - 8 - n;
    if (s_check_header(sf, err) != 0) goto fail;
    free(hdr);
    return 0;
fail:
    free(hdr);
    s_close(sf);
    return -1;
}

static void s_shape_str(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* Find F32 tensor name with the expected shape (or, when ndim < 0, any shape
 * with count elements); fills its byte range. */
static int s_find_typed(const s_file_t *sf, const char *name, int ndim, const int64_t *shape,
                        size_t count, s_range_t *r, int *is_i64, char *err)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(sf->root, name);
    if (!e || strcmp(name, "__metadata__") == 0)
        return dp_err(err, "%s: tensor '%s' missing", sf->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    int i64 = is_i64 && strcmp(dt->valuestring, "I64") == 0;
    if (is_i64) *is_i64 = i64;
    if (!i64 && strcmp(dt->valuestring, "F32") != 0)
        return dp_err(err, "%s: tensor '%s' has dtype %s, expected F32", sf->path, name,
                      dt->valuestring);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"), *d;
    int64_t got[DP_ST_MAX_DIMS] = {0};
    int gn = 0, same = 1;
    uint64_t n = 1, v = 0;
    cJSON_ArrayForEach(d, sh)
    {
        s_json_uint(d, &v); /* validated by s_open */
        if (gn < DP_ST_MAX_DIMS) got[gn] = (int64_t)v;
        if (ndim >= 0 && (gn >= ndim || (uint64_t)shape[gn] != v)) same = 0;
        gn++;
        n *= v;
    }
    if (ndim >= 0 && gn != ndim) same = 0;
    if (ndim < 0 && n != count) {
        return dp_err(err, "%s: tensor '%s' has %" PRIu64 " elements, expected %zu", sf->path,
                      name, n, count);
    }
    if (!same) {
        char a[128], b[128];
        s_shape_str(a, sizeof a, gn < DP_ST_MAX_DIMS ? gn : DP_ST_MAX_DIMS, got);
        s_shape_str(b, sizeof b, ndim, shape);
        return dp_err(err, "%s: tensor '%s' has shape %s%s, expected %s", sf->path, name, a,
                      gn > DP_ST_MAX_DIMS ? "..." : "", b);
    }
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    s_json_uint(off->child, &r->begin);
    s_json_uint(off->child->next, &r->end);
    return 0;
}

static int s_find_f32(const s_file_t *sf, const char *name, int ndim, const int64_t *shape,
                      size_t count, s_range_t *r, char *err)
{
    return s_find_typed(sf, name, ndim, shape, count, r, NULL, err);
}

/* Read range r into out, which holds exactly cap bytes: a range of any
 * other length is refused, so no header (nor a size computed from one) can
 * make a read pass the caller's buffer. */
static int s_read_range(const s_file_t *sf, const s_range_t *r, void *out, size_t cap, char *err)
{
    size_t len = (size_t)(r->end - r->begin);
    if (r->end - r->begin != (uint64_t)cap)
        return dp_err(err, "%s: tensor data of %" PRIu64 " bytes, expected %zu", sf->path,
                      r->end - r->begin, cap);
    if (len == 0) return 0;
    if (fseeko(sf->f, (off_t)(sf->data_start + r->begin), SEEK_SET) != 0 ||
        fread(out, 1, len, sf->f) != len)
        return dp_err(err, "%s: read error in the tensor data", sf->path);
    return 0;
}

int dp_safetensors_read_tensor(const char *path, const char *name, float *out, size_t count,
                               char *err)
{
    s_file_t sf;
    if (s_open(&sf, path, err) != 0) return -1;
    s_range_t r;
    int rc = s_find_f32(&sf, name, -1, NULL, count, &r, err);
    size_t bytes = 0;
    if (rc == 0 && dp_size_mul(count, sizeof(float), &bytes) != 0)
        rc = dp_err(err, "%s: tensor '%s': %zu floats do not fit in memory", path, name, count);
    if (rc == 0) {
        float *tmp = dp_malloc(bytes);
        rc = s_read_range(&sf, &r, tmp, bytes, err);
        if (rc == 0 && count) memcpy(out, tmp, count * sizeof(float));
        free(tmp);
    }
    s_close(&sf);
    return rc;
}

static const char *s_meta(const s_file_t *sf, const char *key)
{
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(sf->root, "__metadata__");
    const cJSON *v = md ? cJSON_GetObjectItemCaseSensitive(md, key) : NULL;
    return v ? v->valuestring : NULL;
}

char *dp_safetensors_read_meta(const char *path, const char *key, char *err)
{
    s_file_t sf;
    if (s_open(&sf, path, err) != 0) return NULL;
    const char *v = s_meta(&sf, key);
    char *out = v ? dp_strdup(v) : NULL;
    if (!v && err) err[0] = 0;
    s_close(&sf);
    return out;
}

/* A tensor of a --init file: its header entry and where its data lies. */
typedef struct {
    const cJSON *e;
    s_range_t r;
    int order;             /* position in the header */
} s_entry_t;

static int s_entry_cmp(const void *a, const void *b)
{
    const s_entry_t *x = a, *y = b;
    if (x->r.begin != y->r.begin) return x->r.begin < y->r.begin ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* Is name one of the comma-separated list? */
static int s_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* Every name of list must be a tensor of the table (a typo would silently
 * train a buffer by gradients). */
static int s_check_list(const char *path, const char *what, const char *list,
                        const s_entry_t *es, int n, char *err)
{
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        int len = (int)(comma ? (size_t)(comma - p) : strlen(p));
        int found = 0;
        for (int i = 0; i < n && !found; i++)
            found = (int)strlen(es[i].e->string) == len && strncmp(es[i].e->string, p, (size_t)len) == 0;
        if (!found)
            return dp_err(err, "%s: %s names '%.*s', which is not a tensor of the file", path,
                          what, len > 96 ? 96 : len, p);
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* The table's entries from the validated header, in data order. */
static int s_table_entries(const s_file_t *sf, const char *state, const char *extra,
                           s_entry_t *es, int n, dp_table_entry_t *t, int64_t (*shapes)[DP_PARAM_MAX_DIMS],
                           char *err)
{
    for (int i = 0; i < n; i++) {
        const cJSON *e = es[i].e;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        if (strcmp(dt->valuestring, "F32") != 0)
            return dp_err(err, "%s: tensor '%.96s' is %s; the servers hold float32 tensors "
                          "(downpour.torch.save_init converts)", sf->path, e->string, dt->valuestring);
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"), *d;
        int nd = 0;
        uint64_t v = 0;
        cJSON_ArrayForEach(d, sh)
        {
            if (nd == DP_PARAM_MAX_DIMS)
                return dp_err(err, "%s: tensor '%.96s' has more than %d dimensions", sf->path,
                              e->string, DP_PARAM_MAX_DIMS);
            s_json_uint(d, &v); /* validated by s_open */
            shapes[i][nd++] = v > INT64_MAX ? INT64_MAX : (int64_t)v;
        }
        t[i] = (dp_table_entry_t){e->string, nd, shapes[i],
                                  !s_in_list(state, e->string) && !s_in_list(extra, e->string)};
    }
    if (s_check_list(sf->path, "metadata '" DP_ST_STATE_KEY "'", state, es, n, err) != 0 ||
        s_check_list(sf->path, "--state-tensors", extra, es, n, err) != 0)
        return -1;
    return 0;
}

/* The floats of every entry into a fresh buffer laid out as m, checked
 * finite. */
static int s_table_values(const s_file_t *sf, const dp_model_t *m, const s_entry_t *es,
                          float **values, char *err)
{
    float *x = dp_aligned_alloc((m->n_floats + 1) * sizeof(float));
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        if (s_read_range(sf, &es[i].r, x + p->offset, p->count * sizeof(float), err) != 0)
            goto fail;
        for (size_t j = 0; j < p->count; j++)
            if (!isfinite(x[p->offset + j])) {
                dp_err(err, "%s: tensor '%s' element %zu is not finite", sf->path, p->name, j);
                goto fail;
            }
    }
    *values = x;
    return 0;
fail:
    free(x);
    return -1;
}

int dp_safetensors_read_table(const char *path, const char *extra_state, dp_model_t *m,
                              float **values, char *err)
{
    s_file_t sf;
    if (s_open(&sf, path, err) != 0) return -1;
    int total = cJSON_GetArraySize(sf.root), n = 0, rc = -1;
    s_entry_t *es = dp_malloc((size_t)(total ? total : 1) * sizeof *es);
    const cJSON *e;
    cJSON_ArrayForEach(e, sf.root)
    {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        es[n].e = e;
        es[n].order = n;
        s_json_uint(off->child, &es[n].r.begin); /* validated by s_open */
        s_json_uint(off->child->next, &es[n].r.end);
        n++;
    }
    dp_table_entry_t *t = NULL;
    int64_t (*shapes)[DP_PARAM_MAX_DIMS] = NULL;
    dp_model_t *tm = dp_malloc(sizeof *tm);
    if (n == 0 || n > DP_MAX_PARAMS) {
        dp_err(err, "%s: %d tensors; a --init file holds 1..%d", path, n, DP_MAX_PARAMS);
        goto out;
    }
    qsort(es, (size_t)n, sizeof *es, s_entry_cmp);
    t = dp_malloc((size_t)n * sizeof *t);
    shapes = dp_malloc((size_t)n * sizeof *shapes);
    char e2[DP_ERR_LEN];
    if (s_table_entries(&sf, s_meta(&sf, DP_ST_STATE_KEY), extra_state, es, n, t, shapes, err) != 0)
        goto out;
    if (dp_model_from_table(tm, t, n, e2) != 0) {
        dp_err(err, "%s: %s", path, e2);
        goto out;
    }
    const char *rows = s_meta(&sf, DP_ST_ROWS_KEY);
    if (rows) { /* a row table beside the tensors: its width */
        char *end = NULL;
        long d = strtol(rows, &end, 10);
        if (end == rows || *end || d < 1 || d > DP_MODEL_MAX_EMBED) {
            dp_err(err, "%s: metadata '" DP_ST_ROWS_KEY "' is '%.40s', not a row width (1..%d)",
                   path, rows, DP_MODEL_MAX_EMBED);
            goto out;
        }
        if (dp_model_table_rows(tm, (int)d, e2) != 0) {
            dp_err(err, "%s: %s", path, e2);
            goto out;
        }
    }
    if (values && s_table_values(&sf, tm, es, values, err) != 0) goto out;
    *m = *tm;
    rc = 0;
out:
    free(tm);
    free(shapes);
    free(t);
    free(es);
    s_close(&sf);
    return rc;
}

/* Tensor name's entry: its dtype must be want, its shape [n] (d == 0) or
 * [n, d]; *n and its byte range filled. */
static int s_find_rows_part(const s_file_t *sf, const char *name, const char *want, int d,
                            uint64_t *n, s_range_t *r, char *err)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(sf->root, name);
    if (!e)
        return dp_err(err, "%s: no tensor '%s': the file holds no row table (a sparse model's "
                      "file names its keys %s and its rows %s)", sf->path, name, DP_ST_ROWS_KEYS,
                      DP_ST_ROWS_WEIGHT);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype"), *x;
    if (strcmp(dt->valuestring, want) != 0)
        return dp_err(err, "%s: tensor '%s' has dtype %s, expected %s", sf->path, name,
                      dt->valuestring, want);
    uint64_t dims[2] = {0, 0};
    int nd = 0;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(e, "shape"))
    {
        if (nd < 2) s_json_uint(x, &dims[nd]); /* validated by s_open */
        nd++;
    }
    if (nd != (d ? 2 : 1) || (d && dims[1] != (uint64_t)d)) {
        if (d)
            return dp_err(err, "%s: tensor '%s' is not [n, %d] (rows of the model's width)",
                          sf->path, name, d);
        return dp_err(err, "%s: tensor '%s' is not [n] (one key a row)", sf->path, name);
    }
    *n = dims[0];
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    s_json_uint(off->child, &r->begin);
    s_json_uint(off->child->next, &r->end);
    return 0;
}

int dp_safetensors_read_rows(const char *path, int d, uint64_t **keys, float **rows, size_t *n,
                             char *err)
{
    if (d < 1) return dp_err(err, "%s: rows of width %d asked", path, d);
    s_file_t sf;
    if (s_open(&sf, path, err) != 0) return -1;
    uint64_t nk = 0, nr = 0;
    s_range_t rk, rr;
    uint64_t *k = NULL;
    float *w = NULL;
    int rc = -1;
    if (s_find_rows_part(&sf, DP_ST_ROWS_KEYS, "U64", 0, &nk, &rk, err) != 0 ||
        s_find_rows_part(&sf, DP_ST_ROWS_WEIGHT, "F32", d, &nr, &rr, err) != 0)
        goto out;
    if (nk != nr) {
        dp_err(err, "%s: %" PRIu64 " keys (%s) but %" PRIu64 " rows (%s)", path, nk,
               DP_ST_ROWS_KEYS, nr, DP_ST_ROWS_WEIGHT);
        goto out;
    }
    /* the header's byte counts match these shapes and lie inside the file
     * (s_open), so nk x 8 and nk x d x 4 bytes are the file's own */
    size_t count = (size_t)nk, rb = count * (size_t)d * sizeof(float);
    k = dp_malloc((count ? count : 1) * sizeof *k);
    w = dp_malloc(rb ? rb : 1);
    if (s_read_range(&sf, &rk, k, count * sizeof *k, err) != 0 || s_read_range(&sf, &rr, w, rb, err) != 0)
        goto out;
    for (size_t i = 1; i < count; i++)
        if (k[i] <= k[i - 1]) {
            if (k[i] == k[i - 1])
                dp_err(err, "%s: key %" PRIu64 " twice in %s (at %zu and %zu): each key has one "
                       "row", path, k[i], DP_ST_ROWS_KEYS, i - 1, i);
            else
                dp_err(err, "%s: %s not in ascending order: key %" PRIu64 " at %zu after %" PRIu64,
                       path, DP_ST_ROWS_KEYS, k[i], i, k[i - 1]);
            goto out;
        }
    for (size_t i = 0; i < count * (size_t)d; i++)
        if (!isfinite(w[i])) {
            dp_err(err, "%s: the row of key %" PRIu64 " (%s) holds a value that is not finite",
                   path, k[i / (size_t)d], DP_ST_ROWS_WEIGHT);
            goto out;
        }
    if (count == 0) { /* nothing to hand over */
        free(k), free(w);
        k = NULL, w = NULL;
    }
    *keys = k, *rows = w, *n = count;
    k = NULL, w = NULL;
    rc = 0;
out:
    free(k);
    free(w);
    s_close(&sf);
    return rc;
}

int dp_safetensors_write(const char *path, const dp_st_tensor_t *t, int n,
                         const char *const *meta_kv, char *err)
{
    return dp_safetensors_write_typed(path, t, NULL, n, meta_kv, err);
}

int dp_safetensors_write_typed(const char *path, const dp_st_tensor_t *t, const int *i64, int n,
                               const char *const *meta_kv, char *err)
{
    cJSON *root = cJSON_CreateObject();
    char *json = NULL;
    uint8_t *buf = NULL;
    int rc = -1;
    if (meta_kv && meta_kv[0]) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; meta_kv[i]; i += 2) {
            if (!meta_kv[i + 1]) {
                dp_err(err, "%s: metadata key '%s' has no value", path, meta_kv[i]);
                goto out;
            }
            if (cJSON_GetObjectItemCaseSensitive(md, meta_kv[i])) {
                dp_err(err, "%s: metadata key '%s' given twice", path, meta_kv[i]);
                goto out;
            }
            cJSON_AddStringToObject(md, meta_kv[i], meta_kv[i + 1]);
        }
    }
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name;
        if (!name || !name[0] || strcmp(name, "__metadata__") == 0 ||
            cJSON_GetObjectItemCaseSensitive(root, name)) {
            dp_err(err, "%s: bad or duplicate tensor name '%s'", path, name ? name : "(null)");
            goto out;
        }
        if (t[i].ndim < 0 || t[i].ndim > DP_ST_MAX_DIMS) {
            dp_err(err, "%s: tensor '%s': bad rank %d", path, name, t[i].ndim);
            goto out;
        }
        uint64_t count = 1;
        cJSON *e = cJSON_AddObjectToObject(root, name);
        int type = i64 ? i64[i] : DP_ST_F32, wide = type != DP_ST_F32; /* 8 bytes an element */
        cJSON_AddStringToObject(e, "dtype", type == DP_ST_U64 ? "U64" : wide ? "I64" : "F32");
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) {
                dp_err(err, "%s: tensor '%s': negative dimension", path, name);
                goto out;
            }
            count *= (uint64_t)t[i].shape[d];
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        }
        cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)total));
        total += count * (wide ? sizeof(int64_t) : sizeof(float));
        /* cJSON prints integers below 1e15 without an exponent. */
        if (total >= (uint64_t)1e15) {
            dp_err(err, "%s: tensors too large", path);
            goto out;
        }
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)total));
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) {
        dp_err(err, "%s: cannot format the header", path);
        goto out;
    }
    size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;
    buf = dp_malloc(8 + hlen + (size_t)total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, json, jlen);
    memset(buf + 8 + jlen, ' ', hlen - jlen);
    uint8_t *p = buf + 8 + hlen;
    for (int i = 0; i < n; i++) {
        size_t count = 1;
        for (int d = 0; d < t[i].ndim; d++) count *= (size_t)t[i].shape[d];
        if (i64 && i64[i] == DP_ST_U64) {
            if (count) memcpy(p, t[i].data, count * sizeof(uint64_t));
            p += count * sizeof(uint64_t);
            continue;
        }
        if (i64 && i64[i] == DP_ST_I64) {
            for (size_t k = 0; k < count; k++, p += sizeof(int64_t)) {
                int64_t v = (int64_t)llrintf(t[i].data[k]);
                memcpy(p, &v, sizeof v);
            }
            continue;
        }
        if (count) memcpy(p, t[i].data, count * sizeof(float));
        p += count * sizeof(float);
    }
    rc = dp_write_file_atomic(path, buf, 8 + hlen + (size_t)total, err);
out:
    free(buf);
    free(json);
    cJSON_Delete(root);
    return rc;
}

/* dp_checkpoint_save_ex with extra tensor i of dtype extra_types[i]
 * (extra_types NULL: all F32). */
static int s_checkpoint_write(const char *path, const dp_model_t *m, const float *params, long step,
                              long version, const dp_st_tensor_t *extra, const int *extra_types,
                              int n_extra, const char *const *extra_kv, char *err)
{
    int n = m->n_params + n_extra;
    dp_st_tensor_t *t = dp_malloc((size_t)(n ? n : 1) * sizeof *t);
    int *i64 = dp_calloc((size_t)(n ? n : 1), sizeof *i64);
    int64_t shapes[DP_MAX_PARAMS][DP_PARAM_MAX_DIMS];
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        for (int d = 0; d < p->ndim; d++) shapes[i][d] = p->shape[d];
        t[i] = (dp_st_tensor_t){p->name, params + p->offset, p->ndim, shapes[i]};
        i64[i] = p->counter ? DP_ST_I64 : DP_ST_F32;
    }
    for (int i = 0; i < n_extra; i++) {
        t[m->n_params + i] = extra[i];
        i64[m->n_params + i] = extra_types ? extra_types[i] : DP_ST_F32;
    }

    char input[48], classes[16], fp[24], st[24], ver[24];
    snprintf(input, sizeof input, "%dx%dx%d", m->in_c, m->in_h, m->in_w);
    snprintf(classes, sizeof classes, "%d", m->classes);
    snprintf(fp, sizeof fp, "%016" PRIx64, m->fingerprint);
    snprintf(st, sizeof st, "%ld", step);
    snprintf(ver, sizeof ver, "%ld", version);
    const char *base[] = {"format", "downpour", "spec", m->spec, "input", input,
                          "classes", classes, "fingerprint", fp, "step", st, "version", ver};
    int nb = (int)(sizeof base / sizeof base[0]), ne = 0;
    while (extra_kv && extra_kv[ne]) ne += extra_kv[ne + 1] ? 2 : 1;
    const char **kv = dp_malloc((size_t)(nb + ne + 1) * sizeof *kv);
    memcpy(kv, base, sizeof base);
    for (int i = 0; i < ne; i++) kv[nb + i] = extra_kv[i];
    kv[nb + ne] = NULL;
    int rc = dp_safetensors_write_typed(path, t, i64, n, kv, err);
    free(kv);
    free(i64);
    free(t);
    return rc;
}

int dp_checkpoint_save_ex(const char *path, const dp_model_t *m, const float *params, long step,
                          long version, const dp_st_tensor_t *extra, int n_extra,
                          const char *const *extra_kv, char *err)
{
    return s_checkpoint_write(path, m, params, step, version, extra, NULL, n_extra, extra_kv, err);
}

int dp_checkpoint_save_rows(const char *path, const dp_model_t *m, const float *params, long step,
                            long version, const uint64_t *keys, const float *rows, size_t n,
                            const char *const *extra_kv, char *err)
{
    int64_t ks[1] = {(int64_t)n}, rs[2] = {(int64_t)n, m->embed_dim};
    const dp_st_tensor_t t[2] = {{DP_ST_ROWS_KEYS, (const float *)(const void *)keys, 1, ks},
                                 {DP_ST_ROWS_WEIGHT, rows, 2, rs}};
    const int types[2] = {DP_ST_U64, DP_ST_F32};
    return s_checkpoint_write(path, m, params, step, version, t, types, 2, extra_kv, err);
}

int dp_checkpoint_save(const char *path, const dp_model_t *m, const float *params, long step,
                       long version, const char *const *extra_kv, char *err)
{
    return dp_checkpoint_save_ex(path, m, params, step, version, NULL, 0, extra_kv, err);
}

/* Metadata integer key (absent: 0). */
static int s_meta_long(const s_file_t *sf, const char *key, long *out, char *err)
{
    const char *v = s_meta(sf, key);
    *out = 0;
    if (!v) return 0;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno)
        return dp_err(err, "%s: metadata '%s' is not an integer: '%.32s'", sf->path, key, v);
    *out = x;
    return 0;
}

int dp_checkpoint_load(const char *path, const dp_model_t *m, float *params, long *step,
                       long *version, char *err)
{
    s_file_t sf;
    if (s_open(&sf, path, err) != 0) return -1;
    /* m's sizes are bounded by dp_model_parse; checked again here because
     * the buffer and each read below must agree whatever m says. */
    size_t bytes = 0;
    if (dp_size_mul(m->n_floats, sizeof(float), &bytes) != 0) {
        s_close(&sf);
        return dp_err(err, "%s: the model's %zu floats do not fit in memory", path, m->n_floats);
    }
    float *tmp = dp_malloc(bytes);
    long st = 0, ver = 0;
    int rc = -1;
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        int64_t shape[DP_PARAM_MAX_DIMS];
        for (int d = 0; d < p->ndim; d++) shape[d] = p->shape[d];
        s_range_t r;
        if (p->offset > m->n_floats || p->count > m->n_floats - p->offset) {
            dp_err(err, "%s: model tensor '%s' lies outside the model's %zu floats", path,
                   p->name, m->n_floats);
            goto out;
        }
        int i64 = 0;
        if (s_find_typed(&sf, p->name, p->ndim, shape, p->count, &r, p->counter ? &i64 : NULL,
                         err) != 0)
            goto out;
        if (i64) { /* a counter PyTorch's way: exact in a float below 2^24 */
            int64_t *v = dp_malloc((p->count ? p->count : 1) * sizeof *v);
            int ok = s_read_range(&sf, &r, v, p->count * sizeof *v, err) == 0;
            for (size_t k = 0; ok && k < p->count; k++) {
                if (v[k] < 0 || v[k] > ((int64_t)1 << 24)) {
                    dp_err(err, "%s: counter '%s' is %lld (0..2^24)", path, p->name, (long long)v[k]);
                    ok = 0;
                }
                tmp[p->offset + k] = (float)v[k];
            }
            free(v);
            if (!ok) goto out;
            continue;
        }
        if (s_read_range(&sf, &r, tmp + p->offset, p->count * sizeof(float), err) != 0)
            goto out;
    }
    if (s_meta_long(&sf, "step", &st, err) != 0 || s_meta_long(&sf, "version", &ver, err) != 0)
        goto out;
    memcpy(params, tmp, bytes);
    if (step) *step = st;
    if (version) *version = ver;
    rc = 0;
out:
    free(tmp);
    s_close(&sf);
    return rc;
}
