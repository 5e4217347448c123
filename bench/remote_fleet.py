#!/usr/bin/env python3
"""The shared tier (Redis) across a fleet of daemons (issue 14, point 10): a benchmark.

One redis-server on a Unix socket and N kcache-fsd daemons (each its own db and mount,
all with `--remote unix:SOCK`), for each N in --nodes (default 2 and 4):

  compile  node A "compiles" ENTRIES (500) Triton-shaped entries: per entry a sleep of
           --compile-ms (20 ms: the compile), then, as Triton does, mkdir <hash>/, the
           three files (__grp__k.json, k.cubin of --cubin-kib KiB, k.json) written in
           a tmp.* dir and renamed into <hash>/. Then waits until A's write-behind has
           uploaded every entry (remote_uploads).
  serve    the other N-1 nodes at once each run the job: per entry Triton's probe
           (makedirs(<hash>), exists(__grp__), read the three files), compiling
           (sleep + store) only what is not found. Every entry must come from Redis
           (read-through). Time per node against A's compile time.
  local    on node B, entries already local: the probe-and-read of every entry, with
           Redis healthy, frozen (SIGSTOP, a black hole) and killed (SIGKILL); per
           entry latency (median, p99) and the ratio to healthy. Also a few misses
           (new names) in each state: what a miss costs when Redis is away.

Then, each with a Redis of its own:

  staggered  --stagger-nodes (4) nodes start one after another, --stagger-s apart,
           while the job runs: node 0 starts the job on an empty Redis, node k mounts
           k * stagger-s later and runs the same job at once. Per node: when it
           started, how long its job took, entries from Redis, entries it compiled;
           the fleet's compiles against the job's size (1.00x: nothing compiled twice)
           and each node's time against node 0's (the baseline: a lone compile).
  restart  node A compiles the job; `kcache remote push --job-tag` tags it;
           `kcache remote pull --job-tag` pulls it into an empty db (--pull-runs times:
           the prefetch's loop alone, without a daemon); node B
           runs it by read-through (the baseline), then restarts on an empty db with
           --prefetch-job-tag: how long the mount takes to come up, the job run at
           once (while the prefetch goes on), how long the prefetch took (its
           remote_prefetched reaching the job's size), the job run again (all local);
           and once more restarted empty, waiting for the prefetch before the job.

Issue 22 (compile leases on by default, Redis Cluster), each on a backend of its own:

  staggered  as above, once per --leases value (0: no leases; auto: the default).
  storm    for each --backends (1 Redis, 3 client-side shards, a 3+3 Redis Cluster on
           loopback), --storm-nodes (4, 8) and --leases: every node mounted first, then
           all run the same job at the same moment, so every node misses the same
           kernel at once. Compiles per kernel for the fleet, each node's job time, the
           lease waits and timeouts, and files read with wrong bytes (every cubin read
           is checked against what its compile wrote).
  holder   the same with leases on, but node 0 first misses every entry (taking every
           lease) and is SIGKILLed before the others start: what a dead holder costs.
  failover the storm on the cluster with a master SIGKILLed a third of the way through
           (its replica promoted: cluster-node-timeout 1 s).

Usage: bench/remote_fleet.py --fsd build/fsd/kcache-fsd --kcache build/cli/kcache
           [--nodes 2,4,8] [--entries 300] [--compile-ms 20] [--cubin-kib 64]
           [--stagger-nodes 4] [--stagger-s 2.0] [--phases fleet,staggered,restart]
           [--remote-timeout 300ms] [--pull-runs 5] [--dir DIR]
           [--storm-nodes 4,8] [--backends redis,shards,cluster] [--leases 0,auto]
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Redis:
    def __init__(self, directory, preexec_fn=None):
        server = shutil.which("redis-server")
        if not server:
            sys.exit("redis-server is not installed (scripts/setup.sh installs it)")
        os.makedirs(directory, exist_ok=True)
        self.sock = os.path.join(directory, "redis.sock")
        self.proc = subprocess.Popen(
            [server, "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", directory,
             "--logfile", os.path.join(directory, "redis.log"), "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn)
        end = time.monotonic() + 15
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > end:
                sys.exit("redis-server did not start")
            time.sleep(0.05)

    def ping(self):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                s.connect(self.sock)
                s.sendall(b"*1\r\n$4\r\nPING\r\n")
                return s.recv(64) == b"+PONG\r\n"
        except OSError:
            return False

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


def remote_args(remote):
    """--remote arguments for a URL (str), a list of URLs (shards) or a backend."""
    if hasattr(remote, "urls"):
        remote = remote.urls
    if isinstance(remote, str):
        remote = [remote]
    out = []
    for url in remote:
        out += ["--remote", url]
    return out


class Shards:
    """Client-side shards: --shards plain redis-servers, each key on one of them."""

    def __init__(self, directory, n=3):
        self.servers = [Redis(os.path.join(directory, f"shard{k}")) for k in range(n)]
        self.urls = [f"unix:{r.sock}" for r in self.servers]
        self.name = f"{n} shards"

    def stop(self):
        for r in self.servers:
            r.stop()


def free_port():
    for _ in range(1000):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", 0))
                port = a.getsockname()[1]
                if port + 10000 > 65535:
                    continue
                b.bind(("127.0.0.1", port + 10000))  # the cluster bus
                return port
            except OSError:
                continue
    sys.exit("no free port pair")


def resp(port, *argv, timeout=2):
    """One command to 127.0.0.1:port; the raw reply bytes (enough for INFO / SLOTS)."""
    cmd = f"*{len(argv)}\r\n".encode()
    for a in argv:
        a = a.encode() if isinstance(a, str) else a
        cmd += f"${len(a)}\r\n".encode() + a + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(cmd)
        out = b""
        while True:
            chunk = s.recv(65536)
            out += chunk
            if not chunk or len(chunk) < 65536:
                return out


class Cluster:
    """A Redis Cluster of 3 masters and 3 replicas on loopback (cluster-node-timeout 1 s)."""

    def __init__(self, directory):
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if not server or not cli:
            sys.exit("redis-server / redis-cli are not installed")
        self.procs = {}
        ports = []
        while len(ports) < 6:
            p = free_port()
            if p not in ports:
                ports.append(p)
        for p in ports:
            d = os.path.join(directory, str(p))
            os.makedirs(d, exist_ok=True)
            self.procs[p] = subprocess.Popen(
                [server, "--port", str(p), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", os.path.join(d, "nodes.conf"),
                 "--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no",
                 "--dir", d, "--logfile", os.path.join(d, "redis.log"), "--daemonize", "no"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for p in ports:
            end = time.monotonic() + 15
            while True:
                try:
                    if resp(p, "PING").startswith(b"+PONG"):
                        break
                except OSError:
                    pass
                if time.monotonic() > end:
                    sys.exit(f"cluster node {p} did not start")
                time.sleep(0.05)
        r = subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                            "--cluster-replicas", "1", "--cluster-yes"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            sys.exit(f"redis-cli --cluster create failed: {r.stdout}{r.stderr}")
        self.wait_ok()
        self.urls = ["redis-cluster://127.0.0.1:%d" % ports[0]]
        self.name = "cluster 3+3"

    def masters(self):
        """Ports of the masters serving slots, from CLUSTER NODES of a live node."""
        for p in self.procs:
            try:
                text = resp(p, "CLUSTER", "NODES").decode(errors="replace")
            except OSError:
                continue
            out = []
            for line in text.splitlines():
                f = line.split()
                if len(f) > 8 and "master" in f[2] and "fail" not in f[2]:
                    out.append(int(f[1].split("@")[0].rsplit(":", 1)[1]))
            return out
        return []

    def wait_ok(self, timeout=60, dead=None):
        """Until every node is ok and 3 live masters (not `dead`) serve the slots."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                masters = self.masters()
                if all(b"cluster_state:ok" in resp(p, "CLUSTER", "INFO") for p in self.procs) \
                        and len(masters) == 3 and dead not in masters:
                    return time.monotonic()
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit("the cluster did not settle")

    def kill_master(self):
        """SIGKILLs one master; returns (port, seconds until its replica serves)."""
        port = self.masters()[0]
        proc = self.procs.pop(port)
        t = time.monotonic()
        proc.kill()
        proc.wait()
        return port, self.wait_ok(dead=port) - t

    def stop(self):
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


