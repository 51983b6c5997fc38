/* kernelslot native: the AVX-512 VNNI integer kernels of the MX path for MXFP4 weights (MXFP8
 * activations), compiled with the AVX-512 F/BW/VL/DQ flags plus -mavx512vnni; called only where
 * the CPU has AVX512_VNNI (ks_native.c checks it).  Contract and planes: ks_mxint_avx2.c.
 *
 * Lane = row.  Four consecutive 4-row tiles (16 rows) are decoded together: per 32-block, 16
 * vectors of 16 dwords, vector kp holding in lane i the int16 pair (W[i][e], W[i][e']) of row i
 * (W = 2·e2m1, |W| <= 12) for the two elements (e, e') that the activation planes store in dword
 * kp (ks_mxfp8_planes' order: kp 0-3 = (4m, 4m+2), 4-7 = (4m+1, 4m+3), 8-11 = (16+4m, 18+4m),
 * 12-15 = (17+4m, 19+4m), m = kp % 4).  Lane i = row r of tile q is i = 4q + r.  Per token and
 * block: vpmaddwd + 15 vpdpwssd, each with the token's plane dword kp broadcast from memory, give
 * 16 int32 lanes, the exact block sums S of the 16 rows (32 products: |S| <= 32·12·28672 < 2^24,
 * so the int32 -> fp32 conversion is exact; lo plane: |lo| < 8); then, per lane, one multiply by
 * the row's weight scale 2^(sw-127) (exact) and one FMA by the plane scale (2^(sb-134) hi,
 * 2^(sb-137) lo: planes with w_log2 = 0) add the block into one fp32 accumulator per (row, token).  Order: every block's
 * hi part, kb ascending, then the lo parts of the flagged blocks, kb ascending — the same in the
 * fused (few tokens) and the decode-once kernels, so the bits depend neither on the thread count
 * nor on how many tokens share the expert.  (Not the AVX2 kernels' bits: they keep 2 partial
 * fp32 sums per row, lanes of 16 products.)
 *
 * Decode of a block (4 tiles of 64 code bytes, byte j of a row = codes j | j+16 << 4): a
 * 2-level vpermt2d transpose makes D_m, whose lane i is dword m (bytes 4m..4m+3) of row i; then
 * vpermw on a 32-word table (entry c = W(c & 15): only each index word's bits 0-4 are read, bit 4
 * is ignored by the duplication) of D_m, D_m >> 8, D_m >> 4 and D_m >> 12 gives the 4 vectors of
 * kp = m, 4+m, 8+m, 12+m: the low word of each dword indexes with the nibble at its bits 0-3, the
 * high word with the nibble at bits 16-19, which are exactly the element pairs above.  Per block
 * (512 weights): 4 loads, 8 vpermt2d, 12 shifts, 16 vpermw, and the scale vector (~8 ops); per
 * token 16 multiply-adds (32 MACs each), 1 convert, 1 multiply, 1 FMA.
 */
#include "ks_native.h"
#include <immintrin.h>

#define R KS_TILE_ROWS
#define BLK (R * 17) /* bytes of one MXFP4 tile block: 4 x 16 code bytes, then 4 scale bytes */
#define INLINE static inline __attribute__((always_inline))
#define KS_PF 4096   /* software prefetch distance in each tile's stream (as the other AVX-512 kernels) */

INLINE __m512i w_table(void) {
    static const int16_t t[32] __attribute__((aligned(64))) = {
        0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
        0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    return _mm512_load_si512((const void *)t);
}

/* The tile-block pointers of block kb (ntl < 4: missing tiles read as zero codes). */
typedef struct { const uint8_t *p[4]; int ntl; int64_t stride; } tiles4;

/* Software prefetch of each tile's stream KS_PF bytes ahead of block kb; past its tile's end the
 * stream continues in the same tile of the next group (4 tiles on), which is what it reads next
 * (4 KB ahead in address order would land in the next tile of this group, already being read). */
INLINE void prefetch_blocks(const tiles4 *t, int kb) {
    int64_t off = (int64_t)kb * BLK + KS_PF;
    if (off >= t->stride - 64) off += 3 * t->stride;
    for (int q = 0; q < t->ntl; ++q) {
        _mm_prefetch((const char *)(t->p[q] + off), _MM_HINT_T0);
        _mm_prefetch((const char *)(t->p[q] + off + 64), _MM_HINT_T0);
    }
}

INLINE __m512i load_codes(const tiles4 *t, int q, int kb) {
    return q < t->ntl ? _mm512_loadu_si512((const void *)(t->p[q] + (int64_t)kb * BLK)) : _mm512_setzero_si512();
}

/* Weight scales 2^(s-127) of the 16 rows (lane 4q + r), the values of ks_e8m0_lut. */
INLINE __m512 row_scales(const tiles4 *t, int kb) {
    int32_t s[4];
    for (int q = 0; q < 4; ++q) s[q] = q < t->ntl ? *(const int32_t *)(t->p[q] + (int64_t)kb * BLK + 64) : 0;
    const __m512i b = _mm512_cvtepu8_epi32(_mm_setr_epi32(s[0], s[1], s[2], s[3]));
    __m512i f = _mm512_slli_epi32(b, 23);                                     /* 2^(s-127) for s in 1..254 */
    f = _mm512_mask_mov_epi32(f, _mm512_testn_epi32_mask(b, b), _mm512_set1_epi32(0x00400000)); /* 2^-127 */
    f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7FC00000));
    return _mm512_castsi512_ps(f);
}

