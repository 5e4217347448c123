// A second translation unit linked with params.cu into an executable: the
// executable's .nv_fatbin section then holds one fatbin container per unit.
extern "C" __global__ void main_kernel(int* p, int n) {
    p[n] = n;
}

int main() {
    return 0;
}
