/* Element conversions shared by the example kernels: float32, bfloat16 (round to nearest even), float16. */
#ifndef DIRECT_EXAMPLE_DTYPES_H
#define DIRECT_EXAMPLE_DTYPES_H
#include <stdint.h>
#include <string.h>

#define KS_EXPORT __attribute__((visibility("default")))

static inline float load_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
static inline void store_f32(void *p, int64_t i, float v) { ((float *)p)[i] = v; }

static inline float load_bf16(const void *p, int64_t i) {
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}
static inline void store_bf16(void *p, int64_t i, float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        bits = 0x7fc00000u; /* NaN stays NaN */
    } else {
        bits += 0x7fffu + ((bits >> 16) & 1u);
    }
    ((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
}

static inline float load_f16(const void *p, int64_t i) { return (float)((const _Float16 *)p)[i]; }
static inline void store_f16(void *p, int64_t i, float v) { ((_Float16 *)p)[i] = (_Float16)v; }
#endif
