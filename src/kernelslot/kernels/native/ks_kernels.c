/* Per-ISA tile kernels for the native MoE decode path; compiled four times with
 * -DKS_ISA=0 (portable C), 1 (AVX2+FMA+F16C), 2 (AVX-512 F/BW/VL/DQ) or 3 (2 + AVX512_BF16,
 * adding the exact-bf16 MX path for MXFP4 and MXFP8), each with the matching -m flags.  Layout
 * contract: ks_native.h.
 *
 * A tile of 4 weight rows is streamed once per chunk of up to NT_MAX tokens: every
 * 32-element block is dequantised in registers (FP4 through a 16-entry table scaled by the
 * block scale, FP8 E4M3 through an exponent-rebias bit trick, bf16 by a shift or a mask of
 * its paired words, fp16 by widening) and
 * FMA'd against each token's activations; fp32 accumulation, one horizontal sum per
 * (row, token) at the end of the tile.
 */
#include "ks_native.h"
#include <stdlib.h>
#include <string.h>

#if KS_ISA >= 2
#include <immintrin.h>
#define VL 16
#define NT_MAX 5
#if KS_ISA == 3
#define SUFFIX(name) name##_avx512bf16
#else
#define SUFFIX(name) name##_avx512
#endif
typedef __m512 vf;
typedef struct { vf a, b; } kctx;
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1) /* into L2, not L1: see tile_dot */
#elif KS_ISA == 1
#include <immintrin.h>
#define VL 8
#define NT_MAX 2
#define SUFFIX(name) name##_avx2
typedef __m256 vf;
typedef struct { vf a, b; } kctx;
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline float vsum(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define PREFETCH_L2(p) PREFETCH(p) /* not measured on AVX2 */
#else
#define VL 1
#define NT_MAX 4
#define SUFFIX(name) name##_portable
typedef float vf;
typedef struct { float a, b; } kctx; /* scale(s) of the block; tables looked up per element */
static inline vf vload(const float *p) { return *p; }
static inline void vstore(float *p, vf v) { *p = v; }
static inline vf vzero(void) { return 0.0f; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vmul(vf a, vf b) { return a * b; }
static inline vf vset1(float x) { return x; }
static inline float vsum(vf a) { return a; }
#define PREFETCH(p) ((void)(p))
#define PREFETCH_L2(p) ((void)(p))
#endif

#ifndef KS_PREFETCH
/* bytes ahead in the tile stream: AVX2 1 KB (measured on Zen 3, docs/native.md "Fifth pass"),
 * elsewhere 4 KB (measured on an AVX-512 machine, "Figures") */
#define KS_PREFETCH (KS_ISA == 1 ? 1024 : 4096)
#endif
#define NV (KS_KBLOCK / VL)
#define R KS_TILE_ROWS
#define INLINE static inline __attribute__((always_inline))

INLINE int data_bytes(int fmt) {
    switch (fmt) {
    case KS_F32: return 4 * KS_KBLOCK;
    case KS_BF16: case KS_F16: return 2 * KS_KBLOCK;
    case KS_FP8ROW: case KS_MXFP8: return KS_KBLOCK;
    default: return KS_KBLOCK / 2;
    }
}
INLINE int scale_bytes(int fmt) {
    return fmt == KS_MXFP8 || fmt == KS_MXFP4 ? 1 : fmt == KS_NVFP4 ? 2 : 0;
}

/* Per-(row, block) dequantisation context from the block's scale bytes. */
INLINE kctx make_ctx(int fmt, const uint8_t *s) {
    kctx c;
#if KS_ISA == 0
    c.a = c.b = 1.0f;
    if (fmt == KS_MXFP8) c.a = ks_e8m0_p120_lut[s[0]];
    else if (fmt == KS_FP8ROW) c.a = 0x1p120f;
    else if (fmt == KS_MXFP4) c.a = c.b = ks_e8m0_lut[s[0]];
    else if (fmt == KS_NVFP4) { c.a = ks_e4m3_lut[s[0]]; c.b = ks_e4m3_lut[s[1]]; }
#elif KS_ISA >= 2
    c.a = c.b = vzero();
    if (fmt == KS_MXFP8) c.a = vset1(ks_e8m0_p8_lut[s[0]]);   /* the fp16 decode gives value * 2^-8 */
    else if (fmt == KS_FP8ROW) c.a = vset1(0x1p8f);
    /* FP4: the 16 values e2m1[c] * scale, precomputed per scale byte (exact products): a load,
     * no multiply per row-block */
    else if (fmt == KS_MXFP4) c.a = c.b = _mm512_load_ps(ks_fp4_f32[0][s[0]]);
    else if (fmt == KS_NVFP4) {
        c.a = _mm512_load_ps(ks_fp4_f32[1][s[0]]);
        c.b = _mm512_load_ps(ks_fp4_f32[1][s[1]]);
    }
#else /* AVX2 (FP8: ks_fp8_avx2.c): FP4 tables hold the 8 magnitudes; the sign is OR'ed from the code's bit 3 */
    c.a = c.b = vzero();
    if (fmt == KS_MXFP4) c.a = c.b = vmul(vload(ks_e2m1_values), vset1(ks_e8m0_lut[s[0]]));
    else if (fmt == KS_NVFP4) {
        c.a = vmul(vload(ks_e2m1_values), vset1(ks_e4m3_lut[s[0]]));
        c.b = vmul(vload(ks_e2m1_values), vset1(ks_e4m3_lut[s[1]]));
    }
#endif
    return c;
}

/* Elements [j*VL, (j+1)*VL) of one row's 32-element block `d`. */
INLINE vf dequant(int fmt, const uint8_t *d, int j, kctx c) {
#if KS_ISA == 0
    switch (fmt) {
    case KS_F32: { float v; memcpy(&v, d + 4 * j, 4); return v; }
    case KS_BF16: { uint16_t h; memcpy(&h, d + KS_BF16_POS(j), 2); uint32_t b = (uint32_t)h << 16; float v; memcpy(&v, &b, 4); return v; }
    case KS_F16: { uint16_t h; memcpy(&h, d + 2 * j, 2); return ks_half_to_float(h); }
    case KS_FP8ROW: case KS_MXFP8: {
        uint32_t b = d[j], bits = ((b & 0x7Fu) << 20) | ((b & 0x80u) << 24); float v;
        memcpy(&v, &bits, 4); return v * c.a;
    }
    default: { /* MXFP4 / NVFP4 */
        int code = j < 16 ? (d[j] & 15) : (d[j - 16] >> 4);
        return ks_e2m1_values[code] * (j < 16 ? c.a : c.b);
    }
    }
#elif KS_ISA >= 2
    switch (fmt) {
    case KS_F32: return _mm512_loadu_ps((const float *)d + 16 * j);
    case KS_BF16: { /* elements 0..15 by a shift (j = 0), 16..31 by a mask (j = 1) of the one load */
        const __m512i w = _mm512_loadu_si512((const void *)d);
        return _mm512_castsi512_ps(j ? _mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)) : _mm512_slli_epi32(w, 16));
    }
    case KS_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + 32 * j)));
    case KS_FP8ROW: case KS_MXFP8: {
        /* fp16 with E4M3's bits (sign to bit 15, exponent and mantissa to bits 13..7): value * 2^-8
         * exactly for every code; vcvtph2ps makes E4M3 subnormals (fp16 subnormals) normal fp32, so
         * no fp32 denormal reaches the multiply (Intel takes a microcode assist per denormal
         * operand: the fp32 bit trick value * 2^-120 ran 20x slower on random codes). */
        __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(d + 16 * j)));
        w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
        return _mm512_mul_ps(_mm512_cvtph_ps(w), c.a);
    }
    default: {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)d));
        if (j) idx = _mm512_srli_epi32(idx, 4);
        return _mm512_permutexvar_ps(idx, j ? c.b : c.a);
    }
    }
