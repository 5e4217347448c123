// The loader's GPU tests: stored in a cache entry, loaded and launched through
// libkcache_loader (tests/loader/test_gpu.cpp).
extern "C" __global__ void vector_add(const float* a, const float* b, float* out, int n) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = a[i] + b[i];
}
