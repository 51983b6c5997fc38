/* kernelslot native CPU MoE decode path: entry points, routing groups, threads, ISA choice,
 * the activation and the MXFP8 online quantiser (bit-exact with kernelslot.formats.quantize_mx:
 * E4M3 elements, E8M0 scale byte = clamp(exponent_field(amax) - 8, 0, 254), elements
 * x * 2^(127-b) saturated to ±448 and rounded to nearest even).  Layout: ks_native.h.
 */
#include "ks_native.h"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

float ks_e4m3_lut[256];
float ks_e8m0_lut[256];
float ks_e8m0_p120_lut[256];
float ks_e8m0_p8_lut[256];
uint8_t ks_fp4_bf16[2][256][32];
float ks_fp4_f32[2][256][16] __attribute__((aligned(64)));
uint8_t ks_e4m3_bf16[2][128] __attribute__((aligned(64)));
const float ks_e2m1_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static float f32_from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t bits_from_f32(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

float ks_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexpf((float)(man | 0x400), (int)exp - 25);
    return f32_from_bits(bits_from_f32(v) | sign);
}

__attribute__((constructor)) static void ks_init_tables(void) {
    for (int b = 0; b < 256; ++b) {
        const int e = (b >> 3) & 0xF, m = b & 7;
        const float mag = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10); /* 0x7F: 480 */
        const float v = (b & 0x7F) == 0x7F ? NAN : mag;
        ks_e4m3_lut[b] = (b & 0x80) ? -v : v;
        ks_e8m0_lut[b] = b == 255 ? NAN : ldexpf(1.0f, b - 127);
        ks_e8m0_p120_lut[b] = b == 255 ? NAN : ldexpf(1.0f, b - 7);
        ks_e8m0_p8_lut[b] = b == 255 ? NAN : ldexpf(1.0f, b - 119);
        if (b < 128) { /* exact: <= 4 significant bits; 0x7F is 480 as in the kernels' decodes */
            const uint32_t h = bits_from_f32(mag) >> 16;
            ks_e4m3_bf16[0][b] = (uint8_t)(h & 0xFF);
            ks_e4m3_bf16[1][b] = (uint8_t)(h >> 8);
        }
    }
    for (int kind = 0; kind < 2; ++kind)
        for (int b = 0; b < 256; ++b)
            for (int c = 0; c < 16; ++c) { /* exact: the low 16 bits of the fp32 product are 0 */
                const uint32_t v = bits_from_f32(ks_e2m1_values[c] * (kind ? ks_e4m3_lut[b] : ks_e8m0_lut[b])) >> 16;
                ks_fp4_bf16[kind][b][c] = (uint8_t)(v & 0xFF);
                ks_fp4_bf16[kind][b][16 + c] = (uint8_t)(v >> 8);
                ks_fp4_f32[kind][b][c] = ks_e2m1_values[c] * (kind ? ks_e4m3_lut[b] : ks_e8m0_lut[b]);
            }
}

float ks_apply_act(const ks_act *a, float g, float u) {
    if (a->has_gate_lo) g = fmaxf(g, a->gate_lo);
    if (a->has_gate_hi) g = fminf(g, a->gate_hi);
    if (a->has_up_lo) u = fmaxf(u, a->up_lo);
    if (a->has_up_hi) u = fminf(u, a->up_hi);
    float act;
    if (a->kind == KS_ACT_GELU) act = 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
    else if (a->kind == KS_ACT_GELU_TANH)
        act = 0.5f * g * (1.0f + tanhf(0.79788456080286536f * (g + 0.044715f * g * g * g)));
    else act = g / (1.0f + expf(-a->alpha * g));
    return act * (u + a->up_bias);
}