class OneRedis:
    def __init__(self, directory):
        self.redis = Redis(directory)
        self.urls = [f"unix:{self.redis.sock}"]
        self.name = "1 Redis"

    def stop(self):
        self.redis.stop()


def make_backend(kind, directory):
    return {"redis": OneRedis, "shards": Shards, "cluster": Cluster}[kind](directory)


class Node:
    def __init__(self, args, root, name, remote_url, ns, extra=()):
        self.args, self.name = args, name
        self.db = os.path.join(root, name, "db")
        self.mnt = os.path.join(root, name, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        self.log = open(os.path.join(root, name, "fsd.log"), "ab")
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            [args.fsd, "-f", "--db", self.db, *remote_args(remote_url), "--remote-namespace", ns,
             "--remote-timeout", args.remote_timeout,
             "--remote-connect-timeout", args.remote_timeout, *extra, self.mnt],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 15
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > end:
                sys.exit(f"kcache-fsd ({name}) did not mount")
            time.sleep(0.005)
        self.mount_s = time.perf_counter() - start  # from exec to the mount being up
        self.cache = os.path.join(self.mnt, "triton")
        os.makedirs(self.cache, exist_ok=True)

    def stats(self):
        r = subprocess.run([self.args.kcache, "--db", self.db, "stats", "--json"],
                           capture_output=True, text=True, timeout=60)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def stop(self):
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True, timeout=60)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True)
        self.log.close()


