/* conv_simd: the SIMD kernels of the fast convolution (conv.c), written once
 * over a few vector macros and compiled once per path: conv_avx512.c (16
 * floats a vector) and conv_avx2.c (8). Not a header to include anywhere
 * else: the including file defines, before including it,
 *
 *   V, VW               the vector type and its width in floats
 *   V_LOAD/STORE(p[,v]) unaligned full-vector load / store
 *   V_ZERO(), V_SET1(x), V_FMA(a, b, c) = a * b + c (fused), V_ADD(a, b)
 *   VM, V_MASK(n)       a mask for the first n lanes (1 <= n <= VW)
 *   V_MLOAD(m, p), V_MSTORE(m, p, v)  masked load (others 0) / store
 *   V_MASK_BITS(u)      the lanes whose bits are set in the uint32_t u
 *   V_TRANSPOSE(r)      r[0..VW) (an array of V) transposed in place
 *   S(name)             the path's name for a kernel (name ## _avx2 ...)
 *   FWD_BIG_NV, FWD_BIG_TP, FWD_SMALL_NV, FWD_SMALL_TP  GEMM tiles (below)
 *   FWD_ONE_TP          positions of the one-vector forward tile
 *   DW_TO, DW_NV        the direct dw's tile: DW_TO channels x DW_NV vectors
 *   FL_OCT, FL_NQ       the flat forward's tile: FL_OCT channels x FL_NQ vectors
 *                       (a path without them has no flat forward)
 *   NZ_LIST             (optional) the path's nz_list kernel (cpu.h)
 *   SP_NV, SP_NR        the sparse products' tile: SP_NV * VW floats (64 on
 *                       AVX-512, 32 on AVX2), SP_NR * SP_NV FMA chains (16, 8)
 *
 * and gets `const dp_conv_simd_t S(dp_conv_simd)`. The arithmetic order is
 * the same for every width (each output is one chain of FMAs in the same
 * order), so the avx512 instance computes exactly what conv.c's AVX-512 code
 * did before this file existed. */

/* dst[0, n) = src[0, n) */
static inline void S(s_copy)(float *dst, const float *src, int n)
{
    int i = 0;
    for (; i + VW <= n; i += VW) V_STORE(dst + i, V_LOAD(src + i));
    if (i < n) {
        VM m = V_MASK(n - i);
        V_MSTORE(m, dst + i, V_MLOAD(m, src + i));
    }
}

/* dst[0, n) += src[0, n) */
static inline void S(s_add)(float *dst, const float *src, int n)
{
    int i = 0;
    for (; i + VW <= n; i += VW) V_STORE(dst + i, V_ADD(V_LOAD(dst + i), V_LOAD(src + i)));
    if (i < n) {
        VM m = V_MASK(n - i);
        V_MSTORE(m, dst + i, V_ADD(V_MLOAD(m, dst + i), V_MLOAD(m, src + i)));
    }
}

/* Stride-1 im2col / col2im rows through the zero-padded image (conv.c). */
static void S(s_im2col_s1)(float *col, size_t ld, float *pin, const dp_conv_dims_t *d)
{
    DP_S1_BODY(S(s_copy)(cr, pr, OW))
}

static void S(s_col2im_s1)(float *col, size_t ld, float *pin, const dp_conv_dims_t *d)
{
    DP_S1_BODY(S(s_add)(pr, cr, OW))
}

/* colT[p, r'] (patch order) from the padded HWC image, any stride. */
static void S(s_im2colT)(float *colT, const float *pin, const dp_conv_dims_t *d)
{
    int K = d->K, st = d->stride, C = d->C, Wp = d->W + 2 * d->pad, run = K * C;
    size_t CKK = (size_t)C * K * K;
    for (int oy = 0; oy < d->OH; oy++)
        for (int ox = 0; ox < d->OW; ox++) {
            float *dst = colT + (size_t)(oy * d->OW + ox) * CKK;
            const float *src = pin + ((size_t)oy * st * Wp + (size_t)ox * st) * C;
            for (int ky = 0; ky < K; ky++)
                S(s_copy)(dst + (size_t)ky * run, src + (size_t)ky * Wp * C, run);
        }
}