/* RNE of |y| <= 448 onto the E4M3 grid; returns the rounded value (sign kept). */
static inline float e4m3_round(float y) {
    const uint32_t sign = bits_from_f32(y) & 0x80000000u;
    const float a = fabsf(y);
    float r;
    if (a < 0x1p-6f) {
        volatile float t = a + 16384.0f; /* ulp(2^14) = 2^-9, the E4M3 subnormal step */
        r = t - 16384.0f;
    } else {
        uint32_t u = bits_from_f32(a);
        u = (u + 0x7FFFFu + ((u >> 20) & 1u)) & ~0xFFFFFu;
        r = f32_from_bits(u);
    }
    return f32_from_bits(bits_from_f32(r) | sign);
}

static inline uint8_t e4m3_code(float r) { /* r already on the grid, |r| <= 448 */
    const uint32_t b = bits_from_f32(r), sign = (b >> 24) & 0x80u;
    const float a = fabsf(r);
    if (a < 0x1p-6f) return (uint8_t)(sign | (uint32_t)(a * 512.0f));
    const uint32_t exp = ((b >> 23) & 0xFF) - 127 + 7, man = (b >> 20) & 7u;
    return (uint8_t)(sign | (exp << 3) | man);
}

static inline uint8_t e8m0_floor_e4m3(float amax) {
    const int ef = (int)((bits_from_f32(amax) >> 23) & 0xFF);
    if (ef == 255) return 0xFF;
    int b = ef - 8;
    return (uint8_t)(b < 0 ? 0 : b > 254 ? 254 : b);
}

/* Quantise one 32-element block; writes codes (if non-NULL), returns the scale byte, the
 * dequantised values in y (if non-NULL, may alias x) and the E4M3 values in ev (if non-NULL). */
static uint8_t mxfp8_block(const float *x, float *y, uint8_t *codes, float *ev) {
    float amax = 0.0f;
    int nan = 0;
    for (int i = 0; i < 32; ++i) { float a = fabsf(x[i]); if (a != a) nan = 1; amax = a > amax ? a : amax; }
    const uint8_t sb = nan ? 0xFF : e8m0_floor_e4m3(amax);
    if (sb == 0xFF) {
        for (int i = 0; i < 32; ++i) { if (y) y[i] = NAN; if (codes) codes[i] = 0x7F; if (ev) ev[i] = 0.0f; }
        return sb;
    }
    const float inv = sb == 254 ? 0x1p-127f : ldexpf(1.0f, 127 - sb), scale = ks_e8m0_lut[sb];
    for (int i = 0; i < 32; ++i) {
        float v = x[i] * inv;
        v = v > 448.0f ? 448.0f : v < -448.0f ? -448.0f : v;
        const float r = e4m3_round(v);
        if (codes) codes[i] = e4m3_code(r);
        if (ev) ev[i] = r;
        if (y) y[i] = r * scale;
    }
    return sb;
}

/* The scalar reference over n elements (n % 32 == 0): y (may alias x), codes, ev (E4M3 values),
 * scales (E8M0 bytes) and the planes p, each only if non-NULL.  The vector versions
 * (ks_mxfp8_avx512.c, ks_mxfp8_avx2.c) give the same bits for every input. */
void ks_mxfp8_rows_scalar(const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                          const ks_mxplanes *p, int64_t n) {
    float evb[32];
    for (int64_t b = 0; b < n / 32; ++b) {
        float *e = p ? evb : ev ? ev + 32 * b : NULL;
        const uint8_t sb = mxfp8_block(x + 32 * b, y ? y + 32 * b : NULL, codes ? codes + 32 * b : NULL, e);
        if (scales) scales[b] = sb;
        if (p && ev) memcpy(ev + 32 * b, evb, sizeof evb);
        if (!p) continue;
        int16_t *hi = p->hi + 32 * b, *lo = p->lo + 32 * b;
        int any = 0;
        for (int i = 0; i < 32; ++i) {
            const int32_t a = (int32_t)(evb[i] * 512.0f), h = a / 8; /* exact: |a| < 2^18 */
            const int pos = (i & 16) | (i & 1) << 3 | (i & 15) >> 1; /* group * 8 + index */
            hi[pos] = (int16_t)h;
            lo[pos] = (int16_t)(a - 8 * h);
            any |= a - 8 * h;
        }
        p->scale[2 * b] = sb == 0xFF ? NAN : ldexpf(1.0f, sb - 134 - p->w_log2);
        p->scale[2 * b + 1] = sb == 0xFF ? NAN : ldexpf(1.0f, sb - 137 - p->w_log2);
        p->has_lo[b] = any != 0;
    }
}