#else
    switch (fmt) {
    case KS_F32: return _mm256_loadu_ps((const float *)d + 8 * j);
    case KS_BF16: { /* elements 8j.. by a shift (j < 2) or a mask (j >= 2) of dwords 8(j&1).. */
        const __m256i w = _mm256_loadu_si256((const __m256i *)(d + 32 * (j & 1)));
        return _mm256_castsi256_ps(j >= 2 ? _mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u))
                                          : _mm256_slli_epi32(w, 16));
    }
    case KS_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + 16 * j)));
    default: { /* MXFP4 / NVFP4 (FP8 never reaches here: ks_fp8_avx2.c) */
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(d + 8 * (j & 1))));
        if (j >= 2) idx = _mm256_srli_epi32(idx, 4);
        __m256 mag = _mm256_permutevar8x32_ps(j >= 2 ? c.b : c.a, idx);
        __m256i sign = _mm256_and_si256(_mm256_slli_epi32(idx, 28), _mm256_set1_epi32((int)0x80000000u));
        return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
    }
    }
#endif
}

/* res[r*nt + t] = <row r of the tile, xs[t]> over nkb blocks, for nt <= NT_MAX tokens. */
INLINE void tile_dot(const int fmt, const int nt, const uint8_t *tile, int nkb,
                     const float *const *xs, float *res) {
    const int DB = data_bytes(fmt), SB = scale_bytes(fmt), BS = R * (DB + SB);
    vf acc[R][NT_MAX];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int t = 0; t < nt; ++t) acc[r][t] = vzero();
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * BS;
        /* NVFP4 (fp32 activations, 128 bytes per block and token against 72 of weights) prefetches
         * into L2 only: into L1 the streamed weights evicted the activations (AMD Zen 4, cold:
         * 1.005-1.09x in two A/Bs; docs/native.md, "Activations that stay in L1") */
        if (fmt == KS_NVFP4)
            for (int off = 0; off < BS; off += 64) PREFETCH_L2(blk + KS_PREFETCH + off);
        else
            for (int off = 0; off < BS; off += 64) PREFETCH(blk + KS_PREFETCH + off);
        kctx c[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) c[r] = make_ctx(fmt, blk + R * DB + r * SB);
#pragma GCC unroll 32
        for (int j = 0; j < NV; ++j) {
            vf w[R];
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) w[r] = dequant(fmt, blk + r * DB, j, c[r]);
#pragma GCC unroll 8
            for (int t = 0; t < nt; ++t) {
                vf x = vload(xs[t] + kb * KS_KBLOCK + j * VL);
#pragma GCC unroll 4
                for (int r = 0; r < R; ++r) acc[r][t] = vfma(w[r], x, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int t = 0; t < nt; ++t) res[r * nt + t] = vsum(acc[r][t]);
}

#define NT_CASE(F, N) case N: tile_dot(F, N, tile, nkb, xs, res); break;
#if NT_MAX == 5
#define NT_SWITCH(F) switch (nt) { NT_CASE(F, 1) NT_CASE(F, 2) NT_CASE(F, 3) NT_CASE(F, 4) NT_CASE(F, 5) }
#elif NT_MAX == 4
#define NT_SWITCH(F) switch (nt) { NT_CASE(F, 1) NT_CASE(F, 2) NT_CASE(F, 3) NT_CASE(F, 4) }
#else
#define NT_SWITCH(F) switch (nt) { NT_CASE(F, 1) NT_CASE(F, 2) }
#endif

