#!/usr/bin/env python3
"""TLS to Redis against plain TCP: a cold node's prefetch, bytes and time (issue 32).

    bench/remote_tls.py --fsd build/fsd/kcache-fsd --kcache build/cli/kcache \\
        [--entries 300] [--cubin-kib 64] [--rounds 5] [--work DIR]

Makes a CA and a server certificate with the openssl CLI, starts ONE redis-server that
serves the same data on two loopback ports: plain TCP (redis://127.0.0.1:P) and TLS
(rediss://127.0.0.1:Q, tls-auth-clients no). Fills a db through a kcache-fsd mount with
--entries Triton-shaped entries (a cubin of --cubin-kib, half random bytes and half
text, a json and a group file), pushes them once with a job tag over plain TCP, then
measures per side, the two sides alternating, --rounds times:
  - a cold node's prefetch: `kcache remote pull --job-tag job` into a fresh db (the loop
    behind kcache-fsd --prefetch-job-tag): its wall time, the payload it read from Redis
    (remote_bytes_down), and the bytes the server wrote to its sockets meanwhile (wchar of
    redis-server's /proc/PID/io: Redis writes with write(2), plain or through OpenSSL's
    socket BIO, so these are the TCP payload bytes, TLS records and handshake included);
  - one entry pulled by a fresh process (connect, TLS handshake, one round of GETs).
Medians, and TLS / plain ratios.
"""

import argparse
import base64
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """[req]
distinguished_name = dn
prompt = no
[dn]
CN = kcache bench
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
[server]
basicConstraints = CA:FALSE
subjectAltName = IP:127.0.0.1
extendedKeyUsage = serverAuth
"""


def make_certs(d):
    os.makedirs(d, exist_ok=True)
    cnf = os.path.join(d, "openssl.cnf")
    with open(cnf, "w") as f:
        f.write(CONFIG)
    p = lambda n: os.path.join(d, n)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", "-new", *ec, "-keyout", p("ca.key"), "-out", p("ca.pem"),
         "-days", "2", "-config", cnf, "-extensions", "ca"])
    run(["openssl", "req", "-new", *ec, "-keyout", p("server.key"), "-out", p("server.csr"),
         "-config", cnf])
    run(["openssl", "x509", "-req", "-in", p("server.csr"), "-CA", p("ca.pem"), "-CAkey",
         p("ca.key"), "-CAcreateserial", "-out", p("server.pem"), "-days", "2", "-extfile", cnf,
         "-extensions", "server"])
    return p("ca.pem"), p("server.pem"), p("server.key")


