#!/usr/bin/env python3
"""What a lookup costs a new node fed by the shared tier (issue 31, point 5): a benchmark.

One redis-server on a Unix socket; node A (kcache-fsd --remote) stores --entries
Inductor-shaped entries below containers (an FX graph `inductor/fxgraph/<xx>/<key>/<file>`
and a kernel module `inductor/<xx>/<key>.py` each, spread over two-letter shards), and
waits until its write-behind uploaded them. Then node B, a new empty db on the same Redis,
and node P, a mount without --remote (the baseline), each time one open+read per file:

  fleet hit      B's first read of an entry: the walk through containers B lacks (made
                 from the container set), the entry's read-through (manifest + blobs).
  local hit      B's second read of the same files, in a fresh process.
  miss, known    a new key below a container the shared tier holds: one read-through that
                 finds no manifest (one Redis round trip), ENOENT.
  miss, unknown  a new key below a shard no node ever made: ENOENT with no round trip.
  plain miss     the same lookups on P (no --remote): what a miss costs without the tier.
  frozen         Redis SIGSTOPped: B's misses below known containers, bounded by the
                 deadline (--remote-timeout, connect + operation) until the circuit opens,
                 then answered at once.

It also counts the commands Redis processed during B's miss phases (INFO stats), less
the daemons' own once-a-second traffic measured over the same time while idle.

Usage: bench/fleet_lookup.py --fsd build/fsd/kcache-fsd --kcache build/cli/kcache
           [--entries 300] [--remote-timeout 300ms] [--dir DIR]
"""
import argparse
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from remote_fleet import Node, Redis  # noqa: E402


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def key(tag, i):
    return hashlib.sha256(f"{tag}-{i}".encode()).hexdigest()[:52]


def shard(k):
    return k[1:3]  # Inductor shards by two letters of its key


def fx_path(k):
    return f"inductor/fxgraph/{shard(k)}/f{k}/p{k[:40]}"


def module_path(k):
    return f"inductor/{shard(k)}/c{k}.py"


def content(path):
    return hashlib.sha256(path.encode()).digest() * 256  # 8 KiB


def publish(root, rel):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(content(rel))
    os.rename(tmp, path)


def timed_reads(root, rels, expect):
    """Reads each file in a fresh process, timing each open+read (µs); checks the bytes
    of hits. `expect`: True for hits, False for misses (ENOENT)."""
    code = r"""
import os, sys, time, json
root, expect = sys.argv[1], sys.argv[2] == "1"
out = []
for rel in sys.stdin.read().split():
    t = time.perf_counter()
    try:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        ok = True
    except FileNotFoundError:
        ok = False
    out.append(((time.perf_counter() - t) * 1e6, ok))
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code, root, "1" if expect else "0"],
                       input="\n".join(rels), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"reader failed: {r.stderr}")
    import json
    got = json.loads(r.stdout)
    wrong = sum(1 for _, ok in got if ok != expect)
    return [us for us, _ in got], wrong


def redis_calls(sock):
    """INFO commandstats: calls per command ("get", "eval", ...), and "all"."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(sock)
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        data = b""
        while True:
            data += s.recv(65536)
            if data.startswith(b"$"):
                head, _, rest = data.partition(b"\r\n")
                if len(rest) >= int(head[1:]):
                    break
    calls = {"all": 0}
    for line in data.decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line[len("cmdstat_"):].partition(":")
            n = int(fields.split(",")[0].split("=")[1])
            calls[name] = n
            calls["all"] += n
    return calls


