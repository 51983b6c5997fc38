/* Rejected: parameter 2 (rows) is an int32_t (4 bytes) in the object; the manifest declares 8. */
#include <math.h>
#include <stdint.h>
#define KS_EXPORT __attribute__((visibility("default")))

KS_EXPORT void ks_silu_f32(const float *x, float *out, int32_t rows, int64_t d, int64_t xs, int64_t os) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < d; j++) {
            double g = x[r * xs + j], u = x[r * xs + d + j];
            out[r * os + j] = (float)(g / (1.0 + exp(-g)) * u);
        }
}
