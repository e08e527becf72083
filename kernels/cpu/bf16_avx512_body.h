/* bf16_avx512_body: the avx512_bf16 path's passes (bf16_ops.h), written
 * once against the few macros below and compiled twice: by bf16_avx512.c
 * with the real intrinsics (the path the CPU runs), and by
 * tests/unit/test_bf16_ops.c against a scalar model of those intrinsics
 * (Intel's pseudo-code), so the packing, tiling and tails, where the bugs
 * live, run and are tested on a CPU without the instructions. Everything
 * that is not one intrinsic lives here, in both copies.
 *
 * The includer defines, each one intrinsic (or a cast):
 *   S(name)            this copy's name for a function
 *   BV, BI, BH, BM     16 fp32 (__m512); 16 dwords (__m512i), which hold
 *                      32 bf16 as pairs; 16 bf16 (__m256i); a 16-lane mask
 *   BF_ZERO()          16 fp32 zeros
 *   BF_MLOAD(m, p)     16 floats at p, lanes outside m zero and not read
 *   BF_MSTORE(m, p, v) the lanes of v inside m to p
 *   BF_LOADI(p), BF_STOREI(p, v), BF_SET1I(u)   64 bytes; u in every dword
 *   BF_DP(acc, a, b)   vdpbf16ps: lane j += a.hi*b.hi, then += a.lo*b.lo
 *   BF_CVT(v)          vcvtneps2bf16: 16 fp32 to 16 bf16 (to nearest even)
 *   BF_WIDEN(h)        vpmovzxwd: 16 bf16 to the low halves of 16 dwords
 *   BF_SHL16(x), BF_OR(x, y)   dword shift left by 16; or
 *
 * The GEMM: C[M,N] (fp32, rows ldc apart) (+)= A[M,Kd] B[Kd,N], A and B
 * packed as bf16 pairs along K (pair p holds k = 2p in its low half and
 * 2p + 1 in its high half, a zero past Kd on both sides): A as rows of
 * P = ceil(Kd / 2) dwords, M rounded up to BF_MR with zero rows, a pair
 * broadcast to all lanes; B as panels of 16 columns, each P vectors of 16
 * dwords, N rounded up to BF_NV panels with zero columns. A tile is BF_MR
 * rows x BF_NV vectors of C, each lane one fp32 chain over all of K: start
 * (0, or C's value when accumulating), then for p ascending vdpbf16ps adds
 * the k = 2p + 1 product and then the k = 2p one, each rounded to nearest
 * even, subnormal inputs and results read and written as zero (DAZ, FTZ:
 * the instruction's rule, MXCSR aside). So the bits of a C element depend
 * on its operands alone, never on the tiling or the thread that ran it:
 * every pass gives the same bits for any thread count.
 *
 * The convolution goes through im2col and col2im, one image at a time: it
 * makes the forward, the input gradient and the weight gradient three calls
 * of the one GEMM above, which is the part to get right first on a CPU no
 * one here has run (the fp32 path's direct kernels are faster; this path
 * is measured on a Zen 4 before it is tuned). Bias sums and db are fp32
 * sums of fp32 values, never rounded to bf16. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/util.h"
#include "kernels/cpu/bf16_ops.h"
#include "kernels/cpu/bf16_ref.h"
#include "kernels/cpu/cpu.h"

#define BF_MR 4 /* rows of C a tile */
#define BF_NV 2 /* vectors of 16 columns a tile */
#define BF_NT (16 * BF_NV)
#define BF_MASK(n) ((BM)((n) <= 0 ? 0u : (n) >= 16 ? 0xffffu : (1u << (n)) - 1u))
#define BF_ROUND_UP(x, m) (((x) + (m) - 1) / (m) * (m))

/* The dword of a pair, by dp_bf16_from_f32 (the scalar packers). */
static inline uint32_t S(pair)(float lo, float hi)
{
    return (uint32_t)dp_bf16_from_f32(lo) | (uint32_t)dp_bf16_from_f32(hi) << 16;
}

/* The dwords of 16 pairs (lo[j], hi[j]): the vector packer. Bit for bit
 * dp_bf16_from_f32's pairs, but for an fp32 subnormal, which vcvtneps2bf16
 * makes a zero of its sign (vdpbf16ps reads a bf16 subnormal as zero
 * anyway, so no product changes). */
static inline BI S(pairs)(BV lo, BV hi)
{
    return BF_OR(BF_WIDEN(BF_CVT(lo)), BF_SHL16(BF_WIDEN(BF_CVT(hi))));
}

