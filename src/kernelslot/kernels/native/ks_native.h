/* kernelslot native CPU MoE decode kernels: shared declarations.
 *
 * Contract (see docs/native.md): weights are repacked once, in Python, into row tiles of
 * KS_TILE_ROWS rows.  A tile is one sequential stream: for every contraction block of
 * KS_KBLOCK elements, the data of its rows ([row][data bytes]) immediately followed by the
 * rows' block scales ([row][scale bytes]); tiles are padded to 64 bytes.  Gate/up tiles
 * interleave rows (gate i, up i, gate i+1, up i+1); down tiles are 4 consecutive output rows.
 * FP4 rows store byte j = code[j] | code[j+16] << 4 inside each 32-element block (NVFP4:
 * elements 0..15 are the first 16-block, 16..31 the second; two E4M3 scale bytes).  bf16 rows
 * store dword p = e[p] | e[p+16] << 16 (p = 0..15) inside each 32-element block, so a shift of
 * a load gives elements p in order and a mask of the same load elements p+16 (KS_BF16_POS).
 * Weights are dequantised exactly; products are exact; sums are fp32.
 */
#ifndef KS_NATIVE_H
#define KS_NATIVE_H
#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define KS_TILE_ROWS 4
#define KS_KBLOCK 32
/* Byte offset of element e (0..31) inside a bf16 row-block of the prepared layout. */
#define KS_BF16_POS(e) (4 * ((e) & 15) + 2 * ((e) >> 4))
#define KS_GROUP_MAX 64 /* pairs per expert group in one kernel pass */

enum ks_format {
    KS_F32 = 0, KS_BF16 = 1, KS_F16 = 2, KS_FP8ROW = 3, KS_MXFP8 = 4, KS_MXFP4 = 5, KS_NVFP4 = 6,
    KS_NUM_FORMATS = 7
};
enum ks_isa { KS_ISA_PORTABLE = 0, KS_ISA_AVX2 = 1, KS_ISA_AVX512 = 2, KS_ISA_AVX512BF16 = 3 };
int ks_isa_supported(int isa);  /* whether this CPU runs isa (ks_native.c) */
int ks_best_isa(void);
enum ks_act_kind { KS_ACT_SWISH = 0, KS_ACT_GELU = 1, KS_ACT_GELU_TANH = 2 };

typedef struct {
    int32_t format, num_experts, hidden, inter;
    const uint8_t *gate_up;      /* [E][inter/2 tiles][gu_tile_stride] */
    const uint8_t *down;         /* [E][hidden/4 tiles][dn_tile_stride] */
    int64_t gu_tile_stride, dn_tile_stride;  /* bytes */
    const float *gu_row_scale;   /* fp8_row: (E, 2I) gate rows then up rows, else NULL */
    const float *dn_row_scale;   /* fp8_row: (E, H), else NULL */
    const float *gu_outer;       /* nvfp4: (E,), else NULL */
    const float *dn_outer;       /* nvfp4: (E,), else NULL */
    const float *gu_bias;        /* (E, 2I) or NULL */
    const float *dn_bias;        /* (E, H) or NULL */
    int32_t bf16_scales_ok;      /* mxfp4: every E8M0 scale byte in [2, 252] (bf16 MX path) */
} ks_experts;

typedef struct {
    int32_t kind;                /* enum ks_act_kind */
    float alpha, up_bias;
    int32_t has_gate_lo, has_gate_hi, has_up_lo, has_up_hi;
    float gate_lo, gate_hi, up_lo, up_hi;
} ks_act;

/* One routed (expert, token) pair list, grouped by expert. */
typedef struct {
    int32_t expert;      /* local expert id */
    int32_t first;       /* index of its first pair in the pair arrays */
    int32_t count;       /* number of pairs (tokens) */
} ks_group;

/* MXFP8 activations as exact int16 planes (ks_mxfp8_planes; the integer MX path of MXFP4, AVX2 and AVX-512 VNNI): per row of
 * n elements, hi / lo hold n int16: per 32-block the element groups {0,2..14} {1,3..15}
 * {16,18..30} {17,19..31}, with 512·r = 8·hi + lo for each E4M3 value r; per block the fp32 scales 2^(sb-134-w_log2) and
 * 2^(sb-137-w_log2) (NaN for sb = 0xFF) and a byte: lo non-zero. */