/* Padded HWC dpin += the dcolT row (patch order) of position p. */
static void S(s_col2imT_row)(float *dpin, const float *row, int p, const dp_conv_dims_t *d)
{
    int K = d->K, st = d->stride, C = d->C, Wp = d->W + 2 * d->pad, run = K * C;
    int oy = p / d->OW, ox = p % d->OW;
    float *base = dpin + ((size_t)oy * st * Wp + (size_t)ox * st) * C;
    for (int ky = 0; ky < K; ky++)
        S(s_add)(base + (size_t)ky * Wp * C, row + (size_t)ky * run, run);
}

/* The sparse products of the backward (conv.c): for each row i of Y,
 *   Y[i, 0:n) (+)= sum_{j in [start[i], start[i] + count[i])} coef[j] X[idx[j], 0:n)
 * (Y overwritten when !accumulate). Columns go in blocks of SP_NV vectors (64
 * floats on AVX-512, 32 on AVX2) so that the block of X being gathered (P or
 * OC rows of 256 or 128 bytes) stays in L1 over all rows; SP_NR rows go
 * together so that SP_NR * SP_NV independent FMA chains hide the FMA
 * latency. (On AVX-512, 4 x 4 vectors instead of 4 x 2: a term's index and
 * coefficient loaded once for 4 FMAs, not 2: the seed CNN's step 3.7 %
 * faster; 5 or more vectors were slower.) Each element of Y is still one
 * chain over its own j in order, so the blocking changes no bit. */
#define SP_BW (SP_NV * VW)

/* One row, columns [r0, r0 + w) with w <= SP_BW: masked vectors. */
static void S(s_spmm_row)(float *y, int w, const float *X, size_t ldx, const int *idx,
                          const float *coef, int cnt, int accumulate)
{
    for (int v = 0; v * VW < w; v++) {
        VM m = V_MASK(w - v * VW < VW ? w - v * VW : VW);
        V a = accumulate ? V_MLOAD(m, y + v * VW) : V_ZERO();
        for (int j = 0; j < cnt; j++)
            a = V_FMA(V_SET1(coef[j]), V_MLOAD(m, X + (size_t)idx[j] * ldx + v * VW), a);
        V_MSTORE(m, y + v * VW, a);
    }
}

/* SP_NR rows i0.., one full column block at X + r0 / Y + r0, in registers. */
__attribute__((optimize("O3"))) static void S(s_spmm_tile)(float *Y, size_t ldy,
                                                           const float *X, size_t ldx,
                                                           const int *start, const int *count,
                                                           const int *idx, const float *coef,
                                                           int accumulate)
{
    V a[SP_NR][SP_NV];
    int common = count[0];
    for (int i = 0; i < SP_NR; i++) {
        if (count[i] < common) common = count[i];
        for (int v = 0; v < SP_NV; v++)
            a[i][v] = accumulate ? V_LOAD(Y + i * ldy + v * VW) : V_ZERO();
    }
    for (int j = 0; j < common; j++) /* every row has a j-th term: all chains at once */
        _Pragma("GCC unroll 4") for (int i = 0; i < SP_NR; i++)
        {
            V g = V_SET1(coef[start[i] + j]);
            const float *x = X + (size_t)idx[start[i] + j] * ldx;
            _Pragma("GCC unroll 4") for (int v = 0; v < SP_NV; v++)
                a[i][v] = V_FMA(g, V_LOAD(x + v * VW), a[i][v]);
        }
    for (int i = 0; i < SP_NR; i++) /* the longer rows' remaining terms */
        for (int j = common; j < count[i]; j++) {
            V g = V_SET1(coef[start[i] + j]);
            const float *x = X + (size_t)idx[start[i] + j] * ldx;
            _Pragma("GCC unroll 4") for (int v = 0; v < SP_NV; v++)
                a[i][v] = V_FMA(g, V_LOAD(x + v * VW), a[i][v]);
        }
    for (int i = 0; i < SP_NR; i++)
        for (int v = 0; v < SP_NV; v++) V_STORE(Y + i * ldy + v * VW, a[i][v]);
}