/* D[m] lane 4q + r = dword m of row r of tile q (a 16 x 4 dword transpose of the 4 tile vectors). */
INLINE void transpose(const tiles4 *t, int kb, __m512i D[4]) {
    /* level 1: X lane 8mm + 4qq + r = B_{qq} lane 4r + mm (+2 for the high half) */
    const __m512i i1lo = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i i1hi = _mm512_add_epi32(i1lo, _mm512_set1_epi32(2));
    /* level 2: D lane 4q + r = (q < 2 ? X01 : X23) lane 8mm + 4(q & 1) + r */
    const __m512i i2a = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i i2b = _mm512_add_epi32(i2a, _mm512_set1_epi32(8));
    const __m512i b0 = load_codes(t, 0, kb), b1 = load_codes(t, 1, kb), b2 = load_codes(t, 2, kb), b3 = load_codes(t, 3, kb);
    const __m512i x01lo = _mm512_permutex2var_epi32(b0, i1lo, b1), x01hi = _mm512_permutex2var_epi32(b0, i1hi, b1);
    const __m512i x23lo = _mm512_permutex2var_epi32(b2, i1lo, b3), x23hi = _mm512_permutex2var_epi32(b2, i1hi, b3);
    D[0] = _mm512_permutex2var_epi32(x01lo, i2a, x23lo);
    D[1] = _mm512_permutex2var_epi32(x01lo, i2b, x23lo);
    D[2] = _mm512_permutex2var_epi32(x01hi, i2a, x23hi);
    D[3] = _mm512_permutex2var_epi32(x01hi, i2b, x23hi);
}

/* The 4 weight vectors kp = m, 4+m, 8+m, 12+m from D_m (see the header). */
INLINE void expand(__m512i tab, __m512i d, __m512i v[4]) {
    v[0] = _mm512_permutexvar_epi16(d, tab);
    v[1] = _mm512_permutexvar_epi16(_mm512_srli_epi32(d, 8), tab);
    v[2] = _mm512_permutexvar_epi16(_mm512_srli_epi32(d, 4), tab);
    v[3] = _mm512_permutexvar_epi16(_mm512_srli_epi32(d, 12), tab);
}

/* acc + the pair products of w with the dword at p broadcast, as one vpdpwssd with a {1to16}
 * memory operand (GCC does not fold _mm512_set1_epi32 of a load into it). */
INLINE __m512i dpw(__m512i acc, __m512i w, const int16_t *p, int kp) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(((const int32_t *)p)[kp]));
    return acc;
}

/* One token's planes. */
typedef struct { const int16_t *hi, *lo; const float *scale; const uint8_t *has_lo; } tok;
INLINE tok tok_of(const ks_mxplanes *x) { return (tok){x->hi, x->lo, x->scale, x->has_lo}; }

/* acc + fp32(S) * ws * ps: the per-(row, block) arithmetic shared by every kernel here. */
INLINE __m512 add_block(__m512 acc, __m512i s, __m512 ws, const float *ps) {
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), ws), _mm512_set1_ps(*ps), acc);
}

/* Bits i of the flags f[0..n) (n <= 32 used) that are non-zero. */
INLINE uint32_t lo_bits(const uint8_t *f, int n) {
    const __mmask32 m = n >= 32 ? ~0u : (1u << n) - 1;
    return (uint32_t)_mm256_mask_test_epi8_mask(m, _mm256_maskz_loadu_epi8(m, f), _mm256_set1_epi8(-1));
}
/* Run BODY with kb = every block in [kb0, kb0 + nb) (nb <= 32) whose lo plane is used, ascending. */
#define FOR_LO_BLOCKS(x, kb0, nb, kb, BODY)                                        \
    for (uint32_t m_ = lo_bits((x)->has_lo + (kb0), (nb)); m_; m_ &= m_ - 1) {    \
        const int kb = (kb0) + __builtin_ctz(m_);                                 \
        BODY                                                                      \
    }

#ifndef KS_VNNI_KC
#define KS_VNNI_KC 16 /* blocks per chunk (<= 32): the summation order's unit, and decode-once's L1 chunk (17 KB) */
#endif