/* A packed (see above) from element (m, k) at A[m sm + k sk]. */
static void S(pack_a)(uint32_t *Ap, const float *A, size_t sm, size_t sk, int M, int Kd)
{
    int P = (Kd + 1) / 2, Mp = BF_ROUND_UP(M, BF_MR);
    for (int m = 0; m < Mp; m++)
        for (int p = 0; p < P; p++) {
            int k = 2 * p;
            float lo = m < M ? A[m * sm + k * sk] : 0.0f;
            float hi = m < M && k + 1 < Kd ? A[m * sm + (k + 1) * sk] : 0.0f;
            Ap[(size_t)m * P + p] = S(pair)(lo, hi);
        }
}

/* B packed from element (k, n) at B[k sk + n sn] (any layout, scalar). */
static void S(pack_b)(uint32_t *Bp, const float *B, size_t sk, size_t sn, int Kd, int N)
{
    int P = (Kd + 1) / 2, Np = BF_ROUND_UP(N, BF_NT);
    for (int n = 0; n < Np; n++)
        for (int p = 0; p < P; p++) {
            int k = 2 * p;
            float lo = n < N ? B[k * sk + n * sn] : 0.0f;
            float hi = n < N && k + 1 < Kd ? B[(k + 1) * sk + n * sn] : 0.0f;
            Bp[((size_t)(n / 16) * P + p) * 16 + n % 16] = S(pair)(lo, hi);
        }
}

/* B packed from rows of N floats, ldb apart (element (k, n) at
 * B[k ldb + n]): 16 columns of two rows a step, through the vector packer. */
static void S(pack_b_rows)(uint32_t *Bp, const float *B, size_t ldb, int Kd, int N)
{
    int P = (Kd + 1) / 2, Q = BF_ROUND_UP(N, BF_NT) / 16;
    for (int q = 0; q < Q; q++) {
        BM m = BF_MASK(N - 16 * q);
        for (int p = 0; p < P; p++) {
            const float *row = B + (size_t)(2 * p) * ldb + 16 * q;
            BV lo = BF_MLOAD(m, row);
            BV hi = 2 * p + 1 < Kd ? BF_MLOAD(m, row + ldb) : BF_ZERO();
            BF_STOREI(Bp + ((size_t)q * P + p) * 16, S(pairs)(lo, hi));
        }
    }
}

/* One tile: C[0, mr) x [0, nc) (nc may pass the tile's BF_NT columns, or
 * fall short of them: lanes past nc are neither read nor written). */
