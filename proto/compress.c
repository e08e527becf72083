/* compress: top-k and sign with error feedback, and the servers' check and
 * expansion of a compressed PUSH (see compress.h for the exact rules). */
#include "proto/compress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int dp_compress_parse(const char *s, dp_compress_conf_t *c, char *err)
{
    if (!s) s = "";
    if (strcmp(s, "none") == 0) {
        c->kind = DP_COMPRESS_NONE;
        c->fraction = 0;
        return 0;
    }
    if (strcmp(s, "sign") == 0) {
        c->kind = DP_COMPRESS_SIGN;
        c->fraction = 0;
        return 0;
    }
    if (strncmp(s, "topk:", 5) == 0) {
        char *end = NULL;
        double f = strtod(s + 5, &end);
        /* at most half: k indices and k values are never more bytes than
         * the n dense floats (the servers' bound on a PUSH) */
        if (end != s + 5 && *end == 0 && f > 0 && f <= 0.5) {
            c->kind = DP_COMPRESS_TOPK;
            c->fraction = f;
            return 0;
        }
        return dp_err(err, "--compress '%s': topk:FRACTION takes a fraction in (0, 0.5] (0.01: "
                           "the largest 1 %% of the entries)", s);
    }
    return dp_err(err, "--compress '%s': none, topk:FRACTION or sign", s);
}

void dp_compress_name(const dp_compress_conf_t *c, char *out, size_t n)
{
    if (c->kind == DP_COMPRESS_TOPK) snprintf(out, n, "topk:%g", c->fraction);
    else snprintf(out, n, "%s", c->kind == DP_COMPRESS_SIGN ? "sign" : "none");
}

int dp_compress_ef_parse(const char *s, int *on, char *err)
{
    if (s && strcmp(s, "on") == 0) *on = 1;
    else if (s && strcmp(s, "off") == 0) *on = 0;
    else return dp_err(err, "--error-feedback '%s': on or off", s ? s : "");
    return 0;
}

size_t dp_compress_topk_k(double fraction, size_t n)
{
    size_t k = (size_t)ceil(fraction * (double)n);
    if (k < 1) k = 1;
    if (k > n / 2) k = n / 2;
    return k;
}

void dp_compressor_init(dp_compressor_t *z, const dp_compress_conf_t *c, size_t n)
{
    memset(z, 0, sizeof *z);
    z->conf = *c;
    z->n = n;
    z->v = dp_malloc((n + 1) * sizeof(float));
    if (c->error_feedback) z->resid = dp_calloc(n + 1, sizeof(float));
    if (c->kind == DP_COMPRESS_TOPK) {
        z->hist = dp_malloc(65536 * sizeof *z->hist);
        z->idx = dp_malloc((n / 2 + 1) * sizeof *z->idx);
        z->val = dp_malloc((n / 2 + 1) * sizeof *z->val);
    }
    if (c->kind == DP_COMPRESS_SIGN) z->bits = dp_malloc(n / 8 + 1);
}

void dp_compressor_fini(dp_compressor_t *z)
{
    free(z->v);
    free(z->resid);
    free(z->hist);
    free(z->idx);
    free(z->val);
    free(z->bits);
    memset(z, 0, sizeof *z);
}

static uint32_t s_abs_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}

/* The k entries of largest |v| (ties: lower index first) into idx / val in
 * ascending index order. A radix selection on |v|'s bits (which order the
 * magnitudes as the floats do, a NaN above all): the top 15 bits, then the
 * low 16 within the threshold's bucket, give the exact k-th magnitude T;
 * then one pass takes every entry above T and the first (lowest-index)
 * ones equal to it. Three passes over n, no sort. */
static void s_topk(dp_compressor_t *z)
{
    const float *v = z->v;
    size_t n = z->n, k = z->k;
    uint32_t *h = z->hist;
    memset(h, 0, 32768 * sizeof *h);
    for (size_t i = 0; i < n; i++) h[s_abs_bits(v[i]) >> 16]++;
    size_t cum = 0, above = 0;
    uint32_t hi = 0;
    for (int b = 32767; b >= 0; b--) {
        if (cum + h[b] >= k) {
            hi = (uint32_t)b;
            above = cum;
            break;
        }
        cum += h[b];
    }
    memset(h, 0, 65536 * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        uint32_t a = s_abs_bits(v[i]);
        if (a >> 16 == hi) h[a & 0xffffu]++;
    }
    uint32_t t = hi << 16;
    size_t gt = above;
    cum = above;
    for (int b = 65535; b >= 0; b--) {
        if (cum + h[b] >= k) {
            t = hi << 16 | (uint32_t)b;
            gt = cum;
            break;
        }
        cum += h[b];
    }
    size_t ties = k - gt, j = 0;
    for (size_t i = 0; i < n && j < k; i++) {
        uint32_t a = s_abs_bits(v[i]);
        if (a > t || (a == t && ties > 0)) {
            if (a == t) ties--;
            z->idx[j] = (uint32_t)i;
            z->val[j] = v[i];
            j++;
        }
    }
}

