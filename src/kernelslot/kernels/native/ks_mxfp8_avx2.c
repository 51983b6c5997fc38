/* kernelslot native: the MXFP8 online quantiser with AVX2 (8 fp32 lanes, four vectors per
 * 32-element block), compiled with -mavx2 -mfma -mf16c; called only where the CPU has them
 * (ks_native.c, ks_mxfp8_rows).  The same steps as ks_mxfp8_avx512.c (which describes them),
 * bit for bit the scalar reference of ks_native.c; planes: per 16-element half, vpermd of both
 * vectors (even elements first) and one vpackssdw (|hi| <= 28672, |lo| < 8: no saturation).
 */
#include "ks_native.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* 16 int32 (two vectors, elements 0..15) -> 16 int16 in the planes' order: 0 2 .. 14 1 3 .. 15. */
INLINE __m256i planes_half(__m256i v0, __m256i v1) {
    const __m256i eo = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    return _mm256_packs_epi32(_mm256_permutevar8x32_epi32(v0, eo), _mm256_permutevar8x32_epi32(v1, eo));
}

void ks_mxfp8_rows_avx2(const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                        const ks_mxplanes *p, int64_t n) {
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256 lim = _mm256_set1_ps(448.0f), nlim = _mm256_set1_ps(-448.0f);
    const __m256 sub_lim = _mm256_set1_ps(0x1p-6f), magic = _mm256_set1_ps(16384.0f), k512 = _mm256_set1_ps(512.0f);
    const __m256i rnd = _mm256_set1_epi32(0x7FFFF), one = _mm256_set1_epi32(1), keep = _mm256_set1_epi32(~0xFFFFF);
    const __m256i m7ff = _mm256_set1_epi32(0x7FF), b960 = _mm256_set1_epi32(960), seven = _mm256_set1_epi32(7);
    for (int64_t b = 0; b < n / 32; ++b, x += 32) {
        __m256 xv[4];
        __m256i m = _mm256_setzero_si256();
        for (int j = 0; j < 4; ++j) {
            xv[j] = _mm256_loadu_ps(x + 8 * j);
            m = _mm256_max_epi32(m, _mm256_and_si256(_mm256_castps_si256(xv[j]), absmask));
        }
        __m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4E));
        m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xB1));
        const int ef = _mm_cvtsi128_si32(m4) >> 23;
        if (ef == 255) { /* NaN or inf: the NaN block */
            ks_mxfp8_nan_block(b, y, codes, ev, scales, p);
            continue;
        }
        const int sb = ef - 8 < 0 ? 0 : ef - 8 > 254 ? 254 : ef - 8;
        const __m256 inv = _mm256_set1_ps(sb == 254 ? 0x1p-127f : ks_f32_bits((uint32_t)(254 - sb) << 23));
        const __m256 s = _mm256_set1_ps(ks_e8m0_lut[sb]);
        __m256 r[4];
        __m256i c[4] = {0}, hi[4] = {0}, lo[4] = {0};
        for (int j = 0; j < 4; ++j) {
            __m256 v = _mm256_mul_ps(xv[j], inv);
            v = _mm256_min_ps(_mm256_max_ps(v, nlim), lim);
            const __m256i vb = _mm256_castps_si256(v);
            const __m256i sgn = _mm256_andnot_si256(absmask, vb);
            const __m256 a = _mm256_castsi256_ps(_mm256_and_si256(vb, absmask));
            const __m256 small = _mm256_cmp_ps(a, sub_lim, _CMP_LT_OQ);
            const __m256 rs = _mm256_sub_ps(_mm256_add_ps(a, magic), magic);
            const __m256i ab = _mm256_castps_si256(a);
            const __m256i bit = _mm256_and_si256(_mm256_srli_epi32(ab, 20), one);
            const __m256i rn = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(ab, rnd), bit), keep);
            const __m256 ra = _mm256_blendv_ps(_mm256_castsi256_ps(rn), rs, small); /* |r| */
            r[j] = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(ra), sgn));
            if (y) _mm256_storeu_ps(y + 32 * b + 8 * j, _mm256_mul_ps(r[j], s));
            if (ev) _mm256_storeu_ps(ev + 32 * b + 8 * j, r[j]);
            if (codes) {
                const __m256 rsmall = _mm256_cmp_ps(ra, sub_lim, _CMP_LT_OQ);
                const __m256i cn = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(ra), 20), m7ff), b960);
                const __m256i cs = _mm256_cvttps_epi32(_mm256_mul_ps(ra, k512));
                c[j] = _mm256_or_si256(_mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(cn), _mm256_castsi256_ps(cs), rsmall)),
                                       _mm256_srli_epi32(sgn, 24));
            }
            if (p) { /* a / 8 toward zero: add 7 to negatives, shift */
                const __m256i ai = _mm256_cvttps_epi32(_mm256_mul_ps(r[j], k512));
                hi[j] = _mm256_srai_epi32(_mm256_add_epi32(ai, _mm256_and_si256(_mm256_srai_epi32(ai, 31), seven)), 3);
                lo[j] = _mm256_sub_epi32(ai, _mm256_slli_epi32(hi[j], 3));
            }
        }
        if (codes) { /* 4 x 8 int32 in 0..255 -> 32 bytes in order */
            const __m256i q = _mm256_packus_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
            _mm256_storeu_si256((__m256i *)(codes + 32 * b),
                                _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
        if (scales) scales[b] = (uint8_t)sb;
        if (p) {
            _mm256_storeu_si256((__m256i *)(p->hi + 32 * b), planes_half(hi[0], hi[1]));
            _mm256_storeu_si256((__m256i *)(p->hi + 32 * b + 16), planes_half(hi[2], hi[3]));
            _mm256_storeu_si256((__m256i *)(p->lo + 32 * b), planes_half(lo[0], lo[1]));
            _mm256_storeu_si256((__m256i *)(p->lo + 32 * b + 16), planes_half(lo[2], lo[3]));
            p->scale[2 * b] = ks_pow2f(sb - 134 - p->w_log2);
            p->scale[2 * b + 1] = ks_pow2f(sb - 137 - p->w_log2);
            const __m256i any = _mm256_or_si256(_mm256_or_si256(lo[0], lo[1]), _mm256_or_si256(lo[2], lo[3]));
            p->has_lo[b] = !_mm256_testz_si256(any, any);
        }
    }
}