INLINE void store_rows(__m512 acc, float *res, int ld, int t) {
    float v[16] __attribute__((aligned(64)));
    _mm512_store_ps(v, acc);
    for (int i = 0; i < 16; ++i) res[i * ld + t] = v[i];
}

/* Block kb decoded in registers against nt tokens' plane (lo = 0: hi, 1: lo); s[t] = block sums.
 * Each token's sum runs as 4 independent chains (one per m; vpdpwssd's latency would bound one
 * chain of 16), added at the end: integer, exact, so the order is immaterial. */
INLINE void fused_block(const int nt, __m512i tab, const tiles4 *t, int kb, const tok *x, int lo, __m512i *s) {
    __m512i D[4], c[2][4];
    transpose(t, kb, D);
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
        __m512i v[4];
        expand(tab, D[m], v);
#pragma GCC unroll 2
        for (int k = 0; k < nt; ++k) {
            const int16_t *p = (lo ? x[k].lo : x[k].hi) + 32 * kb;
            c[k][m] = dpw(_mm512_setzero_si512(), v[0], p, m);
            c[k][m] = dpw(c[k][m], v[1], p, 4 + m);
            c[k][m] = dpw(c[k][m], v[2], p, 8 + m);
            c[k][m] = dpw(c[k][m], v[3], p, 12 + m);
        }
    }
    for (int k = 0; k < nt; ++k)
        s[k] = _mm512_add_epi32(_mm512_add_epi32(c[k][0], c[k][1]), _mm512_add_epi32(c[k][2], c[k][3]));
}

/* Decode fused with the dot for nt (1 or 2) tokens: res[i * ld + t], i = 4q + r. */
INLINE void fused(const int nt, const tiles4 *t, int nkb, const ks_mxplanes *const *xp, float *res, int ld) {
    const __m512i tab = w_table();
    tok x[2];
    for (int k = 0; k < nt; ++k) x[k] = tok_of(xp[k]);
    __m512 acc[2];
    for (int k = 0; k < nt; ++k) acc[k] = _mm512_setzero_ps();
    for (int kb0 = 0; kb0 < nkb; kb0 += KS_VNNI_KC) {
        const int nb = nkb - kb0 < KS_VNNI_KC ? nkb - kb0 : KS_VNNI_KC;
        for (int kb = kb0; kb < kb0 + nb; ++kb) {
            prefetch_blocks(t, kb);
            __m512i s[2];
            fused_block(nt, tab, t, kb, x, 0, s);
            const __m512 ws = row_scales(t, kb);
            for (int k = 0; k < nt; ++k) acc[k] = add_block(acc[k], s[k], ws, x[k].scale + 2 * kb);
        }
        for (int k = 0; k < nt; ++k)
            FOR_LO_BLOCKS(&x[k], kb0, nb, kb, {
                __m512i s[1];
                fused_block(1, tab, t, kb, &x[k], 1, s);
                acc[k] = add_block(acc[k], s[0], row_scales(t, kb), x[k].scale + 2 * kb + 1);
            })
    }
    for (int k = 0; k < nt; ++k) store_rows(acc[k], res, ld, k);
}

static tiles4 make_tiles(const uint8_t *tile0, int64_t stride, int ntl) {
    tiles4 t = {{tile0, tile0, tile0, tile0}, ntl, stride};
    for (int q = 0; q < ntl; ++q) t.p[q] = tile0 + q * stride;
    return t;
}

void ks_mxint16_fused_avx512(int nt, const uint8_t *tile0, int64_t stride, int ntl, int nkb,
                             const ks_mxplanes *const *x, float *res, int ld) {
    const tiles4 t = make_tiles(tile0, stride, ntl);
    if (nt == 1) fused(1, &t, nkb, x, res, ld);
    else fused(2, &t, nkb, x, res, ld);
}

/* The decoded group in the scratch: per block the 16 weight vectors (in kp order) and the scales. */
typedef struct { __m512i v[16]; __m512 ws; } dec16;

/* Blocks [kb0, kb0 + nb) of the group into buf (o[0..nb)). */
static void decode_chunk(const tiles4 *tp, int kb0, int nb, dec16 *o) {
    const tiles4 t = *tp;
    const __m512i tab = w_table();
    o -= kb0;
    for (int kb = kb0; kb < kb0 + nb; ++kb) {
        prefetch_blocks(&t, kb);
        __m512i D[4];
        transpose(&t, kb, D);
        for (int m = 0; m < 4; ++m) {
            __m512i v[4];
            expand(tab, D[m], v);
            for (int j = 0; j < 4; ++j) _mm512_store_si512((void *)&o[kb].v[4 * j + m], v[j]);
        }
        o[kb].ws = row_scales(&t, kb);
    }
}

#ifndef KS_VNNI_NB
#define KS_VNNI_NB 4 /* tokens per pass over the decoded group: each weight-vector load serves them all */
#endif