static void s_sign(dp_compressor_t *z)
{
    const float *v = z->v;
    size_t n = z->n;
    double sum = 0;
    memset(z->bits, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++) {
        sum += fabs((double)v[i]);
        if (v[i] < 0) z->bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    z->scale = n ? (float)(sum / (double)n) : 0.0f;
}

size_t dp_compressor_encode(dp_compressor_t *z, const float *g)
{
    size_t n = z->n;
    if (z->resid)
        for (size_t i = 0; i < n; i++) z->v[i] = g[i] + z->resid[i];
    else
        memcpy(z->v, g, n * sizeof(float));
    z->kind = z->conf.kind;
    z->k = 0;
    if (z->kind == DP_COMPRESS_TOPK) {
        z->k = dp_compress_topk_k(z->conf.fraction, n);
        if (z->k == 0) z->kind = DP_COMPRESS_NONE; /* a slice of one float: dense */
        else s_topk(z);
    } else if (z->kind == DP_COMPRESS_SIGN) {
        s_sign(z);
    }
    if (z->resid) {
        /* e = v - expand(c), entry by entry as dp_compressor_expand writes it */
        if (z->kind == DP_COMPRESS_TOPK) {
            memcpy(z->resid, z->v, n * sizeof(float));
            for (size_t j = 0; j < z->k; j++) z->resid[z->idx[j]] = 0.0f;
        } else if (z->kind == DP_COMPRESS_SIGN) {
            for (size_t i = 0; i < n; i++)
                z->resid[i] = z->v[i] - ((z->bits[i >> 3] >> (i & 7)) & 1 ? -z->scale : z->scale);
        } else {
            memset(z->resid, 0, n * sizeof(float));
        }
    }
    return dp_compressor_bytes(z);
}

size_t dp_compressor_bytes(const dp_compressor_t *z)
{
    switch (z->kind) {
    case DP_COMPRESS_TOPK: return z->k * (sizeof(uint32_t) + sizeof(float));
    case DP_COMPRESS_SIGN: return (z->n + 7) / 8 + sizeof(float);
    default: return z->n * sizeof(float);
    }
}

static void s_expand_topk(const uint32_t *idx, const float *val, size_t k, size_t n, float *dense)
{
    memset(dense, 0, n * sizeof(float));
    for (size_t j = 0; j < k; j++) dense[idx[j]] = val[j];
}

static void s_expand_sign(const uint8_t *bits, float scale, size_t n, float *dense)
{
    for (size_t i = 0; i < n; i++) dense[i] = (bits[i >> 3] >> (i & 7)) & 1 ? -scale : scale;
}

void dp_compressor_expand(const dp_compressor_t *z, float *dense)
{
    if (z->kind == DP_COMPRESS_TOPK) s_expand_topk(z->idx, z->val, z->k, z->n, dense);
    else if (z->kind == DP_COMPRESS_SIGN) s_expand_sign(z->bits, z->scale, z->n, dense);
    else memcpy(dense, z->v, z->n * sizeof(float));
}

/* ---- the servers' side ------------------------------------------------- */

/* Descriptor i of a compressed PUSH: dtype, one dimension, at offset lo. */
static int s_desc_ok(const Downpour__Envelope *env, size_t i, int dtype, const char *what,
                     uint64_t lo, char *err)
{
    const Downpour__TensorDesc *d = env->tensors[i];
    if ((int)d->dtype != dtype || d->n_shape != 1)
        return dp_err(err, "malformed: compressed PUSH: tensor %zu (%s) must be the %s (dtype %d, "
                           "one dimension)", i, d->key, what, dtype);
    if (d->offset != lo)
        return dp_err(err, "malformed: compressed PUSH: tensor %zu (%s) at offset %llu but this "
                           "shard's slice starts at %llu", i, d->key,
                      (unsigned long long)d->offset, (unsigned long long)lo);
    return 0;
}

static int s_topk_wire(const Downpour__Envelope *env, const dp_wire_frame_t *frames, uint64_t lo,
                       uint64_t n, float *dense, char *err)
{
    if (env->n_tensors != 2)
        return dp_err(err, "malformed: top-k PUSH with %zu tensors (indices and values: 2)",
                      env->n_tensors);
    if (s_desc_ok(env, 0, DOWNPOUR__DTYPE__UINT32, "indices", lo, err) != 0 ||
        s_desc_ok(env, 1, DOWNPOUR__DTYPE__FLOAT32, "values", lo, err) != 0)
        return -1;
    uint64_t k = (uint64_t)env->tensors[0]->shape[0];
    if ((uint64_t)env->tensors[1]->shape[0] != k)
        return dp_err(err, "malformed: top-k PUSH with %llu indices but %llu values",
                      (unsigned long long)k, (unsigned long long)env->tensors[1]->shape[0]);
    if (k < 1 || k > n / 2)
        return dp_err(err, "malformed: top-k PUSH of %llu entries for a slice of %llu floats "
                           "(1 to %llu: never more bytes than the dense push)",
                      (unsigned long long)k, (unsigned long long)n, (unsigned long long)(n / 2));
    /* the frames may sit at any alignment (ZeroMQ's zero-copy receive) */
    const unsigned char *ip = frames[0].data, *vp = frames[1].data;
    memset(dense, 0, n * sizeof(float));
    uint64_t prev = 0;
    for (uint64_t j = 0; j < k; j++) {
        uint32_t at;
        memcpy(&at, ip + 4 * j, 4);
        if (at >= n)
            return dp_err(err, "malformed: top-k PUSH: index %llu is %u, out of this shard's slice "
                               "of %llu floats", (unsigned long long)j, at, (unsigned long long)n);
        if (j > 0 && at <= prev)
            return dp_err(err, "malformed: top-k PUSH: index %llu is %u after %llu (indices must "
                               "be strictly increasing: sorted, no duplicates)",
                          (unsigned long long)j, at, (unsigned long long)prev);
        memcpy(dense + at, vp + 4 * j, 4);
        prev = at;
    }
    return 0;
}

static int s_sign_wire(const Downpour__Envelope *env, const dp_wire_frame_t *frames, uint64_t lo,
                       uint64_t n, float *dense, char *err)
{
    if (env->n_tensors != 1)
        return dp_err(err, "malformed: sign PUSH with %zu tensors (the signs: 1)", env->n_tensors);
    if (s_desc_ok(env, 0, DOWNPOUR__DTYPE__BIT, "signs", lo, err) != 0) return -1;
    uint64_t bits = (uint64_t)env->tensors[0]->shape[0];
    if (bits != n)
        return dp_err(err, "malformed: sign PUSH of %llu bits (%zu bytes) for a slice of %llu "
                           "floats (one bit each: %llu bytes)",
                      (unsigned long long)bits, frames[0].len, (unsigned long long)n,
                      (unsigned long long)((n + 7) / 8));
    const uint8_t *b = frames[0].data;
    if (n % 8 && (b[n / 8] >> (n % 8)) != 0)
        return dp_err(err, "malformed: sign PUSH: the unused bits of its last byte are not zero");
    float scale = env->push->scale;
    if (scale < 0)
        return dp_err(err, "malformed: sign PUSH with scale %g (a magnitude: >= 0)", (double)scale);
    s_expand_sign(b, scale, n, dense);
    return 0;
}

int dp_compress_expand_wire(const Downpour__Envelope *env, const dp_wire_frame_t *frames,
                            int n_frames, uint64_t lo, uint64_t hi, float *dense, char *err)
{
    if (!env->push || env->shm || (size_t)n_frames != env->n_tensors)
        return dp_err(err, "malformed: a compressed PUSH has its tensors in frames");
    uint64_t n = hi - lo;
    switch (env->push->compression) {
    case DOWNPOUR__COMPRESSION__TOPK: return s_topk_wire(env, frames, lo, n, dense, err);
    case DOWNPOUR__COMPRESSION__SIGN: return s_sign_wire(env, frames, lo, n, dense, err);
    default:
        return dp_err(err, "malformed: PUSH with compression %d (TOPK or SIGN expected here)",
                      (int)env->push->compression);
    }
}
