"""Compiles a few Wave GEMM kernels ahead of time for an AMD target (gfx942; no GPU
needed: IREE compiles to a .vmfb) with WAVE_CACHE_DIR taken from the environment, and
writes a JSON report: per kernel its hash (the cache directory's name), and Wave's own
cache counters (hits: loaded from WAVE_CACHE_DIR, misses: compiled).

    python wave_worker.py --out RESULT.json
"""

import argparse
import json
import os
import sys
import time

from wave_lang.kernel.wave.cache import get_cache_manager
from wave_lang.kernel.wave.compile import WaveCompileOptions, wave_compile
from wave_lang.kernel.wave.constraints import MMAType
from wave_lang.kernel.wave.templates.gemm import get_gemm_kernel

VARIANTS = [
    ((256, 256, 128), (64, 64, 32)),
    ((512, 256, 128), (64, 64, 32)),
    ((256, 512, 256), (128, 64, 32)),
    ((128, 128, 64), (32, 32, 16)),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cache = get_cache_manager()
    kernels = []
    start = time.perf_counter()
    for shape, block in VARIANTS:
        gemm, hyper, _ = get_gemm_kernel(shape, False, MMAType.F32_16x16x16_F16,
                                         block_shape=block)
        options = WaveCompileOptions(subs=hyper, canonicalize=True, target="gfx942",
                                     device="hip")
        hits, misses = cache.cache_hits, cache.cache_misses
        wave_compile(options, gemm)
        kernels.append({"label": f"gemm_{'x'.join(map(str, shape))}_{block[0]}",
                        "hash": options.kernel_hash,
                        "hit": cache.cache_hits - hits, "miss": cache.cache_misses - misses})
    report = {"kernels": kernels, "seconds": time.perf_counter() - start,
              "hits": cache.cache_hits, "misses": cache.cache_misses, "pid": os.getpid()}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
