// Row-wise softmax, one warp per row: max, sum of exp, normalize (numerically
// stable). Build one configuration per compilation: -DDTYPE=float|half.
#include <cuda_fp16.h>

#ifndef DTYPE
#define DTYPE float
#endif
using half = __half;

__device__ __forceinline__ float load(const float* p) {
    return *p;
}
__device__ __forceinline__ float load(const __half* p) {
    return __half2float(*p);
}
__device__ __forceinline__ void store(float* p, float v) {
    *p = v;
}
__device__ __forceinline__ void store(__half* p, float v) {
    *p = __float2half(v);
}

template <typename T>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* in = x + static_cast<long long>(row) * cols;
    T* out = y + static_cast<long long>(row) * cols;
    float m = -INFINITY;
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, load(in + c));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.f;
    for (int c = lane; c < cols; c += 32) s += __expf(load(in + c) - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float inv = 1.f / s;
    for (int c = lane; c < cols; c += 32) store(out + c, __expf(load(in + c) - m) * inv);
}

template __global__ void softmax_rows<DTYPE>(const DTYPE*, DTYPE*, int, int);
