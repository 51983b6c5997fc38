/* kernelslot native: the MXFP8 online quantiser (E4M3 elements, floor E8M0 scale, blocks of 32)
 * with AVX-512 F/BW/VL/DQ, compiled with those flags; called only where the CPU has them
 * (ks_native.c, ks_mxfp8_rows).  Bit for bit the scalar reference of ks_native.c
 * (mxfp8_block, ks_mxfp8_planes), which is bit-exact with kernelslot.formats.quantize_mx.
 *
 * Per block, two vectors of 16 fp32:
 *  - amax and NaN together: the largest |x| as an integer (sign cleared) is the largest finite
 *    |x| when the block holds neither NaN nor inf, and has exponent field 255 when it holds
 *    either: the scalar code's 0xFF scale byte (NaN block) in both cases;
 *  - scale byte sb = clamp(exponent field - 8, 0, 254), element v = x · 2^(127-sb) (2^-127 for
 *    sb = 254, unreachable from a finite amax but kept), clamped to ±448;
 *  - round to nearest even onto E4M3: |v| < 2^-6 (the E4M3 subnormal range, step 2^-9) by
 *    (|v| + 2^14) - 2^14, else by adding 0x7FFFF + bit 20 to the fp32 bits and clearing the low
 *    20 (3 mantissa bits kept); the sign is put back afterwards (so -0 stays -0);
 *  - code: sign | 512·|r| (subnormal) or sign | (bits(|r|) >> 20) - 960 (normal: the exponent
 *    rebiased by 120 and the 3 mantissa bits);
 *  - planes: a = 512·r (an exact integer, |a| <= 229376), hi = a / 8 (C truncation), lo = a - 8 hi,
 *    stored as int16 in the planes' element order (one vpermt2w per plane and block).
 * No denormal-producing step is added: the only operations on values are the scalar code's own
 * (x · inv, the two clamps, the subnormal rounding add/sub, r · 512, r · scale), in the same
 * order, so MXCSR's FTZ / DAZ affect both alike.
 */
#include "ks_native.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

void ks_mxfp8_rows_avx512(const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                          const ks_mxplanes *p, int64_t n) {
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512 lim = _mm512_set1_ps(448.0f), nlim = _mm512_set1_ps(-448.0f);
    const __m512 sub_lim = _mm512_set1_ps(0x1p-6f), magic = _mm512_set1_ps(16384.0f), k512 = _mm512_set1_ps(512.0f);
    const __m512i rnd = _mm512_set1_epi32(0x7FFFF), one = _mm512_set1_epi32(1), keep = _mm512_set1_epi32(~0xFFFFF);
    const __m512i m7ff = _mm512_set1_epi32(0x7FF), b960 = _mm512_set1_epi32(960), seven = _mm512_set1_epi32(7);
    /* planes order: output word k (0..31) = element 16·(k>>4) + (k&15 < 8 ? 2(k&15) : 2(k&15)-15),
     * the low word of its dword in (v0, v1) viewed as 32 words each */
    const __m512i perm = _mm512_set_epi16(62, 58, 54, 50, 46, 42, 38, 34, 60, 56, 52, 48, 44, 40, 36, 32,
                                          30, 26, 22, 18, 14, 10, 6, 2, 28, 24, 20, 16, 12, 8, 4, 0);
    for (int64_t b = 0; b < n / 32; ++b, x += 32) {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const __m512i a0 = _mm512_and_si512(_mm512_castps_si512(x0), absmask);
        const __m512i a1 = _mm512_and_si512(_mm512_castps_si512(x1), absmask);
        const int ef = _mm512_reduce_max_epi32(_mm512_max_epi32(a0, a1)) >> 23;
        if (ef == 255) { /* NaN or inf: the NaN block */
            ks_mxfp8_nan_block(b, y, codes, ev, scales, p);
            continue;
        }
        const int sb = ef - 8 < 0 ? 0 : ef - 8 > 254 ? 254 : ef - 8;
        const __m512 inv = _mm512_set1_ps(sb == 254 ? 0x1p-127f : ks_f32_bits((uint32_t)(254 - sb) << 23));
        __m512 r[2];
        __m512i c[2] = {0}, ai[2] = {0};
        for (int h = 0; h < 2; ++h) {
            __m512 v = _mm512_mul_ps(h ? x1 : x0, inv);
            v = _mm512_min_ps(_mm512_max_ps(v, nlim), lim);
            const __m512i vb = _mm512_castps_si512(v);
            const __m512i sgn = _mm512_andnot_si512(absmask, vb);
            const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(vb, absmask));
            const __mmask16 small = _mm512_cmp_ps_mask(a, sub_lim, _CMP_LT_OQ);
            const __m512 rs = _mm512_sub_ps(_mm512_add_ps(a, magic), magic);
            const __m512i ab = _mm512_castps_si512(a);
            const __m512i bit = _mm512_and_si512(_mm512_srli_epi32(ab, 20), one);
            const __m512i rn = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(ab, rnd), bit), keep);
            const __m512 ra = _mm512_mask_blend_ps(small, _mm512_castsi512_ps(rn), rs); /* |r| */
            r[h] = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(ra), sgn));
            if (codes) {
                const __mmask16 rsmall = _mm512_cmp_ps_mask(ra, sub_lim, _CMP_LT_OQ);
                const __m512i cn = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(ra), 20), m7ff), b960);
                const __m512i cs = _mm512_cvttps_epi32(_mm512_mul_ps(ra, k512));
                c[h] = _mm512_or_si512(_mm512_mask_blend_epi32(rsmall, cn, cs), _mm512_srli_epi32(sgn, 24));
            }
            if (p) ai[h] = _mm512_cvttps_epi32(_mm512_mul_ps(r[h], k512));
        }
        if (y) {
            const __m512 s = _mm512_set1_ps(ks_e8m0_lut[sb]);
            _mm512_storeu_ps(y + 32 * b, _mm512_mul_ps(r[0], s));
            _mm512_storeu_ps(y + 32 * b + 16, _mm512_mul_ps(r[1], s));
        }
        if (ev) { _mm512_storeu_ps(ev + 32 * b, r[0]); _mm512_storeu_ps(ev + 32 * b + 16, r[1]); }
        if (codes) {
            _mm_storeu_si128((__m128i *)(codes + 32 * b), _mm512_cvtepi32_epi8(c[0]));
            _mm_storeu_si128((__m128i *)(codes + 32 * b + 16), _mm512_cvtepi32_epi8(c[1]));
        }
        if (scales) scales[b] = (uint8_t)sb;
        if (p) {
            __m512i hi[2], lo[2];
            for (int h = 0; h < 2; ++h) { /* a / 8 toward zero: add 7 to negatives, shift */
                hi[h] = _mm512_srai_epi32(_mm512_add_epi32(ai[h], _mm512_and_si512(_mm512_srai_epi32(ai[h], 31), seven)), 3);
                lo[h] = _mm512_sub_epi32(ai[h], _mm512_slli_epi32(hi[h], 3));
            }
            _mm512_storeu_si512(p->hi + 32 * b, _mm512_permutex2var_epi16(hi[0], perm, hi[1]));
            _mm512_storeu_si512(p->lo + 32 * b, _mm512_permutex2var_epi16(lo[0], perm, lo[1]));
            p->scale[2 * b] = ks_pow2f(sb - 134 - p->w_log2);
            p->scale[2 * b + 1] = ks_pow2f(sb - 137 - p->w_log2);
            p->has_lo[b] = _mm512_test_epi32_mask(_mm512_or_si512(lo[0], lo[1]), _mm512_or_si512(lo[0], lo[1])) != 0;
        }
    }
}