static void tile_dot_any(int fmt, int nt, const uint8_t *tile, int nkb, const float *const *xs, float *res) {
    switch (fmt) {
    case KS_F32: NT_SWITCH(KS_F32) break;
    case KS_BF16: NT_SWITCH(KS_BF16) break;
    case KS_F16: NT_SWITCH(KS_F16) break;
#if KS_ISA != 1
    case KS_FP8ROW: NT_SWITCH(KS_FP8ROW) break;
    case KS_MXFP8: NT_SWITCH(KS_MXFP8) break;
#endif
    case KS_MXFP4: NT_SWITCH(KS_MXFP4) break;
    case KS_NVFP4: NT_SWITCH(KS_NVFP4) break;
    }
}

#if KS_ISA == 3
/* MXFP4 x exact-bf16 activations (the MX path: MXFP8 values are exact in bf16).  Rows are taken
 * in pairs: one zmm of 32 words holds the 16 packed bytes of two rows; a 32-entry bf16 table
 * (entries 0-15 for the first row, 16-31 for the second) carries each row's E8M0 scale as an
 * exponent offset (scale bytes must lie in [2, 252]); vdpbf16ps multiplies exactly and
 * accumulates in fp32.  Activation rows are in the "bf16 duplicated" layout of ks_to_bf16_dup. */
static inline __m512i bf16_base_table(void) {
    static const uint16_t base[16] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                      0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
    const __m256i h = _mm256_loadu_si256((const __m256i *)base);
    return _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
}

INLINE void tile_dot_mxfp4_bf16(const int nt, const uint8_t *tile, int nkb, const uint16_t *const *xs, float *res) {
    const __m512i base = bf16_base_table(), lo4 = _mm512_set1_epi16(0x0F);
    const __m512i sel = _mm512_maskz_set1_epi16(0xFFFF0000u, 0x10);
    const __mmask32 nonzero = ~0x01010101u;   /* entries 0 and 8 of each half are +-0 */
    __m512 acc[2][NT_MAX];
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q)
#pragma GCC unroll 8
        for (int t = 0; t < nt; ++t) acc[q][t] = _mm512_setzero_ps();
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * R * 17, *sc = blk + R * 16;
        PREFETCH(blk + KS_PREFETCH);
#pragma GCC unroll 2
        for (int q = 0; q < 2; ++q) {
            const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 32 * q)));
            const __m512i il = _mm512_or_si512(_mm512_and_si512(w, lo4), sel);
            const __m512i ih = _mm512_or_si512(_mm512_srli_epi16(w, 4), sel);
            __m512i adj = _mm512_mask_set1_epi16(_mm512_set1_epi16((short)((sc[2 * q] - 127) << 7)), 0xFFFF0000u,
                                                 (short)((sc[2 * q + 1] - 127) << 7));
            const __m512i tab = _mm512_mask_add_epi16(base, nonzero, base, adj);
            const __m512bh wl = (__m512bh)_mm512_permutexvar_epi16(il, tab);
            const __m512bh wh = (__m512bh)_mm512_permutexvar_epi16(ih, tab);
#pragma GCC unroll 8
            for (int t = 0; t < nt; ++t) {
                const uint16_t *x = xs[t] + kb * 64;
                acc[q][t] = _mm512_dpbf16_ps(acc[q][t], wl, (__m512bh)_mm512_loadu_si512(x));
                acc[q][t] = _mm512_dpbf16_ps(acc[q][t], wh, (__m512bh)_mm512_loadu_si512(x + 32));
            }
        }
    }
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q)
#pragma GCC unroll 8
        for (int t = 0; t < nt; ++t) {
            const __m256 lo = _mm512_castps512_ps256(acc[q][t]);
            const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[q][t]), 1));
            __m128 a = _mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
            __m128 b = _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
            a = _mm_add_ps(a, _mm_movehl_ps(a, a)); b = _mm_add_ps(b, _mm_movehl_ps(b, b));
            res[(2 * q) * nt + t] = _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
            res[(2 * q + 1) * nt + t] = _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
        }
}

/* The scales 2^(s-127) of a row pair's block: lanes 0-7 row a (sc[0]), lanes 8-15 row b (sc[1]). */
INLINE __m512 pair_scales(const uint8_t *sc) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(ks_e8m0_lut[sc[0]]), 0xFF00, _mm_load_ss(&ks_e8m0_lut[sc[1]]));
}
/* acc[t] += a row pair's block sums against token t, times sv: wl / wh hold [row a | row b]
 * elements 0-15 / 16-31, xs[t] + off the block in the duplicated layout (ks_to_bf16_dup). */
INLINE void pair_dots(const int nt, __m512bh wl, __m512bh wh, __m512 sv, const uint16_t *const *xs, int64_t off,
                      __m512 *acc) {
#pragma GCC unroll 8
    for (int t = 0; t < nt; ++t) {
        const uint16_t *x = xs[t] + off;
        __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), wl, (__m512bh)_mm512_loadu_si512(x));
        p = _mm512_dpbf16_ps(p, wh, (__m512bh)_mm512_loadu_si512(x + 32));
        acc[t] = _mm512_fmadd_ps(p, sv, acc[t]);
    }
}
/* res[r * nt + t] for the tile's rows 2q (lanes 0-7 of acc[q][t]) and 2q + 1 (lanes 8-15). */
INLINE void pair_store(const int nt, __m512 (*acc)[NT_MAX], float *res) {
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q)
#pragma GCC unroll 8
        for (int t = 0; t < nt; ++t) {
            res[(2 * q) * nt + t] = _mm512_mask_reduce_add_ps(0x00FF, acc[q][t]);
            res[(2 * q + 1) * nt + t] = _mm512_mask_reduce_add_ps(0xFF00, acc[q][t]);
        }
}