/* The block sums of one token (4 chains, see fused_block). */
INLINE __m512i dot16(const dec16 *d, const int16_t *p) {
    __m512i a[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) a[c] = dpw(_mm512_setzero_si512(), d->v[c], p, c);
#pragma GCC unroll 12
    for (int kp = 4; kp < 16; ++kp) a[kp & 3] = dpw(a[kp & 3], d->v[kp], p, kp);
    return _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
}

#ifndef KS_VNNI_CHAINS
#define KS_VNNI_CHAINS 2 /* independent int32 chains per token in a pass of KS_VNNI_NB tokens */
#endif

/* The decoded chunk b (blocks [kb0, kb0 + nb)) against nt <= KS_VNNI_NB tokens: accm[t] += it
 * (the accumulators live in memory between chunks). */
INLINE void buffered(const int nt, const dec16 *b, int kb0, int nb, const ks_mxplanes *const *xp, __m512 *accm) {
    tok x[KS_VNNI_NB];
    __m512 acc[KS_VNNI_NB];
    for (int k = 0; k < nt; ++k) { x[k] = tok_of(xp[k]); acc[k] = accm[k]; }
    b -= kb0;
    for (int kb = kb0; kb < kb0 + nb; ++kb) {
        const dec16 *d = b + kb;
        __m512i s[KS_VNNI_NB], c[KS_VNNI_NB][KS_VNNI_CHAINS];
#pragma GCC unroll 4
        for (int k = 0; k < nt; ++k)
#pragma GCC unroll 4
            for (int j = 0; j < KS_VNNI_CHAINS; ++j) c[k][j] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int kp = 0; kp < 16; ++kp) {
            const __m512i w = _mm512_load_si512((const void *)&d->v[kp]);
#pragma GCC unroll 4
            for (int k = 0; k < nt; ++k) c[k][kp % KS_VNNI_CHAINS] = dpw(c[k][kp % KS_VNNI_CHAINS], w, x[k].hi + 32 * kb, kp);
        }
#pragma GCC unroll 4
        for (int k = 0; k < nt; ++k) {
            s[k] = c[k][0];
#pragma GCC unroll 4
            for (int j = 1; j < KS_VNNI_CHAINS; ++j) s[k] = _mm512_add_epi32(s[k], c[k][j]);
        }
        const __m512 ws = d->ws;
#pragma GCC unroll 4
        for (int k = 0; k < nt; ++k) acc[k] = add_block(acc[k], s[k], ws, x[k].scale + 2 * kb);
    }
    for (int k = 0; k < nt; ++k) {
        FOR_LO_BLOCKS(&x[k], kb0, nb, kb, {
            acc[k] = add_block(acc[k], dot16(b + kb, x[k].lo + 32 * kb), b[kb].ws, x[k].scale + 2 * kb + 1);
        })
        accm[k] = acc[k];
    }
}

size_t ks_mxint16_scratch_bytes(void) { return (size_t)KS_VNNI_KC * sizeof(dec16) + (size_t)KS_GROUP_MAX * sizeof(__m512); }

/* Decode-once: each chunk of KS_VNNI_KC blocks of the group is decoded into the scratch (L1) and
 * every token, KS_VNNI_NB per pass, runs over it; res[i * nt + t] (i = 4q + r). */
void ks_mxint16_batch_avx512(int nt, const uint8_t *tile0, int64_t stride, int ntl, int nkb,
                             const ks_mxplanes *const *x, float *res, void *scratch) {
    const tiles4 t = make_tiles(tile0, stride, ntl);
    dec16 *b = (dec16 *)scratch;
    __m512 *acc = (__m512 *)(b + KS_VNNI_KC);
    for (int k = 0; k < nt; ++k) acc[k] = _mm512_setzero_ps();
    for (int kb0 = 0; kb0 < nkb; kb0 += KS_VNNI_KC) {
        const int nb = nkb - kb0 < KS_VNNI_KC ? nkb - kb0 : KS_VNNI_KC;
        decode_chunk(&t, kb0, nb, b);
        for (int lo = 0; lo < nt; lo += KS_VNNI_NB) {
            switch (nt - lo < KS_VNNI_NB ? nt - lo : KS_VNNI_NB) {
            case 1: buffered(1, b, kb0, nb, x + lo, acc + lo); break;
#if KS_VNNI_NB >= 3
            case 3: buffered(3, b, kb0, nb, x + lo, acc + lo); break;
#endif
#if KS_VNNI_NB >= 4
            case 4: buffered(4, b, kb0, nb, x + lo, acc + lo); break;
#endif
            default: buffered(2, b, kb0, nb, x + lo, acc + lo); break;
            }
        }
    }
    for (int k = 0; k < nt; ++k) store_rows(acc[k], res, nt, k);
}
