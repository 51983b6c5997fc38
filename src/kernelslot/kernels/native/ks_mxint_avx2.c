/* kernelslot native: the AVX2 integer kernels of the MX path for MXFP4 weights (MXFP8
 * activations), compiled with -mavx2 -mfma.
 *
 * Exactness.  A weight is w = c·2^(sw-127) with c = e2m1(code) ∈ {0, ±.5, ..., ±6}, so
 * W = 2c is an integer |W| <= 12.  An MXFP8 activation is x = r·2^(sb-127) with r an E4M3
 * value, so A = 512·r is an integer |A| < 2^18, split A = 8·hi + lo (truncation: |hi| <= 28672,
 * |lo| < 8): two int16 "planes" (ks_mxfp8_planes; lo is non-zero only for |r| < 2^-3, flagged
 * per block).  One pshufb maps codes to W as int8; a shift / a mask turn the even / odd bytes
 * into int16 words 256·W; vpmaddwd multiplies them with the planes and sums pairs in int32.
 * The two row pairs of a tile block are then folded into one vector (unpack + add): per block
 * each lane holds 16 products of one row, |sum| <= 16·256·12·28672 < 2^31, and the sum is
 * 256·S with |S| < 2^23, so the int32 -> fp32 conversion is exact.  Then one fp32 multiply by
 * the weight scale 2^(sw-127) (exact) and one FMA by the plane scale 2^(sb-142) (hi) or
 * 2^(sb-145) (lo) add the block into an fp32 accumulator: each 32-block's dot product with a
 * plane is exact up to one fp32 rounding, and these are summed in fp32 in a fixed order (the hi
 * parts of all blocks, kb ascending, then the lo parts of the flagged blocks, kb ascending, the
 * 2 lanes of a row summed at the end) that is the same in the fused and the decode-once
 * kernels, so results depend neither on the thread count nor on how many tokens share the
 * expert. The lo parts come last so that the block loop has no branch (a branch there kept the
 * accumulators in memory).
 *
 * Layout: one 32-byte load holds two rows of a block (lane 0 row a, lane 1 row b; byte j =
 * codes j, j+16), giving 4 vectors of 8 words per lane: elements {0,2..14}, {1,3..15},
 * {16,18..30}, {17,19..31} — the order the planes are stored in, each 8-word group broadcast
 * to both lanes (vbroadcastf128: a load, no shuffle uop).  Per 128 weights (a tile block):
 * 2 loads, 6 nibble ops, 4 pshufb, 8 shift/mask, the rows' scales (4 loads, 3 shuffles), and per
 * token 8 vpmaddwd, 8 adds, 2 unpacks, 1 convert, 1 mul, 1 FMA; one accumulator per token.
 * vpmaddwd (ymm) issues once per cycle on AMD Zen 4 (measured), so its floor there is 2 core
 * cycles per 32 weights and token.
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

/* The scales 2^(s-127) of a block's 4 rows in the order of tile_sums' lanes:
 * [s0 s2 s0 s2 | s1 s3 s1 s3] (4 broadcast loads from ks_e8m0_lut, 3 shuffles). */
INLINE __m256 tile_scale(const uint8_t *sc) {
    const __m128 a = _mm_broadcast_ss(&ks_e8m0_lut[sc[0]]), b = _mm_broadcast_ss(&ks_e8m0_lut[sc[1]]);
    const __m128 c = _mm_broadcast_ss(&ks_e8m0_lut[sc[2]]), d = _mm_broadcast_ss(&ks_e8m0_lut[sc[3]]);
    return _mm256_set_m128(_mm_unpacklo_ps(b, d), _mm_unpacklo_ps(a, c));
}
/* The 8 words at p in both lanes (vbroadcastf128: a load, no shuffle uop). */
#define BC(p) _mm256_castps_si256(_mm256_broadcast_ps((const __m128 *)(p)))

