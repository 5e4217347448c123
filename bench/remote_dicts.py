#!/usr/bin/env python3
"""Frames over the shared tier, before and after, on real Triton kernels.

    bench/remote_dicts.py --corpus DIR --fsd build/fsd/kcache-fsd --kcache build/cli/kcache \\
        --base-kcache BASE/cli/kcache [--rounds 5] [--work DIR]

DIR is a Triton cache (bench/triton_corpus.py writes one: 88 kernels for sm_90). The
bench copies it into a fresh db through a kcache-fsd mount, runs `kcache gc` (trains the
kinds' dictionaries and recompresses the blobs with them), then gives that one db to two
CLIs, each with a redis-server of its own:
  - "before": --base-kcache, a build from before frames (the blobs it pushes are content,
    recompressed in chunks; the dictionaries stay home);
  - "frames": --kcache (each blob's stored frame as it is, each dictionary once).
Each pushes every entry with a job tag. Measured per side: the bytes of the values in
Redis (STRLEN of every string key, the job set apart), Redis's used_memory over an empty
server, and a cold node's prefetch (`kcache remote pull --job-tag` into a fresh db): the
bytes it read from Redis (remote_bytes_down) and its wall time, the median of --rounds
pulls, the two sides alternating. Also the pulled db's stored/raw.
"""

import argparse
import json
import os
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


class Redis:
    """One redis-server on a Unix socket, with a minimal RESP client."""

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self.sock = os.path.join(directory, "redis.sock")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", directory, "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 15
        while True:
            try:
                if self.command("PING") == "PONG":
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > end:
                sys.exit("redis-server did not start")
            time.sleep(0.05)

    def url(self):
        return "unix:" + self.sock

    def commands(self, cmds):
        out = b"".join(
            b"*%d\r\n" % len(c) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in
                                           (x.encode() if isinstance(x, str) else x for x in c))
            for c in cmds)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(self.sock)
            s.sendall(out)
            f = s.makefile("rb")
            return [self._read(f) for _ in cmds]

    def command(self, *args):
        return self.commands([args])[0]

    def _read(self, f):
        line = f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = f.read(n + 2)[:-2]
            return data
        if kind == b"*":
            return [self._read(f) for _ in range(int(rest))]
        raise RuntimeError(f"bad reply {line!r}")

    def used_memory(self):
        info = self.command("INFO", "memory").decode()
        for line in info.splitlines():
            if line.startswith("used_memory:"):
                return int(line.split(":")[1])
        return 0

    def value_bytes(self):
        keys = [k for k in self.command("KEYS", "kc2:*") if b":j:" not in k]
        lengths = self.commands([("STRLEN", k) for k in keys]) if keys else []
        by_type = {}
        for k, n in zip(keys, lengths):
            t = k.split(b":")[2].decode()
            by_type[t] = by_type.get(t, 0) + n
        return sum(lengths), len(keys), by_type

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def stats(kcache, db):
    return json.loads(run([kcache, "--db", db, "stats", "--json"]).stdout)


def counter(s, name):
    """A counter of `kcache stats --json`, wherever its layout puts it."""
    if name in s:
        return s[name]
    for v in s.values():
        if isinstance(v, dict) and name in v:
            return v[name]
    return 0


def fill_db(args, work):
    """The corpus copied into a fresh db through a mount, then `kcache gc` (train, rewrite)."""
    db, mnt = os.path.join(work, "source-db"), os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    proc = subprocess.Popen([args.fsd, "-f", "--db", db, mnt], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > end:
                sys.exit("kcache-fsd did not mount")
            time.sleep(0.01)
        shutil.copytree(args.corpus, os.path.join(mnt, "triton"))
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", mnt], capture_output=True, timeout=60)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
    run([args.kcache, "--db", db, "gc"])
    return db


def remote(kcache, db, redis, *tail):
    return [kcache, "--db", db, "remote", "--remote", redis.url(), "--remote-namespace", "bench",
            *tail]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--fsd", required=True)
    p.add_argument("--kcache", required=True)
    p.add_argument("--base-kcache", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="kcache-remote-dicts-")
    os.makedirs(work, exist_ok=True)

    db = fill_db(args, work)
    s = stats(args.kcache, db)
    log(f"source db: {counter(s, 'entries')} entries, stored/raw "
        f"{counter(s, 'stored_bytes') / max(counter(s, 'blob_raw_bytes'), 1):.3f}")

    sides = {"before": args.base_kcache, "frames": args.kcache}
    servers = {name: Redis(os.path.join(work, f"redis-{name}")) for name in sides}
    result = {}
    try:
        for name, kcache in sides.items():
            r = servers[name]
            empty = r.used_memory()
            run(remote(kcache, db, r, "push", "--job-tag", "job"))
            total, keys, by_type = r.value_bytes()
            result[name] = {"value_bytes": total, "keys": keys, "by_type": by_type,
                            "used_memory": r.used_memory() - empty, "times": [], "down": []}
        for i in range(args.rounds):
            for name, kcache in (sides.items() if i % 2 == 0 else reversed(sides.items())):
                cold = os.path.join(work, f"cold-{name}-{i}")
                start = time.perf_counter()
                run(remote(kcache, cold, servers[name], "pull", "--job-tag", "job"))
                result[name]["times"].append(time.perf_counter() - start)
                s = stats(args.kcache, cold)
                result[name]["down"].append(counter(s, "remote_bytes_down"))
                result[name]["stored_raw"] = (counter(s, "stored_bytes") /
                                              max(counter(s, "blob_raw_bytes"), 1))
                result[name]["entries"] = counter(s, "entries")
                shutil.rmtree(cold)
    finally:
        for r in servers.values():
            r.stop()

    b, f = result["before"], result["frames"]
    rows = [
        ("Redis value bytes", b["value_bytes"], f["value_bytes"], "{:,} B"),
        ("Redis keys", b["keys"], f["keys"], "{:,}"),
        ("Redis used_memory (over empty)", b["used_memory"], f["used_memory"], "{:,} B"),
        ("cold prefetch, bytes from Redis", statistics.median(b["down"]),
         statistics.median(f["down"]), "{:,.0f} B"),
        (f"cold prefetch, time (median of {args.rounds})", statistics.median(b["times"]),
         statistics.median(f["times"]), "{:.3f} s"),
    ]
    print(f"| | before | frames | ratio |\n|---|---|---|---|")
    for label, x, y, fmt in rows:
        print(f"| {label} | {fmt.format(x)} | {fmt.format(y)} | {y / x:.3f}x |")
    print(f"| pulled db, stored/raw | {b['stored_raw']:.3f} | {f['stored_raw']:.3f} | |")
    print(f"\nentries pulled: before {b['entries']}, frames {f['entries']}")
    print(f"value bytes by key type: before {b['by_type']}, frames {f['by_type']}")
    print(f"prefetch times: before {[round(t, 3) for t in b['times']]}, "
          f"frames {[round(t, 3) for t in f['times']]}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
