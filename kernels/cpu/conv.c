/* conv: the fast 2-D convolution. Images are split over our OpenMP threads;
 * each thread works on whole images with its own slice of the scratch and
 * calls only single-threaded code (OpenBLAS is set to one thread, cpu.h).
 *
 * Per image b (CKK = C*K*K, P = OH*OW), these ways, picked per call or image:
 *   forward, OC a multiple of the path's vector, CKK >= 64, a SIMD path: our
 *     own register-tiled GEMM reads the patches in place from a channel-last
 *     padded copy of in_b (patch order (ky, kx, c): K runs of K*C floats per
 *     patch, no column matrix) and writes out_b; for a same stride-1 3x3 on
 *     AVX-512, the flat forward instead reads in_b itself (s_flat below), the
 *     same sums;
 *   forward otherwise: col[CKK,P] = im2col(in_b); out_b = w[OC,CKK] col + b
 *     (OpenBLAS sgemm);
 *   backward, mostly-zero dout (behind a max-pool), CKK >= 64, a SIMD path:
 *     only the non-zeros are visited (see "sparse backward" below);
 *   backward, dense dout, K = 3, CKK >= 64, a SIMD path (resnet's body): dw
 *     straight from the channel-last padded image, and at stride 1 (C a
 *     multiple of the vector) din as the forward kernel run on dout with the
 *     flipped, transposed filters (see "direct backward" below);
 *   backward otherwise: dw += dout_b col^T; dcol = w^T dout_b; din_b =
 *     col2im(dcol) (OpenBLAS).
 * The SIMD kernels (conv_simd.h: AVX-512 or AVX2 + FMA) are the ones isa.h
 * picked once at start; on the generic path (no AVX2, not x86, or
 * DP_CPU_ISA=generic) only the OpenBLAS ways run, with plain C around them.
 * dw and db are summed per thread (each element one chain in image order),
 * then across threads in thread order: the bits depend on the path and the
 * thread count, never on scheduling. din rows of every image are
 * overwritten. Stride-1 im2col goes through a zero-padded copy of the image
 * so rows are plain copies. Scratch grows once (dp_cpu_scratch).
 *
 * DP_CONV_SPARSE_MAX (environment, default 0.4): the largest non-zero
 * fraction of an image's dout that takes the sparse backward; 0 turns it
 * off (for measuring). DP_CONV_DIRECT (default 2): 1 leaves out the flat
 * forward (the same bits); 0 takes the ways before the direct ones (the
 * forward through a colT copy, the 16-channel block off on avx512, the 3x3
 * backward through OpenBLAS), with their bits, for measuring
 * (tests/bench/bench_conv -d A:B). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "kernels/env.h"
#include "kernels/ops.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"

/* col[r, p] for r = (c, ky, kx), p = (oy, ox); rows ld floats apart. */
static void s_im2col(float *col, size_t ld, const float *in, const dp_conv_dims_t *d)
{
    int K = d->K, S = d->stride, pad = d->pad, H = d->H, W = d->W, OH = d->OH, OW = d->OW;
    for (int c = 0; c < d->C; c++)
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                float *dst = col + (size_t)((c * K + ky) * K + kx) * ld;
                const float *src = in + (size_t)c * H * W;
                /* output columns whose input x = ox*S - pad + kx lies inside [0, W) */
                int ox0 = pad - kx > 0 ? (pad - kx + S - 1) / S : 0;
                int ox1 = (W - 1 + pad - kx) / S + 1; /* exclusive */
                if (W - 1 + pad - kx < 0) ox1 = 0;
                if (ox1 > OW) ox1 = OW;
                if (ox0 > ox1) ox0 = ox1;
                for (int oy = 0; oy < OH; oy++, dst += OW) {
                    int y = oy * S - pad + ky;
                    if (y < 0 || y >= H) {
                        memset(dst, 0, (size_t)OW * sizeof(float));
                        continue;
                    }
                    const float *row = src + (size_t)y * W - pad + kx;
                    for (int ox = 0; ox < ox0; ox++) dst[ox] = 0.0f;
                    if (S == 1) {
                        memcpy(dst + ox0, row + ox0, (size_t)(ox1 - ox0) * sizeof(float));
                    } else {
                        for (int ox = ox0; ox < ox1; ox++) dst[ox] = row[ox * S];
                    }
                    for (int ox = ox1; ox < OW; ox++) dst[ox] = 0.0f;
                }
            }
}