/* The same product for 1-2 tokens, cheaper per weight: an unscaled table (no per-block table
 * build) and each block's partial sum scaled into the accumulator by one FMA per token. */
INLINE void tile_dot_mxfp4_bf16_few(const int nt, const uint8_t *tile, int nkb, const uint16_t *const *xs, float *res) {
    const __m512i tab = bf16_base_table();
    __m512 acc[2][NT_MAX];
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q)
#pragma GCC unroll 2
        for (int t = 0; t < nt; ++t) acc[q][t] = _mm512_setzero_ps();
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * R * 17, *sc = blk + R * 16;
        PREFETCH(blk + KS_PREFETCH);
#pragma GCC unroll 2
        for (int q = 0; q < 2; ++q) {
            const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 32 * q)));
            /* vpermw reads index bits 0-4 and both table halves are equal: no mask for the low nibble */
            const __m512bh wl = (__m512bh)_mm512_permutexvar_epi16(w, tab);
            const __m512bh wh = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), tab);
            pair_dots(nt, wl, wh, pair_scales(sc + 2 * q), xs, kb * 64, acc[q]);
        }
    }
    pair_store(nt, acc, res);
}

/* MXFP8 x exact-bf16 activations (with AVX512_VBMI: only where ks_vbmi_supported()).  Every E4M3
 * value is exact in bf16 (4 significant bits, exponents 2^-9..2^8), so vdpbf16ps multiplies
 * exactly.  One zmm holds two rows' blocks (32 codes each); after a qword permutation each
 * 128-bit lane holds 8 codes of one half-row followed by 8 of the other, two vpermi2b on the
 * 7-bit magnitude (ks_e4m3_bf16: the high and the low byte of bf16(|value|), 0x7F read as 480
 * like every other decode here) and the sign bit give the bytes, and unpack{lo,hi}_epi8 the two
 * bf16 vectors [row a: elements 0-15 | row b: 0-15] and [row a: 16-31 | row b: 16-31]: the order
 * of the MXFP4 kernels' duplicated activation layout (ks_to_bf16_dup).  Per token and row pair:
 * two vdpbf16ps give each row's block sum (8 fp32 lanes per row), one FMA adds it times the
 * block scale 2^(s-127).  The same operations for every token whatever nt is, so a token's bits
 * depend neither on the thread count nor on the group it is computed with. */
#define VBMI __attribute__((target("avx512vbmi")))
INLINE VBMI void tile_dot_mxfp8_bf16(const int nt, const uint8_t *tile, int nkb, const uint16_t *const *xs, float *res) {
    const __m512i th0 = _mm512_loadu_si512(ks_e4m3_bf16[1]), th1 = _mm512_loadu_si512(ks_e4m3_bf16[1] + 64);
    const __m512i tl0 = _mm512_loadu_si512(ks_e4m3_bf16[0]), tl1 = _mm512_loadu_si512(ks_e4m3_bf16[0] + 64);
    const __m512i sign = _mm512_set1_epi8((char)0x80), halves = _mm512_set_epi64(7, 5, 6, 4, 3, 1, 2, 0);
    __m512 acc[2][NT_MAX];
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q)
#pragma GCC unroll 8
        for (int t = 0; t < nt; ++t) acc[q][t] = _mm512_setzero_ps();
    for (int kb = 0; kb < nkb; ++kb) {
        const uint8_t *blk = tile + (int64_t)kb * R * (KS_KBLOCK + 1), *sc = blk + R * KS_KBLOCK;
        /* into L2 only: into L1 the streamed weights evicted the activations, whose L1 misses
         * then held back the weights' (1.08-1.22x cold on AMD Zen 4; the MXFP4 kernels, lighter
         * per byte, ran 0.70-0.86x so: docs/native.md, "Activations that stay in L1") */
        for (int off = 0; off < R * (KS_KBLOCK + 1); off += 64) PREFETCH_L2(blk + KS_PREFETCH + off);
#pragma GCC unroll 2
        for (int q = 0; q < 2; ++q) {
            const __m512i c = _mm512_permutexvar_epi64(halves, _mm512_loadu_si512((const void *)(blk + 64 * q)));
            const __m512i hb = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(th0, c, th1), c, sign, 0xF8); /* a | b & c */
            const __m512i lb = _mm512_permutex2var_epi8(tl0, c, tl1);
            pair_dots(nt, (__m512bh)_mm512_unpacklo_epi8(lb, hb), (__m512bh)_mm512_unpackhi_epi8(lb, hb),
                      pair_scales(sc + 2 * q), xs, kb * 64, acc[q]);
        }
    }
    pair_store(nt, acc, res);
}

static VBMI void tile_dot_mxfp8_bf16_any(int nt, const uint8_t *tile, int nkb, const uint16_t *const *xs, float *res) {
    switch (nt) {
    case 1: tile_dot_mxfp8_bf16(1, tile, nkb, xs, res); break;
    case 2: tile_dot_mxfp8_bf16(2, tile, nkb, xs, res); break;
    case 3: tile_dot_mxfp8_bf16(3, tile, nkb, xs, res); break;
    case 4: tile_dot_mxfp8_bf16(4, tile, nkb, xs, res); break;
    case 5: tile_dot_mxfp8_bf16(5, tile, nkb, xs, res); break;
    }
}

