// Tiled matrix multiply C = A * B (row-major, M x K times K x N), templated on the
// element type and the tile size; accumulates in float (double for double).
// Build one configuration per compilation: -DDTYPE=float|double|half -DTILE=8|16|32.
#include <cuda_fp16.h>

#ifndef DTYPE
#define DTYPE float
#endif
#ifndef TILE
#define TILE 16
#endif

template <typename T>
struct Acc {
    using type = float;
};
template <>
struct Acc<double> {
    using type = double;
};

template <typename T>
__device__ __forceinline__ typename Acc<T>::type to_acc(T v) {
    return static_cast<typename Acc<T>::type>(v);
}
template <>
__device__ __forceinline__ float to_acc<__half>(__half v) {
    return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T from_acc(typename Acc<T>::type v) {
    return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_acc<__half>(float v) {
    return __float2half(v);
}

template <typename T, int Tile>
__global__ void matmul_tiled(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                             int M, int N, int K) {
    __shared__ T as[Tile][Tile];
    __shared__ T bs[Tile][Tile];
    const int row = blockIdx.y * Tile + threadIdx.y;
    const int col = blockIdx.x * Tile + threadIdx.x;
    typename Acc<T>::type acc = 0;
    for (int k0 = 0; k0 < K; k0 += Tile) {
        const int ak = k0 + threadIdx.x;
        const int bk = k0 + threadIdx.y;
        as[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : from_acc<T>(0);
        bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : from_acc<T>(0);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < Tile; ++k)
            acc += to_acc(as[threadIdx.y][k]) * to_acc(bs[k][threadIdx.x]);
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = from_acc<T>(acc);
}

using half = __half;
template __global__ void matmul_tiled<DTYPE, TILE>(const DTYPE*, const DTYPE*, DTYPE*, int, int,
                                                   int);
