/* moe.fused_experts as a sealed native artifact (generic model: SiLU experts, dense weights).
 *
 * prepare: ks_moe_pack_* converts one weight tensor (any strides) into a referee-allocated
 *          contiguous float32 copy (prepared.w13 / prepared.w2); the raw weights are only read.
 * run:     ks_moe_experts_* computes, for every token m and every routed slot k with
 *          e = ids[m, k] >= 0: acc[m] += w[m, k] * W2[e] @ (silu(g) * u), (g | u) = W13[e] @ x[m],
 *          in float32 in workspace.acc (zeroed by the referee's prelaunch fill), then writes every
 *          cell of out once, honouring its strides. Ids of -1 contribute nothing. */
#include <math.h>
#include "dtypes.h"

#define PACK(SUFFIX)                                                                                \
    KS_EXPORT void ks_moe_pack_##SUFFIX(const void *src, float *dst, int64_t n0, int64_t n1,        \
                                        int64_t n2, int64_t s0, int64_t s1, int64_t s2) {           \
        for (int64_t a = 0; a < n0; a++)                                                            \
            for (int64_t b = 0; b < n1; b++)                                                        \
                for (int64_t c = 0; c < n2; c++)                                                    \
                    dst[(a * n1 + b) * n2 + c] = load_##SUFFIX(src, a * s0 + b * s1 + c * s2);      \
    }

#define EXPERTS(SUFFIX)                                                                             \
    KS_EXPORT void ks_moe_experts_##SUFFIX(                                                         \
        const void *x, const int32_t *ids, const float *w, const float *w13, const float *w2,       \
        void *out, float *acc, float *act, int64_t m_tokens, int64_t top_k, int64_t hidden,         \
        int64_t inter, int64_t experts, int64_t xs0, int64_t xs1, int64_t is0, int64_t is1,         \
        int64_t ws0, int64_t ws1, int64_t os0, int64_t os1) {                                       \
        for (int64_t m = 0; m < m_tokens; m++) {                                                    \
            float *row = acc + m * hidden;                                                          \
            for (int64_t k = 0; k < top_k; k++) {                                                   \
                int64_t e = ids[m * is0 + k * is1];                                                 \
                if (e < 0 || e >= experts) continue;                                                \
                const float *g13 = w13 + e * 2 * inter * hidden, *g2 = w2 + e * hidden * inter;     \
                for (int64_t j = 0; j < inter; j++) {                                               \
                    double g = 0.0, u = 0.0;                                                        \
                    for (int64_t h = 0; h < hidden; h++) {                                          \
                        double xv = load_##SUFFIX(x, m * xs0 + h * xs1);                            \
                        g += g13[j * hidden + h] * xv;                                              \
                        u += g13[(inter + j) * hidden + h] * xv;                                    \
                    }                                                                               \
                    act[j] = (float)(g / (1.0 + exp(-g)) * u);                                      \
                }                                                                                   \
                double weight = w[m * ws0 + k * ws1];                                               \
                for (int64_t h = 0; h < hidden; h++) {                                              \
                    double s = 0.0;                                                                 \
                    for (int64_t j = 0; j < inter; j++) s += g2[h * inter + j] * (double)act[j];    \
                    row[h] += (float)(weight * s);                                                  \
                }                                                                                   \
            }                                                                                       \
            for (int64_t h = 0; h < hidden; h++) store_##SUFFIX(out, m * os0 + h * os1, row[h]);    \
        }                                                                                           \
    }

PACK(f32)
PACK(bf16)
PACK(f16)
EXPERTS(f32)
EXPERTS(bf16)
EXPERTS(f16)