static void S(tile)(float *C, size_t ldc, int mr, int nc, int P, const uint32_t *a,
                    const uint32_t *b, int accumulate)
{
    /* the loops over i and v unrolled, so the accumulators stay in registers */
    BV acc[BF_MR][BF_NV];
#pragma GCC unroll 8
    for (int i = 0; i < BF_MR; i++)
#pragma GCC unroll 8
        for (int v = 0; v < BF_NV; v++)
            acc[i][v] = accumulate && i < mr
                            ? BF_MLOAD(BF_MASK(nc - 16 * v), C + i * ldc + 16 * v)
                            : BF_ZERO();
    for (int p = 0; p < P; p++) {
        BI bv[BF_NV];
#pragma GCC unroll 8
        for (int v = 0; v < BF_NV; v++) bv[v] = BF_LOADI(b + ((size_t)v * P + p) * 16);
#pragma GCC unroll 8
        for (int i = 0; i < BF_MR; i++) {
            BI ai = BF_SET1I(a[(size_t)i * P + p]);
#pragma GCC unroll 8
            for (int v = 0; v < BF_NV; v++) acc[i][v] = BF_DP(acc[i][v], ai, bv[v]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < BF_NV; v++)
            BF_MSTORE(BF_MASK(nc - 16 * v), C + i * ldc + 16 * v, acc[i][v]);
}

/* C (+)= A B over the tiles [tiles t / T, tiles (t + 1) / T) of the grid,
 * row-major: thread t of T's share. */
static void S(gemm)(float *C, size_t ldc, int M, int N, int P, const uint32_t *Ap,
                    const uint32_t *Bp, int accumulate, int t, int T)
{
    int nt = (N + BF_NT - 1) / BF_NT;
    long tiles = (long)((M + BF_MR - 1) / BF_MR) * nt;
    for (long k = tiles * t / T; k < tiles * (t + 1) / T; k++) {
        int i = (int)(k / nt) * BF_MR, j = (int)(k % nt) * BF_NT;
        S(tile)(C + (size_t)i * ldc + j, ldc, M - i < BF_MR ? M - i : BF_MR, N - j, P,
                Ap + (size_t)i * P, Bp + (size_t)(j / 16) * P * 16, accumulate);
    }
}

/* The GEMM on dp_cpu_team's threads (same bits for any count). */
static void S(gemm_team)(float *C, size_t ldc, int M, int N, int P, const uint32_t *Ap,
                         const uint32_t *Bp, int accumulate)
{
    int nt = dp_cpu_team(2.0 * M * N * P);
#pragma omp parallel num_threads(nt)
    S(gemm)(C, ldc, M, N, P, Ap, Bp, accumulate, omp_get_thread_num(), omp_get_num_threads());
}

/* Sizes, in dwords, of packed A and B. */
static size_t S(a_size)(int M, int Kd)
{
    return (size_t)BF_ROUND_UP(M, BF_MR) * ((Kd + 1) / 2);
}

static size_t S(b_size)(int Kd, int N)
{
    return (size_t)BF_ROUND_UP(N, BF_NT) * ((Kd + 1) / 2);
}

/* The calling thread's buffer for the operands a pass shares with its
 * team (dp_cpu_scratch is per thread, and the calling thread is also the
 * team's first, so the shared part lives apart). Grows, never shrinks. */
static _Thread_local uint32_t *S(shared_buf);
static _Thread_local size_t S(shared_n);

static uint32_t *S(shared)(size_t dwords)
{
    if (dwords > S(shared_n)) {
        free(S(shared_buf));
        size_t n = dwords + dwords / 4 + 1024;
        S(shared_buf) = dp_aligned_alloc(n * sizeof(uint32_t));
        S(shared_n) = n;
    }
    return S(shared_buf);
}

/* col[r, p] of one CHW image, r = (c, ky, kx), p = (oy, ox); zero where
 * the window leaves the image. */
static void S(im2col)(float *col, const float *img, const dp_conv_dims_t *d)
{
    int K = d->K;
    for (int c = 0; c < d->C; c++)
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++)
                for (int oy = 0; oy < d->OH; oy++) {
                    int y = oy * d->stride - d->pad + ky;
                    for (int ox = 0; ox < d->OW; ox++) {
                        int x = ox * d->stride - d->pad + kx;
                        int inside = y >= 0 && y < d->H && x >= 0 && x < d->W;
                        *col++ = inside ? img[((size_t)c * d->H + y) * d->W + x] : 0.0f;
                    }
                }
}

/* img[c, y, x] = the sum of the col[r, p] im2col took from it, in fp32,
 * r ascending, then p ascending. */
static void S(col2im)(float *img, const float *col, const dp_conv_dims_t *d)
{
    int K = d->K;
    memset(img, 0, (size_t)d->C * d->H * d->W * sizeof *img);
    for (int c = 0; c < d->C; c++)
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++)
                for (int oy = 0; oy < d->OH; oy++) {
                    int y = oy * d->stride - d->pad + ky;
                    for (int ox = 0; ox < d->OW; ox++, col++) {
                        int x = ox * d->stride - d->pad + kx;
                        if (y >= 0 && y < d->H && x >= 0 && x < d->W)
                            img[((size_t)c * d->H + y) * d->W + x] += *col;
                    }
                }
}

/* Threads for work split by images: whole images a thread. */
static int S(image_team)(const dp_conv_dims_t *d)
{
    int nt = dp_cpu_team(2.0 * d->B * d->OC * d->OH * d->OW * d->C * d->K * d->K);
    return nt < d->B ? nt : d->B;
}

/* out_n[OC,P] = b + w[OC,R] col_n[R,P] per image n (R = C K K, P = OH OW):
 * A = w (k contiguous), B = col_n's rows. */
static void S(conv_forward)(float *out, const float *in, const float *w, const float *b,
                            const dp_conv_dims_t *d)
{
    int R = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    size_t bsz = S(b_size)(R, P);
    uint32_t *Ap = S(shared)(S(a_size)(OC, R));
    S(pack_a)(Ap, w, (size_t)R, 1, OC, R);
#pragma omp parallel for num_threads(S(image_team)(d)) schedule(static)
    for (int n = 0; n < d->B; n++) {
        float *col = dp_cpu_scratch((size_t)R * P + bsz);
        uint32_t *Bp = (uint32_t *)(col + (size_t)R * P);
        float *o = out + (size_t)n * OC * P;
        S(im2col)(col, in + (size_t)n * d->C * d->H * d->W, d);
        S(pack_b_rows)(Bp, col, (size_t)P, R, P);
        for (int oc = 0; oc < OC && b; oc++)
            for (int p = 0; p < P; p++) o[(size_t)oc * P + p] = b[oc];
        S(gemm)(o, (size_t)P, OC, P, (R + 1) / 2, Ap, Bp, b != NULL, 0, 1);
    }
}

/* dw[OC,R] = sum over images n of dout_n[OC,P] col_n^T: K runs over the
 * positions, image after image (each image's pairs padded on its own);
 * A = dout_n (k contiguous), B(k = p, n = r) = col_n[r, p]. One image at a
 * time, its tiles split over the team. */