/* Whether the quantiser runs vector code: KERNELSLOT_NATIVE_MXFP8_SCALAR=1 forces the scalar
 * reference (read per call: tests and A/B runs switch it). */
static int mxq_scalar_forced(void) {
    const char *v = getenv("KERNELSLOT_NATIVE_MXFP8_SCALAR");
    return v && v[0] == '1' && !v[1];
}

/* The quantiser for a call on `isa`: the vector version of that ISA (avx512bf16: the AVX-512 one),
 * the scalar reference for portable or when forced.  Same bits in every case. */
static int mxq_for_isa(int isa) {
    if (mxq_scalar_forced()) return KS_ISA_PORTABLE;
    if (isa == KS_ISA_AVX512BF16) isa = KS_ISA_AVX512;
    return ks_isa_supported(isa) ? isa : KS_ISA_PORTABLE;
}

void ks_mxfp8_rows(int impl, const float *x, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                   const ks_mxplanes *p, int64_t n) {
#if defined(__x86_64__)
    if (impl == KS_ISA_AVX512) { ks_mxfp8_rows_avx512(x, y, codes, ev, scales, p, n); return; }
    if (impl == KS_ISA_AVX2) { ks_mxfp8_rows_avx2(x, y, codes, ev, scales, p, n); return; }
#endif
    (void)impl;
    ks_mxfp8_rows_scalar(x, y, codes, ev, scales, p, n);
}

void ks_mxfp8_qdq(int impl, const float *x, float *y, int64_t n) { ks_mxfp8_rows(impl, x, y, NULL, NULL, NULL, NULL, n); }

void ks_mxfp8_planes(int impl, const float *x, float *y, ks_mxplanes p, int64_t n) {
    ks_mxfp8_rows(impl, x, y, NULL, NULL, NULL, &p, n);
}

/* Test hook: every output of the quantiser of `impl` (a KS_ISA_* the CPU supports; avx512bf16
 * as avx512; -1: the one ks_moe_experts would pick for the best ISA) over n elements; NULL
 * outputs are skipped (planes when hi is NULL).  Returns 0, -1 bad n, -4 unsupported impl. */
int ks_mxfp8_rows_hook(int impl, const float *x, int64_t n, float *y, uint8_t *codes, float *ev, uint8_t *scales,
                       int16_t *hi, int16_t *lo, float *pscale, uint8_t *has_lo, int w_log2) {
    if (n < 0 || n % 32) return -1;
    if (impl < 0) impl = mxq_for_isa(ks_best_isa());
    if (impl == KS_ISA_AVX512BF16) impl = KS_ISA_AVX512;
    if (impl > KS_ISA_AVX512 || !ks_isa_supported(impl)) return -4;
    ks_mxplanes p = {hi, lo, pscale, has_lo, w_log2};
    ks_mxfp8_rows(impl, x, y, codes, ev, scales, hi ? &p : NULL, n);
    return 0;
}

void ks_to_bf16_dup(const float *x, uint16_t *y, int64_t n) {
    for (int64_t b = 0; b < n; b += 32, x += 32, y += 64)
        for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 16; ++i) {
                const uint16_t v = (uint16_t)(bits_from_f32(x[16 * h + i]) >> 16);
                y[32 * h + i] = v;
                y[32 * h + 16 + i] = v;
            }
}

void ks_to_fp4pair(const float *x, float *y, int64_t n) {
    for (int64_t g = 0; g < n; g += 8, x += 8, y += 16)
        for (int i = 0; i < 4; ++i) y[i] = y[4 + i] = x[2 * i], y[8 + i] = y[12 + i] = x[2 * i + 1];
}

/* Test hook: (rows, cols) fp32 -> E4M3 codes (rows, cols) and E8M0 scales (rows, cols/32), with the
 * quantiser ks_moe_experts picks for the best ISA. */
