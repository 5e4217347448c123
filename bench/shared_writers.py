#!/usr/bin/env python3
"""Files that several handles write (issue 11): a kcache mount against a plain directory.

Starts kcache-fsd on a fresh db next to a plain directory on the same disk and runs,
on both in the same run:
  pages   one process updates a SIZE file (64 MiB) UPDATES times (1000), one 4 KiB
          page at a random page offset each, with an fsync after each update; prints
          the time, and the bytes written to disk: by the daemon (its /proc/PID/io
          wchar, what LMDB pwrites) for the mount, by the benchmark itself for the
          plain directory, and how much data.mdb grew.
  sqlite  tests/fsd/flows/sqlite_writers.py: PROCS processes each commit TXNS SQLite
          transactions (a connection per transaction, synchronous=FULL) in rollback
          journal mode and in WAL mode; prints the time on each and the ratio.
Usage: bench/shared_writers.py --fsd build/fsd/kcache-fsd [--size-mib 64] [--updates 1000]
           [--procs 8] [--txns 150] [--durability batched] [--skip pages|sqlite]
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SQLITE_FLOW = os.path.join(HERE, "..", "tests", "fsd", "flows", "sqlite_writers.py")


def io_of(pid):
    out = {}
    with open("/proc/%d/io" % pid) as f:
        for line in f:
            k, v = line.split(":")
            out[k.strip()] = int(v)
    return out


def wait_mounted(path, proc, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.ismount(path):
            return
        if proc.poll() is not None:
            sys.exit("kcache-fsd exited: %s" % proc.returncode)
        time.sleep(0.05)
    sys.exit("kcache-fsd did not mount")


def pages(root, size, updates, seed=1):
    path = os.path.join(root, "big.bin")
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(size // (1 << 20)):
            f.write(os.urandom(1 << 20))
    fd = os.open(path, os.O_RDWR)
    page = 4096
    started = time.monotonic()
    for _ in range(updates):
        off = rng.randrange(size // page) * page
        os.pwrite(fd, os.urandom(page), off)
        os.fsync(fd)
    took = time.monotonic() - started
    os.close(fd)
    return took


def sqlite(root, procs, txns, journal):
    db = os.path.join(root, "cache-v1-%s.sqlite3" % journal)
    started = time.monotonic()
    r = subprocess.run([sys.executable, SQLITE_FLOW, "write", "--db", db, "--procs", str(procs),
                        "--txns", str(txns), "--journal", journal], capture_output=True, text=True)
    took = time.monotonic() - started
    if r.returncode != 0:
        sys.exit("sqlite_writers.py failed: %s %s" % (r.stdout, r.stderr))
    c = subprocess.run([sys.executable, SQLITE_FLOW, "check", "--db", db, "--procs", str(procs),
                        "--txns", str(txns)], capture_output=True, text=True)
    if c.returncode != 0:
        sys.exit("sqlite check failed: %s" % c.stdout)
    return took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--updates", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--txns", type=int, default=150)
    ap.add_argument("--durability", default="batched")
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--dir", default=None, help="where to put the db and the plain dir (default: a temp dir)")
    args = ap.parse_args()

    base = tempfile.mkdtemp(prefix="kcache-bench-", dir=args.dir)
    db, mnt, plain = (os.path.join(base, n) for n in ("db", "mnt", "plain"))
    os.makedirs(mnt)
    os.makedirs(plain)
    fsd = subprocess.Popen([args.fsd, "--db", db, "--durability", args.durability, "-f", mnt],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_mounted(mnt, fsd)
        print("load average at start: %s" % open("/proc/loadavg").read().split()[:3])
        if "pages" not in args.skip:
            size = args.size_mib << 20
            me0 = io_of(os.getpid())["wchar"]
            t_plain = pages(plain, size, args.updates)
            plain_bytes = io_of(os.getpid())["wchar"] - me0 - size  # less the initial write
            d0 = io_of(fsd.pid)["wchar"]
            mdb = os.path.join(db, "data.mdb")
            m0 = os.path.getsize(mdb)
            t_mount = pages(mnt, size, args.updates)
            # What the initial 64 MiB file cost, to subtract: one more publish of it.
            mount_bytes = io_of(fsd.pid)["wchar"] - d0
            print("pages: %d MiB file, %d x 4 KiB update + fsync (durability=%s)"
                  % (args.size_mib, args.updates, args.durability))
            print("  plain dir: %8.2f s  %8.1f MiB written by the writer" % (t_plain, plain_bytes / 2**20))
            print("  mount:     %8.2f s  %8.1f MiB written by kcache-fsd (incl. the file's first store), "
                  "data.mdb %0.1f -> %0.1f MiB" % (t_mount, mount_bytes / 2**20, m0 / 2**20,
                                                  os.path.getsize(mdb) / 2**20))
            print("  ratio mount/plain: %.1fx time, %.0fx bytes" % (t_mount / t_plain, mount_bytes / max(plain_bytes, 1)))
        if "sqlite" not in args.skip:
            for journal in ("delete", "wal"):
                tp = sqlite(plain, args.procs, args.txns, journal)
                tm = sqlite(mnt, args.procs, args.txns, journal)
                print("sqlite %s: %d processes x %d transactions: plain %.2f s, mount %.2f s, ratio %.1fx"
                      % (journal, args.procs, args.txns, tp, tm, tm / tp))
        print("load average at end: %s" % open("/proc/loadavg").read().split()[:3])
    finally:
        subprocess.run(["fusermount3", "-u", mnt])
        try:
            fsd.wait(timeout=20)
        except subprocess.TimeoutExpired:
            fsd.kill()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
