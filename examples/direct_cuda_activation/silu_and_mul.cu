// activation.silu_and_mul as a sealed CUBIN (cuda.cubin.v1): one thread per output cell.
// Leading dimensions arrive as (n0, n1) with strides in elements; a rank-2 call reads a broadcast
// leading dimension (n0 = 1, stride 0). The flat cell index is split with the referee-built
// CUTLASS FastDivmod of d; out is never assumed contiguous.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

struct FastDivmod { int32_t divisor; uint32_t multiplier; uint32_t shift_right; };

__device__ __forceinline__ int64_t fast_div(const FastDivmod &dm, int64_t n) {
    return dm.divisor == 1 ? n : (int64_t)(__umulhi((uint32_t)n, dm.multiplier) >> dm.shift_right);
}

template <typename T>
__device__ void silu_and_mul(const T *x, T *out, int64_t cells, int64_t n1, FastDivmod d, int64_t xs0, int64_t xs1,
                             int64_t xs2, int64_t os0, int64_t os1, int64_t os2) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= cells) return;
    int64_t row = fast_div(d, i), j = i - row * d.divisor;
    int64_t a = row / n1, b = row % n1;
    float g = (float)x[a * xs0 + b * xs1 + j * xs2], u = (float)x[a * xs0 + b * xs1 + (d.divisor + j) * xs2];
    out[a * os0 + b * os1 + j * os2] = (T)(g / (1.0f + expf(-g)) * u);
}

#define SILU(NAME, T)                                                                                            \
    extern "C" __global__ void NAME(const T *x, T *out, int64_t cells, int64_t n1, FastDivmod d, int64_t xs0,   \
                                    int64_t xs1, int64_t xs2, int64_t os0, int64_t os1, int64_t os2) {           \
        silu_and_mul<T>(x, out, cells, n1, d, xs0, xs1, xs2, os0, os1, os2);                                     \
    }

SILU(ks_silu_and_mul_bf16, __nv_bfloat16)
SILU(ks_silu_and_mul_f16, __half)
SILU(ks_silu_and_mul_f32, float)