static void S(s_spmm)(float *Y, size_t ldy, int rows, int n, const float *X, size_t ldx,
                      const int *start, const int *count, const int *idx, const float *coef,
                      int accumulate)
{
    for (int r0 = 0; r0 < n; r0 += SP_BW) {
        int w = n - r0 < SP_BW ? n - r0 : SP_BW, i = 0;
        if (w == SP_BW)
            for (; i + SP_NR <= rows; i += SP_NR)
                S(s_spmm_tile)(Y + i * ldy + r0, ldy, X + r0, ldx, start + i, count + i, idx,
                               coef, accumulate);
        for (; i < rows; i++)
            S(s_spmm_row)(Y + i * ldy + r0, w, X + r0, ldx, idx + start[i], coef + start[i],
                          count[i], accumulate);
    }
}

/* Forward GEMM of our own, read in place from a padded HWC image (no
 * im2col):  out[oc, p] = b[oc] + sum_r' wt[r', oc] X[p, r'] for channels
 * [oc0, oc0 + NV*VW), X[p, r'] the patch of position p in patch order
 * r' = (ky, kx, c): row ky of it is the K*C contiguous floats of pin at
 * ((oy*S + ky) * Wp + ox*S) * C. A transposed column matrix colT[P, CKK] is
 * the same thing for the geometry C = CKK, K = 1, W = OW, no pad, stride 1
 * (conv.c's s_colT_dims), so the kernel serves both, with the same FMAs in
 * the same order. A tile of TP positions x NV channel vectors lives in
 * registers for the whole CKK sum: per r', NV vectors of wt and TP
 * broadcasts feed TP*NV FMAs (24 of 32 zmm registers for AVX-512, 12 of 16
 * ymm for AVX2). The tile goes out into NCHW rows ldo floats apart by
 * VW x VW transposes in registers, each channel's run of positions stored
 * whole (masked past the tile's end): a scatter of each vector (lane l to
 * out[(oc + l) * ldo + p]) took 4-25 % longer on the AVX-512 path (AMD's
 * vscatterdps is slow, and each row got one float at a time), a copy
 * through the stack, float by float, about 10 % of the tile's time. */
#define DP_FWD_GEMM(NAME, NV, TP)                                                                \
    __attribute__((optimize("O3"))) static void NAME(float *out, size_t ldo, const float *pin,  \
                                                     const dp_conv_dims_t *d, const float *wt,   \
                                                     const float *b, int oc0)                    \
    {                                                                                            \
        int P = d->OH * d->OW, OW = d->OW, OC = d->OC, C = d->C, K = d->K, st = d->stride;       \
        int run = K * C;                                                                         \
        size_t Wp = (size_t)d->W + 2 * d->pad, rstep = Wp * C;                                  \
        V bias[NV];                                                                              \
        for (int v = 0; v < NV; v++) bias[v] = b ? V_LOAD(b + oc0 + VW * v) : V_ZERO();         \
        for (int p0 = 0; p0 < P; p0 += TP) {                                                     \
            int np = P - p0 < TP ? P - p0 : TP;                                                  \
            const float *row[TP];                                                                \
            for (int j = 0; j < TP; j++) { /* spare rows of a short tile repeat the last */      \
                int p = p0 + (j < np ? j : np - 1), oy = p / OW, ox = p % OW;                    \
                row[j] = pin + ((size_t)oy * st * Wp + (size_t)ox * st) * C;                     \
            }                                                                                    \
            V acc[TP][NV];                                                                       \
            _Pragma("GCC unroll 12") for (int j = 0; j < TP; j++)                                \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[j][v] = bias[v];       \
            const float *wr = wt + oc0;                                                          \
            for (int ky = 0; ky < K; ky++) {                                                     \
                for (int r = 0; r < run; r++, wr += OC) {                                        \
                    V wv[NV];                                                                    \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) wv[v] =                 \
                        V_LOAD(wr + VW * v);                                                     \
                    _Pragma("GCC unroll 12") for (int j = 0; j < TP; j++)                        \
                    {                                                                            \
                        V x = V_SET1(row[j][r]);                                                 \
                        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                     \
                            acc[j][v] = V_FMA(x, wv[v], acc[j][v]);                              \
                    }                                                                            \
                }                                                                                \
                for (int j = 0; j < TP; j++) row[j] += rstep;                                    \
            }                                                                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                 \
                _Pragma("GCC unroll 2") for (int j0 = 0; j0 < TP; j0 += VW)                     \
                {                                                                                \
                    if (j0 >= np) break;                                                         \
                    V r[VW];                                                                     \
                    _Pragma("GCC unroll 16") for (int j = 0; j < VW; j++) r[j] =                 \
                        j0 + j < TP ? acc[j0 + j][v] : V_ZERO();                                 \
                    V_TRANSPOSE(r);                                                              \
                    VM m = V_MASK(np - j0 < VW ? np - j0 : VW);                                  \
                    float *o = out + (size_t)(oc0 + VW * v) * ldo + p0 + j0;                     \
                    _Pragma("GCC unroll 16") for (int c = 0; c < VW; c++)                        \
                        V_MSTORE(m, o + (size_t)c * ldo, r[c]);                                  \
                }                                                                                \
        }                                                                                        \
    }