/* One token's plane block (32 int16, the 4 groups each in both lanes). */
typedef struct { __m256i g[4]; } act_block;
INLINE act_block load_act(const int16_t *q) {
    act_block a = {{BC(q), BC(q + 8), BC(q + 16), BC(q + 24)}};
    return a;
}
/* int32 lane sums of a row pair's block against one token: [row a: 4 | row b: 4], 8 products each. */
INLINE __m256i pair_isum(const __m256i v[4], const act_block *a) {
    const __m256i p0 = _mm256_madd_epi16(v[0], a->g[0]), p1 = _mm256_madd_epi16(v[1], a->g[1]);
    const __m256i p2 = _mm256_madd_epi16(v[2], a->g[2]), p3 = _mm256_madd_epi16(v[3], a->g[3]);
    return _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3));
}
/* fp32 of the tile block's 8 lane sums [r0 r2 r0 r2 | r1 r3 r1 r3] (16 products each) from the
 * two pairs' int32 sums (exact: |sum| <= 16·256·12·28672 < 2^31, and it is 256·S, |S| < 2^23). */
INLINE __m256 tile_sums(__m256i sa, __m256i sb) {
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_unpacklo_epi32(sa, sb), _mm256_unpackhi_epi32(sa, sb)));
}
/* acc += one block's lane sums times the rows' scales ws times the token's plane scale ps. */
INLINE __m256 add_block(__m256 acc, __m256 sums, __m256 ws, const float *ps) {
    return _mm256_fmadd_ps(_mm256_mul_ps(sums, ws), _mm256_broadcast_ss(ps), acc);
}

/* One token's planes, unpacked for the inner loops. */
typedef struct { const int16_t *hi, *lo; const float *scale; const uint8_t *has_lo; } tok;
INLINE void load_toks(const int nt, const ks_mxplanes *const *x, tok *t) {
    for (int i = 0; i < nt; ++i) t[i] = (tok){x[i]->hi, x[i]->lo, x[i]->scale, x[i]->has_lo};
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

/* res[r * ld] = the sum of row r's two lanes of acc (r = 0..3). */
INLINE void tile_store(__m256 acc, float *res, int ld) {
    const __m128 l = _mm256_castps256_ps128(acc), h = _mm256_extractf128_ps(acc, 1); /* r0 r2 r0 r2 | r1 r3 r1 r3 */
    const __m128 a = _mm_add_ps(l, _mm_movehl_ps(l, l)), b = _mm_add_ps(h, _mm_movehl_ps(h, h)); /* r0 r2, r1 r3 */
    res[0] = _mm_cvtss_f32(a);
    res[ld] = _mm_cvtss_f32(b);
    res[2 * ld] = _mm_cvtss_f32(_mm_shuffle_ps(a, a, 1));
    res[3 * ld] = _mm_cvtss_f32(_mm_shuffle_ps(b, b, 1));
}

/* One decoded tile block (the decode-once scratch holds nkb of them): both pairs' weight vectors and the rows' scales. */
typedef struct { __m256i va[4], vb[4]; __m256 ws; } dec_block;

/* Decode tile block blk into d. */
INLINE void decode_block(const uint8_t *blk, dec_block *d) {
    decode_pair(blk, d->va);
    decode_pair(blk + 32, d->vb);
    d->ws = tile_scale(blk + R * 16);
}

/* The decoded block d against one token's plane block at q (weights read from the scratch). */
INLINE __m256 dec_sums(const dec_block *d, const int16_t *q) {
    const act_block a = load_act(q);
    return tile_sums(pair_isum(d->va, &a), pair_isum(d->vb, &a));
}

/* The hi pass of the fused kernel for nt (1 or 2) tokens: acc[t].  Each row pair is used as soon
 * as it is decoded (a whole dec_block held across two tokens measured 6 % slower at nt = 2). */
INLINE void fused_hi(const int nt, const uint8_t *tile, int nkb, const tok *x, __m256 *acc) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * R * 17;
        _mm_prefetch((const char *)(blk + 4096), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 4096 + 64), _MM_HINT_T0);
        const act_block a0 = load_act(x[0].hi + 32 * kb), a1 = load_act(x[nt - 1].hi + 32 * kb);
        __m256i v[4];
        decode_pair(blk, v);
        const __m256i sa0 = pair_isum(v, &a0), sa1 = nt == 2 ? pair_isum(v, &a1) : sa0;
        decode_pair(blk + 32, v);
        const __m256i sb0 = pair_isum(v, &a0), sb1 = nt == 2 ? pair_isum(v, &a1) : sb0;
        const __m256 ws = tile_scale(blk + R * 16);
        acc0 = add_block(acc0, tile_sums(sa0, sb0), ws, x[0].scale + 2 * kb);
        if (nt == 2) acc1 = add_block(acc1, tile_sums(sa1, sb1), ws, x[1].scale + 2 * kb);
    }
    acc[0] = acc0;
    if (nt == 2) acc[1] = acc1;
}
/* Not inlined into the lo pass: with both in one function GCC kept the accumulators in memory (a
 * store-to-load round trip on the loop-carried chain, ~1.4x slower). */