typedef struct {
    int16_t *hi, *lo;
    float *scale;     /* 2 per block: 2^(sb-134-w_log2) (hi), 2^(sb-137-w_log2) (lo) */
    uint8_t *has_lo;  /* 1 per block */
    int32_t w_log2;   /* log2 of the factor the kernel's integer weights carry: 8 (AVX2, words 256·W), 0 (VNNI, W) */
} ks_mxplanes;

/* Row `row` (of n elements each) of a planes buffer. */
static inline ks_mxplanes ks_planes_row(const ks_mxplanes *b, int64_t row, int64_t n) {
    ks_mxplanes r = {b->hi + row * n, b->lo + row * n, b->scale + row * (n / 16), b->has_lo + row * (n / 32), b->w_log2};
    return r;
}

typedef struct {
    const ks_experts *ex;
    const ks_act *act;
    const float *x;          /* (T, H) activations the gate/up reads (maybe MXFP8 q-dq) */
    int64_t T;
    const ks_group *groups;
    int32_t num_groups;
    const int32_t *pair_token;   /* (P,) token of each pair */
    const float *pair_weight;    /* (P,) multiplier of each pair (1 under NO_SCALE) */
    float *inter;                /* (P, I) workspace: SwiGLU intermediate per pair */
    int32_t quantize_inter;      /* MXFP8 q-dq of the intermediate before down */
    float *out;                  /* (T, H) accumulator */
    const uint16_t *xb;          /* bf16 MX path: x in the bf16-duplicated layout, else NULL */
    uint16_t *inter_b;           /* bf16 MX path: (P, 2I) duplicated intermediate, else NULL */
    const float *xd;             /* AVX2 FP4 path: x (T, 2H) in the fp4pair layout, else NULL */
    float *inter_d;              /* AVX2 FP4 path: (P, 2I) fp4pair intermediate, else NULL */
    const ks_mxplanes *xi;       /* AVX2 MX path (MXFP4): planes of x (T rows of H), else NULL */
    const ks_mxplanes *inter_i;  /* AVX2 MX path (MXFP4): planes of the intermediate (P rows of I) */
    const float *xf;             /* AVX2 FP8: x (T, H) permuted and scaled (ks_fp8_act_avx2), else NULL */
    const float *xf_unscale;     /* AVX2 FP8: (T,) the 2^-a of each row of xf */
    float *inter_f;              /* AVX2 FP8: (P, I) the intermediate likewise (its own phase) */
    float *inter_f_unscale;      /* AVX2 FP8: (P,) */
    int64_t num_pairs;           /* P: routed (token, expert) pairs */
    int *next_item;              /* the gate/up and down phases' work-item counter, 0 at each start */
    int32_t mxq;                 /* MXFP8 quantiser: KS_ISA_PORTABLE (scalar), _AVX2 or _AVX512 (same bits) */
} ks_call;

/* Bytes of one contraction block of a tile (data then scales of its KS_TILE_ROWS rows). */
static inline int ks_block_bytes(int fmt) {
    static const int data[KS_NUM_FORMATS] = {128, 64, 64, 32, 32, 16, 16};
    static const int scale[KS_NUM_FORMATS] = {0, 0, 0, 0, 1, 1, 2};
    return KS_TILE_ROWS * (data[fmt] + scale[fmt]);
}

/* The thread pool (ks_pool.c): fn(arg, tid, nth) for tid < nth, the caller is tid 0. */
typedef void (*ks_pool_fn)(void *arg, int tid, int nth);
void ks_pool_run(ks_pool_fn fn, void *arg, int nth);
void ks_pool_lock(void);
void ks_pool_unlock(void);
void ks_pool_warm(int nth);  /* exported: wake nth-1 workers, untimed (benchmarks) */

#if defined(__x86_64__)
/* AVX2 FP4 kernels (ks_fp4_avx2.c); nv = 1 for NVFP4, 0 for MXFP4; xd in the fp4pair layout. */
void ks_fp4_tile_fused_avx2(int nv, int nt, const uint8_t *tile, int nkb, int bstride,
                            const float *const *xd, float *res);          /* nt <= 2 */