class Redis:
    """One redis-server: plain TCP on `port`, TLS on `tls_port`, the same data."""

    def __init__(self, directory, port, tls_port, cert, key, ca):
        self.port, self.tls_port = port, tls_port
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--tls-port",
             str(tls_port), "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file",
             ca, "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir",
             directory, "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > end:
                sys.exit("redis-server did not start (built without TLS?)")
            time.sleep(0.05)

    def wchar(self):
        with open(f"/proc/{self.proc.pid}/io") as f:
            return int(dict(line.split(": ") for line in f.read().splitlines())["wchar"])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def key_of(i):
    digest = hashlib.sha256(f"tls-bench-{i}".encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=")[:52]


def fill_db(args, work):
    """--entries Triton-shaped entries written through a kcache-fsd mount."""
    db, mnt = os.path.join(work, "source-db"), os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    proc = subprocess.Popen([args.fsd, "-f", "--db", db, mnt], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rng = random.Random(32)
    try:
        end = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > end:
                sys.exit("kcache-fsd did not mount")
            time.sleep(0.01)
        half = args.cubin_kib * 512
        for i in range(args.entries):
            d = os.path.join(mnt, "triton", key_of(i))
            os.makedirs(d)
            text = (f"// kernel {i}\n" + ".reg .f32 %f<64>;\n" * 8) * (half // 150 + 1)
            files = {
                f"k{i}.cubin": rng.randbytes(half) + text.encode()[:half],
                f"k{i}.json": json.dumps({"name": f"k{i}", "num_warps": 4}).encode(),
                f"__grp__k{i}.json": json.dumps({"child_paths": {
                    f"k{i}.cubin": f"{d}/k{i}.cubin", f"k{i}.json": f"{d}/k{i}.json"}}).encode(),
            }
            for name, data in files.items():
                with open(os.path.join(d, name), "wb") as f:
                    f.write(data)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", mnt], capture_output=True, timeout=60)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
    return db


def counter(s, name):
    if name in s:
        return s[name]
    for v in s.values():
        if isinstance(v, dict) and name in v:
            return v[name]
    return 0


def cpu_of_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measured(cmd, redis):
    """Runs `cmd`: its wall time, its CPU time (user + sys: less swayed by a loaded
    machine than wall time), and the bytes redis-server wrote meanwhile."""
    before, cpu = redis.wchar(), cpu_of_children()
    start = time.perf_counter()
    run(cmd)
    wall = time.perf_counter() - start
    return wall, cpu_of_children() - cpu, redis.wchar() - before


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fsd", required=True)
    p.add_argument("--kcache", required=True)
    p.add_argument("--entries", type=int, default=300)
    p.add_argument("--cubin-kib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work")
    args = p.parse_args()
    if shutil.which("openssl") is None:
        sys.exit("openssl is not installed (scripts/setup.sh installs it)")
    work = args.work or tempfile.mkdtemp(prefix="kcache-remote-tls-")
    os.makedirs(work, exist_ok=True)
    ca, cert, key = make_certs(os.path.join(work, "certs"))
    redis = Redis(work, free_port(), free_port(), cert, key, ca)
    sides = {
        "plain": ["--remote", f"redis://127.0.0.1:{redis.port}"],
        "tls": ["--remote", f"rediss://127.0.0.1:{redis.tls_port}", "--remote-tls-ca", ca],
    }
    result = {name: {"time": [], "cpu": [], "down": [], "wire": [], "one": [], "one_cpu": []}
              for name in sides}
    try:
        db = fill_db(args, work)
        run([args.kcache, "--db", db, "remote", *sides["plain"], "--remote-namespace", "bench",
             "push", "--job-tag", "job"])
        one = "triton/" + key_of(0)
        for i in range(args.rounds):
            for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
                cold = os.path.join(work, f"cold-{name}-{i}")
                wall, cpu, wire = measured([args.kcache, "--db", cold, "remote", *sides[name],
                                       "--remote-namespace", "bench", "pull", "--job-tag", "job"],
                                      redis)
                s = json.loads(run([args.kcache, "--db", cold, "stats", "--json"]).stdout)
                if counter(s, "entries") != args.entries:
                    sys.exit(f"{name}: pulled {counter(s, 'entries')} of {args.entries} entries")
                result[name]["time"].append(wall)
                result[name]["wire"].append(wire)
                result[name]["cpu"].append(cpu)
                result[name]["down"].append(counter(s, "remote_bytes_down"))
                shutil.rmtree(cold)
                cold = os.path.join(work, f"one-{name}-{i}")
                wall, cpu, _ = measured([args.kcache, "--db", cold, "remote", *sides[name],
                                    "--remote-namespace", "bench", "pull", one], redis)
                result[name]["one"].append(wall)
                result[name]["one_cpu"].append(cpu)
                shutil.rmtree(cold)
    finally:
        redis.stop()

    pl, tl = result["plain"], result["tls"]
    med = statistics.median
    rows = [
        (f"cold prefetch of {args.entries} entries, time (median of {args.rounds})",
         med(pl["time"]), med(tl["time"]), "{:.3f} s"),
        ("cold prefetch, client CPU time (user + sys)", med(pl["cpu"]), med(tl["cpu"]),
         "{:.3f} s"),
        ("cold prefetch, payload from Redis (remote_bytes_down)", med(pl["down"]),
         med(tl["down"]), "{:,.0f} B"),
        ("cold prefetch, bytes on the wire from Redis (its sockets' writes)", med(pl["wire"]),
         med(tl["wire"]), "{:,.0f} B"),
        (f"one entry, fresh process (connect, handshake, pull; median of {args.rounds})",
         med(pl["one"]), med(tl["one"]), "{:.3f} s"),
        ("one entry, client CPU time (user + sys)", med(pl["one_cpu"]), med(tl["one_cpu"]),
         "{:.3f} s"),
    ]
    print("| | plain TCP | TLS | TLS / plain |\n|---|---|---|---|")
    for label, x, y, fmt in rows:
        print(f"| {label} | {fmt.format(x)} | {fmt.format(y)} | {y / x:.3f}x |")
    print(f"\nprefetch times: plain {[round(t, 3) for t in pl['time']]}, "
          f"tls {[round(t, 3) for t in tl['time']]}")
    print(f"one-entry times: plain {[round(t, 3) for t in pl['one']]}, "
          f"tls {[round(t, 3) for t in tl['one']]}")
    print(f"loadavg at the end: {os.getloadavg()}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