DP_FWD_GEMM(S(s_fwd_big), FWD_BIG_NV, FWD_BIG_TP)
DP_FWD_GEMM(S(s_fwd_small), FWD_SMALL_NV, FWD_SMALL_TP)
/* one vector of channels (16 on AVX-512, where the small block is 32: resnet's
 * 16-channel stage); on AVX2 the small block is already one vector and this
 * instance, the same macro at NV = 1, is never reached */
DP_FWD_GEMM(S(s_fwd_one), 1, FWD_ONE_TP)

/* out (one image) = conv via our GEMM: big channel blocks, then small ones,
 * then one-vector ones (OC a multiple of VW). Each output is one FMA chain
 * over r' whatever block it falls in, so the blocking changes no bit. */
static void S(s_fwd)(float *out, size_t ldo, const float *pin, const dp_conv_dims_t *d,
                     const float *wt, const float *b)
{
    int oc0 = 0, OC = d->OC;
    for (; oc0 + FWD_BIG_NV * VW <= OC; oc0 += FWD_BIG_NV * VW)
        S(s_fwd_big)(out, ldo, pin, d, wt, b, oc0);
    for (; oc0 + FWD_SMALL_NV * VW <= OC; oc0 += FWD_SMALL_NV * VW)
        S(s_fwd_small)(out, ldo, pin, d, wt, b, oc0);
    for (; oc0 < OC; oc0 += VW) S(s_fwd_one)(out, ldo, pin, d, wt, b, oc0);
}

#ifdef FL_OCT /* the path has one */
/* ---- the flat forward -----------------------------------------------------
 * A "same" stride-1 convolution (2 pad = K - 1, so OH = H and OW = W) read in
 * place from the CHW image, vectors along the plane: output positions
 * q .. q + VW - 1 (consecutive in the flattened H x W plane, across row
 * ends) take tap (ky, kx) of channel c from in[c, q + (ky - pad) W +
 * (kx - pad) ...], a masked load whose lanes off the image (the border, a
 * row's wrap, past the plane) read 0 (masks: s_flat_masks' table, one
 * per vector and tap). A tile of FL_OCT channels x FL_NQ vectors lives in
 * registers: per (tap, c), FL_NQ loads and FL_OCT broadcasts of wt feed
 * FL_OCT * FL_NQ FMAs, and the tile is stored as whole runs of positions of
 * each channel's NCHW plane. So no padded HWC copy of the image is made
 * and no tile is transposed: the two cost a 16-channel 32x32 layer about
 * 40 % of s_fwd's time. Each output is the same FMA chain as s_fwd's: the
 * bias, then r' = (ky, kx, c) in order, the padding's zeros included (as 0
 * times the weight), so the bits are s_fwd's. OC a multiple of FL_OCT. */
#define FL_NB (FL_NQ * VW) /* positions in a tile */

