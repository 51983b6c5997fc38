/* kernelslot native: the AVX2 FP4 (MXFP4 / NVFP4) tile kernels, compiled with -mavx2 -mfma.
 *
 * Exact decode through bf16 byte tables: for every scale byte s the 16 codes' values
 * e2m1[c]·scale(s) are exact in bf16 (2 significant bits times an E8M0 power of two, or times
 * an E4M3 scale: at most 6 bits), so one pshufb on the nibbles gives their low bytes and one
 * their high bytes (ks_fp4_bf16[kind][s] = 16 low bytes then 16 high bytes; the scale is
 * folded into the table, no multiply).  One unpack widens bytes -> bf16 words; a shift and a
 * mask turn the even / odd words of each dword into fp32.  One 32-byte load holds two rows of
 * a block (lane 0 row a, lane 1 row b, FP4 byte j = codes j, j+16), so every fp32 vector
 * carries 4 elements of row a and the same 4 of row b, and the activations are read in the
 * "pair" layout of ks_to_fp4pair by the fused kernel (passes of <= 2 tokens, for groups of up to
 * 4); for more, chunks of the tile are decoded in natural order for ks_kernels.c's decode-once
 * dot.  Per 32 weights: 1/2 load, 3/2 nibble ops, 2 table loads and 2 lane permutes (NVFP4;
 * MXFP4 half that), 2 pshufb, 2 unpacks, 4 shift/mask, and 4 FMAs per token (docs/native.md).
 * Products are exact, sums in fp32.
 */
#include "ks_native.h"
#include <immintrin.h>

#define R KS_TILE_ROWS
#define INLINE static inline __attribute__((always_inline))

/* The 8 fp32 vectors of one row pair's 32-element block: vector 2g holds elements 8g + {0, 2,
 * 4, 6} and vector 2g+1 elements 8g + {1, 3, 5, 7}, lane 0 of row a, lane 1 of row b. */
INLINE void decode_pair(const int nv, const uint8_t *d, const uint8_t *sc, __m256 f[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i w = _mm256_loadu_si256((const __m256i *)d);
    const __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
    __m256i tl0, th0, tl1, th1; /* tables for the low nibbles (elements 0-15), high (16-31) */
    /* One 32-byte load per table (row a's in ta, row b's in tb), then one lane permute per
     * table half: [a low bytes | b low bytes] and [a high bytes | b high bytes] (two loads
     * fewer per table pair than loading each 16-byte half; NVFP4 kernel-only ~5 % at 1 token). */
#define TABLES(ta, tb, tl, th) do { const __m256i a_ = _mm256_loadu_si256((const __m256i *)(ta)), b_ = _mm256_loadu_si256((const __m256i *)(tb)); \
        tl = _mm256_permute2x128_si256(a_, b_, 0x20); th = _mm256_permute2x128_si256(a_, b_, 0x31); } while (0)
    if (nv) { /* NVFP4: two E4M3 scale bytes per row, one per 16 elements */
        const uint8_t (*t)[32] = ks_fp4_bf16[1];
        TABLES(t[sc[0]], t[sc[2]], tl0, th0);
        TABLES(t[sc[1]], t[sc[3]], tl1, th1);
    } else {  /* MXFP4: one E8M0 scale byte per row */
        const uint8_t (*t)[32] = ks_fp4_bf16[0];
        TABLES(t[sc[0]], t[sc[1]], tl0, th0);
        tl1 = tl0, th1 = th0;
    }
#undef TABLES
    const __m256i llo = _mm256_shuffle_epi8(tl0, lo), lhi = _mm256_shuffle_epi8(th0, lo);
    const __m256i hlo = _mm256_shuffle_epi8(tl1, hi), hhi = _mm256_shuffle_epi8(th1, hi);
    const __m256i w0 = _mm256_unpacklo_epi8(llo, lhi), w1 = _mm256_unpackhi_epi8(llo, lhi);
    const __m256i w2 = _mm256_unpacklo_epi8(hlo, hhi), w3 = _mm256_unpackhi_epi8(hlo, hhi);
    /* a dword of w holds the bf16 words of elements 2i (low) and 2i+1 (high): shift / mask */
    const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
    f[0] = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
    f[1] = _mm256_castsi256_ps(_mm256_and_si256(w0, hi16));
    f[2] = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
    f[3] = _mm256_castsi256_ps(_mm256_and_si256(w1, hi16));
    f[4] = _mm256_castsi256_ps(_mm256_slli_epi32(w2, 16));
    f[5] = _mm256_castsi256_ps(_mm256_and_si256(w2, hi16));
    f[6] = _mm256_castsi256_ps(_mm256_slli_epi32(w3, 16));
    f[7] = _mm256_castsi256_ps(_mm256_and_si256(w3, hi16));
}

