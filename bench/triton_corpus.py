"""Writes a real Triton cache: 88 kernels (axpy, softmax and matmul variants) compiled
ahead of time for sm_90 (no GPU, no driver needed), into DIR (TRITON_CACHE_DIR).

    .venv/bin/python bench/triton_corpus.py DIR

kcache-bench-dicts imports DIR to measure stored/raw by file kind with and without
trained dictionaries (bench/README.md, "Trained dictionaries"). Compiling takes a few
minutes on 2 CPUs; a kernel already in DIR is not compiled again.
"""

import os
import sys

if len(sys.argv) != 2:
    sys.exit(__doc__)
os.environ["TRITON_CACHE_DIR"] = os.path.abspath(sys.argv[1])
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


def specs():
    """(function, signature, constexprs, num_warps): 88 distinct kernels."""
    out = []
    for dtype in ("fp32", "fp16", "bf16"):  # 3 x 6 x 2 = 36
        for block in (64, 128, 256, 512, 1024, 2048):
            for warps in (4, 8):
                out.append((axpy_kernel,
                            {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "out_ptr": f"*{dtype}",
                             "alpha": "fp32", "n": "i32", "BLOCK": "constexpr"},
                            {"BLOCK": block}, warps))
    for dtype in ("fp32", "fp16", "bf16"):  # 3 x 4 x 2 = 24
        for block in (128, 256, 512, 1024):
            for warps in (4, 8):
                out.append((softmax_kernel,
                            {"x_ptr": f"*{dtype}", "out_ptr": "*fp32", "stride": "i32",
                             "n_cols": "i32", "BLOCK_N": "constexpr"},
                            {"BLOCK_N": block}, warps))
    for dtype in ("fp16", "bf16"):  # 2 x 7 x 2 = 28
        for bm, bn, bk in ((32, 32, 32), (64, 32, 32), (64, 64, 32), (64, 64, 64),
                           (128, 64, 32), (64, 128, 32), (128, 128, 32)):
            for warps in (4, 8):
                out.append((matmul_kernel,
                            {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": "*fp32",
                             "M": "i32", "N": "i32", "K": "i32", "BM": "constexpr",
                             "BN": "constexpr", "BK": "constexpr"},
                            {"BM": bm, "BN": bn, "BK": bk}, warps))
    return out


def main():
    kernels = specs()
    for i, (fn, signature, constexprs, warps) in enumerate(kernels):
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        triton.compile(src, target=TARGET, options={"num_warps": warps})
        print(f"\r{i + 1}/{len(kernels)} kernels", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