static void S(conv_dw)(float *dw, const float *dout, const float *in, const dp_conv_dims_t *d)
{
    int R = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    size_t asz = S(a_size)(OC, P), bsz = S(b_size)(P, R);
    uint32_t *Ap = S(shared)(asz + bsz + (size_t)R * P);
    uint32_t *Bp = Ap + asz;
    float *col = (float *)(Bp + bsz);
    int nt = dp_cpu_team(2.0 * d->B * OC * P * R);
    for (int n = 0; n < d->B; n++) {
        S(im2col)(col, in + (size_t)n * d->C * d->H * d->W, d);
        S(pack_a)(Ap, dout + (size_t)n * OC * P, (size_t)P, 1, OC, P);
        S(pack_b)(Bp, col, 1, (size_t)P, P, R);
#pragma omp parallel num_threads(nt)
        S(gemm)(dw, (size_t)R, OC, R, (P + 1) / 2, Ap, Bp, n > 0, omp_get_thread_num(),
                omp_get_num_threads());
    }
}

/* din_n = col2im(w^T dout_n) per image: A(m = r, k = oc) = w[oc, r],
 * B = dout_n's rows (k = oc). */
static void S(conv_din)(float *din, const float *dout, const float *w, const dp_conv_dims_t *d)
{
    int R = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    size_t bsz = S(b_size)(OC, P);
    uint32_t *Ap = S(shared)(S(a_size)(R, OC));
    S(pack_a)(Ap, w, 1, (size_t)R, R, OC);
#pragma omp parallel for num_threads(S(image_team)(d)) schedule(static)
    for (int n = 0; n < d->B; n++) {
        float *dcol = dp_cpu_scratch((size_t)R * P + bsz);
        uint32_t *Bp = (uint32_t *)(dcol + (size_t)R * P);
        S(pack_b_rows)(Bp, dout + (size_t)n * OC * P, (size_t)P, OC, P);
        S(gemm)(dcol, (size_t)P, R, P, (OC + 1) / 2, Ap, Bp, 0, 0, 1);
        S(col2im)(din + (size_t)n * d->C * d->H * d->W, dcol, d);
    }
}

/* db[oc]: dout over images, then positions, ascending (fp32, as the
 * reference). */
static void S(conv_backward)(float *din, float *dw, float *db, const float *dout,
                             const float *in, const float *w, const dp_conv_dims_t *d)
{
    if (db) dp_bf16_conv_db(db, dout, d);
    S(conv_dw)(dw, dout, in, d);
    if (din) S(conv_din)(din, dout, w, d);
}


static void S(fc_forward)(float *out, const float *in, const float *w, const float *b, int B,
                          int IN, int OUT)
{
    /* out[B,OUT] = in[B,IN] w^T: A = in (k contiguous), B(k, n) = w[n, k] */
    uint32_t *Ap = S(shared)(S(a_size)(B, IN) + S(b_size)(IN, OUT));
    uint32_t *Bp = Ap + S(a_size)(B, IN);
    S(pack_a)(Ap, in, (size_t)IN, 1, B, IN);
    S(pack_b)(Bp, w, 1, (size_t)IN, IN, OUT);
    for (int n = 0; n < B && b; n++) memcpy(out + (size_t)n * OUT, b, (size_t)OUT * sizeof *b);
    S(gemm_team)(out, (size_t)OUT, B, OUT, (IN + 1) / 2, Ap, Bp, b != NULL);
}

static void S(fc_backward)(float *din, float *dw, float *db, const float *dout,
                           const float *in, const float *w, int B, int IN, int OUT)
{
    if (db) dp_bf16_fc_db(db, dout, B, OUT);
    /* dw[OUT,IN] = dout^T in: A(m = o, k = n) = dout[n, o]; B = in's rows */
    uint32_t *Ap = S(shared)(S(a_size)(OUT, B) + S(b_size)(B, IN));
    uint32_t *Bp = Ap + S(a_size)(OUT, B);
    S(pack_a)(Ap, dout, 1, (size_t)OUT, OUT, B);
    S(pack_b_rows)(Bp, in, (size_t)IN, B, IN);
    S(gemm_team)(dw, (size_t)IN, OUT, IN, (B + 1) / 2, Ap, Bp, 0);
    if (!din) return;
    /* din[B,IN] = dout w: A = dout (k = o contiguous); B = w's rows */
    Ap = S(shared)(S(a_size)(B, OUT) + S(b_size)(OUT, IN));
    Bp = Ap + S(a_size)(B, OUT);
    S(pack_a)(Ap, dout, (size_t)OUT, 1, B, OUT);
    S(pack_b_rows)(Bp, w, (size_t)IN, OUT, IN);
    S(gemm_team)(din, (size_t)IN, B, IN, (OUT + 1) / 2, Ap, Bp, 0);
}