/* din (zeroed by the caller) += col2im(col); rows ld floats apart. */
static void s_col2im(float *din, const float *col, size_t ld, const dp_conv_dims_t *d)
{
    int K = d->K, S = d->stride, pad = d->pad, H = d->H, W = d->W, OH = d->OH, OW = d->OW;
    for (int c = 0; c < d->C; c++)
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                const float *src = col + (size_t)((c * K + ky) * K + kx) * ld;
                float *dst = din + (size_t)c * H * W;
                int ox0 = pad - kx > 0 ? (pad - kx + S - 1) / S : 0;
                int ox1 = (W - 1 + pad - kx) / S + 1;
                if (W - 1 + pad - kx < 0) ox1 = 0;
                if (ox1 > OW) ox1 = OW;
                if (ox0 > ox1) ox0 = ox1;
                for (int oy = 0; oy < OH; oy++, src += OW) {
                    int y = oy * S - pad + ky;
                    if (y < 0 || y >= H) continue;
                    float *row = dst + (size_t)y * W - pad + kx;
                    if (S == 1) {
                        for (int ox = ox0; ox < ox1; ox++) row[ox] += src[ox];
                    } else {
                        for (int ox = ox0; ox < ox1; ox++) row[ox * S] += src[ox];
                    }
                }
            }
}

/* Stride-1 im2col / col2im through a zero-padded copy of the image: every
 * column-matrix row is then OH plain copies of OW floats, with no edge tests
 * and no tiny memcpy calls (those made im2col cost half as much as the GEMM).
 * The row copies are SIMD moves on the avx512 and avx2 paths. */
static void s_pad(float *pin, const float *in, const dp_conv_dims_t *d)
{
    int H = d->H, W = d->W, p = d->pad, Hp = H + 2 * p, Wp = W + 2 * p;
    memset(pin, 0, (size_t)d->C * Hp * Wp * sizeof(float));
    for (int c = 0; c < d->C; c++)
        for (int y = 0; y < H; y++)
            memcpy(pin + ((size_t)c * Hp + y + p) * Wp + p, in + ((size_t)c * H + y) * W,
                   (size_t)W * sizeof(float));
}

/* The generic path's stride-1 im2col / col2im (conv_simd.h has the SIMD ones). */
__attribute__((optimize("O3"))) static void s_im2col_s1_plain(float *col, size_t ld, float *pin,
                                                              const dp_conv_dims_t *d)
{
    DP_S1_BODY({
        for (int x = 0; x < OW; x++) cr[x] = pr[x];
    })
}

__attribute__((optimize("O3"))) static void s_col2im_s1_plain(float *col, size_t ld, float *pin,
                                                              const dp_conv_dims_t *d)
{
    DP_S1_BODY({
        for (int x = 0; x < OW; x++) pr[x] += cr[x];
    })
}

/* Our SIMD kernels for the path in use (isa.h); NULL on the generic path. */
static const dp_conv_simd_t *s_simd(void)
{
#if defined(__x86_64__) || defined(__i386__)
    switch (dp_cpu_isa()) {
    case DP_CPU_ISA_AVX512: return &dp_conv_simd_avx512;
    case DP_CPU_ISA_AVX2: return &dp_conv_simd_avx2;
    default: break;
    }
#endif
    return NULL;
}

/* col = im2col(in) for any stride; pin: scratch of C*(H+2p)*(W+2p) floats. */
static void s_im2col_any(float *col, size_t ld, float *pin, const float *in,
                         const dp_conv_dims_t *d, const dp_conv_simd_t *k)
{
    if (d->stride != 1) {
        s_im2col(col, ld, in, d);
        return;
    }
    s_pad(pin, in, d);
    if (k)
        k->im2col_s1(col, ld, pin, d);
    else
        s_im2col_s1_plain(col, ld, pin, d);
}

/* din = col2im(col) (overwritten) for any stride; pin as above. */
static void s_col2im_any(float *din, const float *col, size_t ld, float *pin,
                         const dp_conv_dims_t *d, const dp_conv_simd_t *k)
{
    int H = d->H, W = d->W, p = d->pad, Hp = H + 2 * p, Wp = W + 2 * p;
    if (d->stride != 1) {
        memset(din, 0, (size_t)d->C * H * W * sizeof(float));
        s_col2im(din, col, ld, d);
        return;
    }
    memset(pin, 0, (size_t)d->C * Hp * Wp * sizeof(float));
    if (k)
        k->col2im_s1((float *)col, ld, pin, d);
    else
        s_col2im_s1_plain((float *)col, ld, pin, d);
    for (int c = 0; c < d->C; c++)
        for (int y = 0; y < H; y++)
            memcpy(din + ((size_t)c * H + y) * W, pin + ((size_t)c * Hp + y + p) * Wp + p,
                   (size_t)W * sizeof(float));
}