/* The bf16 MX path's tile kernel for format fmt (MXFP4 or MXFP8), nt <= NT_MAX tokens. */
static void tile_dot_bf16_any(int fmt, int nt, const uint8_t *tile, int nkb, const uint16_t *const *xs, float *res) {
    if (fmt == KS_MXFP8) {
        tile_dot_mxfp8_bf16_any(nt, tile, nkb, xs, res);
        return;
    }
    switch (nt) {
    case 1: tile_dot_mxfp4_bf16_few(1, tile, nkb, xs, res); break;
    case 2: tile_dot_mxfp4_bf16_few(2, tile, nkb, xs, res); break;
    case 3: tile_dot_mxfp4_bf16(3, tile, nkb, xs, res); break;
    case 4: tile_dot_mxfp4_bf16(4, tile, nkb, xs, res); break;
    case 5: tile_dot_mxfp4_bf16(5, tile, nkb, xs, res); break;
    }
}
#endif

#if KS_ISA >= 1
/* A thread's scratch for the AVX2 FP4 / integer and AVX-512 VNNI decoded tiles (grown on demand, kept for the thread's lifetime). */
static __thread float *tl_buf;
static __thread size_t tl_cap;

static float *scratch(size_t n) {
    if (n > tl_cap) {
        free(tl_buf);
        tl_buf = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        tl_cap = tl_buf ? n : 0;
    }
    return tl_buf;
}
#endif

#define KC 8 /* blocks per decode-once chunk: 4 rows x 256 fp32 weights = 4 KB, L1-resident */

/* Blocks [kb0, kb0 + nb) of a tile, dequantised exactly (scales applied) into buf[block][row][32]. */
static void decode_chunk(int fmt, const uint8_t *tile, int kb0, int nb, float *buf) {
#if KS_ISA == 1
    if (fmt == KS_FP8ROW || fmt == KS_MXFP8) { /* in the permuted order of ks_fp8_act_avx2 */
        ks_fp8_decode_chunk_avx2(fmt == KS_MXFP8, tile, kb0, nb, buf);
        return;
    }
    if (fmt == KS_MXFP4 || fmt == KS_NVFP4) {
        ks_fp4_decode_chunk_avx2(fmt == KS_NVFP4, tile, kb0, nb, ks_block_bytes(fmt), buf);
        return;
    }
#endif
    const int DB = data_bytes(fmt), SB = scale_bytes(fmt), BS = R * (DB + SB);
    for (int k = 0; k < nb; ++k) {
        const uint8_t *blk = tile + (int64_t)(kb0 + k) * BS;
        for (int off = 0; off < BS; off += 64) PREFETCH(blk + KS_PREFETCH + off);
        for (int r = 0; r < R; ++r) {
            kctx c = make_ctx(fmt, blk + R * DB + r * SB);
#if KS_ISA >= 2
            /* decode-once: the FP4 tables by a multiply, not ks_fp4_f32 (same values; the loads
             * measured 5-10 % slower at T = 8-16 here, the fused kernel 5-9 % faster with them) */
            if (fmt == KS_MXFP4) c.a = c.b = vmul(vload(ks_e2m1_values), vset1(ks_e8m0_lut[blk[R * DB + r * SB]]));
            if (fmt == KS_NVFP4) {
                c.a = vmul(vload(ks_e2m1_values), vset1(ks_e4m3_lut[blk[R * DB + r * SB]]));
                c.b = vmul(vload(ks_e2m1_values), vset1(ks_e4m3_lut[blk[R * DB + r * SB + 1]]));
            }
#endif
            for (int j = 0; j < NV; ++j) vstore(buf + (k * R + r) * KS_KBLOCK + j * VL, dequant(fmt, blk + r * DB, j, c));
        }
    }
}

/* acc[t][r] (kept in memory between chunks) += a decoded chunk of nb blocks, starting at
 * block kb0 of the activations, for nt <= NT_MAX tokens: 4 x nt accumulator chains, each
 * summing in k order (so chunking does not change the bits). */
INLINE void chunk_dot(const int nt, const float *buf, int kb0, int nb, const float *const *xs, vf (*acc)[R]) {
    vf a[NT_MAX][R];
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < R; ++r) a[t][r] = acc[t][r];
    for (int k = 0; k < nb * KS_KBLOCK; k += VL) {
        const float *b = buf + (k / KS_KBLOCK) * R * KS_KBLOCK + k % KS_KBLOCK;
        vf w[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) w[r] = vload(b + r * KS_KBLOCK);
#pragma GCC unroll 8
        for (int t = 0; t < nt; ++t) {
            const vf x = vload(xs[t] + (int64_t)kb0 * KS_KBLOCK + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) a[t][r] = vfma(w[r], x, a[t][r]);
        }
    }
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < R; ++r) acc[t][r] = a[t][r];
}

/* Decode-once for n <= KS_GROUP_MAX tokens: each chunk of the tile is decoded once and every
 * token's dot runs over it while it is in L1, so an extra token costs its FMAs only.
 * out[r * n + t]. */
static void tile_batch(int fmt, int n, const uint8_t *tile, int nkb, const float *const *xs, float *out) {
    float buf[R * KC * KS_KBLOCK] __attribute__((aligned(64)));
    vf acc[KS_GROUP_MAX][R];
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < R; ++r) acc[t][r] = vzero();
    for (int kb0 = 0; kb0 < nkb; kb0 += KC) {
        const int nb = nkb - kb0 < KC ? nkb - kb0 : KC;
        decode_chunk(fmt, tile, kb0, nb, buf);
        for (int lo = 0; lo < n; lo += NT_MAX) {
            const float *const *x = xs + lo;
            switch (n - lo < NT_MAX ? n - lo : NT_MAX) {
            case 1: chunk_dot(1, buf, kb0, nb, x, acc + lo); break;
#if NT_MAX >= 4
            case 3: chunk_dot(3, buf, kb0, nb, x, acc + lo); break;
            case 4: chunk_dot(4, buf, kb0, nb, x, acc + lo); break;
#endif
#if NT_MAX >= 5
            case 5: chunk_dot(5, buf, kb0, nb, x, acc + lo); break;
#endif
            default: chunk_dot(2, buf, kb0, nb, x, acc + lo); break;
            }
        }
    }
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < R; ++r) out[r * n + t] = vsum(acc[t][r]);
}

