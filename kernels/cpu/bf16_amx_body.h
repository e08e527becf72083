/* bf16_amx_body: the AMX kernel's body, written once and compiled twice:
 * by bf16_amx.c on the real tile instructions, and by
 * tests/unit/test_bf16_amx.c on a scalar model of them (so the packing,
 * tiling and tails, where the bugs live, run on any CPU). Not a header to
 * include anywhere else.
 *
 * The includer defines, before including it, the tile operations on
 * literal tile numbers (as the intrinsics take them):
 *   AMX_LOADCONFIG(cfg)        ldtilecfg from a 64-byte s_amx_cfg_t
 *   AMX_RELEASE()              tilerelease
 *   AMX_ZERO(t)                tilezero tmm t
 *   AMX_LOADD(t, base, stride) tileloadd: the rows of tmm t from base, stride bytes apart
 *   AMX_STORED(t, base, stride) tilestored
 *   AMX_DPBF16PS(c, a, b)      tdpbf16ps: tmm c += tmm a (M x 2K bf16) . tmm b (K x N pairs)
 *
 * One GEMM does all the work: C[M,N] (fp32) = A[M,K] B[K,N], the operands
 * rounded to bf16 while they are packed into tile order, K zero-padded to
 * whole 32-element tiles and M, N to whole 16-row / 16-column tiles (the
 * padding's products are zeros, and only C's valid part is written back):
 *   A tiles: 16 rows x 32 bf16 (64 bytes), row i = A[m0 + i, k0 .. k0 + 32);
 *   B tiles (VNNI): 16 rows x 16 pairs, row kk = for each column n the pair
 *     (B[k0 + 2 kk, n], B[k0 + 2 kk + 1, n]): TDPBF16PS multiplies A's
 *     element 2 kk with the pair's first and 2 kk + 1 with its second;
 *   C tiles: 16 x 16 fp32, tmm0; A in tmm1, B in tmm2 (one C tile at a
 *     time: simple before fast).
 * Every C tile is one thread's, its K blocks added in order, so the bits
 * do not depend on the thread count at all; threads (dp_cpu_team) split
 * the C tiles, and each thread loads its own tile configuration (the
 * configuration is per thread) and releases it when done.
 *
 * The convolution: im2col fused into the packing. The tiles need their
 * operands copied into tile order anyway, so the copy reads the patches
 * straight from the NCHW image (zero outside it) and no fp32 column matrix
 * is made; a direct convolution would need a tile row per output position
 * with the stride inside a row, which tileloadd's one row stride cannot
 * express. Per image n, with r = (c, ky, kx) and p = (oy, ox):
 *   forward:  out_n[OC, P]   = W[OC, CKK] X_n[CKK, P]            (+ b)
 *   din:      dcol[CKK, P]   = W^T[CKK, OC] dout_n[OC, P], then col2im
 *   dw:       dw[OC, CKK]   += dout_n[OC, P] X_n^T[P, CKK], the images in
 *             order, C reloaded between them (exactly one long K loop, as
 *             the tile's fp32 round-trips through memory unchanged). */

#include <stdint.h>
#include <string.h>

#include "common/bf16.h"
#include "kernels/cpu/bf16_ref.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"

#define S_AMX_TM 16 /* C and A tile rows */
#define S_AMX_TN 16 /* C and B tile columns (fp32 / bf16 pairs) */
#define S_AMX_TK 32 /* bf16 elements of K per A row / B tile */
#define S_AMX_TILE (S_AMX_TM * S_AMX_TK) /* bf16 per packed A or B tile */

/* ldtilecfg's 64 bytes, palette 1 (Intel SDM vol. 1, "Tile configuration"). */
typedef struct {
    uint8_t palette_id; /* 1: 8 tiles of up to 16 rows x 64 bytes */
    uint8_t start_row;  /* 0: restart after an interrupted load or store */
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row, per tile */
    uint8_t rows[16];   /* rows, per tile */
} s_amx_cfg_t;
_Static_assert(sizeof(s_amx_cfg_t) == 64, "ldtilecfg reads 64 bytes");

/* tmm0: C (16 x 16 fp32), tmm1: A (16 x 32 bf16), tmm2: B (16 x 16 pairs). */
static void s_amx_cfg(s_amx_cfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette_id = 1;
    for (int t = 0; t < 3; t++) {
        cfg->rows[t] = S_AMX_TM;
        cfg->colsb[t] = 64;
    }
}

/* An operand read element by element while packing: a strided matrix
 * (element (i, j) at x[i rs + j cs]), or, where d is set, image x's patch
 * matrix X[r, p] (r = (c, ky, kx), p = (oy, ox), zero outside the image),
 * as (i, j) = (r, p), or (p, r) when transposed. */
typedef struct {
    const float *x;
    size_t rs, cs;
    const dp_conv_dims_t *d;
    int transposed;
} s_amx_src_t;