/* A 1x1, stride-1, unpadded convolution needs no im2col: the image is the column matrix. */
static int s_is_pointwise(const dp_conv_dims_t *d)
{
    return d->K == 1 && d->stride == 1 && d->pad == 0;
}

/* ---- sparse backward ------------------------------------------------------
 * Behind a max-pool (and a relu) most of dout is exactly zero: a 2x2 pool
 * passes gradient to at most one cell in four. For such images the GEMMs
 * waste >= 3/4 of their work, so the backward walks only the non-zeros:
 *   dw[oc, :]   += sum over non-zero (oc, p) of g * colT[p, :]
 *   dcolT[p, :]  = sum over non-zero (oc, p) of g * w[oc, :]
 * with colT[P, CKK] the transposed column matrix (one patch per row, so both
 * sums are axpys of contiguous CKK-float rows), then dcolT is scattered into
 * the padded input gradient. Used per image when the non-zero fraction is at
 * most DP_SPARSE_MAX, CKK >= 64 and a SIMD path runs. */
#define DP_SPARSE_MAX 0.4
static double s_sparse_max = DP_SPARSE_MAX;
/* The direct ways (below): DP_CONV_DIRECT, 2 all of them, 1 all but the
 * flat forward, 0 none. */
static long s_direct = 2;

/* DP_CONV_SPARSE_MAX (a fraction in [0, 1]; 0: never sparse) replaces it;
 * DP_CONV_DIRECT=1 leaves the flat forward out, 0 every direct way (the
 * ways before them, for measuring); both read by dp_kernels_env from main. */
int dp_conv_env(char *err)
{
    if (dp_opts_env_double("DP_CONV_SPARSE_MAX", 0, 1, &s_sparse_max, err) != 0) return -1;
    return dp_opts_env_long("DP_CONV_DIRECT", 0, 2, &s_direct, err);
}

/* The flat forward (conv_simd.h; the AVX-512 path has one) for our forward
 * kernel's work on a "same" stride-1 3x3 convolution (resnet's body) and
 * for the direct din of one (the same geometry): the same bits, read in
 * place from the CHW image, no padded HWC copy, no transposes. Taken where
 * its tiles' spare lanes are at most a quarter of the positions (the last
 * tile is cut off mid-plane): 1.1-1.3x the forward on 32x32 to 8x8 and
 * 28x28, 14x14 (tests/bench/bench_conv -d 1:2), 0.92x on 7x7 (49
 * positions in 64 lanes); 0.98x on the seed CNN's 5x5 conv2, whose GEMM
 * tile already runs near the FMA peak. */
static int s_flat(const dp_conv_dims_t *d, const dp_conv_simd_t *k)
{
    int HW = d->H * d->W, nb = k ? k->flat_block : 0;
    return s_direct >= 2 && k && k->fwd_flat && d->stride == 1 && d->K == 3 && d->pad == 1 &&
           d->OC % k->flat_oc == 0 && ((HW + nb - 1) / nb * nb - HW) * 4 <= HW;
}

/* The flat forward's distance between channel planes: the image's own
 * (H W), but for planes whose size is a multiple of 4 KB (32x32) a copy's,
 * 64 bytes more: a tap reads the same offset of every plane, and 4 KB apart
 * those all fall in one set of L1 (a 16-channel 32x32 layer took 25 % longer
 * read in place than through the copy, tests/bench/bench_conv). */
static size_t s_flat_ld(const dp_conv_dims_t *d)
{
    size_t HW = (size_t)d->H * d->W;
    return HW % 1024 ? HW : HW + 16;
}

/* Scratch floats for the flat forward's copy of n planes (0: none made). */
static size_t s_flat_copy_floats(const dp_conv_dims_t *d, int n)
{
    size_t ld = s_flat_ld(d);
    return ld == (size_t)d->H * d->W ? 0 : n * ld;
}

/* What the flat forward reads for the n planes of x: x itself, or their
 * copy in buf, s_flat_ld(d) apart. */
static const float *s_flat_input(float *buf, const float *x, int n, const dp_conv_dims_t *d)
{
    size_t HW = (size_t)d->H * d->W, ld = s_flat_ld(d);
    if (ld == HW) return x;
    for (int c = 0; c < n; c++) memcpy(buf + c * ld, x + c * HW, HW * sizeof(float));
    return buf;
}

/* colT rows are in "patch order" r' = (ky, kx, c), not the (c, ky, kx) of w:
 * from a channel-last (HWC) padded image a patch row is then K runs of K*C
 * contiguous floats (160 for conv2 of the default model) instead of C*K runs
 * of K (5), which made building colT cost a third as much as the GEMM. The
 * weights are repacked to match (once per call) and dw is permuted back. */
