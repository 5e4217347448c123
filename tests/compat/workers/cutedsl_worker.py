"""CuTe DSL (nvidia-cutlass-dsl) kernels JIT-compiled for sm_90a with CUTE_DSL_CACHE_DIR
taken from the environment; writes a JSON report: per kernel whether CuTe DSL's file
cache had it (loaded) or it was compiled and stored, and how the launch ended.

    python cutedsl_worker.py --out RESULT.json

CuTe DSL caches only on its JIT path (calling the @cute.jit function): cute.compile
(ahead of time) sets no_cache. The JIT path compiles, stores the .mlir file, then
launches, which without a driver fails (cudaErrorInsufficientDriver): the worker
records that failure and goes on. With a GPU the launches run.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.base_dsl import compile_backend  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

FILE_CACHE = []  # per lookup: True (loaded from the file cache) or False
_load = compile_backend.load_cache_from_path


def _counting_load(*args, **kwargs):
    fn = _load(*args, **kwargs)
    FILE_CACHE.append(fn is not None)
    return fn


compile_backend.load_cache_from_path = _counting_load


@cute.kernel
def axpy_kernel(gX: cute.Tensor, gY: cute.Tensor, alpha: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    gY[i] = gX[i] * alpha + gY[i]


@cute.jit
def axpy(mX: cute.Tensor, mY: cute.Tensor, alpha: cutlass.Constexpr, threads: cutlass.Constexpr):
    axpy_kernel(mX, mY, alpha).launch(grid=(cute.size(mX) // threads, 1, 1),
                                      block=(threads, 1, 1))


VARIANTS = [(torch.float32, 2.0, 128), (torch.float32, 3.0, 256), (torch.float32, 0.5, 64),
            (torch.float32, 1.5, 512)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    kernels = []
    start = time.perf_counter()
    for dtype, alpha, threads in VARIANTS:
        x = torch.ones(1024, dtype=dtype)
        y = torch.ones(1024, dtype=dtype)
        before = len(FILE_CACHE)
        launch = "ok"
        try:
            axpy(from_dlpack(x), from_dlpack(y), alpha, threads)
        except Exception as e:  # no driver: the launch fails after compile and store
            launch = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        lookups = FILE_CACHE[before:]
        kernels.append({"label": f"axpy_{str(dtype).split('.')[-1]}_{alpha}_{threads}",
                        "file_cache": lookups, "launch": launch})
    report = {"kernels": kernels, "seconds": time.perf_counter() - start, "pid": os.getpid()}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