static inline float s_amx_at(const s_amx_src_t *s, int i, int j)
{
    if (!s->d) return s->x[(size_t)i * s->rs + (size_t)j * s->cs];
    const dp_conv_dims_t *d = s->d;
    int r = s->transposed ? j : i, p = s->transposed ? i : j;
    int kx = r % d->K, ky = r / d->K % d->K, c = r / (d->K * d->K);
    int y = p / d->OW * d->stride - d->pad + ky, x = p % d->OW * d->stride - d->pad + kx;
    if (y < 0 || y >= d->H || x < 0 || x >= d->W) return 0.0f;
    return s->x[((size_t)c * d->H + y) * d->W + x];
}

static inline int s_amx_blocks(int n, int per) { return (n + per - 1) / per; }

/* bf16 elements of a packed operand of rows x cols (A: M x K, B: K x N). */
static size_t s_amx_packed_a(int M, int K)
{
    return (size_t)s_amx_blocks(M, S_AMX_TM) * s_amx_blocks(K, S_AMX_TK) * S_AMX_TILE;
}
static size_t s_amx_packed_b(int K, int N)
{
    return (size_t)s_amx_blocks(N, S_AMX_TN) * s_amx_blocks(K, S_AMX_TK) * S_AMX_TILE;
}

/* The floats n bf16 take in the scratch, in whole 64-byte lines, and n bf16
 * cut from the scratch at *at (so every piece stays 64-byte aligned). */
static size_t s_amx_floats(size_t n) { return (n + 31) / 32 * 16; }
static uint16_t *s_amx_carve(float **at, size_t n)
{
    uint16_t *p = (uint16_t *)*at;
    *at += s_amx_floats(n);
    return p;
}

/* Ap: A[M, K] in tiles, tile (mb, kb) at (mb Kb + kb) S_AMX_TILE. */
static void s_amx_pack_a(uint16_t *Ap, const s_amx_src_t *s, int M, int K, int nt)
{
    int Mb = s_amx_blocks(M, S_AMX_TM), Kb = s_amx_blocks(K, S_AMX_TK);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < Mb * Kb; t++) {
        uint16_t *tile = Ap + (size_t)t * S_AMX_TILE;
        int m0 = t / Kb * S_AMX_TM, k0 = t % Kb * S_AMX_TK;
        for (int i = 0; i < S_AMX_TM; i++)
            for (int j = 0; j < S_AMX_TK; j++) {
                int m = m0 + i, k = k0 + j;
                float v = m < M && k < K ? s_amx_at(s, m, k) : 0.0f;
                tile[i * S_AMX_TK + j] = dp_bf16_from_f32(v);
            }
    }
}

/* Bp: B[K, N] in VNNI tiles, tile (nb, kb) at (nb Kb + kb) S_AMX_TILE:
 * row kk, pair n holds B[k0 + 2 kk, n0 + n] then B[k0 + 2 kk + 1, n0 + n]. */
static void s_amx_pack_b(uint16_t *Bp, const s_amx_src_t *s, int K, int N, int nt)
{
    int Nb = s_amx_blocks(N, S_AMX_TN), Kb = s_amx_blocks(K, S_AMX_TK);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < Nb * Kb; t++) {
        uint16_t *tile = Bp + (size_t)t * S_AMX_TILE;
        int n0 = t / Kb * S_AMX_TN, k0 = t % Kb * S_AMX_TK;
        for (int kk = 0; kk < S_AMX_TK / 2; kk++)
            for (int j = 0; j < S_AMX_TN; j++)
                for (int e = 0; e < 2; e++) {
                    int k = k0 + 2 * kk + e, n = n0 + j;
                    float v = k < K && n < N ? s_amx_at(s, k, n) : 0.0f;
                    tile[kk * 2 * S_AMX_TN + 2 * j + e] = dp_bf16_from_f32(v);
                }
    }
}

/* C[M, N] (rows ldc floats apart) = (accumulate ? C : 0) + A B, A and B
 * packed by s_amx_pack_a / s_amx_pack_b with the same K. */
