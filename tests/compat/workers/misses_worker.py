"""Compiles one variant of a Triton kernel ahead of time for sm_90 (no GPU needed), or
runs one JAX function, with the cache directory taken from the environment, so that
kcache can explain each miss (tests/compat/compat.py, scenario misses).

    python misses_worker.py --out RESULT.json triton VARIANT [--src DIR]
    python misses_worker.py --out RESULT.json jax STATIC

Triton VARIANT: base (num_warps 4, BLOCK 128), warps8, block256, edited (another body),
comment (base with a comment changed on a line: the key changes, the cubin does not),
scale (another kernel). The kernel's module is written to DIR/misses_kernels.py (the
same path every time: Triton's debug info holds the path and line numbers, so only the
comment differs). JAX: jit of f(x, k) with k static (TRITON_CACHE_DIR and
JAX_COMPILATION_CACHE_DIR name the caches).
"""

import argparse
import importlib
import json
import os
import sys

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

BODY = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # {comment}
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, {expr}, mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)
'''


def triton_variant(variant, src_dir):
    comment = "offsets of this block" if variant != "comment" else "this block's offsets"
    expr = "x + y" if variant != "edited" else "x * y + y"
    path = os.path.join(src_dir, "misses_kernels.py")
    with open(path, "w") as f:
        f.write(BODY.format(comment=comment, expr=expr))
    sys.path.insert(0, src_dir)
    import triton
    from triton.backends.compiler import GPUTarget
    mod = importlib.import_module("misses_kernels")
    if variant == "scale":
        fn = mod.scale_kernel
        sig = {"x_ptr": "*fp32", "out_ptr": "*fp32", "alpha": "fp32", "n": "i32",
               "BLOCK": "constexpr"}
    else:
        fn = mod.add_kernel
        sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
               "BLOCK": "constexpr"}
    block = 256 if variant == "block256" else 128
    warps = 8 if variant == "warps8" else 4
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": block})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    from triton.runtime.cache import get_cache_manager
    return {"variant": variant, "hash": kernel.hash,
            "dir": os.path.basename(get_cache_manager(kernel.hash).cache_dir)}


def jax_run(static):
    import jax
    import jax.numpy as jnp
    from functools import partial
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    @partial(jax.jit, static_argnums=(1,))
    def scaled(x, k):
        return jnp.sin(x) * k + 1.0

    out = scaled(jnp.ones(8), static)
    return {"static": static, "sum": float(out.sum())}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("compiler", choices=["triton", "jax"])
    parser.add_argument("what")
    parser.add_argument("--src", default=None)
    args = parser.parse_args()
    if args.compiler == "triton":
        report = triton_variant(args.what, args.src)
    else:
        report = jax_run(int(args.what))
    report["pid"] = os.getpid()
    with open(args.out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