/* the vectors the tiles cover: whole tiles over the plane */
static int S(s_flat_vectors)(const dp_conv_dims_t *d)
{
    return (d->H * d->W + FL_NB - 1) / FL_NB * FL_NQ;
}

/* m[v * K * K + tap]: the lanes of vector v (positions v VW ..) inside the
 * image at tap (ky, kx), for every vector the tiles cover (the spare ones
 * of the last tile all off). */
static void S(s_flat_masks)(uint32_t *m, const dp_conv_dims_t *d)
{
    int H = d->H, W = d->W, K = d->K, HW = H * W, p = d->pad, nv = S(s_flat_vectors)(d);
    for (int v = 0; v < nv; v++)
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                uint32_t bits = 0;
                for (int l = 0; l < VW; l++) {
                    int q = v * VW + l, y = q / W + ky - p, x = q % W + kx - p;
                    if (q < HW && y >= 0 && y < H && x >= 0 && x < W) bits |= 1u << l;
                }
                m[(size_t)v * K * K + ky * K + kx] = bits;
            }
}

static size_t S(s_flat_mask_count)(const dp_conv_dims_t *d)
{
    return (size_t)S(s_flat_vectors)(d) * d->K * d->K;
}

/* channels [oc0, oc0 + FL_OCT) x vectors [v0, v0 + FL_NQ) */
__attribute__((optimize("O3"))) static void S(s_flat_tile)(float *out, const float *in,
                                                          const dp_conv_dims_t *d,
                                                          const float *wt, const float *b,
                                                          const uint32_t *masks, int oc0, int v0,
                                                          size_t ldi)
{
    int W = d->W, K = d->K, C = d->C, OC = d->OC, p = d->pad;
    ptrdiff_t HW = (ptrdiff_t)d->H * W;
    V acc[FL_OCT][FL_NQ];
    _Pragma("GCC unroll 8") for (int i = 0; i < FL_OCT; i++)
    {
        V bv = b ? V_SET1(b[oc0 + i]) : V_ZERO();
        _Pragma("GCC unroll 8") for (int v = 0; v < FL_NQ; v++) acc[i][v] = bv;
    }
    const uint32_t *mt = masks + (size_t)v0 * K * K;
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            int tap = ky * K + kx;
            VM m[FL_NQ];
            _Pragma("GCC unroll 8") for (int v = 0; v < FL_NQ; v++) m[v] =
                V_MASK_BITS(mt[(size_t)v * K * K + tap]);
            /* the tap's first position, maybe before the plane (lanes off) */
            ptrdiff_t off = (ptrdiff_t)v0 * VW + (ptrdiff_t)(ky - p) * W + (kx - p);
            const float *wr = wt + (size_t)tap * C * OC + oc0;
            for (int c = 0; c < C; c++, wr += OC) {
                const float *x = in + c * ldi + off;
                V xv[FL_NQ];
                _Pragma("GCC unroll 8") for (int v = 0; v < FL_NQ; v++) xv[v] =
                    V_MLOAD(m[v], x + v * VW);
                _Pragma("GCC unroll 8") for (int i = 0; i < FL_OCT; i++)
                {
                    V wv = V_SET1(wr[i]);
                    _Pragma("GCC unroll 8") for (int v = 0; v < FL_NQ; v++) acc[i][v] =
                        V_FMA(wv, xv[v], acc[i][v]);
                }
            }
        }
    _Pragma("GCC unroll 8") for (int v = 0; v < FL_NQ; v++)
    {
        ptrdiff_t q = (ptrdiff_t)(v0 + v) * VW;
        if (q >= HW) break;
        _Pragma("GCC unroll 8") for (int i = 0; i < FL_OCT; i++)
        {
            float *o = out + (size_t)(oc0 + i) * HW + q;
            if (q + VW <= HW)
                V_STORE(o, acc[i][v]);
            else
                V_MSTORE(V_MASK((int)(HW - q)), o, acc[i][v]);
        }
    }
}

/* out (one image, NCHW) = conv(in) for a "same" stride-1 d, masks from
 * s_flat_masks for d. Tiles of positions outermost: a tile's input (C
 * planes' runs) stays in L1 over all channel blocks. */
