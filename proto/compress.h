/* compress: gradient compression of a PUSH (downpour-worker --compress) —
 * top-k sparsification and 1-bit sign with a scale, each with or without
 * error feedback — and the servers' side of it: a compressed PUSH's frames
 * checked against the shard's range and expanded into a dense gradient.
 *
 * The unit is one shard's slice of the gradient (n floats): the worker
 * compresses each slice on its own, the shard expands its own, and the lab
 * engine (deploy/lab) does the same per simulated shard, so a run, its
 * simulation and its replay see the same floats.
 *
 * The rules, exact (replay is bit for bit):
 *   v = g + e (error feedback on; e starts at 0), else v = g.
 *   top-k:  k = ceil(fraction * n), at most n / 2 (a compressed push is
 *           never larger than the dense one; n < 2: the slice goes dense).
 *           The k entries of largest |v|; among equal magnitudes the lower
 *           index first (the order on |v|'s bits, so -0 ties with +0 and a
 *           NaN sorts above every number). Sent as ascending indices (uint32,
 *           slice positions) and their values v[i]; expanded: v[i] at each
 *           index, 0 elsewhere.
 *   sign:   scale = mean |v| over the slice (summed in double, rounded to
 *           float once), the scaled sign of EF-SignSGD (Karimireddy et al.
 *           2019); bit i = 1 when v[i] < 0 (so 0 and -0 count as +); expanded:
 *           bit ? -scale : +scale.
 *   error feedback: e = v - expand(compress(v)) after each push (Stich et
 *           al. 2018, Karimireddy et al. 2019): exactly 0 at the entries
 *           top-k sent, v[i] elsewhere; v[i] -/+ scale for sign.
 *
 * Bytes a push moves (dp_compress_bytes): dense 4 n; top-k 8 k (indices and
 * values); sign ceil(n / 8) + 4 (the scale, in the envelope). Nothing here
 * asserts on network input: dp_compress_expand_wire refuses with one line
 * starting "malformed: ". */
#ifndef DP_COMPRESS_H
#define DP_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

typedef enum { DP_COMPRESS_NONE = 0, DP_COMPRESS_TOPK = 1, DP_COMPRESS_SIGN = 2 } dp_compress_kind_t;

/* What --compress and --error-feedback say; zeroed: none, error feedback off. */
typedef struct {
    dp_compress_kind_t kind;
    double fraction;        /* top-k: the share of entries sent, in (0, 0.5] */
    int error_feedback;     /* keep what was not sent and add it to the next gradient */
} dp_compress_conf_t;

/* "none", "topk:FRACTION" (0 < FRACTION <= 0.5) or "sign" into c->kind and
 * c->fraction (c->error_feedback untouched). */
int dp_compress_parse(const char *s, dp_compress_conf_t *c, char *err);
/* "none", "topk:0.01", "sign": the text dp_compress_parse reads back. */
void dp_compress_name(const dp_compress_conf_t *c, char *out, size_t n);
/* "on" / "off" into *on. */
int dp_compress_ef_parse(const char *s, int *on, char *err);

/* Entries top-k sends of a slice of n floats; 0: the slice goes dense. */
size_t dp_compress_topk_k(double fraction, size_t n);

/* One slice's compressor: its encoding buffers and its error feedback.
 * Buffers are made once, for slices of n floats. */
typedef struct {
    dp_compress_conf_t conf;
    size_t n;               /* floats of the slice */
    float *resid;           /* [n] error feedback: what earlier pushes did not send; NULL: off */
    float *v;               /* [n] the vector compressed (g + resid) */
    uint32_t *hist;         /* top-k: the radix selection's counts, 65536 */
    /* the last encoding */
    dp_compress_kind_t kind; /* as sent: NONE when the slice went dense (v then holds it) */
    size_t k;               /* top-k: entries */
    uint32_t *idx;          /* [n / 2] top-k: ascending slice positions */
    float *val;             /* [n / 2] top-k: v at those positions */
    uint8_t *bits;          /* [ceil(n / 8)] sign: bit i = v[i] < 0 */
    float scale;            /* sign: mean |v| */
} dp_compressor_t;

void dp_compressor_init(dp_compressor_t *z, const dp_compress_conf_t *c, size_t n);
void dp_compressor_fini(dp_compressor_t *z);     /* safe twice */

/* Encode g[0..n) (plus the residual with error feedback) and update the
 * residual. Returns the bytes the encoding moves. */
size_t dp_compressor_encode(dp_compressor_t *z, const float *g);

/* Bytes of the last encoding (dp_compressor_encode's figure). */
size_t dp_compressor_bytes(const dp_compressor_t *z);

/* dense[0..n) = the gradient the last encoding stands for. */
void dp_compressor_expand(const dp_compressor_t *z, float *dense);

/* The servers' side: a PUSH whose Push.compression is TOPK or SIGN, its
 * frames already through dp_wire_check, checked against the shard's float
 * range [lo, hi) (the layout in proto/downpour.proto: tensor count, dtypes,
 * offsets, counts, indices in range and strictly increasing, no padding
 * bits, scale >= 0) and expanded into dense[0..hi - lo). Values are not
 * checked finite here: the caller's finite check on dense refuses them as
 * it refuses a dense gradient's. -1 with "malformed: ..." in err; dense may
 * then hold part of it. */
int dp_compress_expand_wire(const Downpour__Envelope *env, const dp_wire_frame_t *frames,
                            int n_frames, uint64_t lo, uint64_t hi, float *dense, char *err);

/* A model with state that is not a gradient (batch norm's statistics,
 * whose floats a push carries as values) is not compressed: a sparsified
 * or signed value would become the servers' statistics. One line, the
 * same for the worker and the simulator. */
#define DP_COMPRESS_STATE_REFUSED                                                      \
    "--compress: this model has state tensors (batch norm's running statistics), "    \
    "whose values a push carries and compression would corrupt; train it without "    \
    "--compress"

#endif
