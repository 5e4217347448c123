// Kernels with known parameter lists for the loader's introspection tests. Expected
// offsets and sizes are asserted in tests/loader/expected.hpp; keep the two in step.

#include <cstdio>

struct alignas(16) Vec4 {  // 16 bytes, aligned to 16
    float x, y, z, w;
};
struct Mixed {  // 24 bytes, aligned to 8
    char c;
    double d;
    int i;
};

extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void no_params() {}

extern "C" __global__ void by_value(Vec4 v, Mixed m, char c, short s, double* out) {
    out[0] = v.x + v.w + m.d + m.i + m.c + c + s;
}

extern "C" __global__ void many_params(float* out, int a0, int a1, int a2, int a3, int a4, int a5,
                                       int a6, int a7, int a8, int a9, int a10, int a11, int a12,
                                       int a13, int a14, int a15, char last) {
    out[0] = static_cast<float>(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 +
                                a13 + a14 + a15 + last);
}

// Not a kernel: must not be listed.
__device__ __noinline__ int triple(int x) {
    return 3 * x;
}

// A C++ kernel: listed under its mangled name, _Z10cpp_kernelix.
__global__ void cpp_kernel(int a, long long b) {
    if (a == 7) printf("%lld %d\n", b, triple(a));
}