INLINE void pair_sums(__m256 a, float *ra, float *rb) {
    const __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
    const __m128 s = _mm_hadd_ps(lo, hi);          /* a0+a1 a2+a3 b0+b1 b2+b3 */
    const __m128 t = _mm_hadd_ps(s, s);            /* A B A B */
    *ra = _mm_cvtss_f32(t);
    *rb = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
}

/* Fused decode + dot for nt = 1 or 2 tokens (3 accumulator chains per row pair for one token,
 * 2 per token for two). */
INLINE void fused(const int nv, const int nt, const uint8_t *tile, int nkb, int bstride,
                  const float *const *xd, float *res) {
    enum { NA = 4 };
    const int na = nt == 1 ? 3 : 2; /* 3: with 4 chains GCC keeps two of them in memory */
    __m256 acc[2][2][NA];
    for (int p = 0; p < 2; ++p)
        for (int t = 0; t < nt; ++t)
            for (int q = 0; q < na; ++q) acc[p][t][q] = _mm256_setzero_ps();
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * bstride;
        /* weights into L2 only (as in ks_fp8_avx2.c): the pair-layout activations, 256 bytes per
         * block and token, then stay in L1 (cold NVFP4, this code on AMD Zen 4: 1.00-1.08x) */
        _mm_prefetch((const char *)(blk + 4096), _MM_HINT_T1);
        _mm_prefetch((const char *)(blk + 4096 + 64), _MM_HINT_T1);
#pragma GCC unroll 2
        for (int p = 0; p < 2; ++p) {
            __m256 f[8];
            decode_pair(nv, blk + 32 * p, blk + R * 16 + (nv ? 4 : 2) * p, f);
#pragma GCC unroll 2
            for (int t = 0; t < nt; ++t) {
                const float *x = xd[t] + (int64_t)kb * 64;
#pragma GCC unroll 8
                for (int k = 0; k < 8; ++k)
                    acc[p][t][k % na] = _mm256_fmadd_ps(f[k], _mm256_loadu_ps(x + 8 * k), acc[p][t][k % na]);
            }
        }
    }
    for (int p = 0; p < 2; ++p)
        for (int t = 0; t < nt; ++t) {
            __m256 s = acc[p][t][0];
            for (int q = 1; q < na; ++q) s = _mm256_add_ps(s, acc[p][t][q]);
            pair_sums(s, &res[(2 * p) * nt + t], &res[(2 * p + 1) * nt + t]);
        }
}

void ks_fp4_tile_fused_avx2(int nv, int nt, const uint8_t *tile, int nkb, int bstride,
                            const float *const *xd, float *res) {
    if (nv) { if (nt == 1) fused(1, 1, tile, nkb, bstride, xd, res); else fused(1, 2, tile, nkb, bstride, xd, res); }
    else { if (nt == 1) fused(0, 1, tile, nkb, bstride, xd, res); else fused(0, 2, tile, nkb, bstride, xd, res); }
}

/* Blocks [kb0, kb0 + nb) of a tile as exact fp32 in natural order, buf[block][row][32] (the
 * decode-once chunks of ks_kernels.c): unpack{lo,hi}_ps re-interleave the even / odd vectors. */
void ks_fp4_decode_chunk_avx2(int nv, const uint8_t *tile, int kb0, int nb, int bstride, float *buf) {
    for (int k = 0; k < nb; ++k) {
        const uint8_t *blk = tile + (int64_t)(kb0 + k) * bstride;
        _mm_prefetch((const char *)(blk + 4096), _MM_HINT_T1);
        _mm_prefetch((const char *)(blk + 4096 + 64), _MM_HINT_T1);
        for (int p = 0; p < 2; ++p) {
            __m256 f[8];
            if (nv) decode_pair(1, blk + 32 * p, blk + R * 16 + 4 * p, f);
            else decode_pair(0, blk + 32 * p, blk + R * 16 + 2 * p, f);
            float *a = buf + (k * R + 2 * p) * KS_KBLOCK, *b = a + KS_KBLOCK;
            for (int g = 0; g < 4; ++g) {
                const __m256 lo = _mm256_unpacklo_ps(f[2 * g], f[2 * g + 1]); /* elements 8g + 0..3 */
                const __m256 hi = _mm256_unpackhi_ps(f[2 * g], f[2 * g + 1]); /* elements 8g + 4..7 */
                _mm_storeu_ps(a + 8 * g, _mm256_castps256_ps128(lo));
                _mm_storeu_ps(a + 8 * g + 4, _mm256_castps256_ps128(hi));
                _mm_storeu_ps(b + 8 * g, _mm256_extractf128_ps(lo, 1));
                _mm_storeu_ps(b + 8 * g + 4, _mm256_extractf128_ps(hi, 1));
            }
        }
    }
}