static void s_amx_gemm(float *C, size_t ldc, int M, int N, int K, const uint16_t *Ap,
                       const uint16_t *Bp, int accumulate, int nt)
{
    int Mb = s_amx_blocks(M, S_AMX_TM), Nb = s_amx_blocks(N, S_AMX_TN);
    int Kb = s_amx_blocks(K, S_AMX_TK);
#pragma omp parallel num_threads(nt)
    {
        s_amx_cfg_t cfg;
        s_amx_cfg(&cfg);
        AMX_LOADCONFIG(&cfg);
        float cbuf[S_AMX_TM * S_AMX_TN] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int t = 0; t < Mb * Nb; t++) {
            int mb = t / Nb, nb = t % Nb, m0 = mb * S_AMX_TM, n0 = nb * S_AMX_TN;
            int rows = M - m0 < S_AMX_TM ? M - m0 : S_AMX_TM;
            int cols = N - n0 < S_AMX_TN ? N - n0 : S_AMX_TN;
            if (accumulate) {
                memset(cbuf, 0, sizeof cbuf);
                for (int i = 0; i < rows; i++)
                    memcpy(cbuf + i * S_AMX_TN, C + (size_t)(m0 + i) * ldc + n0,
                           (size_t)cols * sizeof(float));
                AMX_LOADD(0, cbuf, S_AMX_TN * sizeof(float));
            } else {
                AMX_ZERO(0);
            }
            const uint16_t *a = Ap + (size_t)mb * Kb * S_AMX_TILE;
            const uint16_t *b = Bp + (size_t)nb * Kb * S_AMX_TILE;
            for (int kb = 0; kb < Kb; kb++) {
                AMX_LOADD(1, a + (size_t)kb * S_AMX_TILE, S_AMX_TK * sizeof(uint16_t));
                AMX_LOADD(2, b + (size_t)kb * S_AMX_TILE, S_AMX_TK * sizeof(uint16_t));
                AMX_DPBF16PS(0, 1, 2);
            }
            AMX_STORED(0, cbuf, S_AMX_TN * sizeof(float));
            for (int i = 0; i < rows; i++)
                memcpy(C + (size_t)(m0 + i) * ldc + n0, cbuf + i * S_AMX_TN,
                       (size_t)cols * sizeof(float));
        }
        AMX_RELEASE();
    }
}

/* out[rows, n] += b[row], in fp32 */
static void s_amx_add_bias(float *out, const float *b, int rows, size_t n, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < rows; i++)
        for (size_t j = 0; j < n; j++) out[(size_t)i * n + j] += b[i];
}

static void s_amx_conv_forward(float *out, const float *in, const float *w, const float *b,
                               const dp_conv_dims_t *d)
{
    int CKK = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    size_t plane = (size_t)d->C * d->H * d->W;
    int nt = dp_cpu_team((double)d->B * OC * P * CKK);
    size_t na = s_amx_packed_a(OC, CKK), nb = s_amx_packed_b(CKK, P);
    float *at = dp_cpu_scratch(s_amx_floats(na) + s_amx_floats(nb));
    uint16_t *Ap = s_amx_carve(&at, na), *Bp = s_amx_carve(&at, nb);
    s_amx_pack_a(Ap, &(s_amx_src_t){.x = w, .rs = (size_t)CKK, .cs = 1}, OC, CKK, nt);
    for (int n = 0; n < d->B; n++) {
        float *o = out + (size_t)n * OC * P;
        s_amx_pack_b(Bp, &(s_amx_src_t){.x = in + n * plane, .d = d}, CKK, P, nt);
        s_amx_gemm(o, (size_t)P, OC, P, CKK, Ap, Bp, 0, nt);
        if (b) s_amx_add_bias(o, b, OC, (size_t)P, nt);
    }
}

/* din_n[C, H, W] = the sum of dcol[r, p] over the (r, p) that read (c, y, x),
 * in the order of r and p: col2im, one thread per channel. */
static void s_amx_col2im(float *din, const float *dcol, const dp_conv_dims_t *d, int nt)
{
    int K = d->K, P = d->OH * d->OW;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int c = 0; c < d->C; c++) {
        float *plane = din + (size_t)c * d->H * d->W;
        memset(plane, 0, (size_t)d->H * d->W * sizeof(float));
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                const float *row = dcol + (size_t)((c * K + ky) * K + kx) * P;
                for (int p = 0; p < P; p++) {
                    int y = p / d->OW * d->stride - d->pad + ky;
                    int x = p % d->OW * d->stride - d->pad + kx;
                    if (y >= 0 && y < d->H && x >= 0 && x < d->W) plane[y * d->W + x] += row[p];
                }
            }
    }
}

