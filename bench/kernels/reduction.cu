// Sum of a float array: each block reduces BLOCK elements per step with warp
// shuffles and one shared-memory pass, then one atomicAdd per block.
// Build one configuration per compilation: -DBLOCK=128|256|512.
#ifndef BLOCK
#define BLOCK 256
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
    reduce_sum(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float partial[BLOCK / 32];
    float v = 0.f;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) v += in[i];
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < BLOCK / 32 ? partial[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) atomicAdd(out, v);
    }
}