static void S(s_fwd_flat)(float *out, const float *in, size_t ldi, const dp_conv_dims_t *d,
                          const float *wt, const float *b, const uint32_t *masks)
{
    int nv = (d->H * d->W + VW - 1) / VW;
    for (int v0 = 0; v0 < nv; v0 += FL_NQ)
        for (int oc0 = 0; oc0 < d->OC; oc0 += FL_OCT)
            S(s_flat_tile)(out, in, d, wt, b, masks, oc0, v0, ldi);
}
#endif

/* pin (the padded HWC image: (H + 2 pad) rows of W + 2 pad pixels of C
 * floats) from in (CHW): the border zeroed, the inside by VW x VW
 * transposes (VW channels x up to VW positions of a row, the last ones
 * masked); channels past the last multiple of VW, and rows of at most
 * VW / 2 positions (where the transposes were slower: AVX-512 on 8x8 and
 * 7x7), float by float. Plain copies, so the bits are the same either
 * way; the scalar loop alone (a store every C floats) took 12 % of
 * resnet20's step, and the transposes take 30-40 % less on 14x14 to 32x32. */
static void S(s_pad_hwc)(float *pin, const float *in, const dp_conv_dims_t *d)
{
    int C = d->C, H = d->H, W = d->W, p = d->pad, Wp = W + 2 * p;
    size_t HW = (size_t)H * W, row = (size_t)Wp * C;
    memset(pin, 0, (size_t)p * row * sizeof(float));
    memset(pin + (size_t)(p + H) * row, 0, (size_t)p * row * sizeof(float));
    for (int y = 0; y < H; y++) {
        float *r0 = pin + (size_t)(y + p) * row, *dst = r0 + (size_t)p * C;
        const float *src = in + (size_t)y * W;
        memset(r0, 0, (size_t)p * C * sizeof(float));
        memset(dst + (size_t)W * C, 0, (size_t)p * C * sizeof(float));
        int c0 = 0;
        for (; c0 + VW <= C && W > VW / 2; c0 += VW)
            for (int x0 = 0; x0 < W; x0 += VW) {
                int nx = W - x0 < VW ? W - x0 : VW;
                VM m = V_MASK(nx);
                V r[VW];
                _Pragma("GCC unroll 16") for (int i = 0; i < VW; i++) r[i] =
                    V_MLOAD(m, src + (c0 + i) * HW + x0);
                V_TRANSPOSE(r);
                for (int i = 0; i < nx; i++) V_STORE(dst + (size_t)(x0 + i) * C + c0, r[i]);
            }
        for (; c0 < C; c0++)
            for (int x = 0; x < W; x++) dst[(size_t)x * C + c0] = src[c0 * HW + x];
    }
}

/* ---- direct dw ------------------------------------------------------------
 * dwq[oc, r'] (patch order, OC x CKK) += sum_p g[oc, p] X[p, r'] for one
 * image, X read in place from the padded HWC image as in the forward (no
 * im2col, any stride). A tile of DW_TO channels x NV column vectors stays in
 * registers over all P positions: per position, NV loads of X and DW_TO
 * broadcasts of g feed DW_TO * NV FMAs. Columns go per patch row ky (K*C
 * contiguous floats), in blocks of DW_NV vectors, then single vectors, the
 * last one masked. Each dwq element gains one FMA chain over p in order,
 * started from zero and added once per image (one chain over the whole
 * batch, B * P terms, drifted far enough from the per-image GEMM's sums to
 * fail test_resnet_cluster's sync == standalone comparison), whatever the
 * tile, so both widths give the same bits. */
