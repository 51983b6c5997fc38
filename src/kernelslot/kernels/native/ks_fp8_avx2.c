/* kernelslot native: the AVX2 FP8 (MXFP8 / FP8-row, E4M3) tile kernels, compiled with -mavx2 -mfma.
 *
 * Decode (exact, every code).  One 32-byte load holds a row's block.  punpck{l,h}bw with zero
 * puts each code in the high byte of a 16-bit word; an arithmetic shift by 4 leaves sign copies
 * in bits 14..11 and the code's exponent and mantissa in bits 10..4; per dword, the high word
 * (mask 0x87F00000) or the low word (shift left 16, same mask) is then the fp32 with E4M3's
 * sign, exponent and mantissa bits, i.e. the value times 2^-120 exactly (subnormal codes become
 * fp32 denormals: exact, and only FMAs touch them, which on Zen 3, unlike vmulps, take a
 * denormal operand at full speed).  Per 32 weights: 1 load, 2 unpacks, 2 word
 * shifts, 2 dword shifts, 4 ANDs — no multiply.  The four vectors hold the block's elements in
 * the order of ks_fp8_act_avx2 (below), so the activations are permuted once per row instead.
 *
 * Scales.  A weight w·2^-120 times an activation near 1 would underflow, so each activation row
 * is scaled by 2^a (a = 90 - exponent of its largest finite |x|, clamped to ±126) when it is
 * permuted; products are then in the normal range (exact in the FMA) unless an activation is
 * below 2^-90 of its row's largest one.  The fused kernel sums each row-block in fp32 and folds
 * the block scale 2^(s-7) (MXFP8) in with one FMA per block, or 2^120 (FP8-row) at the end;
 * for decode-once (ks_kernels.c tile_batch, groups of more than 4 tokens) chunks of the tile are
 * stored as exact dequantised weights (w·2^(s-127), or w).  Every dot comes out times 2^a; the
 * caller multiplies by 2^-a (exact).  The order of the sums depends on the path (fused passes of
 * <= 2 tokens, or decode-once) and never on the thread count.
 */
#include "ks_native.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define R KS_TILE_ROWS
#define INLINE static inline __attribute__((always_inline))

float ks_fp8_act_avx2(const float *x, int64_t n, float *xf) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = fabsf(x[i]);
        if (a <= 3.4028235e38f && a > amax) amax = a; /* finite only (NaN / inf propagate anyway) */
    }
    int a = 0;
    if (amax > 0.0f) {
        uint32_t b;
        memcpy(&b, &amax, 4);
        const int e = (int)((b >> 23) & 0xFF) - 127; /* subnormal amax: e = -127, a clamps */
        a = 90 - e;
        a = a > 126 ? 126 : a < -126 ? -126 : a;
    }
    const float up = ldexpf(1.0f, a);
    /* position 8g + i holds element (g & 2 ? 8 : 0) + (i < 4 ? 2i : 2i + 8) + (g & 1) */
    static const int8_t src[32] = {0, 2, 4, 6, 16, 18, 20, 22, 1, 3, 5, 7, 17, 19, 21, 23,
                                   8, 10, 12, 14, 24, 26, 28, 30, 9, 11, 13, 15, 25, 27, 29, 31};
    for (int64_t b = 0; b < n; b += 32)
        for (int p = 0; p < 32; ++p) xf[b + p] = x[b + src[p]] * up;
    return ldexpf(1.0f, -a);
}

/* The 4 fp32 vectors (value·2^-120) of one row's 32-byte block, in the permuted order. */
INLINE void decode_row(const uint8_t *d, __m256 f[4]) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)d), z = _mm256_setzero_si256();
    const __m256i m = _mm256_set1_epi32((int)0x87F00000u);
    const __m256i lo = _mm256_srai_epi16(_mm256_unpacklo_epi8(z, v), 4);
    const __m256i hi = _mm256_srai_epi16(_mm256_unpackhi_epi8(z, v), 4);
    f[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(lo, 16), m));
    f[1] = _mm256_castsi256_ps(_mm256_and_si256(lo, m));
    f[2] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hi, 16), m));
    f[3] = _mm256_castsi256_ps(_mm256_and_si256(hi, m));
}

INLINE float hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One row-block's sum of exact products with a token's block x (mx: summed apart, then scaled). */
INLINE __m256 block_sum(const __m256 f[4], const float *x, __m256 nz) {
    __m256 b = _mm256_fmadd_ps(f[0], _mm256_loadu_ps(x), nz);
    b = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(x + 8), b);
    b = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(x + 16), b);
    return _mm256_fmadd_ps(f[3], _mm256_loadu_ps(x + 24), b);
}