def calls_between(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def summary(name, us, wrong, n):
    us = sorted(us)
    p99 = us[min(len(us) - 1, int(len(us) * 0.99))]
    print(f"  {name:<15} n={len(us):<5} median {statistics.median(us):9.1f} us   "
          f"p99 {p99:9.1f} us   max {us[-1]:9.1f} us   unexpected {wrong}/{n}")
    return statistics.median(us)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--kcache", required=True)
    ap.add_argument("--entries", type=int, default=300)
    ap.add_argument("--remote-timeout", default="300ms")
    ap.add_argument("--lease-ms", default="",
                    help="node B's --remote-lease-ms (default: the daemon's, renewed leases)")
    ap.add_argument("--dir")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="kcache-fleet-lookup-", dir=args.dir)
    nodes = []
    redis = Redis(os.path.join(root, "redis"))
    url = f"unix:{redis.sock}"
    try:
        print(f"load at start: {os.getloadavg()[0]:.2f}")
        a = Node(args, root, "A", url, "lookup", ("--remote-lease-ms", "0"))
        nodes.append(a)
        keys = [key("k", i) for i in range(args.entries)]
        rels = [p for k in keys for p in (fx_path(k), module_path(k))]
        for rel in rels:
            publish(a.mnt, rel)
        end = time.monotonic() + 120
        while a.stats().get("remote_uploads", 0) < len(rels) and time.monotonic() < end:
            time.sleep(0.3)
        log(f"A uploaded {a.stats().get('remote_uploads', 0)} of {len(rels)} entries")
        a.stop()
        nodes.remove(a)

        b_args = ("--remote-lease-ms", args.lease_ms) if args.lease_ms else ()
        b = Node(args, root, "B", url, "lookup", b_args)
        nodes.append(b)
        plain_dir = os.path.join(root, "P")
        os.makedirs(os.path.join(plain_dir, "mnt"), exist_ok=True)
        pm = subprocess.Popen([args.fsd, "-f", "--db", os.path.join(plain_dir, "db"),
                               os.path.join(plain_dir, "mnt")],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
        end = time.monotonic() + 15
        while not os.path.ismount(os.path.join(plain_dir, "mnt")) and time.monotonic() < end:
            time.sleep(0.01)
        p_mnt = os.path.join(plain_dir, "mnt")
        for k in keys[:8]:  # P has the containers (a node that compiled there)
            publish(p_mnt, fx_path(k))
            publish(p_mnt, module_path(k))

        print(f"\n{args.entries} Inductor-shaped entries x 2 files; fresh reader process per "
              f"phase; Redis on a Unix socket; --remote-timeout {args.remote_timeout}; "
              f"B's --remote-lease-ms {args.lease_ms or 'default (renewed leases)'}")
        fleet, wrong = timed_reads(b.mnt, rels, True)
        m_fleet = summary("fleet hit", fleet, wrong, len(rels))
        local, wrong = timed_reads(b.mnt, rels, True)
        m_local = summary("local hit", local, wrong, len(rels))
        new_keys = [key("new", i) for i in range(args.entries)]
        known = [f"inductor/fxgraph/{shard(keys[i % len(keys)])}/f{k}/x" for i, k in
                 enumerate(new_keys)]
        unknown = [f"inductor/fxgraph/z{i % 10}/f{k}/x" for i, k in enumerate(new_keys)]
        # Redis commands during each miss phase, by command: a miss below a known
        # container is one round trip (its manifest's GET; with leases, the lease script
        # pipelined with it); the lease keeper's renewals (EVAL, once a second per lease
        # held) and the daemons' SCARD/PING run beside.
        c0 = redis_calls(redis.sock)
        miss_known, wrong = timed_reads(b.mnt, known, False)
        c_known = calls_between(c0, redis_calls(redis.sock))
        m_known = summary("miss, known", miss_known, wrong, len(known))
        c0 = redis_calls(redis.sock)
        miss_unknown, wrong = timed_reads(b.mnt, unknown, False)
        c_unknown = calls_between(c0, redis_calls(redis.sock))
        m_unknown = summary("miss, unknown", miss_unknown, wrong, len(unknown))
        plain_known = [f"inductor/fxgraph/{shard(keys[i % 8])}/f{k}/x" for i, k in
                       enumerate(new_keys)]
        plain, wrong = timed_reads(p_mnt, plain_known, False)
        m_plain = summary("plain miss", plain, wrong, len(plain_known))
        redis.signal(signal.SIGSTOP)
        frozen_keys = [f"inductor/fxgraph/{shard(keys[i % len(keys)])}/f{key('frozen', i)}/x"
                       for i in range(50)]
        frozen, wrong = timed_reads(b.mnt, frozen_keys, False)
        summary("frozen", frozen, wrong, len(frozen_keys))
        redis.signal(signal.SIGCONT)
        print(f"\n  Redis commands during {len(known)} misses below known containers: "
              f"{c_known}; GETs per miss {c_known.get('get', 0) / len(known):.2f}")
        print(f"  Redis commands during {len(unknown)} misses below unknown containers: "
              f"{c_unknown}; GETs per miss {c_unknown.get('get', 0) / len(unknown):.2f}")
        s = b.stats()
        print(f"  node B: remote_hits {s.get('remote_hits', 0)}, remote_misses "
              f"{s.get('remote_misses', 0)}, remote_containers {s.get('remote_containers', 0)}, "
              f"hits_fleet {s.get('hits_fleet', 0)}, misses {s.get('misses', 0)}")
        print(f"  ratios: fleet hit / local hit {m_fleet / m_local:.1f}x; miss below a known "
              f"container / plain miss {m_known / m_plain:.1f}x; below an unknown one / plain "
              f"miss {m_unknown / m_plain:.1f}x")
        print(f"load at end: {os.getloadavg()[0]:.2f}")
        subprocess.run(["fusermount3", "-u", p_mnt], capture_output=True)
        pm.wait(timeout=30)
    finally:
        for n in nodes:
            n.stop()
        redis.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