#define DP_DW_TILE(NAME, NV, MASKED)                                                             \
    __attribute__((optimize("O3"))) static void NAME(float *y, size_t ldy, const float *g,      \
                                                     int nrows, const float *x0,                 \
                                                     const dp_conv_dims_t *d, int w)             \
    {                                                                                            \
        int P = d->OH * d->OW, st = d->stride;                                                   \
        size_t xrow = ((size_t)d->W + 2 * d->pad) * st * d->C, xcol = (size_t)st * d->C;         \
        VM m = V_MASK(w < VW ? w : VW);                                                          \
        (void)m;                                                                                 \
        const float *gr[DW_TO];                                                                  \
        float *yr[DW_TO];                                                                        \
        for (int i = 0; i < DW_TO; i++) { /* spare rows repeat the last, never stored */         \
            int k = i < nrows ? i : nrows - 1;                                                   \
            gr[i] = g + (size_t)k * P;                                                           \
            yr[i] = y + (size_t)k * ldy;                                                         \
        }                                                                                        \
        V acc[DW_TO][NV];                                                                        \
        for (int i = 0; i < DW_TO; i++)                                                          \
            for (int v = 0; v < NV; v++) acc[i][v] = V_ZERO();                                   \
        int p = 0;                                                                               \
        for (int oy = 0; oy < d->OH; oy++) {                                                     \
            const float *x = x0 + oy * xrow;                                                     \
            for (int ox = 0; ox < d->OW; ox++, p++, x += xcol) {                                 \
                V xv[NV];                                                                        \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) xv[v] =                     \
                    MASKED ? V_MLOAD(m, x + v * VW) : V_LOAD(x + v * VW);                        \
                _Pragma("GCC unroll 8") for (int i = 0; i < DW_TO; i++)                          \
                {                                                                                \
                    V gv = V_SET1(gr[i][p]);                                                     \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                         \
                        acc[i][v] = V_FMA(gv, xv[v], acc[i][v]);                                 \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int i = 0; i < nrows; i++)                                                          \
            for (int v = 0; v < NV; v++) {                                                       \
                if (MASKED)                                                                      \
                    V_MSTORE(m, yr[i] + v * VW, V_ADD(V_MLOAD(m, yr[i] + v * VW), acc[i][v]));   \
                else                                                                             \
                    V_STORE(yr[i] + v * VW, V_ADD(V_LOAD(yr[i] + v * VW), acc[i][v]));          \
            }                                                                                    \
    }
DP_DW_TILE(S(s_dw_block), DW_NV, 0)
DP_DW_TILE(S(s_dw_vec), 1, 1)

static void S(s_dw)(float *dwq, const float *g, const float *pin, const dp_conv_dims_t *d)
{
    int C = d->C, K = d->K, OC = d->OC, run = K * C;
    size_t CKK = (size_t)run * K, rstep = ((size_t)d->W + 2 * d->pad) * C;
    for (int ky = 0; ky < K; ky++)
        for (int o0 = 0; o0 < OC; o0 += DW_TO) {
            int nrows = OC - o0 < DW_TO ? OC - o0 : DW_TO, c0 = 0;
            float *y = dwq + (size_t)o0 * CKK + (size_t)ky * run;
            const float *g0 = g + (size_t)o0 * d->OH * d->OW, *x0 = pin + ky * rstep;
            for (; c0 + DW_NV * VW <= run; c0 += DW_NV * VW)
                S(s_dw_block)(y + c0, CKK, g0, nrows, x0 + c0, d, DW_NV * VW);
            for (; c0 < run; c0 += VW) S(s_dw_vec)(y + c0, CKK, g0, nrows, x0 + c0, d, run - c0);
        }
}

const dp_conv_simd_t S(dp_conv_simd) = {
    .pad_hwc = S(s_pad_hwc),
#ifdef FL_OCT
    .flat_oc = FL_OCT,
    .flat_block = FL_NB,
    .fwd_flat = S(s_fwd_flat),
    .flat_masks = S(s_flat_masks),
    .flat_mask_count = S(s_flat_mask_count),
#endif
    .oc_multiple = VW,
    .oc_block = FWD_SMALL_NV * VW,
    .fwd = S(s_fwd),
    .dw = S(s_dw),
    .spmm = S(s_spmm),
#ifdef NZ_LIST
    .nz_list = NZ_LIST,
#endif
    .im2colT = S(s_im2colT),
    .col2imT_row = S(s_col2imT_row),
    .im2col_s1 = S(s_im2col_s1),
    .col2im_s1 = S(s_col2im_s1),
};
