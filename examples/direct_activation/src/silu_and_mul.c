/* activation.silu_and_mul as a sealed native artifact: out = silu(x[..., :d]) * x[..., d:].
 *
 * Leading dimensions arrive as (n0, n1) with their strides, so a rank-2 call reads a broadcast
 * leading dimension (n0 = 1, stride 0). Every stride is in elements; out is never assumed
 * contiguous. Arithmetic in double, rounded once to the output dtype. */
#include <math.h>
#include "dtypes.h"

#define SILU_AND_MUL(SUFFIX)                                                                          \
    KS_EXPORT void ks_silu_and_mul_##SUFFIX(const void *x, void *out, int64_t n0, int64_t n1,         \
                                            int64_t d, int64_t xs0, int64_t xs1, int64_t xs2,         \
                                            int64_t os0, int64_t os1, int64_t os2) {                  \
        for (int64_t a = 0; a < n0; a++)                                                              \
            for (int64_t b = 0; b < n1; b++) {                                                        \
                int64_t xrow = a * xs0 + b * xs1, orow = a * os0 + b * os1;                           \
                for (int64_t j = 0; j < d; j++) {                                                     \
                    double g = load_##SUFFIX(x, xrow + j * xs2);                                      \
                    double u = load_##SUFFIX(x, xrow + (d + j) * xs2);                                \
                    store_##SUFFIX(out, orow + j * os2, (float)(g / (1.0 + exp(-g)) * u));            \
                }                                                                                     \
            }                                                                                         \
    }

SILU_AND_MUL(f32)
SILU_AND_MUL(bf16)
SILU_AND_MUL(f16)