/* The activations of one group's n pairs in every layout a kernel may read. */
typedef struct {
    const float *x[KS_GROUP_MAX];
    const float *xd[KS_GROUP_MAX];
    const uint16_t *xb[KS_GROUP_MAX];
    ks_mxplanes xi[KS_GROUP_MAX];
    const ks_mxplanes *xip[KS_GROUP_MAX];  /* &xi[t] when the planes exist, else NULL */
    const float *xf[KS_GROUP_MAX];         /* AVX2 FP8 layout (ks_fp8_act_avx2), else NULL */
    float xf_unscale[KS_GROUP_MAX];
} group_x;

/* The activation rows a phase reads, in every layout (NULL: absent): x / planes / xf rows of k
 * elements, xd / xb rows of 2k. */
typedef struct {
    const float *x, *xd;
    const uint16_t *xb;
    const ks_mxplanes *xi;
    const float *xf, *xf_unscale;
    int64_t k;
} act_rows;

/* Slot t of gx <- row `row` of every layout of a. */
static inline void set_row(group_x *gx, int t, const act_rows *a, int64_t row) {
    gx->x[t] = a->x + row * a->k;
    gx->xd[t] = a->xd ? a->xd + row * 2 * a->k : NULL;
    gx->xb[t] = a->xb ? a->xb + row * 2 * a->k : NULL;
    if (a->xi) gx->xi[t] = ks_planes_row(a->xi, row, a->k);
    gx->xip[t] = a->xi ? &gx->xi[t] : NULL;
    gx->xf[t] = a->xf ? a->xf + row * a->k : NULL;
    gx->xf_unscale[t] = a->xf ? a->xf_unscale[row] : 1.0f;
}

/* Groups of up to KS_PASS_MAX tokens run as fused passes of NT_MAX (AVX2: 2) tokens over the
 * tile, which is in L1/L2 after the first pass; larger groups decode the tile once.  On AVX2
 * with 2 threads (GPT-OSS shape) decode-once streamed worse for small groups (its decode bursts
 * memory requests, its dot makes none): passes for every group size were 1.05-1.23x faster at
 * T=8-16 for bf16, NVFP4 and MXFP8 but 1.1-1.3x slower at T=32-64 (4-8 tokens per expert);
 * passes up to 4 tokens then decode-once kept the T=16 gain and lost nothing at T=32-64.  The
 * AVX2 integer MX path keeps decode-once above 2 tokens (passes were no faster).  AVX2 bf16
 * always runs passes: with its one-op decode, passes for every group size measured 1.02-1.12x
 * faster than decode-once above 4 tokens at T=16-64 (docs/native.md, "Fifth pass").  On AVX-512
 * every format but FP8 runs passes for every group size too (pass_max). */
#ifndef KS_PASS_MAX
#define KS_PASS_MAX (KS_ISA == 1 ? 4 : NT_MAX)
#endif
/* The largest group that runs as fused passes for format fmt: every group for AVX2 bf16 and, on
 * AVX-512, for every format but FP8 (passes of 5 tokens measured 1.12-1.35x faster than decode-once
 * hot at 6-64 tokens on AMD Zen 4 for bf16, f32, f16, MXFP4 and NVFP4, and give the same bits;
 * FP8, whose decode costs more, 0.97-1.10x: docs/native.md, Performance, "Passes for every group
 * on AVX-512"). */
static inline int pass_max(int fmt) {
    if (KS_ISA == 1 && fmt == KS_BF16) return KS_GROUP_MAX;
    if (KS_ISA >= 2 && fmt != KS_FP8ROW && fmt != KS_MXFP8) return KS_GROUP_MAX;
    return KS_PASS_MAX;
}

/* out[r * n + i] = <row r of tile tp, activations of pair i> for all n (<= KS_GROUP_MAX) pairs of a group:
 * n small -> decode fused with the dot; else the tile is decoded once and reused by every
 * chunk of tokens.  Every path multiplies the same exact weights; only fp32 summation order
 * differs between paths (never with the thread count). */
static void group_tile(int fmt, const uint8_t *tp, int nkb, const group_x *gx, int n, float *out) {
    float res[R * 8];
#define SCATTER(lo, nt) for (int r = 0; r < R; ++r) for (int t = 0; t < (nt); ++t) out[r * n + (lo) + t] = res[r * (nt) + t]
/* Fused passes of at most STEP tokens: CALL computes res for tokens [lo, lo + nt). */
#define PASSES(STEP, CALL)                          \
    for (int lo = 0; lo < n; lo += (STEP)) {        \
        const int nt = n - lo < (STEP) ? n - lo : (STEP); \
        CALL;                                       \
        SCATTER(lo, nt);                            \
    }
#if KS_ISA == 3
    if (gx->xb[0]) {
        PASSES(NT_MAX, tile_dot_bf16_any(fmt, nt, tp, nkb, gx->xb + lo, res))
        return;
    }
#endif
#if KS_ISA >= 1
    /* MXFP8 / FP8-row through ks_fp8_avx2.c (results carry 2^a per token): every group on AVX2;
     * on AVX-512 the groups of <= 2 tokens, where ks_native.c chose the exponent rebias (AMD) */
    if (gx->xf[0] && (KS_ISA == 1 || n <= 2)) {
        if (n > pass_max(fmt)) tile_batch(fmt, n, tp, nkb, gx->xf, out);
        else PASSES(2, ks_fp8_tile_fused_avx2(fmt == KS_MXFP8, nt, tp, nkb, gx->xf + lo, res))
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < n; ++t) out[r * n + t] *= gx->xf_unscale[t];
        return;
    }
