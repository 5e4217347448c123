"""Compiles a fixed set of Triton kernels ahead of time for sm_90 (no GPU, no driver
needed) with TRITON_CACHE_DIR taken from the environment, and writes what happened to
a JSON file: per kernel its cache key directory, metadata, and how many compile stages
ran (0 = loaded from Triton's file cache).

    python triton_worker.py --out RESULT.json [--only LABEL,LABEL...]

Compile stages are counted by wrapping every stage the CUDA backend registers in
add_stages (ttir, ttgir, llir, ptx, cubin): triton.compile calls add_stages only when
its cache lookup failed, so a cached kernel runs none.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.cache import get_cache_manager  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
STAGES_RUN = []  # names of the stages run, in order

_original_add_stages = CUDABackend.add_stages


def _counting_add_stages(self, stages, options, *args, **kwargs):
    _original_add_stages(self, stages, options, *args, **kwargs)
    for name, fn in list(stages.items()):
        def counted(*a, _fn=fn, _name=name, **k):
            STAGES_RUN.append(_name)
            return _fn(*a, **k)
        stages[name] = counted


CUDABackend.add_stages = _counting_add_stages


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
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


def kernel_specs():
    """label -> (jit function, signature, constexprs). 22 distinct kernels."""
    specs = {}
    for dtype in ("fp32", "fp16", "bf16"):
        for block in (64, 128, 256, 512, 1024):
            specs[f"add_{dtype}_{block}"] = (
                add_kernel,
                {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "out_ptr": f"*{dtype}",
                 "n": "i32", "BLOCK": "constexpr"},
                {"BLOCK": block})
    for dtype in ("fp32", "fp16"):
        for block in (128, 256):
            specs[f"scale_{dtype}_{block}"] = (
                scale_kernel,
                {"x_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "alpha": "fp32", "n": "i32",
                 "BLOCK": "constexpr"},
                {"BLOCK": block})
    for block in (128, 256):
        specs[f"softmax_fp32_{block}"] = (
            softmax_kernel,
            {"x_ptr": "*fp32", "out_ptr": "*fp32", "stride": "i32", "n_cols": "i32",
             "BLOCK_N": "constexpr"},
            {"BLOCK_N": block})
    specs["matmul_fp16_64"] = (
        matmul_kernel,
        {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32", "N": "i32",
         "K": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
        {"BM": 64, "BN": 64, "BK": 32})
    return specs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    specs = kernel_specs()
    labels = [x for x in args.only.split(",") if x] or list(specs)
    results = []
    start = time.perf_counter()
    for label in labels:
        fn, signature, constexprs = specs[label]
        before = len(STAGES_RUN)
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        kernel = triton.compile(src, target=TARGET)
        md = kernel.metadata
        results.append({
            "label": label,
            "hash": kernel.hash,
            "dir": os.path.basename(get_cache_manager(kernel.hash).cache_dir),
            "name": md.name,
            "shared": md.shared,
            "num_warps": md.num_warps,
            "params": [k for k, v in signature.items() if v != "constexpr"],
            "param_types": [v for v in signature.values() if v != "constexpr"],
            "stages": STAGES_RUN[before:],
            "cubin_size": len(kernel.asm["cubin"]),
        })
    seconds = time.perf_counter() - start
    with open(args.out, "w") as f:
        json.dump({"kernels": results, "seconds": seconds, "pid": os.getpid(),
                   "triton": triton.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