/* Row r of block kb into its accumulators A (token 0) and B (token 1; FP8-row with one token:
 * the odd vectors' chain).  Named variables, not an array: an array kept them in memory. */
#define FUSED_ROW(r, A, B)                                                                   \
    do {                                                                                     \
        __m256 f[4];                                                                         \
        decode_row(blk + 32 * (r), f);                                                       \
        if (mx) { /* block sum, then its scale 2^(s-7) in one FMA */                         \
            const __m256 s = _mm256_broadcast_ss(&ks_e8m0_p120_lut[blk[R * KS_KBLOCK + (r)]]); \
            A = _mm256_fmadd_ps(block_sum(f, x0, nz), s, A);                                 \
            if (nt == 2) B = _mm256_fmadd_ps(block_sum(f, x1, nz), s, B);                    \
        } else if (nt == 1) { /* two chains per row (even / odd vectors) */                  \
            A = _mm256_fmadd_ps(f[0], _mm256_loadu_ps(x0), A);                               \
            B = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(x0 + 8), B);                           \
            A = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(x0 + 16), A);                          \
            B = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(x0 + 24), B);                          \
        } else {                                                                             \
            for (int j = 0; j < 4; ++j) A = _mm256_fmadd_ps(f[j], _mm256_loadu_ps(x0 + 8 * j), A); \
            for (int j = 0; j < 4; ++j) B = _mm256_fmadd_ps(f[j], _mm256_loadu_ps(x1 + 8 * j), B); \
        }                                                                                    \
    } while (0)

/* Decode fused with the dot for nt = 1 or 2 tokens: res[r * nt + t] = dot · 2^a. */
INLINE void fused(const int mx, const int nt, const uint8_t *tile, int nkb, const float *const *xf, float *res) {
    const int bs = R * (KS_KBLOCK + mx);
    const __m256 nz = _mm256_set1_ps(-0.0f);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * bs;
        /* weights into L2 only: prefetched into L1 they evicted the activations, whose L1 misses
         * then held back the weights' (cold, this code on AMD Zen 4: MXFP8 1.04-1.10x, FP8-row
         * 1.03-1.15x; docs/native.md, "Activations that stay in L1") */
        for (int off = 0; off < bs; off += 64) _mm_prefetch((const char *)(blk + 4096 + off), _MM_HINT_T1);
        const float *x0 = xf[0] + (int64_t)kb * KS_KBLOCK, *x1 = nt == 2 ? xf[1] + (int64_t)kb * KS_KBLOCK : x0;
        FUSED_ROW(0, a0, b0);
        FUSED_ROW(1, a1, b1);
        FUSED_ROW(2, a2, b2);
        FUSED_ROW(3, a3, b3);
    }
    const __m256 acc[R][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}};
    for (int r = 0; r < R; ++r) {
        if (!mx && nt == 1) { res[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) * 0x1p120f; continue; }
        for (int t = 0; t < nt; ++t) res[r * nt + t] = mx ? hsum(acc[r][t]) : hsum(acc[r][t]) * 0x1p120f;
    }
}

void ks_fp8_tile_fused_avx2(int mx, int nt, const uint8_t *tile, int nkb, const float *const *xf, float *res) {
    if (mx) { if (nt == 1) fused(1, 1, tile, nkb, xf, res); else fused(1, 2, tile, nkb, xf, res); }
    else { if (nt == 1) fused(0, 1, tile, nkb, xf, res); else fused(0, 2, tile, nkb, xf, res); }
}

/* Exact dequantised weights (w·2^(s-127), or w) of blocks [kb0, kb0 + nb) of a tile into
 * buf[block][row][32] (permuted order): the decode-once chunks of ks_kernels.c.  fma(w, s, -0)
 * is w·s, sign of zero included, and unlike vmulps takes a denormal operand (subnormal code)
 * at full speed on this CPU. */
void ks_fp8_decode_chunk_avx2(int mx, const uint8_t *tile, int kb0, int nb, float *buf) {
    const int bs = R * (KS_KBLOCK + mx);
    const __m256 nz = _mm256_set1_ps(-0.0f);
    for (int k = 0; k < nb; ++k) {
        const uint8_t *blk = tile + (int64_t)(kb0 + k) * bs;
        for (int off = 0; off < bs; off += 64) _mm_prefetch((const char *)(blk + 4096 + off), _MM_HINT_T1);
        for (int r = 0; r < R; ++r) {
            __m256 f[4];
            decode_row(blk + 32 * r, f);
            const __m256 s = _mm256_set1_ps(mx ? ks_e8m0_p120_lut[blk[R * KS_KBLOCK + r]] : 0x1p120f);
            float *o = buf + (k * R + r) * KS_KBLOCK;
            for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + 8 * j, _mm256_fmadd_ps(f[j], s, nz));
        }
    }
}