#endif
#if KS_ISA == 1
    if (gx->xip[0]) { /* MXFP4 on the MX path: exact integer block sums (ks_mxint_avx2.c) */
        void *buf = n > 2 ? scratch((ks_mxint_scratch_bytes(nkb) + sizeof(float) - 1) / sizeof(float)) : NULL;
        if (buf) {
            ks_mxint_tile_decode_avx2(tp, nkb, buf);
            ks_mxint_dot_avx2(n, buf, nkb, gx->xip, out); /* out is [r * n + t] */
            return;
        }
        /* <= 2 tokens, or no memory for the scratch: fused, 2 at a time */
        PASSES(2, ks_mxint_tile_fused_avx2(nt, tp, nkb, gx->xip + lo, res))
        return;
    }
    if (gx->xd[0]) { /* MXFP4 / NVFP4, fp32 activations: fused in the pair layout, else tile_batch */
        if (n > pass_max(fmt)) tile_batch(fmt, n, tp, nkb, gx->x, out);
        else PASSES(2, ks_fp4_tile_fused_avx2(fmt == KS_NVFP4, nt, tp, nkb, ks_block_bytes(fmt), gx->xd + lo, res))
        return;
    }
#endif
    if (n > pass_max(fmt)) tile_batch(fmt, n, tp, nkb, gx->x, out);
    else PASSES(NT_MAX, tile_dot_any(fmt, nt, tp, nkb, gx->x + lo, res))
#undef PASSES
#undef SCATTER
}

#if KS_ISA >= 2
#ifndef KS_VNNI_FUSED_MAX
#define KS_VNNI_FUSED_MAX 2 /* the largest group the VNNI kernels run fused (decode in registers) */
#endif
/* MXFP4 on the MX path with AVX512_VNNI (ks_mxint_avx512.c): ntl <= 4 consecutive tiles at once,
 * lane = row; out[(4q + r) * n + t].  Small groups decode in registers, 2 tokens per pass; larger
 * ones decode each L1 chunk of the group once into the thread's scratch and run every token over it.  Both sum
 * every (row, token) in the same order: the bits do not depend on n. */
static void group_tiles16(const uint8_t *tp, int64_t stride, int ntl, int nkb, const group_x *gx, int n, float *out) {
    void *buf = n > KS_VNNI_FUSED_MAX ? scratch((ks_mxint16_scratch_bytes() + sizeof(float) - 1) / sizeof(float)) : NULL;
    if (buf) {
        ks_mxint16_batch_avx512(n, tp, stride, ntl, nkb, gx->xip, out, buf);
        return;
    }
    for (int lo = 0; lo < n; lo += 2)
        ks_mxint16_fused_avx512(n - lo < 2 ? n - lo : 2, tp, stride, ntl, nkb, gx->xip + lo, out + lo, n);
}
#define GROUP_TILES(g16, tp, stride, nq, nkb, gx, n, res, FMT) \
    do { if (g16) group_tiles16(tp, stride, nq, nkb, gx, n, res); else group_tile(FMT, tp, nkb, gx, n, res); } while (0)
#else
#define GROUP_TILES(g16, tp, stride, nq, nkb, gx, n, res, FMT) group_tile(FMT, tp, nkb, gx, n, res)
#endif

/* Work items, taken from the phase's counter by whichever thread is free: gate/up items are
 * (group, KS_GU_ITEM blocks of 32 I-elements), down items KS_DN_ITEM tiles of H rows across all
 * groups (so no two threads add to the same output element).  An element is computed by the
 * same code whichever thread takes its item, so the bits do not depend on the thread count, and
 * a thread slowed by the host no longer holds the others at the phase barrier. */
#define KS_GU_ITEM 2
#define KS_DN_ITEM 16
static inline int next_item(const ks_call *c) { return __atomic_fetch_add(c->next_item, 1, __ATOMIC_RELAXED); }

