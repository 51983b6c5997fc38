/* kernelslot native: the AVX2 integer kernels of the MX path for MXFP4 weights (MXFP8
 * activations), compiled with -mavx2 -mfma.
 *
 * Exactness.  A weight is w = c·2^(sw-127) with c = e2m1(code) ∈ {0, ±.5, ..., ±6}, so
 * W = 2c is an integer |W| <= 12.  An MXFP8 activation is x = r·2^(sb-127) with r an E4M3
 * value, so A = 512·r is an integer |A| < 2^18, split A = 8·hi + lo (truncation: |hi| <= 28672,
 * |lo| < 8): two int16 "planes" (ks_mxfp8_planes; lo is non-zero only for |r| < 2^-3, flagged
 * per block).  One pshufb maps codes to W as int8; a shift / a mask turn the even / odd bytes
 * into int16 words 256·W; vpmaddwd multiplies them with the planes and sums pairs in int32.
 * Per block and row each lane adds 8 products: |sum| <= 8·256·12·28672 < 2^31, and the sum is
 * 256·S with |S| < 2^22, so the int32 -> fp32 conversion is exact.  Then one fp32 multiply by
 * the weight scale 2^(sw-127) (exact) and one FMA by the plane scale 2^(sb-142) (hi) or
 * 2^(sb-145) (lo) add the block into an fp32 accumulator: each 32-block's dot product with a
 * plane is exact up to one fp32 rounding, and these are summed in fp32 in a fixed order (the hi
 * parts of all blocks, kb ascending, then the lo parts of the flagged blocks, kb ascending, the
 * 4 lanes of a row summed at the end) that is the same in the fused and the decode-once
 * kernels, so results depend neither on the thread count nor on how many tokens share the
 * expert. The lo parts come last so that the block loop has no branch (a branch there kept the
 * accumulators in memory).
 *
 * Layout: one 32-byte load holds two rows of a block (lane 0 row a, lane 1 row b; byte j =
 * codes j, j+16), giving 4 vectors of 8 words per lane: elements {0,2..14}, {1,3..15},
 * {16,18..30}, {17,19..31} — the order the planes are stored in, each 8-word group broadcast
 * to both lanes (vbroadcastf128: a load, no shuffle uop).  Per 64 weights: 1 load, 3 nibble ops,
 * 2 pshufb, 4 shift/mask, and per token 4 vpmaddwd, 3 adds, 1 convert, 1 mul, 1 FMA.
 */
#include "ks_native.h"
#include <immintrin.h>

#define R KS_TILE_ROWS
#define INLINE static inline __attribute__((always_inline))

static const int8_t e2m1_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 256·W of one row pair's block in the plane order (see above). */
INLINE void decode_pair(const uint8_t *d, __m256i v[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), odd = _mm256_set1_epi16((short)0xFF00);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)e2m1_x2));
    const __m256i w = _mm256_loadu_si256((const __m256i *)d);
    const __m256i lo = _mm256_shuffle_epi8(tab, _mm256_and_si256(w, m4));
    const __m256i hi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(w, 4), m4));
    v[0] = _mm256_slli_epi16(lo, 8);
    v[1] = _mm256_and_si256(lo, odd);
    v[2] = _mm256_slli_epi16(hi, 8);
    v[3] = _mm256_and_si256(hi, odd);
}

/* [2^(sa-127) x4 | 2^(sb-127) x4] for the rows of a pair (scale bytes sc[0], sc[1]). */
INLINE __m256 pair_scale(const uint8_t *sc) {
    return _mm256_set_m128(_mm_broadcast_ss(&ks_e8m0_lut[sc[1]]), _mm_broadcast_ss(&ks_e8m0_lut[sc[0]]));
}
/* The 8 words at p in both lanes (vbroadcastf128: a load, no shuffle uop). */
#define BC(p) _mm256_castps_si256(_mm256_broadcast_ps((const __m128 *)(p)))

