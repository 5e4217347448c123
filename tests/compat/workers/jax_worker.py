"""Compiles a set of jitted functions on JAX's CPU backend with the persistent
compilation cache in --cache-dir, and writes a JSON report: cache requests, hits and
misses (JAX's own monitoring events), the results, and every warning or error JAX
raised.

    python jax_worker.py --cache-dir DIR --out RESULT.json [--count N] [--max-size BYTES]
                         [--rounds R]

--max-size sets jax_compilation_cache_max_size (JAX's own LRU eviction, under its
.lockfile); -1 (default) disables it.
"""

import argparse
import json
import logging
import os
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import monitoring  # noqa: E402

EVENTS = {}


def _listener(event, **kwargs):
    if event.startswith("/jax/compilation_cache/"):
        EVENTS[event] = EVENTS.get(event, 0) + 1


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(f"{record.name}: {record.getMessage()}")


def family(i):
    """The i-th function: distinct programs (different ops and constants)."""
    kind = i % 4
    if kind == 0:
        return lambda x: jnp.sin(x) * (i + 1) + jnp.cos(x)
    if kind == 1:
        return lambda x: jnp.cumsum(x * (i + 2), axis=-1)
    if kind == 2:
        return lambda x: jnp.tanh(x @ x.T + i)
    return lambda x: jnp.sum(jnp.exp(-x * x) * (i + 3), axis=0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-size", type=int, default=-1)
    args = parser.parse_args()

    capture = _Capture()
    logging.getLogger("jax").addHandler(capture)
    monitoring.register_event_listener(_listener)
    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", args.max_size)
    jax.config.update("jax_enable_compilation_cache", True)

    results = []
    errors = []
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for r in range(args.rounds):
            for i in range(args.count):
                x = np.linspace(0.0, 1.0, 8 * (i % 5 + 2), dtype=np.float32).reshape(-1, 8)
                try:
                    # A fresh jit object each round: JAX's in-memory caches are keyed
                    # by function identity, so every round asks the persistent cache.
                    y = jax.jit(family(i))(x)
                    results.append(float(np.asarray(y, dtype=np.float64).sum()))
                except Exception as e:  # a JAX error is a finding: report, go on
                    errors.append(f"function {i} round {r}: {type(e).__name__}: {e}")
                    results.append(None)
            if args.rounds > 1:
                jax.clear_caches()
    seconds = time.perf_counter() - start
    report = {
        "events": EVENTS,
        "requests": EVENTS.get("/jax/compilation_cache/compile_requests_use_cache", 0),
        "hits": EVENTS.get("/jax/compilation_cache/cache_hits", 0),
        "misses": EVENTS.get("/jax/compilation_cache/cache_misses", 0),
        "results": results,
        "errors": errors,
        "warnings": [str(w.message) for w in caught] + capture.records,
        "seconds": seconds,
        "pid": os.getpid(),
        "jax": jax.__version__,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