int ks_mxfp8_quantize(const float *x, int64_t rows, int64_t cols, uint8_t *codes, uint8_t *scales) {
    if (cols % 32) return -1;
    const int impl = mxq_for_isa(ks_best_isa());
    for (int64_t r = 0; r < rows; ++r)
        ks_mxfp8_rows(impl, x + r * cols, NULL, codes + r * cols, NULL, scales + r * (cols / 32), NULL, cols);
    return 0;
}

/* ---------------------------------------------------------------- ISA selection */
/* A per-vendor choice: environment variable `name` set to 1 or 0 forces it (read per call: tests
 * and A/B runs switch it), else on for AMD CPUs. */
static int forced_or_amd(const char *name) {
    const char *v = getenv(name);
    if (v && (v[0] == '0' || v[0] == '1') && !v[1]) return v[0] == '1';
#if defined(__x86_64__)
    return __builtin_cpu_is("amd");
#else
    return 0;
#endif
}

/* Whether avx512bf16 runs MXFP4 and (with AVX512_VBMI) MXFP8 weights on the MX path with vdpbf16ps
 * (the bf16 MX path) or with the fp32 kernels on the q-dq activations (same exact products, other
 * fp32 summation order).  Measured on AMD Zen 4: MXFP4 1.1-1.3x faster than the fp32 kernels
 * (docs/native.md, "Figures"), MXFP8 1.5-1.8x hot and 1.01-1.09x cold ("bf16 MX path for MXFP8");
 * MXFP4 1.1-1.7x slower on an Intel Sapphire Rapids-class Xeon ("AVX-512 pass"), so by vendor;
 * KERNELSLOT_NATIVE_BF16_MX=1 / 0 forces it (read per call: tests switch it). */
static int bf16_mx_path_wanted(void) { return forced_or_amd("KERNELSLOT_NATIVE_BF16_MX"); }

/* Whether the AVX-512 variants run MXFP4 on the MX path with the VNNI integer kernels
 * (ks_mxint_avx512.c) where the CPU has AVX512_VNNI and the bf16 MX path is not chosen;
 * KERNELSLOT_NATIVE_VNNI_MX=0 turns them off (the fp32 kernels on the q-dq activations run
 * instead; read per call: tests and A/B runs switch it). */
static int vnni_mx_wanted(void) {
    const char *v = getenv("KERNELSLOT_NATIVE_VNNI_MX");
    return !(v && v[0] == '0' && !v[1]);
}

/* Whether the AVX-512 variants run FP8 (MXFP8 / FP8-row) groups of at most 2 tokens with the AVX2
 * fused kernels (ks_fp8_avx2.c: the exponent-rebias decode, FMAs only, subnormal codes as fp32
 * denormals) instead of their own fp16 decode, which exists for Intel (a microcode assist on every
 * denormal operand: "AVX-512 pass" in docs/native.md).  Measured hot on AMD Zen 4 (1 thread, one
 * expert, H = I = 1024): 4.62 against 6.19 cycles per 32 weights at T=1, 6.72 against 7.39 at T=2,
 * and slower from T=4 (13.0 against 9.5), hence only for <= 2 tokens; by vendor, like
 * bf16_mx_path_wanted.  KERNELSLOT_NATIVE_FP8_REBIAS=1 / 0 forces it (read per call). */
static int fp8_rebias_wanted(void) { return forced_or_amd("KERNELSLOT_NATIVE_FP8_REBIAS"); }

