// A kernel whose parameters exceed 4 KiB: ptxas describes them with
// EIATTR_KPARAM_INFO_V2 records instead of EIATTR_KPARAM_INFO.
struct Big {
    float v[2000];  // 8000 bytes
};

extern "C" __global__ void big_param(char c, Big b, short s, double* out) {
    out[0] = b.v[17] + c + s;
}