static size_t s_patch_index(int c, int ky, int kx, int C, int K)
{
    return ((size_t)ky * K + kx) * C + c;
}

/* din (CHW, overwritten) = the inside of a padded HWC gradient, the
 * layout the kernels' pad_hwc makes: pin[(y * Wp + x) * C + c]. */
static void s_unpad_hwc(float *din, const float *pin, const dp_conv_dims_t *d)
{
    int C = d->C, H = d->H, W = d->W, p = d->pad, Wp = W + 2 * p;
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H; y++) {
            float *dst = din + ((size_t)c * H + y) * W;
            const float *src = pin + ((size_t)(y + p) * Wp + p) * C + c;
            for (int x = 0; x < W; x++) dst[x] = src[(size_t)x * C];
        }
}

/* The geometry under which a transposed column matrix colT[P, CKK] reads
 * like a padded HWC image to the SIMD forward: every patch one "pixel" of
 * CKK channels, a 1x1 kernel, no pad, stride 1. */
static dp_conv_dims_t s_colT_dims(const dp_conv_dims_t *d)
{
    dp_conv_dims_t t = {.B = d->B, .C = d->C * d->K * d->K, .H = d->OH, .W = d->OW,
                        .OC = d->OC, .K = 1, .pad = 0, .stride = 1, .OH = d->OH, .OW = d->OW};
    return t;
}

/* wp[oc, r'] = w[oc, r] (patch order), for OC rows. */
static void s_pack_patch_rows(float *wp, const float *w, const dp_conv_dims_t *d)
{
    int C = d->C, K = d->K;
    size_t CKK = (size_t)C * K * K;
    for (int oc = 0; oc < d->OC; oc++)
        for (int c = 0; c < C; c++)
            for (int ky = 0; ky < K; ky++)
                for (int kx = 0; kx < K; kx++)
                    wp[oc * CKK + s_patch_index(c, ky, kx, C, K)] =
                        w[oc * CKK + ((size_t)c * K + ky) * K + kx];
}

/* Non-zeros of one image's dout[OC, P], listed by channel (ocp, ocg, ocn[oc]
 * entries from ocs[oc]) and by position (pos*, likewise). Returns the count. */
typedef struct {
    int *ocs, *ocn, *ocp;  /* per channel: start, count; then positions */
    float *ocg;            /* values, channel order */
    int *ps, *pn, *poc;    /* per position: start, count; then channels */
    float *pg;             /* values, position order */
} s_nz_t;

static int s_nz_build(s_nz_t *z, const float *g, int OC, int P, int by_pos,
                      const dp_conv_simd_t *simd)
{
    int k = 0;
    for (int oc = 0; oc < OC; oc++) {
        z->ocs[oc] = k;
        const float *row = g + (size_t)oc * P;
        if (simd->nz_list)
            k += simd->nz_list(z->ocp + k, z->ocg + k, row, P);
        else /* branch-free: whether a cell is zero is a coin toss for the predictor */
            for (int p = 0; p < P; p++) {
                z->ocp[k] = p;
                z->ocg[k] = row[p];
                k += row[p] != 0.0f;
            }
        z->ocn[oc] = k - z->ocs[oc];
    }
    if (!by_pos) return k;
    /* counting sort of the same entries by position; channel order kept */
    memset(z->pn, 0, (size_t)P * sizeof(int));
    for (int i = 0; i < k; i++) z->pn[z->ocp[i]]++;
    for (int p = 0, acc = 0; p < P; p++) {
        z->ps[p] = acc;
        acc += z->pn[p];
        z->pn[p] = 0;
    }
    for (int oc = 0; oc < OC; oc++)
        for (int i = z->ocs[oc]; i < z->ocs[oc] + z->ocn[oc]; i++) {
            int p = z->ocp[i], at = z->ps[p] + z->pn[p]++;
            z->poc[at] = oc;
            z->pg[at] = z->ocg[i];
        }
    return k;
}

