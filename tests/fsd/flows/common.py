"""Shared helpers of the compiler-like flows that the kcache-fsd tests run.

Each flow script mimics how one compiler's cache code uses its cache directory, with
the same calls in the same order. `--mode store` compiles N keys (misses) and reads
them back as the compiler would; `--mode lookup` finds and reads every key (hits) and
checks every byte. A script exits 0 on success and 1 with a message on stderr.
"""

import argparse
import hashlib
import os
import sys


def parse_args(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--root", required=True, help="the cache dir (on the mount)")
    parser.add_argument("--mode", required=True, choices=["store", "lookup"])
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--so", default=None, help="a shared library to store and dlopen")
    return parser.parse_args()


def key_of(flow, index):
    return hashlib.sha256(f"{flow}-{index}".encode()).hexdigest()


def content(key, name, min_size=64, max_size=40000):
    """Deterministic bytes for file `name` of `key`: a size from the names, then
    sha256 blocks (incompressible, distinct for every file)."""
    seed = hashlib.sha256(f"{key}/{name}".encode()).digest()
    size = min_size + int.from_bytes(seed[:4], "little") % (max_size - min_size + 1)
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(seed + counter.to_bytes(8, "little")).digest()
        counter += 1
    return bytes(out[:size])


def fail(message):
    print(f"{os.path.basename(sys.argv[0])} (pid {os.getpid()}): {message}",
          file=sys.stderr, flush=True)
    sys.exit(1)


def expect_bytes(path, expected):
    try:
        with open(path, "rb") as f:
            got = f.read()
    except OSError as e:
        fail(f"cannot read {path}: {e}")
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                     min(len(got), len(expected)))
        fail(f"{path}: {len(got)} bytes, expected {len(expected)}; first difference at {first}")
