"""CuTe DSL's file cache raced by several processes (issue 21, "every hit counted"): the
calls of cutlass/base_dsl/cache_helpers.py in their order. To store a kernel a process
makes tmp.pid_<pid>_<uuid>/ in the cache dir, writes cute_dsl_<key>.mlir in it,
os.replace()s it up into the cache dir and os.removedirs() the temp dir; to look one up
it checks os.path.exists and reads the file. PROCS processes go through the same KEYS
kernels together (a barrier per key, so their stores and loads of one kernel race); each
counts what it loaded from the cache. Prints {"loads": N, "compiles": M} and exits 0
when every byte read was right.

    cutedsl_race.py --root DIR [--procs 6] [--keys 40]
"""

import argparse
import json
import multiprocessing
import os
import random
import sys
import uuid

import common


def save_ir(root, key, data):
    name = f"cute_dsl_{key}.mlir"
    temp_dir = os.path.join(root, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
    os.makedirs(temp_dir, exist_ok=False)
    temp = os.path.join(temp_dir, name)
    with open(temp, "wb") as f:
        f.write(data)
    os.replace(temp, os.path.join(root, name))
    os.removedirs(temp_dir)


def worker(root, keys, barrier, seed, out):
    rng = random.Random(seed)
    loads = compiles = 0
    for i in range(keys):
        key = common.key_of("cutedsl-race", i)
        data = common.content(key, "mlir", 2000, 20000)
        path = os.path.join(root, f"cute_dsl_{key}.mlir")
        barrier.wait()
        for _ in range(rng.randrange(200)):  # a little skew between the processes
            pass
        if os.path.exists(path):
            common.expect_bytes(path, data)
            loads += 1
        else:
            save_ir(root, key, data)
            compiles += 1
    out.put((loads, compiles))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--procs", type=int, default=6)
    parser.add_argument("--keys", type=int, default=40)
    args = parser.parse_args()
    os.makedirs(args.root, exist_ok=True)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(args.procs)
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(args.root, args.keys, barrier, seed, out))
             for seed in range(args.procs)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            common.fail(f"a worker exited {p.exitcode}")
    print(json.dumps({"loads": sum(r[0] for r in results),
                      "compiles": sum(r[1] for r in results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