/* ---- direct backward (3x3) ------------------------------------------------
 * A dense dout of a 3x3 convolution (resnet's body and its stride-2 ones)
 * on a SIMD path takes no column matrix:
 *   dw: dwq[oc, r'] += sum_p g[oc, p] X[p, r'] read in place from the padded
 *       HWC image (conv_simd.h's dw: a tile of channels x patch columns held
 *       in registers over all positions; the per-image GEMM had M = OC = 16
 *       rows, too few for OpenBLAS, and wrote the CKK x P column matrix);
 *   din, stride 1, C in the forward's channel multiple, pad <= K - 1: a
 *       stride-1 convolution's transpose is a convolution, so din =
 *       conv(dout padded by K - 1 - pad, wf), wf[c, oc, ky, kx] =
 *       w[oc, c, K-1-ky, K-1-kx], through our forward kernel on a padded HWC
 *       copy of dout (no dcol = w^T dout GEMM with inner dimension OC, no
 *       col2im). Otherwise din is the GEMM + col2im as before.
 * Only K = 3 takes them, so the seed CNN (5x5) keeps its bits, and only
 * CKK >= 64: below, the patch rows (K*C = 3 or 9 floats for resnet's first
 * convolution) fill a fraction of a vector and the GEMM was faster (0.7-0.8x
 * its time direct, tests/bench/bench_conv). */
static int s_direct_dw(const dp_conv_dims_t *d, const dp_conv_simd_t *k)
{
    return s_direct && k && d->K == 3 && d->C * d->K * d->K >= 64;
}

static int s_direct_din(const dp_conv_dims_t *d, const dp_conv_simd_t *k)
{
    return s_direct_dw(d, k) && d->stride == 1 && d->pad <= d->K - 1 &&
           d->C % k->oc_multiple == 0;
}

void dp_conv2d_backward_ways(const dp_conv_dims_t *d, int *dw, int *din)
{
    const dp_conv_simd_t *k = s_simd();
    *dw = s_direct_dw(d, k);
    *din = s_direct_din(d, k);
}

/* dout's geometry as the input of din's convolution (OH = H, OW = W). */
static dp_conv_dims_t s_din_dims(const dp_conv_dims_t *d)
{
    dp_conv_dims_t t = {.B = d->B, .C = d->OC, .H = d->OH, .W = d->OW, .OC = d->C, .K = d->K,
                        .pad = d->K - 1 - d->pad, .stride = 1, .OH = d->H, .OW = d->W};
    return t;
}

/* wf[r'', c] = w[oc, c, K-1-ky, K-1-kx], r'' = (ky, kx, oc) the patch order
 * of s_din_dims: the forward kernel's wt for din. */
static void s_pack_flipped(float *wf, const float *w, const dp_conv_dims_t *d)
{
    int C = d->C, K = d->K, OC = d->OC;
    for (int oc = 0; oc < OC; oc++)
        for (int c = 0; c < C; c++)
            for (int ky = 0; ky < K; ky++)
                for (int kx = 0; kx < K; kx++)
                    wf[s_patch_index(oc, ky, kx, OC, K) * C + c] =
                        w[(((size_t)oc * C + c) * K + (K - 1 - ky)) * K + (K - 1 - kx)];
}

/* Scratch floats one thread needs for the backward. */
typedef struct {
    size_t col, dcol, dw, db, pad, nz, gpad, total;
} s_bw_layout_t; /* per thread: col | dcol | dw (std order) | dw (patch order) | db | pad | nz | gpad */

static void s_bw_layout(s_bw_layout_t *L, const dp_conv_dims_t *d, int din, int point,
                        int ddin, size_t fcopy)
{
    size_t CKK = (size_t)d->C * d->K * d->K, P = (size_t)d->OH * d->OW, OC = d->OC;
    L->col = point ? 0 : CKK * P;              /* col (dense) or colT (sparse) */
    L->dcol = din ? CKK * P : 0;               /* dcol (dense) or dcolT (sparse) */
    L->dw = OC * CKK;                          /* this thread's dw partials (two orders) */
    L->db = (OC + 15) / 16 * 16;               /* this thread's db partial */
    L->pad = point ? 0 : (size_t)d->C * (d->H + 2 * d->pad) * (d->W + 2 * d->pad);
    L->nz = 2 * OC + 2 * OC * P + 2 * P + 2 * OC * P; /* s_nz_t arrays (int = float size) */
    /* padded HWC dout; for the flat din, fcopy floats of a copy of its planes */
    L->gpad = ddin ? OC * (d->H + d->K - 1) * (d->W + d->K - 1) : 0;
    if (L->gpad < fcopy) L->gpad = fcopy;
    L->total = (L->col + L->dcol + 2 * L->dw + L->db + L->pad + L->nz + L->gpad + 15) / 16 * 16;
}

/* What every image of one backward call shares. */
typedef struct {
    const dp_conv_dims_t *d;
    const s_bw_layout_t *L;
    const float *w, *wp;     /* weights, in (c, ky, kx) and in patch order (sparse din) */
    const float *wf;         /* flipped transposed weights (direct din) */
    const dp_conv_simd_t *k; /* our SIMD kernels; NULL on the generic path */
    dp_conv_dims_t dt;       /* din's convolution (direct din) */
    int point;               /* 1x1 unpadded stride 1: no im2col */
    int sparse;              /* the sparse backward may run (SIMD kernels, CKK >= 64) */
    int ddw, ddin;           /* the direct dw, din run (dense images) */
    const uint32_t *fmasks;  /* din by the flat forward (its masks for dt); NULL: on gpad */
} s_bw_t;