/* blocks [kb0, kb0 + nb) of a tile as exact fp32 weights, buf[block][row][32] (decode-once) */
void ks_fp4_decode_chunk_avx2(int nv, const uint8_t *tile, int kb0, int nb, int bstride, float *buf);
/* AVX2 integer MX-path kernels for MXFP4 (ks_mxint_avx2.c). */
void ks_mxint_tile_fused_avx2(int nt, const uint8_t *tile, int nkb, const ks_mxplanes *const *x, float *res); /* nt <= 2 */
size_t ks_mxint_scratch_bytes(int nkb);
void ks_mxint_tile_decode_avx2(const uint8_t *tile, int nkb, void *buf);
void ks_mxint_dot_avx2(int nt, const void *buf, int nkb, const ks_mxplanes *const *x, float *res);
/* AVX-512 VNNI integer MX-path kernels for MXFP4 (ks_mxint_avx512.c; only where ks_vnni_supported()):
 * a group of ntl <= 4 consecutive tiles, stride bytes apart (16 rows, lane = row i = 4q + r);
 * results res[i * ld + t] (batch: ld = nt). */
int ks_vnni_supported(void);
int ks_vbmi_supported(void); /* AVX512_VBMI: the bf16 MX path for MXFP8 weights (vpermi2b) */
void ks_mxint16_fused_avx512(int nt, const uint8_t *tile0, int64_t stride, int ntl, int nkb,
                             const ks_mxplanes *const *x, float *res, int ld);       /* nt <= 2 */
size_t ks_mxint16_scratch_bytes(void);  /* of the decode-once kernel (64-byte aligned) */
void ks_mxint16_batch_avx512(int nt, const uint8_t *tile0, int64_t stride, int ntl, int nkb,
                             const ks_mxplanes *const *x, float *res, void *scratch);  /* nt <= KS_GROUP_MAX */
/* AVX2 FP8 kernels (ks_fp8_avx2.c); mx = 1 for MXFP8, 0 for FP8-row; xf rows from
 * ks_fp8_act_avx2; every result is the dot times 2^a of its activation row. */
float ks_fp8_act_avx2(const float *x, int64_t n, float *xf);  /* permute, scale by 2^a; returns 2^-a */
void ks_fp8_tile_fused_avx2(int mx, int nt, const uint8_t *tile, int nkb, const float *const *xf, float *res); /* nt <= 2 */
/* blocks [kb0, kb0 + nb) of a tile as exact fp32 weights, buf[block][row][32] (decode-once) */
void ks_fp8_decode_chunk_avx2(int mx, const uint8_t *tile, int kb0, int nb, float *buf);
#endif

/* Per-ISA phases, thread `tid` of `nth` (each covers a disjoint slice). */
void ks_gate_up_portable(const ks_call *c, int tid, int nth);
void ks_down_portable(const ks_call *c, int tid, int nth);
double ks_read_portable(const uint8_t *p, int64_t n);
#if defined(__x86_64__)
void ks_gate_up_avx2(const ks_call *c, int tid, int nth);
void ks_down_avx2(const ks_call *c, int tid, int nth);
double ks_read_avx2(const uint8_t *p, int64_t n);
void ks_gate_up_avx512(const ks_call *c, int tid, int nth);
void ks_down_avx512(const ks_call *c, int tid, int nth);
double ks_read_avx512(const uint8_t *p, int64_t n);
void ks_gate_up_avx512bf16(const ks_call *c, int tid, int nth);
void ks_down_avx512bf16(const ks_call *c, int tid, int nth);
double ks_read_avx512bf16(const uint8_t *p, int64_t n);
#endif