/* fp32 of the 4 lane sums per row (exact): v against one plane block q (32 int16). */
INLINE __m256 pair_dot(const __m256i v[4], const int16_t *q) {
    const __m256i p0 = _mm256_madd_epi16(v[0], BC(q)), p1 = _mm256_madd_epi16(v[1], BC(q + 8));
    const __m256i p2 = _mm256_madd_epi16(v[2], BC(q + 16)), p3 = _mm256_madd_epi16(v[3], BC(q + 24));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
}

/* One token's planes, unpacked for the inner loops. */
typedef struct { const int16_t *hi, *lo; const float *scale; const uint8_t *has_lo; } tok;
INLINE void load_toks(const int nt, const ks_mxplanes *const *x, tok *t) {
    for (int i = 0; i < nt; ++i) t[i] = (tok){x[i]->hi, x[i]->lo, x[i]->scale, x[i]->has_lo};
}

/* acc += block kb of one pair against one token's hi plane (lo: its lo plane). */
INLINE __m256 hi_block(__m256 acc, const __m256i v[4], __m256 ws, const tok *x, int kb) {
    return _mm256_fmadd_ps(_mm256_mul_ps(pair_dot(v, x->hi + 32 * kb), ws), _mm256_broadcast_ss(x->scale + 2 * kb), acc);
}
INLINE __m256 lo_block(__m256 acc, const __m256i v[4], __m256 ws, const tok *x, int kb) {
    return _mm256_fmadd_ps(_mm256_mul_ps(pair_dot(v, x->lo + 32 * kb), ws), _mm256_broadcast_ss(x->scale + 2 * kb + 1), acc);
}

/* Bits i of the flags f[0..n) (n <= 32 used) that are non-zero; never reads past f + n. */
INLINE uint32_t lo_bits(const uint8_t *f, int n) {
    if (n >= 32)
        return ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)f), _mm256_setzero_si256()));
    uint8_t b[32] = {0};
    for (int i = 0; i < n; ++i) b[i] = f[i];
    return ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)b), _mm256_setzero_si256())) & ((1u << n) - 1);
}
/* Run BODY with kb = every block of x whose lo plane is used, ascending: the lo pass after
 * the hi pass keeps the block loop free of branches (and the accumulators in registers). */
#define FOR_LO_BLOCKS(x, nkb, kb, BODY)                                        \
    for (int c0_ = 0; c0_ < (nkb); c0_ += 32)                                 \
        for (uint32_t m_ = lo_bits((x)->has_lo + c0_, (nkb) - c0_); m_; m_ &= m_ - 1) { \
            const int kb = c0_ + __builtin_ctz(m_);                           \
            BODY                                                              \
        }

INLINE void pair_sums(__m256 a, float *ra, float *rb) {
    const __m128 s = _mm_hadd_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t = _mm_hadd_ps(s, s);
    *ra = _mm_cvtss_f32(t);
    *rb = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
}

/* Decode fused with the dot for nt (1 or 2) tokens: res[r * nt + t]. */
INLINE void fused(const int nt, const uint8_t *tile, int nkb, const ks_mxplanes *const *xp, float *res) {
    tok x[2];
    load_toks(nt, xp, x);
    __m256 acc[2][2];
    for (int p = 0; p < 2; ++p)
        for (int t = 0; t < nt; ++t) acc[p][t] = _mm256_setzero_ps();
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * R * 17;
        _mm_prefetch((const char *)(blk + 4096), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 4096 + 64), _MM_HINT_T0);
#pragma GCC unroll 2
        for (int p = 0; p < 2; ++p) {
            __m256i v[4];
            decode_pair(blk + 32 * p, v);
            const __m256 ws = pair_scale(blk + R * 16 + 2 * p);
#pragma GCC unroll 2
            for (int t = 0; t < nt; ++t) acc[p][t] = hi_block(acc[p][t], v, ws, &x[t], kb);
        }
    }
    for (int t = 0; t < nt; ++t)
        FOR_LO_BLOCKS(&x[t], nkb, kb, {
            const uint8_t *blk = tile + (int64_t)kb * R * 17;
            for (int p = 0; p < 2; ++p) {
                __m256i v[4];
                decode_pair(blk + 32 * p, v);
                acc[p][t] = lo_block(acc[p][t], v, pair_scale(blk + R * 16 + 2 * p), &x[t], kb);
            }
        })
    for (int p = 0; p < 2; ++p)
        for (int t = 0; t < nt; ++t) pair_sums(acc[p][t], &res[(2 * p) * nt + t], &res[(2 * p + 1) * nt + t]);
}