def key_of(job, i):
    digest = hashlib.sha256(f"{job}-{i}".encode()).digest()
    import base64
    return base64.b32encode(digest).decode().rstrip("=")[:52]


WRONG = []  # files read with bytes other than their compile wrote
ARGS = None


def cubin_of(key, args):
    return hashlib.sha256(key.encode()).digest() * (args.cubin_kib * 1024 // 32)


def compile_entry(cache, key, i, args):
    """The simulated compile, then Triton's way of storing: tmp dir, rename, rmdir."""
    time.sleep(args.compile_ms / 1000.0)
    d = os.path.join(cache, key)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f"tmp.pid_{os.getpid()}_{i}")
    os.mkdir(tmp)
    files = {  # in Triton's order: the group file last (put_group follows the files)
        f"k{i}.cubin": cubin_of(key, args),
        f"k{i}.json": json.dumps({"name": f"k{i}", "num_warps": 4, "shared": 0}).encode(),
        f"__grp__k{i}.json": json.dumps({"child_paths": {
            f"k{i}.cubin": f"{d}/k{i}.cubin", f"k{i}.json": f"{d}/k{i}.json"}}).encode(),
    }
    for name, data in files.items():
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(data)
        os.rename(os.path.join(tmp, name), os.path.join(d, name))
    os.rmdir(tmp)


def probe(cache, key, i):
    """Triton's cache lookup: makedirs(<key>), exists(__grp__), read the group's files.
    True on a hit."""
    d = os.path.join(cache, key)
    os.makedirs(d, exist_ok=True)
    grp = os.path.join(d, f"__grp__k{i}.json")
    if not os.path.exists(grp):
        return False
    for name in (grp, os.path.join(d, f"k{i}.cubin"), os.path.join(d, f"k{i}.json")):
        with open(name, "rb") as f:
            data = f.read()
        if name.endswith(".cubin") and data != cubin_of(key, ARGS):
            WRONG.append(name)  # wrong bytes: never expected
    return True


def run_job(cache, keys, args):
    """Probe each entry, compile what is missing. Returns (seconds, hits, compiled)."""
    hits = compiled = 0
    start = time.perf_counter()
    for i, key in enumerate(keys):
        if probe(cache, key, i):
            hits += 1
        else:
            compile_entry(cache, key, i, args)
            compiled += 1
    return time.perf_counter() - start, hits, compiled