void SUFFIX(ks_gate_up)(const ks_call *c, int tid, int nth) {
    (void)tid; (void)nth;
    const ks_experts *ex = c->ex;
    const int H = ex->hidden, I = ex->inter, nkb = H / KS_KBLOCK;
    const int nblk = I / KS_KBLOCK, per_group = (nblk + KS_GU_ITEM - 1) / KS_GU_ITEM;
    group_x gx;
    float res[4 * R * KS_GROUP_MAX];
    const int g16 = KS_ISA >= 2 && c->xi != NULL; /* VNNI MX path: 4 tiles per kernel call */
    for (int it; (it = next_item(c)) < c->num_groups * per_group;) {
        const int g = it / per_group, b0 = it % per_group * KS_GU_ITEM;
        const int t0 = b0 * (KS_KBLOCK / 2), t1 = (b0 + KS_GU_ITEM < nblk ? b0 + KS_GU_ITEM : nblk) * (KS_KBLOCK / 2);
        const ks_group *gr = &c->groups[g];
        const int e = gr->expert, n = gr->count;
        const uint8_t *base = ex->gate_up + (int64_t)e * (I / 2) * ex->gu_tile_stride;
        const float *rs = ex->gu_row_scale ? ex->gu_row_scale + (int64_t)e * 2 * I : NULL;
        const float *bias = ex->gu_bias ? ex->gu_bias + (int64_t)e * 2 * I : NULL;
        const float outer = ex->gu_outer ? ex->gu_outer[e] : 1.0f;
        const act_rows src = {c->x, c->xd, c->xb, c->xi, c->xf, c->xf_unscale, H};
        for (int t = 0; t < n; ++t) set_row(&gx, t, &src, c->pair_token[gr->first + t]);
        for (int tile0 = t0; tile0 < t1; tile0 += g16 ? 4 : 1) {
            const int nq = g16 ? (t1 - tile0 < 4 ? t1 - tile0 : 4) : 1;
            GROUP_TILES(g16, base + (int64_t)tile0 * ex->gu_tile_stride, ex->gu_tile_stride, nq, nkb, &gx, n, res, ex->format);
            for (int q = 0; q < nq; ++q) {
                const int tile = tile0 + q;
                const float *rq = res + q * R * n;
                for (int p = 0; p < 2; ++p) {
                    const int i = 2 * tile + p;
                    float sg = outer, su = outer;
                    if (rs) { sg *= rs[i]; su *= rs[I + i]; }
                    for (int t = 0; t < n; ++t) {
                        float gv = rq[(2 * p) * n + t] * sg, uv = rq[(2 * p + 1) * n + t] * su;
                        if (bias) { gv += bias[i]; uv += bias[I + i]; }
                        c->inter[(int64_t)(gr->first + t) * I + i] = ks_apply_act(c->act, gv, uv);
                    }
                }
            }
        }
        if (t1 > t0)
            for (int t = 0; t < n; ++t) {
                const int64_t pi = gr->first + t, len = 2 * (int64_t)(t1 - t0);
                float *row = c->inter + pi * I + 2 * t0;
                if (c->inter_i) {
                    ks_mxplanes pl = ks_planes_row(c->inter_i, pi, I);
                    pl.hi += 2 * t0; pl.lo += 2 * t0; pl.scale += 2 * t0 / 16; pl.has_lo += 2 * t0 / 32;
                    ks_mxfp8_planes(c->mxq, row, row, pl, len);
                } else if (c->quantize_inter) ks_mxfp8_qdq(c->mxq, row, row, len);
                if (c->inter_b) ks_to_bf16_dup(row, c->inter_b + pi * 2 * I + 4 * t0, len);
                if (c->inter_d) ks_to_fp4pair(row, c->inter_d + pi * 2 * I + 4 * t0, len);
            }
    }
}

void SUFFIX(ks_down)(const ks_call *c, int tid, int nth) {
    (void)tid; (void)nth;
    const ks_experts *ex = c->ex;
    const int H = ex->hidden, I = ex->inter, nkb = I / KS_KBLOCK, ntiles = H / R;
    group_x gx;
    float res[4 * R * KS_GROUP_MAX];
    const int g16 = KS_ISA >= 2 && c->inter_i != NULL; /* VNNI MX path: 4 tiles per kernel call */
    for (int it; (it = next_item(c)) * KS_DN_ITEM < ntiles;) {
        const int t0 = it * KS_DN_ITEM, t1 = t0 + KS_DN_ITEM < ntiles ? t0 + KS_DN_ITEM : ntiles;
        for (int g = 0; g < c->num_groups; ++g) {
            const ks_group *gr = &c->groups[g];
            const int e = gr->expert, n = gr->count;
            const uint8_t *base = ex->down + (int64_t)e * ntiles * ex->dn_tile_stride;
            const float *rs = ex->dn_row_scale ? ex->dn_row_scale + (int64_t)e * H : NULL;
            const float *bias = ex->dn_bias ? ex->dn_bias + (int64_t)e * H : NULL;
            const float outer = ex->dn_outer ? ex->dn_outer[e] : 1.0f;
            const act_rows src = {c->inter, c->inter_d, c->inter_b, c->inter_i, c->inter_f, c->inter_f_unscale, I};
            for (int t = 0; t < n; ++t) set_row(&gx, t, &src, gr->first + t);
            for (int tile0 = t0; tile0 < t1; tile0 += g16 ? 4 : 1) {
                const int nq = g16 ? (t1 - tile0 < 4 ? t1 - tile0 : 4) : 1;
                GROUP_TILES(g16, base + (int64_t)tile0 * ex->dn_tile_stride, ex->dn_tile_stride, nq, nkb, &gx, n, res, ex->format);
                for (int r = 0; r < R * nq; ++r) { /* row r of the group: tile tile0 + r / 4 */
                    const int h = R * tile0 + r;
                    const float s = rs ? outer * rs[h] : outer;
                    for (int t = 0; t < n; ++t) {
                        const int pi = gr->first + t;
                        float v = res[r * n + t] * s;
                        if (bias) v += bias[h];
                        c->out[(int64_t)c->pair_token[pi] * H + h] += v * c->pair_weight[pi];
                    }
                }
            }
        }
    }
}

/* Streaming read of n bytes (n % 256 == 0): the bandwidth probe of the benchmark. */
double SUFFIX(ks_read)(const uint8_t *p, int64_t n) {
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    const float *f = (const float *)p;
    const int64_t nf = n / 4;
    for (int64_t i = 0; i < nf; i += 4 * VL) {
        a0 = vfma(vload(f + i), vload(f + i), a0);
        a1 = vfma(vload(f + i + VL), vload(f + i + VL), a1);
        a2 = vfma(vload(f + i + 2 * VL), vload(f + i + 2 * VL), a2);
        a3 = vfma(vload(f + i + 3 * VL), vload(f + i + 3 * VL), a3);
    }
    return (double)vsum(a0) + vsum(a1) + vsum(a2) + vsum(a3);
}