/* One image's db partials, dbp[oc] += the sum of channel oc of g (four
 * chains over p mod 4, the tail on the first, then (s0 + s1) + (s2 + s3)),
 * and the count of its non-zeros, in one pass: the sparse backward's choice
 * needs the count, and counting on its own (scalar, while the sum of the
 * same floats ran apart) was 5 % of resnet20's step. Four channels go
 * together so that their chains hide the adds' latency; each channel's
 * chains are the same, so db keeps its bits. */
typedef float s_v4f __attribute__((vector_size(16)));
typedef int s_v4i __attribute__((vector_size(16)));

static size_t s_db_nz(float *dbp, const float *g, int OC, int P)
{
    size_t nz = 0;
    int oc = 0;
    for (; oc + 4 <= OC; oc += 4) {
        const float *r = g + (size_t)oc * P;
        s_v4f s[4] = {{0}}; /* lanes: the chains of p mod 4 */
        s_v4i n[4] = {{0}};
        int p = 0;
        for (; p + 4 <= P; p += 4)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            {
                s_v4f v;
                memcpy(&v, r + (size_t)j * P + p, sizeof v);
                s[j] += v;
                n[j] -= v != 0.0f; /* -1 where true */
            }
        for (int j = 0; j < 4; j++) {
            for (int q = p; q < P; q++) {
                float v = r[(size_t)j * P + q];
                s[j][0] += v;
                n[j][0] += v != 0.0f;
            }
            dbp[oc + j] += (s[j][0] + s[j][1]) + (s[j][2] + s[j][3]);
            nz += (size_t)n[j][0] + n[j][1] + n[j][2] + n[j][3];
        }
    }
    for (; oc < OC; oc++) {
        const float *r = g + (size_t)oc * P;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int p = 0;
        for (; p + 4 <= P; p += 4) {
            s0 += r[p];
            s1 += r[p + 1];
            s2 += r[p + 2];
            s3 += r[p + 3];
        }
        for (; p < P; p++) s0 += r[p];
        dbp[oc] += (s0 + s1) + (s2 + s3);
        for (p = 0; p < P; p++) nz += r[p] != 0.0f;
    }
    return nz;
}

/* The sparse backward of one image when its dout is sparse enough; returns 0
 * (nothing done) otherwise. */
static int s_sparse_image(const s_bw_t *c, float *din_b, float *dwq, const float *g,
                          const float *src, float *sc, size_t nz)
{
    const dp_conv_dims_t *d = c->d;
    const s_bw_layout_t *L = c->L;
    int CKK = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    float *col = sc, *dcol = col + L->col, *pin = dcol + L->dcol + 2 * L->dw + L->db;
    if ((double)nz > s_sparse_max * OC * P) return 0;
    s_nz_t z;
    z.ocs = (int *)(pin + L->pad);
    z.ocn = z.ocs + OC;
    z.ocp = z.ocn + OC;
    z.ocg = (float *)(z.ocp + (size_t)OC * P);
    z.ps = (int *)(z.ocg + (size_t)OC * P);
    z.pn = z.ps + P;
    z.poc = z.pn + P;
    z.pg = (float *)(z.poc + (size_t)OC * P);
    int nnz = s_nz_build(&z, g, OC, P, din_b != NULL, c->k);
    if (nnz > s_sparse_max * OC * P) return 0;
    c->k->pad_hwc(pin, src, d);
    c->k->im2colT(col, pin, d);
    c->k->spmm(dwq, CKK, OC, CKK, col, CKK, z.ocs, z.ocn, z.ocp, z.ocg, 1);
    if (!din_b) return 1;
    /* dcolT[p, :] = sum over the channels oc non-zero at p of g w[oc, :] */
    c->k->spmm(dcol, CKK, P, CKK, c->wp, CKK, z.ps, z.pn, z.poc, z.pg, 0);
    memset(pin, 0, L->pad * sizeof(float));
    for (int p = 0; p < P; p++)
        if (z.pn[p]) c->k->col2imT_row(pin, dcol + (size_t)p * CKK, p, d);
    s_unpad_hwc(din_b, pin, d);
    return 1;
}

/* One image's gradient contributions; dwp (std order), dwq (patch order) and
 * dbp accumulate, din_b is overwritten. */