void ks_mxint_tile_fused_avx2(int nt, const uint8_t *tile, int nkb, const ks_mxplanes *const *x, float *res) {
    if (nt == 1) fused(1, tile, nkb, x, res);
    else fused(2, tile, nkb, x, res);
}

/* One decoded pair block in the scratch: the 4 weight vectors and the scale vector. */
typedef struct { __m256i v[4]; __m256 ws; } dec_block;

size_t ks_mxint_scratch_bytes(int nkb) { return (size_t)2 * nkb * sizeof(dec_block); }

/* Decode a tile once into buf ([pair][kb], ks_mxint_scratch_bytes(nkb), 32-byte aligned). */
void ks_mxint_tile_decode_avx2(const uint8_t *tile, int nkb, void *buf) {
    dec_block *o = (dec_block *)buf;
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * R * 17;
        _mm_prefetch((const char *)(blk + 4096), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 4096 + 64), _MM_HINT_T0);
        for (int p = 0; p < 2; ++p) {
            dec_block *d = o + (int64_t)p * nkb + kb;
            decode_pair(blk + 32 * p, d->v);
            d->ws = pair_scale(blk + R * 16 + 2 * p);
        }
    }
}

#define NB_REG 4 /* tokens per pass over the decoded tile: the weight vectors stay in registers */
/* The decoded tile against nt <= NB_REG tokens, one pair at a time: res[r * ldr + t]. */
INLINE void buffered(const int nt, const void *buf, int nkb, const ks_mxplanes *const *xp, float *res, int ldr) {
    const dec_block *b = (const dec_block *)buf;
    tok x[NB_REG];
    load_toks(nt, xp, x);
    for (int p = 0; p < 2; ++p) {
        __m256 acc[NB_REG];
        for (int t = 0; t < nt; ++t) acc[t] = _mm256_setzero_ps();
        for (int kb = 0; kb < nkb; ++kb) {
            const dec_block *d = b + (int64_t)p * nkb + kb;
            __m256i v[4] = {d->v[0], d->v[1], d->v[2], d->v[3]};
            const __m256 ws = d->ws;
#pragma GCC unroll 4
            for (int t = 0; t < nt; ++t) acc[t] = hi_block(acc[t], v, ws, &x[t], kb);
        }
        for (int t = 0; t < nt; ++t)
            FOR_LO_BLOCKS(&x[t], nkb, kb, {
                const dec_block *d = b + (int64_t)p * nkb + kb;
                acc[t] = lo_block(acc[t], d->v, d->ws, &x[t], kb);
            })
        for (int t = 0; t < nt; ++t) pair_sums(acc[t], &res[(2 * p) * ldr + t], &res[(2 * p + 1) * ldr + t]);
    }
}

/* res[r * nt + t] for any nt, in passes of NB_REG tokens. */
void ks_mxint_dot_avx2(int nt, const void *buf, int nkb, const ks_mxplanes *const *x, float *res) {
    for (int lo = 0; lo < nt; lo += NB_REG) {
        const int n = nt - lo < NB_REG ? nt - lo : NB_REG;
        switch (n) {
        case 1: buffered(1, buf, nkb, x + lo, res + lo, nt); break;
        case 2: buffered(2, buf, nkb, x + lo, res + lo, nt); break;
        case 3: buffered(3, buf, nkb, x + lo, res + lo, nt); break;
        default: buffered(4, buf, nkb, x + lo, res + lo, nt); break;
        }
    }
}