static void s_amx_conv_backward(float *din, float *dw, float *db, const float *dout,
                                const float *in, const float *w, const dp_conv_dims_t *d)
{
    int CKK = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    size_t plane = (size_t)d->C * d->H * d->W, oplane = (size_t)OC * P;
    int nt = dp_cpu_team((double)d->B * OC * P * CKK);
    if (db) dp_bf16_conv_db(db, dout, d);
    /* dw's operands, then din's (W^T, dout_n, dcol) in the same scratch */
    size_t dw_a = s_amx_packed_a(OC, P), dw_b = s_amx_packed_b(P, CKK);
    size_t di_a = s_amx_packed_a(CKK, OC), di_b = s_amx_packed_b(OC, P);
    size_t need_dw = s_amx_floats(dw_a) + s_amx_floats(dw_b);
    size_t need_di = s_amx_floats(di_a) + s_amx_floats(di_b) + (size_t)CKK * P;
    float *base = dp_cpu_scratch(need_dw > need_di || !din ? need_dw : need_di), *at = base;
    uint16_t *Ap = s_amx_carve(&at, dw_a), *Bp = s_amx_carve(&at, dw_b);
    for (int n = 0; n < d->B; n++) {
        s_amx_pack_a(Ap, &(s_amx_src_t){.x = dout + n * oplane, .rs = (size_t)P, .cs = 1}, OC, P,
                     nt);
        s_amx_pack_b(Bp, &(s_amx_src_t){.x = in + n * plane, .d = d, .transposed = 1}, P, CKK,
                     nt);
        s_amx_gemm(dw, (size_t)CKK, OC, CKK, P, Ap, Bp, n > 0, nt);
    }
    if (d->B == 0) memset(dw, 0, (size_t)OC * CKK * sizeof(float));
    if (!din) return;
    at = base;
    Ap = s_amx_carve(&at, di_a);
    Bp = s_amx_carve(&at, di_b);
    float *dcol = at;
    s_amx_pack_a(Ap, &(s_amx_src_t){.x = w, .rs = 1, .cs = (size_t)CKK}, CKK, OC, nt);
    for (int n = 0; n < d->B; n++) {
        s_amx_pack_b(Bp, &(s_amx_src_t){.x = dout + n * oplane, .rs = (size_t)P, .cs = 1}, OC, P,
                     nt);
        s_amx_gemm(dcol, (size_t)P, CKK, P, OC, Ap, Bp, 0, nt);
        s_amx_col2im(din + n * plane, dcol, d, nt);
    }
}

static void s_amx_fc_forward(float *out, const float *in, const float *w, const float *b, int B,
                             int IN, int OUT)
{
    int nt = dp_cpu_team((double)B * IN * OUT);
    size_t na = s_amx_packed_a(B, IN), nb = s_amx_packed_b(IN, OUT);
    float *at = dp_cpu_scratch(s_amx_floats(na) + s_amx_floats(nb));
    uint16_t *Ap = s_amx_carve(&at, na), *Bp = s_amx_carve(&at, nb);
    /* out[B, OUT] = in[B, IN] w^T[IN, OUT] */
    s_amx_pack_a(Ap, &(s_amx_src_t){.x = in, .rs = (size_t)IN, .cs = 1}, B, IN, nt);
    s_amx_pack_b(Bp, &(s_amx_src_t){.x = w, .rs = 1, .cs = (size_t)IN}, IN, OUT, nt);
    s_amx_gemm(out, (size_t)OUT, B, OUT, IN, Ap, Bp, 0, nt);
    if (!b) return;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OUT; o++) out[(size_t)n * OUT + o] += b[o];
}

static void s_amx_fc_backward(float *din, float *dw, float *db, const float *dout,
                              const float *in, const float *w, int B, int IN, int OUT)
{
    int nt = dp_cpu_team((double)B * IN * OUT);
    if (db) dp_bf16_fc_db(db, dout, B, OUT);
    size_t dw_a = s_amx_packed_a(OUT, B), dw_b = s_amx_packed_b(B, IN);
    size_t di_a = s_amx_packed_a(B, OUT), di_b = s_amx_packed_b(OUT, IN);
    size_t need_dw = s_amx_floats(dw_a) + s_amx_floats(dw_b);
    size_t need_di = s_amx_floats(di_a) + s_amx_floats(di_b);
    float *base = dp_cpu_scratch(need_dw > need_di ? need_dw : need_di), *at = base;
    /* dw[OUT, IN] = dout^T[OUT, B] in[B, IN] */
    uint16_t *Ap = s_amx_carve(&at, dw_a), *Bp = s_amx_carve(&at, dw_b);
    s_amx_pack_a(Ap, &(s_amx_src_t){.x = dout, .rs = 1, .cs = (size_t)OUT}, OUT, B, nt);
    s_amx_pack_b(Bp, &(s_amx_src_t){.x = in, .rs = (size_t)IN, .cs = 1}, B, IN, nt);
    s_amx_gemm(dw, (size_t)IN, OUT, IN, B, Ap, Bp, 0, nt);
    if (!din) return;
    /* din[B, IN] = dout[B, OUT] w[OUT, IN] */
    at = base;
    Ap = s_amx_carve(&at, di_a);
    Bp = s_amx_carve(&at, di_b);
    s_amx_pack_a(Ap, &(s_amx_src_t){.x = dout, .rs = (size_t)OUT, .cs = 1}, B, OUT, nt);
    s_amx_pack_b(Bp, &(s_amx_src_t){.x = w, .rs = (size_t)IN, .cs = 1}, OUT, IN, nt);
    s_amx_gemm(din, (size_t)IN, B, IN, OUT, Ap, Bp, 0, nt);
}