int ks_vnni_supported(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

int ks_vbmi_supported(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
#else
    return 0;
#endif
}

int ks_isa_supported(int isa) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (isa == KS_ISA_AVX512BF16)
        return ks_isa_supported(KS_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
    if (isa == KS_ISA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
    if (isa == KS_ISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
#endif
    return isa == KS_ISA_PORTABLE;
}

int ks_best_isa(void) {
    if (ks_isa_supported(KS_ISA_AVX512BF16)) return KS_ISA_AVX512BF16;
    if (ks_isa_supported(KS_ISA_AVX512)) return KS_ISA_AVX512;
    if (ks_isa_supported(KS_ISA_AVX2)) return KS_ISA_AVX2;
    return KS_ISA_PORTABLE;
}

typedef void (*phase_fn)(const ks_call *, int, int);
typedef double (*read_fn)(const uint8_t *, int64_t);

static int pick(int isa, phase_fn *gu, phase_fn *dn, read_fn *rd) {
    if (!ks_isa_supported(isa)) return -4;
#if defined(__x86_64__)
    if (isa == KS_ISA_AVX512BF16) { *gu = ks_gate_up_avx512bf16; *dn = ks_down_avx512bf16; *rd = ks_read_avx512bf16; return 0; }
    if (isa == KS_ISA_AVX512) { *gu = ks_gate_up_avx512; *dn = ks_down_avx512; *rd = ks_read_avx512; return 0; }
    if (isa == KS_ISA_AVX2) { *gu = ks_gate_up_avx2; *dn = ks_down_avx2; *rd = ks_read_avx2; return 0; }
#endif
    *gu = ks_gate_up_portable; *dn = ks_down_portable; *rd = ks_read_portable;
    return 0;
}

/* ---------------------------------------------------------------- threads */
/* Each phase runs on nth threads (the caller is thread 0) and is joined before the next:
 * the join is the barrier.  If a thread cannot be created its slice runs on the caller. */
typedef struct {
    ks_call *call;
    const float *h;       /* raw hidden (T, H) */
    float *xq;            /* MXFP8 q-dq hidden or NULL */
    phase_fn fn;          /* NULL: the activation phase (MXFP8 q-dq, bf16 / fp4pair layouts) */
    int tid, nth;
} ks_task;

static void run_task(ks_task *k) {
    if (k->fn) { k->fn(k->call, k->tid, k->nth); return; }
    const int64_t H = k->call->ex->hidden, T = k->call->T;
    const int64_t lo = T * k->tid / k->nth, hi = T * (k->tid + 1) / k->nth;
    if (k->xq && k->call->xi)
        for (int64_t t = lo; t < hi; ++t) ks_mxfp8_planes(k->call->mxq, k->h + t * H, k->xq + t * H, ks_planes_row(k->call->xi, t, H), H);
    else if (k->xq) ks_mxfp8_qdq(k->call->mxq, k->h + lo * H, k->xq + lo * H, (hi - lo) * H);
    const float *x = k->xq ? k->xq : k->h;
    if (k->call->xb) ks_to_bf16_dup(x + lo * H, (uint16_t *)k->call->xb + lo * 2 * H, (hi - lo) * H);
    if (k->call->xd) ks_to_fp4pair(x + lo * H, (float *)k->call->xd + lo * 2 * H, (hi - lo) * H);
#if defined(__x86_64__)
    if (k->call->xf)
        for (int64_t t = lo; t < hi; ++t)
            ((float *)k->call->xf_unscale)[t] = ks_fp8_act_avx2(x + t * H, H, (float *)k->call->xf + t * H);
#endif
}

#if defined(__x86_64__)
/* Between gate/up and down (AVX2 FP8): the intermediate rows in the ks_fp8_act_avx2 layout;
 * a row's scale needs the whole row, which the gate/up threads each wrote a slice of. */
static void inter_fp8_phase(const ks_call *c, int tid, int nth) {
    const int64_t I = c->ex->inter, P = c->num_pairs;
    for (int64_t p = P * tid / nth; p < P * (tid + 1) / nth; ++p)
        c->inter_f_unscale[p] = ks_fp8_act_avx2(c->inter + p * I, I, c->inter_f + p * I);
}
#endif

static void task_main(void *arg, int tid, int nth) {
    ks_task k = *(const ks_task *)arg;
    k.tid = tid; k.nth = nth;
    run_task(&k);
}

/* Run one phase on nth threads of the pool (ks_pool.c); returns when every slice is done. */
static void run_phase(ks_task proto, int nth) { ks_pool_run(task_main, &proto, nth); }

/* Planes buffer of n elements (n % 32 == 0) for kernels whose integer weights carry 2^w_log2; 0 or -1. */
static int planes_alloc(ks_mxplanes *p, int64_t n, int w_log2) {
    p->w_log2 = w_log2;
    p->hi = malloc(sizeof(int16_t) * (size_t)(n + 1));
    p->lo = malloc(sizeof(int16_t) * (size_t)(n + 1));
    p->scale = malloc(sizeof(float) * (size_t)(n / 16 + 1));
    p->has_lo = malloc((size_t)(n / 32 + 1));
    return p->hi && p->lo && p->scale && p->has_lo ? 0 : -1;
}

static void planes_free(ks_mxplanes *p) { free(p->hi); free(p->lo); free(p->scale); free(p->has_lo); }

/* ---------------------------------------------------------------- entry points */
/* out[t] += sum_k w(t,k) * down_e(act(gate_up_e(x_t))), e = ids[t,k]; ids < 0 skipped.
 * Returns 0, or -1 bad argument, -2 expert id out of range, -3 resources, -4 ISA unsupported. */
int ks_moe_experts(const ks_experts *ex, const ks_act *act, const float *h, int64_t T,
                   const int32_t *ids, const float *wts, int64_t K, int post_scale, int quant_act,
                   float *out, int nthreads, int isa) {
    if (!ex || !act || !h || !ids || !out || T < 0 || K <= 0 || (post_scale && !wts)) return -1;
    if (ex->format < 0 || ex->format >= KS_NUM_FORMATS || ex->hidden % KS_KBLOCK ||
        ex->inter % KS_KBLOCK || ex->hidden <= 0 || ex->inter <= 0)
        return -1;
    phase_fn gu, dn;
    read_fn rd;
    int rc = pick(isa, &gu, &dn, &rd);
    if (rc) return rc;
    const int E = ex->num_experts;
    const int64_t P_max = T * K;
    for (int64_t p = 0; p < P_max; ++p)
        if (ids[p] >= E || ids[p] < -1) return -2;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 64) nthreads = 64;

    int32_t *count = calloc((size_t)E + 1, sizeof(int32_t));
    int32_t *pair_token = malloc(sizeof(int32_t) * (size_t)(P_max + 1));
    float *pair_weight = malloc(sizeof(float) * (size_t)(P_max + 1));
    ks_group *groups = malloc(sizeof(ks_group) * (size_t)(E + P_max / KS_GROUP_MAX + 1));
    float *inter = malloc(sizeof(float) * (size_t)(P_max * ex->inter + 1));
    float *xq = quant_act ? malloc(sizeof(float) * (size_t)(T * ex->hidden + 1)) : NULL;
    const int bf16_path = isa == KS_ISA_AVX512BF16 && quant_act && bf16_mx_path_wanted() &&
                          ((ex->format == KS_MXFP4 && ex->bf16_scales_ok) || (ex->format == KS_MXFP8 && ks_vbmi_supported()));
    uint16_t *xb = bf16_path ? malloc(sizeof(uint16_t) * (size_t)(2 * T * ex->hidden + 1)) : NULL;
    uint16_t *inter_b = bf16_path ? malloc(sizeof(uint16_t) * (size_t)(2 * P_max * ex->inter + 1)) : NULL;
    const int avx512 = isa == KS_ISA_AVX512 || isa == KS_ISA_AVX512BF16;
    const int mxint_path = quant_act && ex->format == KS_MXFP4 &&
                           (isa == KS_ISA_AVX2 || (avx512 && !bf16_path && ks_vnni_supported() && vnni_mx_wanted()));
    const int fp4pair_path = isa == KS_ISA_AVX2 && !mxint_path && (ex->format == KS_MXFP4 || ex->format == KS_NVFP4);
    const int fp8_path = (ex->format == KS_FP8ROW || ex->format == KS_MXFP8) && !bf16_path &&
                         (isa == KS_ISA_AVX2 || (avx512 && fp8_rebias_wanted()));
    float *xf = fp8_path ? malloc(sizeof(float) * (size_t)(T * ex->hidden + T + 1)) : NULL;
    float *inter_f = fp8_path ? malloc(sizeof(float) * (size_t)(P_max * ex->inter + P_max + 1)) : NULL;
    ks_mxplanes xi = {0}, ii = {0};
    float *xd = fp4pair_path ? malloc(sizeof(float) * (size_t)(2 * T * ex->hidden + 1)) : NULL;
    float *inter_d = fp4pair_path ? malloc(sizeof(float) * (size_t)(2 * P_max * ex->inter + 1)) : NULL;
    if (!count || !pair_token || !pair_weight || !groups || !inter || (quant_act && !xq) ||
        (bf16_path && (!xb || !inter_b)) || (fp4pair_path && (!xd || !inter_d)) || (fp8_path && (!xf || !inter_f))) {
        rc = -3;
        goto done;
    }
    const int w_log2 = isa == KS_ISA_AVX2 ? 8 : 0; /* AVX2 words 256·W, VNNI W */
    if (mxint_path && (planes_alloc(&xi, T * ex->hidden, w_log2) || planes_alloc(&ii, P_max * ex->inter, w_log2))) { rc = -3; goto done; }

    /* Counting sort of the routed pairs by expert, token order kept inside an expert. */
    for (int64_t p = 0; p < P_max; ++p) if (ids[p] >= 0) count[ids[p] + 1]++;
    for (int e = 0; e < E; ++e) count[e + 1] += count[e];
    int ng = 0;  /* groups of at most KS_GROUP_MAX pairs (an id repeated within a row can exceed T) */
    for (int e = 0; e < E; ++e)
        for (int first = count[e]; first < count[e + 1]; first += KS_GROUP_MAX, ++ng) {
            groups[ng].expert = e;
            groups[ng].first = first;
            groups[ng].count = count[e + 1] - first < KS_GROUP_MAX ? count[e + 1] - first : KS_GROUP_MAX;
        }
    for (int64_t p = 0; p < P_max; ++p) {
        const int e = ids[p];
        if (e < 0) continue;
        const int slot = count[e]++;
        pair_token[slot] = (int32_t)(p / K);
        pair_weight[slot] = post_scale ? wts[p] : 1.0f;
    }
    if (ng == 0) goto done;
    if (nthreads > ex->inter / KS_KBLOCK) nthreads = ex->inter / KS_KBLOCK;

    const int64_t P = count[E]; /* routed pairs */
    ks_call call = {ex, act, quant_act ? xq : h, T, groups, ng, pair_token, pair_weight, inter, quant_act, out,
                    xb, inter_b, xd, inter_d, mxint_path ? &xi : NULL, mxint_path ? &ii : NULL,
                    xf, xf ? xf + T * ex->hidden : NULL, inter_f, inter_f ? inter_f + P_max * ex->inter : NULL, P, NULL,
                    mxq_for_isa(isa)};
    int next_item = 0;  /* reset before each phase; the pool's post publishes it */
    call.next_item = &next_item;
    ks_task proto = {&call, h, xq, NULL, 0, 1};
    ks_pool_lock();
    if (quant_act || xd || xf) run_phase(proto, T < nthreads ? (int)T : nthreads);
    proto.fn = gu;
    next_item = 0;
    run_phase(proto, nthreads);
#if defined(__x86_64__)
    if (inter_f) {
        proto.fn = inter_fp8_phase;
        run_phase(proto, P < nthreads ? (int)P : nthreads);
    }
#endif
    proto.fn = dn;
    next_item = 0;
    run_phase(proto, nthreads);
    ks_pool_unlock();
done:
    free(count); free(pair_token); free(pair_weight); free(groups); free(inter); free(xq); free(xb); free(inter_b); free(xd); free(inter_d);
    free(xf); free(inter_f);
    planes_free(&xi); planes_free(&ii);
    return rc;
}

typedef struct { const uint8_t *p; int64_t n; read_fn rd; double sum; } ks_read_job;

static void *read_main(void *arg) {
    ks_read_job *j = (ks_read_job *)arg;
    j->sum = j->rd(j->p, j->n);
    return NULL;
}

/* Read n bytes with nthreads threads (n % (256 * nthreads) == 0); returns a checksum. */
double ks_read_bandwidth_probe(const uint8_t *p, int64_t n, int nthreads, int isa) {
    phase_fn gu, dn;
    read_fn rd;
    if (pick(isa, &gu, &dn, &rd) || nthreads < 1 || nthreads > 64) return NAN;
    ks_read_job jobs[64];
    pthread_t th[64];
    const int64_t chunk = n / nthreads;
    for (int t = 0; t < nthreads; ++t) { jobs[t].p = p + chunk * t; jobs[t].n = chunk; jobs[t].rd = rd; jobs[t].sum = 0; }
    int started = 1;
    for (int t = 1; t < nthreads; ++t) { if (pthread_create(&th[t], NULL, read_main, &jobs[t])) break; ++started; }
    read_main(&jobs[0]);
    double s = jobs[0].sum;
    for (int t = 1; t < started; ++t) { pthread_join(th[t], NULL); s += jobs[t].sum; }
    for (int t = started; t < nthreads; ++t) s += rd(jobs[t].p, jobs[t].n);
    return s;
}

/* Repack one matrix (rows x K logical, row-major source) into the tile layout of ks_native.h
 * (per 32-block: the 4 rows' data, then their scales).
 * data: row_bytes per row (natural FP4 packing: even element in the low nibble); scales:
 * scale_row_bytes per row (or NULL); order: source row of each destination row; dst: rows/4
 * tiles of tile_stride bytes (the caller zeroes the padding).  Returns 0 or -1. */
int ks_repack_matrix(int fmt, const uint8_t *data, int64_t row_bytes, const uint8_t *scales,
                     int64_t scale_row_bytes, int64_t rows, int64_t K, const int64_t *order,
                     uint8_t *dst, int64_t tile_stride) {
    if (K % KS_KBLOCK || rows % KS_TILE_ROWS || fmt < 0 || fmt >= KS_NUM_FORMATS) return -1;
    const int64_t nkb = K / KS_KBLOCK, db = row_bytes / nkb;
    const int64_t sb = scales ? scale_row_bytes / nkb : 0;
    const int fp4 = fmt == KS_MXFP4 || fmt == KS_NVFP4;
    for (int64_t t = 0; t < rows / KS_TILE_ROWS; ++t) {
        uint8_t *tile = dst + t * tile_stride;
        const int64_t bs = KS_TILE_ROWS * (db + sb);
        for (int r = 0; r < KS_TILE_ROWS; ++r) {
            const int64_t src = order[t * KS_TILE_ROWS + r];
            if (src < 0 || src >= rows) return -1;
            const uint8_t *srow = data + src * row_bytes;
            for (int64_t kb = 0; kb < nkb; ++kb) {
                uint8_t *d = tile + kb * bs + r * db;
                const uint8_t *s = srow + kb * db;
                if (fp4) {
                    uint8_t c[32];
                    for (int j = 0; j < 16; ++j) { c[2 * j] = s[j] & 15; c[2 * j + 1] = s[j] >> 4; }
                    for (int j = 0; j < 16; ++j) d[j] = (uint8_t)(c[j] | (c[j + 16] << 4));
                } else if (fmt == KS_BF16) { /* words 2p, 2p+1 = elements p, p+16 (KS_BF16_POS) */
                    uint16_t e[KS_KBLOCK], w[KS_KBLOCK];
                    memcpy(e, s, sizeof e);
                    for (int p = 0; p < KS_KBLOCK / 2; ++p) { w[2 * p] = e[p]; w[2 * p + 1] = e[p + KS_KBLOCK / 2]; }
                    memcpy(d, w, sizeof w);
                } else {
                    memcpy(d, s, (size_t)db);
                }
                if (sb) memcpy(tile + kb * bs + KS_TILE_ROWS * db + r * sb, scales + src * scale_row_bytes + kb * sb, (size_t)sb);
            }
        }
    }
    return 0;
}