static __attribute__((noinline)) void fused_hi_1(const uint8_t *t, int nkb, const tok *x, __m256 *acc) { fused_hi(1, t, nkb, x, acc); }
static __attribute__((noinline)) void fused_hi_2(const uint8_t *t, int nkb, const tok *x, __m256 *acc) { fused_hi(2, t, nkb, x, acc); }

/* Decode fused with the dot for nt (1 or 2) tokens: res[r * nt + t]. */
INLINE void fused(const int nt, const uint8_t *tile, int nkb, const ks_mxplanes *const *xp, float *res) {
    tok x[2];
    load_toks(nt, xp, x);
    __m256 acc[2];
    if (nt == 1) fused_hi_1(tile, nkb, x, acc);
    else fused_hi_2(tile, nkb, x, acc);
    for (int t = 0; t < nt; ++t) {
        FOR_LO_BLOCKS(&x[t], nkb, kb, {
            dec_block d;
            decode_block(tile + (int64_t)kb * R * 17, &d);
            acc[t] = add_block(acc[t], dec_sums(&d, x[t].lo + 32 * kb), d.ws, x[t].scale + 2 * kb + 1);
        })
        tile_store(acc[t], res + t, nt);
    }
}

void ks_mxint_tile_fused_avx2(int nt, const uint8_t *tile, int nkb, const ks_mxplanes *const *x, float *res) {
    if (nt == 1) fused(1, tile, nkb, x, res);
    else fused(2, tile, nkb, x, res);
}

size_t ks_mxint_scratch_bytes(int nkb) { return (size_t)nkb * sizeof(dec_block); }

/* Decode a tile once into buf ([kb], ks_mxint_scratch_bytes(nkb), 32-byte aligned). */
void ks_mxint_tile_decode_avx2(const uint8_t *tile, int nkb, void *buf) {
    dec_block *o = (dec_block *)buf;
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * R * 17;
        _mm_prefetch((const char *)(blk + 4096), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 4096 + 64), _MM_HINT_T0);
        decode_block(blk, o + kb);
    }
}

#define NB_REG 4 /* tokens per pass over the decoded tile */
/* The decoded tile against nt <= NB_REG tokens: res[r * ldr + t]. */
INLINE void buffered(const int nt, const void *buf, int nkb, const ks_mxplanes *const *xp, float *res, int ldr) {
    const dec_block *b = (const dec_block *)buf;
    tok x[NB_REG];
    load_toks(nt, xp, x);
    __m256 acc[NB_REG];
    for (int t = 0; t < nt; ++t) acc[t] = _mm256_setzero_ps();
    for (int kb = 0; kb < nkb; ++kb) {
#pragma GCC unroll 4
        for (int t = 0; t < nt; ++t) acc[t] = add_block(acc[t], dec_sums(b + kb, x[t].hi + 32 * kb), b[kb].ws, x[t].scale + 2 * kb);
    }
    for (int t = 0; t < nt; ++t) {
        FOR_LO_BLOCKS(&x[t], nkb, kb, { acc[t] = add_block(acc[t], dec_sums(b + kb, x[t].lo + 32 * kb), b[kb].ws, x[t].scale + 2 * kb + 1); })
        tile_store(acc[t], res + t, ldr);
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
