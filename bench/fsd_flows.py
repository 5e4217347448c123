#!/usr/bin/env python3
"""Compiler-like cache flows on a kcache mount against a plain directory.

Starts kcache-fsd on a fresh db next to a plain directory on the same disk, then
runs each phase on both, alternating, several rounds, and prints the median time
per phase and the ratio mount / plain. Phases:
  store  one process stores N Triton-style entries (tmp dir, write, os.replace,
         os.removedirs; three files: 8 KiB binary, 1 KiB JSON, 16 KiB IR)
  hit    P fresh processes each look up and read every entry
  miss   one process looks up N keys that are absent (os.path.exists)
Usage: bench/fsd_flows.py --fsd build/fsd/kcache-fsd [--entries 200] [--procs 4] [--rounds 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

STORE = r'''
import os, sys, uuid
root, n, salt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
blob = (bytes(range(256)) * 32)
for i in range(n):
    key = f"{salt}{i:06d}"
    d = os.path.join(root, key)
    os.makedirs(d, exist_ok=True)
    files = {"k.cubin": blob[:8000] + key.encode() * 8,
             "k.json": (('{"name": "k%s", "num_warps": 4}' % key) * 30).encode()[:1024],
             "k.ptx": (("// " + key + "\n.reg .f32 %f<64>;\nld.global.f32 %f1, [%rd1];\n") * 300).encode()[:16384]}
    for name, data in files.items():
        tmp = os.path.join(d, f"tmp.pid_{os.getpid()}_{uuid.uuid4().hex}")
        os.makedirs(tmp)
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(data)
        os.replace(os.path.join(tmp, name), os.path.join(d, name))
        os.removedirs(tmp)  # stops at the non-empty key dir, as Triton does
'''
HIT = r'''
import os, sys
root, n, salt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
total = 0
for i in range(n):
    d = os.path.join(root, f"{salt}{i:06d}")
    for name in ("k.json", "k.cubin", "k.ptx"):
        with open(os.path.join(d, name), "rb") as f:
            total += len(f.read())
assert total > 0
'''
MISS = r'''
import os, sys
root, n, salt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for i in range(n):
    assert not os.path.exists(os.path.join(root, f"absent{salt}{i:06d}", "k.json"))
'''


def timed(cmds):
    start = time.perf_counter()
    procs = [subprocess.Popen(c) for c in cmds]
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"flow failed: {p.args}")
    return time.perf_counter() - start


def wait_mounted(path, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.ismount(path):
            return
        time.sleep(0.05)
    sys.exit(f"{path} did not mount")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--entries", type=int, default=200)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--durability", default="batched")
    ap.add_argument("--dir", default=None, help="where to put the db and the plain dir (default: a temp dir)")
    args = ap.parse_args()
    py = sys.executable
    work = tempfile.mkdtemp(prefix="kcache-bench-", dir=args.dir)
    db, mnt, plain = (os.path.join(work, x) for x in ("db", "mnt", "plain"))
    os.makedirs(mnt)
    os.makedirs(plain)
    subprocess.check_call([args.fsd, "--db", db, "--durability", args.durability, mnt])
    wait_mounted(mnt)
    results = {(phase, where): [] for phase in ("store", "hit", "miss") for where in ("mount", "plain")}
    try:
        for r in range(args.rounds):
            for where, root in (("mount", mnt), ("plain", plain)) if r % 2 == 0 else (("plain", plain), ("mount", mnt)):
                salt = f"r{r}x"
                n = str(args.entries)
                results[("store", where)].append(timed([[py, "-c", STORE, root, n, salt]]))
                results[("hit", where)].append(timed([[py, "-c", HIT, root, n, salt]] * args.procs))
                results[("miss", where)].append(timed([[py, "-c", MISS, root, n, salt]]))
    finally:
        subprocess.call(["fusermount3", "-u", mnt])
    print(f"kcache-fsd flows: {args.entries} entries x 3 files, {args.procs} reader processes, "
          f"{args.rounds} rounds alternated, durability {args.durability}, dir {work}")
    print(f"{'phase':8} {'mount s':>10} {'plain s':>10} {'ratio':>8}")
    for phase in ("store", "hit", "miss"):
        m = statistics.median(results[(phase, "mount")])
        p = statistics.median(results[(phase, "plain")])
        print(f"{phase:8} {m:10.3f} {p:10.3f} {m / p:7.2f}x")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