/* Shared scalar helpers (ks_native.c). */
extern float ks_e4m3_lut[256];       /* E4M3 byte -> fp32 */
extern float ks_e8m0_lut[256];       /* E8M0 byte -> fp32 2^(b-127), 0xFF -> NaN */
extern float ks_e8m0_p120_lut[256];  /* 2^(b-7): E8M0 scale times 2^120 (fp8 bit trick) */
extern float ks_e8m0_p8_lut[256];    /* 2^(b-119): E8M0 scale times 2^8 (AVX-512 fp8 decode through fp16) */
extern const float ks_e2m1_values[16];
/* [0: MXFP4 E8M0, 1: NVFP4 E4M3][scale byte][16 low bytes, 16 high bytes of bf16(e2m1[c] * scale)] */
extern uint8_t ks_fp4_bf16[2][256][32];
/* the same values as fp32: [kind][scale byte][code] (AVX-512 FP4 decode: one vpermps each) */
extern float ks_fp4_f32[2][256][16];
/* [0: low byte, 1: high byte][E4M3 magnitude code 0..127] of bf16(|value|), 0x7F read as 480 (the bf16 MX path for MXFP8) */
extern uint8_t ks_e4m3_bf16[2][128];
float ks_half_to_float(uint16_t h);
float ks_apply_act(const ks_act *a, float g, float u);
/* The MXFP8 online quantiser (E4M3, floor E8M0, blocks of 32) over n elements (n % 32 == 0):
 * y = q-dq values (may alias x), codes = E4M3 bytes, ev = E4M3 values, scales = E8M0 bytes, p =
 * the exact int16 planes, each only if non-NULL.  impl: KS_ISA_PORTABLE (the scalar reference),
 * KS_ISA_AVX2 or KS_ISA_AVX512 (vector versions, only where the CPU has them): the same bits. */
void ks_mxfp8_rows(int impl, const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                   const ks_mxplanes *p, int64_t n);
void ks_mxfp8_rows_scalar(const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                          const ks_mxplanes *p, int64_t n);
#if defined(__x86_64__)
void ks_mxfp8_rows_avx2(const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                        const ks_mxplanes *p, int64_t n);
void ks_mxfp8_rows_avx512(const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                          const ks_mxplanes *p, int64_t n);
#endif
/* Shared by the vector quantisers (ks_mxfp8_avx2.c, ks_mxfp8_avx512.c). */
static inline float ks_f32_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
/* 2^k for -149 <= k <= 127 as ldexpf(1.0f, k) gives it: exact, and a denormal one by a multiply,
 * so that it is 0 under flush-to-zero, as the scalar code's ldexpf. */
static inline float ks_pow2f(int k) {
    return k >= -126 ? ks_f32_bits((uint32_t)(k + 127) << 23) : ks_f32_bits((uint32_t)(k + 127 + 64) << 23) * 0x1p-64f;
}
/* Block b's outputs for a block holding NaN or inf (scale byte 0xFF), as the scalar reference writes them. */
static inline void ks_mxfp8_nan_block(int64_t b, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                                      const ks_mxplanes *p) {
    if (y) for (int i = 0; i < 32; ++i) y[32 * b + i] = NAN;
    if (codes) memset(codes + 32 * b, 0x7F, 32);
    if (ev) memset(ev + 32 * b, 0, 32 * sizeof(float));
    if (scales) scales[b] = 0xFF;
    if (p) {
        memset(p->hi + 32 * b, 0, 64);
        memset(p->lo + 32 * b, 0, 64);
        p->scale[2 * b] = p->scale[2 * b + 1] = NAN;
        p->has_lo[b] = 0;
    }
}
/* MXFP8 quantise-dequantise of n elements (n % 32 == 0). */
void ks_mxfp8_qdq(int impl, const float *x, float *y, int64_t n);
/* The same q-dq into y (may alias x) plus the exact int16 planes of the quantised values. */
void ks_mxfp8_planes(int impl, const float *x, float *y, ks_mxplanes p, int64_t n);
/* n elements (n % 32 == 0) -> per 32-block 64 bf16 words: [e0..15, e0..15, e16..31, e16..31]
 * (truncation; exact for values with <= 8 significant bits, e.g. MXFP8 q-dq values). */
void ks_to_bf16_dup(const float *x, uint16_t *y, int64_t n);
/* n elements (n % 8 == 0) -> 2n floats, per group of 8: elements 0 2 4 6 twice, then 1 3 5 7
 * twice (the activation layout of the AVX2 FP4 kernels). */
void ks_to_fp4pair(const float *x, float *y, int64_t n);

#endif