static void s_conv_backward_image(const s_bw_t *c, float *din_b, float *dwp, float *dwq,
                                  float *dbp, const float *g, const float *src, float *sc)
{
    const dp_conv_dims_t *d = c->d;
    int CKK = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    float *col = sc, *dcol = col + c->L->col, *pin = dcol + c->L->dcol + 2 * c->L->dw + c->L->db;
    size_t nz = s_db_nz(dbp, g, OC, P);
    if (c->sparse && s_sparse_image(c, din_b, dwq, g, src, sc, nz)) return;
    /* dense dw: direct (3x3), or a GEMM over the whole image */
    if (c->ddw) {
        c->k->pad_hwc(pin, src, d);
        c->k->dw(dwq, g, pin, d);
    } else {
        const float *cm = src;
        if (!c->point) {
            s_im2col_any(col, P, pin, src, d, c->k);
            cm = col;
        }
        dp_cpu_blas_sgemm(0, 1, OC, CKK, P, 1.0f, g, P, cm, P, 1.0f, dwp, CKK);
    }
    if (!din_b) return;
    /* dense din: direct (3x3, stride 1), or a GEMM (then col2im) */
    if (c->fmasks) {
        float *gl = pin + c->L->pad + c->L->nz; /* the gpad slice: a copy of dout's planes */
        c->k->fwd_flat(din_b, s_flat_input(gl, g, OC, &c->dt), s_flat_ld(&c->dt), &c->dt, c->wf,
                       NULL, c->fmasks);
    } else if (c->ddin) {
        float *gpad = pin + c->L->pad + c->L->nz;
        c->k->pad_hwc(gpad, g, &c->dt);
        c->k->fwd(din_b, (size_t)d->H * d->W, gpad, &c->dt, c->wf, NULL);
    } else if (c->point) {
        dp_cpu_blas_sgemm(1, 0, CKK, P, OC, 1.0f, c->w, CKK, g, P, 0.0f, din_b, P);
    } else {
        dp_cpu_blas_sgemm(1, 0, CKK, P, OC, 1.0f, c->w, CKK, g, P, 0.0f, dcol, P);
        s_col2im_any(din_b, dcol, P, pin, d, c->k);
    }
}

void dp_conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, const dp_conv_dims_t *d)
{
    int CKK = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    size_t HW = (size_t)d->H * d->W;
    int point = s_is_pointwise(d);
    const dp_conv_simd_t *k = s_simd();
    int ddin = din && s_direct_din(d, k);
    dp_conv_dims_t dt = s_din_dims(d);
    int fdin = ddin && s_flat(&dt, k);
    size_t nmask = fdin ? k->flat_mask_count(&dt) : 0;
    s_bw_layout_t L;
    s_bw_layout(&L, d, din != NULL, point, ddin, fdin ? s_flat_copy_floats(&dt, OC) : 0);
    int nt = dp_cpu_team((double)d->B * OC * CKK * P * (din ? 2 : 1));
    if (nt > d->B) nt = d->B;
    /* per-thread slices, then w in patch order and flipped, and the flat
     * din's masks, shared by the team */
    float *scratch = dp_cpu_scratch(L.total * nt + 2 * (size_t)OC * CKK + nmask);
    float *wp = scratch + L.total * nt, *wf = wp + (size_t)OC * CKK;
    uint32_t *fmasks = fdin ? (uint32_t *)(wf + (size_t)OC * CKK) : NULL;
    if (fdin) k->flat_masks(fmasks, &dt);
    /* sparse needs our SIMD kernels, and a patch long enough that the
     * gathers beat the GEMM (conv1 of the default model, CKK = 25, is faster
     * dense) */
    s_bw_t c = {.d = d, .L = &L, .w = w, .wp = wp, .wf = wf, .k = k, .point = point,
                .ddw = s_direct_dw(d, k), .ddin = ddin, .dt = dt, .fmasks = fmasks};
    c.sparse = c.k && !point && CKK >= 64;
    if (din && c.sparse) s_pack_patch_rows(wp, w, d);
    if (ddin) s_pack_flipped(wf, w, d);
    int C = d->C, K = d->K;

#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        float *sc = scratch + L.total * t;
        float *dwp = sc + L.col + L.dcol, *dwq = dwp + L.dw, *dbp = dwq + L.dw;
        memset(dwp, 0, (2 * L.dw + L.db) * sizeof(float));
#pragma omp for schedule(static)
        for (int n = 0; n < d->B; n++)
            s_conv_backward_image(&c, din ? din + (size_t)n * d->C * HW : NULL, dwp, dwq, dbp,
                                  dout + (size_t)n * OC * P, in + (size_t)n * d->C * HW, sc);
        /* sum the per-thread partials of both orders (the omp for ends in a
         * barrier); each thread sums a slice of output channels */
        int lo = OC * t / T, hi = OC * (t + 1) / T;
        for (int oc = lo; oc < hi; oc++)
            for (int c = 0; c < C; c++)
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++) {
                        size_t i = (size_t)oc * CKK + ((size_t)c * K + ky) * K + kx;
                        size_t j = (size_t)oc * CKK + s_patch_index(c, ky, kx, C, K);
                        float s = 0.0f;
                        for (int u = 0; u < T; u++) {
                            const float *part = scratch + L.total * u + L.col + L.dcol;
                            s += part[i] + part[L.dw + j];
                        }
                        dw[i] = s;
                    }
        if (t == 0 && db)
            for (int oc = 0; oc < OC; oc++) {
                float s = 0.0f;
                for (int u = 0; u < T; u++)
                    s += scratch[L.total * u + L.col + L.dcol + 2 * L.dw + oc];
                db[oc] = s;
            }
    }
}