def local_latency(cache, keys, passes=3):
    lat = []
    for _ in range(passes):
        for i, key in enumerate(keys):
            t = time.perf_counter()
            ok = probe(cache, key, i)
            lat.append(time.perf_counter() - t)
            if not ok:
                sys.exit(f"local entry {key} not found")
    lat.sort()
    return statistics.median(lat), lat[int(len(lat) * 0.99)]


def miss_latency(cache, job, count=5):
    lat = []
    for j in range(count):
        key = key_of(job, 10_000 + j)
        t = time.perf_counter()
        probe(cache, key, 10_000 + j)
        lat.append(time.perf_counter() - t)
    return statistics.median(lat), max(lat)


def wait_uploads(node, n, timeout=300):
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if node.stats().get("remote_uploads", 0) >= n:
            return time.perf_counter() - start
        time.sleep(0.25)
    return None


def fleet(args, root, n_nodes):
    redis = Redis(os.path.join(root, "redis"))
    url = f"unix:{redis.sock}"
    nodes = []
    out = {"nodes": n_nodes}
    try:
        for k in range(n_nodes):
            nodes.append(Node(args, root, f"node{k}", url, f"bench{n_nodes}"))
        a, others = nodes[0], nodes[1:]
        keys = [key_of(f"job{n_nodes}", i) for i in range(args.entries)]

        secs, hits, compiled = run_job(a.cache, keys, args)
        assert compiled == args.entries, (hits, compiled)
        out["compile_s"] = secs
        log(f"[{n_nodes} nodes] A compiled and stored {compiled} entries in {secs:.2f}s")
        up = wait_uploads(a, args.entries)
        if up is None:
            sys.exit(f"A uploaded {a.stats().get('remote_uploads', 0)} of {args.entries}")
        out["upload_wait_s"] = up
        log(f"[{n_nodes} nodes] all uploaded {up:.2f}s after the last store")

        results = [None] * len(others)

        def serve(idx, node):
            results[idx] = run_job(node.cache, keys, args)

        threads = [threading.Thread(target=serve, args=(j, node)) for j, node in enumerate(others)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for j, (s, h, c) in enumerate(results):
            log(f"[{n_nodes} nodes] node{j + 1}: {h} from Redis, {c} compiled, {s:.2f}s")
            if c:
                log(f"  WARNING: node{j + 1} compiled {c} entries: read-through missed")
        out["serve_s"] = [r[0] for r in results]
        out["serve_compiled"] = sum(r[2] for r in results)
        b = others[0]
        time.sleep(1.5)  # let B's counters reach its db
        sb = b.stats()
        out["b_remote_hits"] = sb.get("remote_hits", 0)

        out["local"] = {}
        out["miss"] = {}
        out["local"]["healthy"] = local_latency(b.cache, keys)
        out["miss"]["healthy"] = miss_latency(b.cache, f"healthy{n_nodes}")
        redis.signal(signal.SIGSTOP)
        out["local"]["frozen"] = local_latency(b.cache, keys)
        out["miss"]["frozen"] = miss_latency(b.cache, f"frozen{n_nodes}")
        redis.signal(signal.SIGCONT)
        redis.signal(signal.SIGKILL)
        redis.proc.wait()
        out["local"]["killed"] = local_latency(b.cache, keys)
        out["miss"]["killed"] = miss_latency(b.cache, f"killed{n_nodes}")
        time.sleep(1.5)
        sb = b.stats()
        out["b_errors"] = (sb.get("remote_errors", 0), sb.get("remote_timeouts", 0))
    finally:
        for node in nodes:
            node.stop()
        redis.stop()
    return out


def wait_stat(node, name, n, timeout=300):
    """Seconds until the node's statistic `name` reaches n (polled), or None."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if node.stats().get(name, 0) >= n:
            return time.perf_counter() - start
        time.sleep(0.05)
    return None


def storm(args, root, backend_kind, n, leases, fault=None):
    """n nodes mounted first, then all run the same job at the same moment: every node
    misses the same kernels at once. fault: None, "holder" (node 0 first probes every
    entry, taking their leases, and dies; the others then run the job) or "failover"
    (a cluster master is killed a third of the way through)."""
    backend = make_backend(backend_kind, os.path.join(root, "backend"))
    keys = [key_of("storm", i) for i in range(args.entries)]
    nodes = []
    out = {"backend": backend.name, "nodes": n, "leases": leases, "fault": fault}
    try:
        for k in range(n):
            nodes.append(Node(args, root, f"n{k}", backend, "storm", ["--remote-lease-ms", leases]))
        runners = nodes
        if fault == "holder":
            for i, key in enumerate(keys):  # misses: node 0 takes every lease
                probe(nodes[0].cache, key, i)
            nodes[0].proc.kill()
            nodes[0].proc.wait()
            runners = nodes[1:]
        results = [None] * len(runners)
        barrier = threading.Barrier(len(runners) + 1)

        def member(k):
            barrier.wait()
            results[k] = run_job(runners[k].cache, keys, args)

        threads = [threading.Thread(target=member, args=(k,)) for k in range(len(runners))]
        for t in threads:
            t.start()
        wrong_before = len(WRONG)
        barrier.wait()
        t0 = time.perf_counter()
        if fault == "failover":
            time.sleep(max(0.5, args.entries * args.compile_ms / 1000.0 / 3))
            port, took = backend.kill_master()
            out["failover_s"] = took
            log(f"[storm] killed master {port}: its replica served {took:.2f}s later")
        for t in threads:
            t.join()
        out["wall_s"] = time.perf_counter() - t0
        out["jobs_s"] = [r[0] for r in results]
        out["compiled"] = sum(r[2] for r in results)
        out["wrong"] = len(WRONG) - wrong_before
        time.sleep(1.2)  # the counters reach the dbs every second
        waits = timeouts = 0
        for node in runners:
            st = node.stats()
            waits += st.get("remote_lease_waits", 0)
            timeouts += st.get("remote_lease_timeouts", 0)
        out["lease_waits"], out["lease_timeouts"] = waits, timeouts
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.stop()
            else:
                subprocess.run(["fusermount3", "-uz", node.mnt], capture_output=True)
                node.log.close()
        backend.stop()
    log(f"[storm {out['backend']}, {n} nodes, leases {leases}, fault {fault}] "
        f"compiled {out['compiled']} for {args.entries}, wall {out['wall_s']:.2f}s, "
        f"jobs {', '.join('%.2f' % x for x in out['jobs_s'])}, waits {out['lease_waits']}, "
        f"timeouts {out['lease_timeouts']}, wrong {out['wrong']}")
    return out


def staggered(args, root, leases="0"):
    """Nodes start one after another while the job runs; each runs the whole job."""
    redis = Redis(os.path.join(root, "redis"))
    url = f"unix:{redis.sock}"
    keys = [key_of("staggered", i) for i in range(args.entries)]
    n = args.stagger_nodes
    results = [None] * n
    nodes = [None] * n
    t0 = time.perf_counter()

    def member(k):
        time.sleep(max(0.0, k * args.stagger_s - (time.perf_counter() - t0)))
        started = time.perf_counter() - t0
        nodes[k] = Node(args, root, f"s{k}", url, "stagger", ["--remote-lease-ms", leases])
        secs, hits, compiled = run_job(nodes[k].cache, keys, args)
        results[k] = (started, nodes[k].mount_s, secs, hits, compiled)

    try:
        threads = [threading.Thread(target=member, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for node in nodes:
            if node:
                node.stop()
        redis.stop()
    for k, r in enumerate(results):
        log(f"[staggered leases={leases}] node{k}: started {r[0]:.2f}s, job {r[2]:.2f}s, {r[3]} from Redis, {r[4]} compiled")
    return {"nodes": n, "rows": results, "leases": leases}


def restart(args, root):
    """A compiles and tags the job; B reads it through, then restarts empty with prefetch."""
    redis = Redis(os.path.join(root, "redis"))
    url = f"unix:{redis.sock}"
    keys = [key_of("restart", i) for i in range(args.entries)]
    tag = "bench-job"
    out = {}
    a = b = None
    try:
        a = Node(args, root, "A", url, "restart")
        b = Node(args, root, "B", url, "restart")
        out["compile_s"], _, compiled = run_job(a.cache, keys, args)
        assert compiled == args.entries
        if wait_uploads(a, args.entries) is None:
            sys.exit("restart: A did not upload the job")
        t = time.perf_counter()
        r = subprocess.run([args.kcache, "--db", a.db, "remote", "--remote", url, "--remote-namespace", "restart",
                            "push", "--job-tag", tag], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"restart: push --job-tag failed: {r.stderr}")
        out["tag_s"] = time.perf_counter() - t
        # The prefetch's loop alone (Remote::pull_job, as the daemon runs it): `kcache remote
        # pull --job-tag` into an empty db, --pull-runs times (median; each a fresh db).
        pulls = []
        for k in range(args.pull_runs):
            d = os.path.join(root, f"pull-{k}")
            t = time.perf_counter()
            r = subprocess.run([args.kcache, "--db", d, "remote", "--remote", url, "--remote-namespace",
                                "restart", "pull", "--job-tag", tag], capture_output=True, text=True,
                               timeout=300)
            pulls.append(time.perf_counter() - t)
            if r.returncode != 0:
                sys.exit(f"restart: pull --job-tag failed: {r.stderr}")
            shutil.rmtree(d)
        out["cli_pull_s"] = statistics.median(pulls) if pulls else None
        out["cli_pull_all_s"] = pulls
        out["read_through_s"], hits, compiled = run_job(b.cache, keys, args)
        out["read_through_compiled"] = compiled
        out["local_s"], _, _ = run_job(b.cache, keys, args)  # every entry local now

        # Restart on an empty db with --prefetch-job-tag and run the job at once.
        b.stop()
        shutil.rmtree(b.db)
        b = Node(args, root, "B", url, "restart", ["--prefetch-job-tag", tag])
        out["mount_s"] = b.mount_s
        out["at_once_s"], _, out["at_once_compiled"] = run_job(b.cache, keys, args)
        time.sleep(1.2)  # the counters reach the db every second
        # Entries the prefetch pulled before the job read them (the rest were read through).
        out["at_once_prefetched"] = b.stats().get("remote_prefetched", 0)
        out["after_s"], _, _ = run_job(b.cache, keys, args)

        # Again, waiting for the prefetch before the job.
        b.stop()
        shutil.rmtree(b.db)
        b = Node(args, root, "B", url, "restart", ["--prefetch-job-tag", tag])
        done = wait_stat(b, "remote_prefetched", args.entries)
        if done is None:
            sys.exit("restart: the prefetch did not finish")
        out["prefetch_s"] = done + b.mount_s  # until `kcache stats` shows it (counters: every second)
        out["prefetch_log_s"] = None  # the daemon's own figure, from the start of the prefetch
        with open(os.path.join(root, "B", "fsd.log"), errors="replace") as f:
            for line in f:
                m = re.search(r"prefetched job \S+ in ([0-9.]+) s", line)
                if m:
                    out["prefetch_log_s"] = float(m.group(1))
        st = b.stats()
        out["prefetched_bytes"] = st.get("remote_prefetched_bytes", 0)
        out["prefetched_job_s"], hits, out["prefetched_job_compiled"] = run_job(b.cache, keys, args)
        time.sleep(1.2)
        st = b.stats()
        out["prefetched_remote_misses"] = st.get("remote_misses", 0)
        out["prefetched_remote_hits"] = st.get("remote_hits", 0)
    finally:
        for node in (a, b):
            if node:
                node.stop()
        redis.stop()
    log(f"[restart] {out}")
    return out


def fleet_tables(rows):
    print()
    print("| nodes | A compiles + stores | upload done after | B..N serve from Redis (each) "
          "| serve/compile | compiled on B..N |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        serve = r["serve_s"]
        print(f"| {r['nodes']} | {r['compile_s']:.2f} s | {r['upload_wait_s']:.2f} s "
              f"| {', '.join(f'{s:.2f}' for s in serve)} s "
              f"| {', '.join('%.2fx' % (s / r['compile_s']) for s in serve)} "
              f"| {r['serve_compiled']} |")
    print()
    print("| nodes | Redis | local hit median | p99 | median/healthy | miss median | miss max |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        base_med = r["local"]["healthy"][0]
        for state in ("healthy", "frozen", "killed"):
            med, p99 = r["local"][state]
            mmed, mmax = r["miss"][state]
            print(f"| {r['nodes']} | {state} | {med * 1e6:.0f} us | {p99 * 1e6:.0f} us "
                  f"| {med / base_med:.2f}x | {mmed * 1e3:.1f} ms | {mmax * 1e3:.1f} ms |")
    print()
    for r in rows:
        print(f"{r['nodes']} nodes: B remote_hits {r['b_remote_hits']}, "
              f"B remote (errors, timeouts) after the faults {r['b_errors']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--kcache", required=True)
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--entries", type=int, default=300)
    ap.add_argument("--stagger-nodes", type=int, default=4)
    ap.add_argument("--stagger-s", type=float, default=2.0)
    ap.add_argument("--phases", default="fleet,staggered,restart",
                    help="also: storm (every node misses the same kernels at once), holder "
                         "(a node dies holding leases), failover (a cluster master killed mid-storm)")
    ap.add_argument("--storm-nodes", default="4,8")
    ap.add_argument("--backends", default="redis,shards,cluster",
                    help="storm: 1 Redis, 3 client-side shards, a 3+3 Redis Cluster")
    ap.add_argument("--leases", default="0,auto",
                    help="storm / staggered: --remote-lease-ms values compared")
    ap.add_argument("--compile-ms", type=float, default=20)
    ap.add_argument("--cubin-kib", type=int, default=64)
    ap.add_argument("--remote-timeout", default="300ms",
                    help="--remote-timeout and --remote-connect-timeout of every daemon")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--pull-runs", type=int, default=5,
                    help="restart: times `kcache remote pull --job-tag` runs into an empty db")
    args = ap.parse_args()
    global ARGS
    ARGS = args

    phases = args.phases.split(",")
    base = tempfile.mkdtemp(prefix="kcache-remote-fleet-", dir=args.dir)
    rows = []
    stag = rest = None
    stags, storms = [], []
    with open("/proc/loadavg") as f:
        load_before = f.read().strip()
    try:
        if "fleet" in phases:
            for n in [int(x) for x in args.nodes.split(",")]:
                root = os.path.join(base, f"n{n}")
                os.makedirs(root)
                rows.append(fleet(args, root, n))
        if "staggered" in phases:
            for leases in args.leases.split(","):
                root = os.path.join(base, f"staggered-{leases}")
                os.makedirs(root)
                stags.append(staggered(args, root, leases))
        for fault in ("storm", "holder", "failover"):
            if fault not in phases:
                continue
            backends = args.backends.split(",") if fault != "failover" else ["cluster"]
            for kind in backends:
                for n in [int(x) for x in args.storm_nodes.split(",")]:
                    for leases in (args.leases.split(",") if fault == "storm" else ["auto"]):
                        root = os.path.join(base, f"{fault}-{kind}-{n}-{leases}")
                        os.makedirs(root)
                        storms.append(storm(args, root, kind, n, leases,
                                            None if fault == "storm" else fault))
        if "restart" in phases:
            root = os.path.join(base, "restart")
            os.makedirs(root)
            rest = restart(args, root)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    with open("/proc/loadavg") as f:
        load = f.read().strip()
    print(f"remote_fleet: {args.entries} entries, compile {args.compile_ms:g} ms each, "
          f"cubin {args.cubin_kib} KiB, remote timeouts {args.remote_timeout}; {os.cpu_count()} cores; "
          f"loadavg before {load_before}, after {load}")
    if rows:
        fleet_tables(rows)
    if storms:
        print()
        print(f"every node runs the job of {args.entries} entries at the same moment "
              f"(compile {args.compile_ms:g} ms each); wall: the slowest node's job; "
              f"holder: node 0 took every lease and died first; failover: a master killed "
              f"a third of the way through")
        print()
        print("| backend | nodes | leases | fault | compiles per kernel | wall | jobs (each) "
              "| lease waits | lease timeouts | wrong bytes |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in storms:
            fault = r["fault"] or "-"
            if r.get("failover_s") is not None:
                fault += f" (replica serving after {r['failover_s']:.1f} s)"
            print(f"| {r['backend']} | {r['nodes']} | {r['leases']} | {fault} "
                  f"| {r['compiled'] / args.entries:.2f} | {r['wall_s']:.2f} s "
                  f"| {', '.join('%.2f' % x for x in r['jobs_s'])} s "
                  f"| {r['lease_waits']} | {r['lease_timeouts']} | {r['wrong']} |")
    for stag in stags:
        rows_s = stag["rows"]
        base_s = rows_s[0][2]
        print()
        print(f"staggered: {stag['nodes']} nodes, {args.stagger_s:g} s apart, each runs the job of "
              f"{args.entries} entries at once; --remote-lease-ms {stag['leases']}")
        print()
        print("| node | started at | mount up | job | job / node 0's | from Redis | compiled |")
        print("|---|---|---|---|---|---|---|")
        for k, (started, mount_s, secs, hits, compiled) in enumerate(rows_s):
            print(f"| {k} | {started:.2f} s | {mount_s * 1e3:.0f} ms | {secs:.2f} s | {secs / base_s:.2f}x "
                  f"| {hits} | {compiled} |")
        total = sum(r[4] for r in rows_s)
        print(f"\nfleet compiled {total} for {args.entries} entries ({total / args.entries:.2f}x the job)")
    if rest:
        r = rest
        print()
        print(f"restart with --prefetch-job-tag: job of {args.entries} entries, baseline: node B reading it "
              f"through on an empty db")
        print()
        print("| B | time | vs read-through | compiled |")
        print("|---|---|---|---|")
        rt = r["read_through_s"]
        print(f"| A compiles the job | {r['compile_s']:.2f} s | {r['compile_s'] / rt:.2f}x | {args.entries} |")
        print(f"| push --job-tag (A's db, all already remote) | {r['tag_s']:.2f} s | - | - |")
        if r.get("cli_pull_s") is not None:
            runs = ", ".join(f"{x:.2f}" for x in r["cli_pull_all_s"])
            print(f"| `kcache remote pull --job-tag` into an empty db (median of {runs}) "
                  f"| {r['cli_pull_s']:.2f} s | {r['cli_pull_s'] / rt:.2f}x | - |")
        print(f"| job by read-through, empty db (baseline) | {rt:.2f} s | 1.00x | {r['read_through_compiled']} |")
        print(f"| job again, all local | {r['local_s']:.2f} s | {r['local_s'] / rt:.2f}x | 0 |")
        print(f"| restart empty + prefetch: mount up | {r['mount_s'] * 1e3:.0f} ms | - | - |")
        print(f"| job at once, prefetch running ({r['at_once_prefetched']} prefetched by its end) "
              f"| {r['at_once_s']:.2f} s | {r['at_once_s'] / rt:.2f}x | {r['at_once_compiled']} |")
        print(f"| job again after that | {r['after_s']:.2f} s | {r['after_s'] / rt:.2f}x | 0 |")
        if r["prefetch_log_s"] is not None:
            print(f"| restart empty + prefetch: prefetch took (daemon's log; {r['prefetched_bytes'] / 2**20:.1f} MiB) "
                  f"| {r['prefetch_log_s']:.2f} s | {r['prefetch_log_s'] / rt:.2f}x | - |")
        print(f"| restart empty + prefetch: exec to all in `kcache stats` (1 s granularity) "
              f"| {r['prefetch_s']:.2f} s | {r['prefetch_s'] / rt:.2f}x | - |")
        print(f"| job after the prefetch | {r['prefetched_job_s']:.2f} s | {r['prefetched_job_s'] / rt:.2f}x "
              f"| {r['prefetched_job_compiled']} |")
        print(f"\nafter the prefetch: B remote_hits {r['prefetched_remote_hits']}, "
              f"remote_misses {r['prefetched_remote_misses']}")


if __name__ == "__main__":
    main()