void dp_conv2d_forward(float *out, const float *in, const float *w, const float *b,
                       const dp_conv_dims_t *d)
{
    int CKK = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    /* our kernel: OC in the path's channel blocks and a CKK long enough to
     * pay for the transposed stores (conv1 of the default model, CKK = 25, is
     * faster through OpenBLAS) */
    const dp_conv_simd_t *k = s_simd();
    int own = k && OC % (s_direct ? k->oc_multiple : k->oc_block) == 0 && CKK >= 64;
    int flat = own && s_flat(d, k);
    dp_conv_dims_t dc = s_colT_dims(d);
    size_t npad = (size_t)d->C * (d->H + 2 * d->pad) * (d->W + 2 * d->pad);
    size_t nwt = own ? (size_t)CKK * OC : 0, nmask = flat ? k->flat_mask_count(d) : 0;
    size_t per = flat ? s_flat_copy_floats(d, d->C)
                      : (s_is_pointwise(d) && !own ? 0 : (size_t)CKK * P + npad);
    int nt = dp_cpu_team((double)d->B * OC * CKK * P);
    if (nt > d->B) nt = d->B;
    /* per thread: col | pin (the flat forward: its copy of the planes); then
     * wt and the flat forward's masks, shared */
    float *scratch = per || nwt ? dp_cpu_scratch(per * nt + nwt + nmask) : NULL;
    float *wt = scratch + per * nt;
    uint32_t *masks = flat ? (uint32_t *)(wt + nwt) : NULL;
    if (flat) k->flat_masks(masks, d);
    if (own) /* wt[r', oc] = w[oc, r] (r' in patch order), shared by the team */
        for (int oc = 0; oc < OC; oc++)
            for (int c = 0; c < d->C; c++)
                for (int ky = 0; ky < d->K; ky++)
                    for (int kx = 0; kx < d->K; kx++)
                        wt[s_patch_index(c, ky, kx, d->C, d->K) * OC + oc] =
                            w[(size_t)oc * CKK + ((size_t)c * d->K + ky) * d->K + kx];
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num();
        float *col = per ? scratch + per * t : NULL;
        float *pin = per && !flat ? col + (size_t)CKK * P : NULL;
#pragma omp for schedule(static)
        for (int n = 0; n < d->B; n++) {
            const float *src = in + (size_t)n * d->C * d->H * d->W;
            float *dst = out + (size_t)n * OC * P;
            if (flat) {
                k->fwd_flat(dst, s_flat_input(col, src, d->C, d), s_flat_ld(d), d, wt, b, masks);
                continue;
            }
            if (own) {
                /* the patches read in place (DP_CONV_DIRECT=0: copied into colT
                 * first, as before: the same FMAs in the same order) */
                k->pad_hwc(pin, src, d);
                if (s_direct) {
                    k->fwd(dst, P, pin, d, wt, b);
                } else {
                    k->im2colT(col, pin, d);
                    k->fwd(dst, P, col, &dc, wt, b);
                }
                continue;
            }
            const float *cm = src;
            if (per) {
                s_im2col_any(col, P, pin, src, d, k);
                cm = col;
            }
            for (int oc = 0; oc < OC; oc++) {
                float bv = b ? b[oc] : 0.0f;
                float *o = dst + (size_t)oc * P;
                for (int p = 0; p < P; p++) o[p] = bv;
            }
            dp_cpu_blas_sgemm(0, 0, OC, P, CKK, 1.0f, w, CKK, cm, P, 1.0f, dst, P);
        }
    }
}
