#!/usr/bin/env python3
"""Extended attributes and fallocate on a kcache mount against a plain directory (issue 33).

Starts kcache-fsd twice on fresh dbs, once as it is and once with --no-xattrs, next to a
plain directory on the same disk (the temporary directory's file system: ext4 here), and
times, per call (median of CHUNKS chunks of CALLS calls, the three directories in turn, in
microseconds):
  setxattr   user.bench = 32 bytes on one file (a write transaction each on the mount)
  getxattr   the same attribute
  fallocate  KEEP_SIZE of 4 KiB inside the file, and PUNCH_HOLE|KEEP_SIZE of 4 KiB, on a
             descriptor open for writing
  pwrite     4 KiB at offset 0 of a descriptor open for writing: on the mount the kernel
             asks for security.capability before each write(2) once the daemon answers
             extended-attribute requests (FUSE file systems never set S_NOSEC); with
             --no-xattrs it answers ENOSYS once and the kernel asks no more.
Then counts the FUSE requests of WRITES pwrites on a mount run with -d (libfuse's request
log): GETXATTR per WRITE, both ways.
Prints each figure, the mount-against-plain ratios and the pwrite cost with xattrs against
--no-xattrs.
Usage: bench/xattr_fallocate.py --fsd build/fsd/kcache-fsd [--calls 200] [--chunks 30]
           [--writes 200] [--io-uring]
"""
import argparse
import ctypes
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def wait_mounted(path, proc, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.ismount(path):
            return
        if proc.poll() is not None:
            sys.exit("kcache-fsd exited: %s" % proc.returncode)
        time.sleep(0.05)
    sys.exit("kcache-fsd did not mount")


class Mount:
    def __init__(self, fsd, root, name, extra=(), log=None):
        self.db = os.path.join(root, name + "-db")
        self.path = os.path.join(root, name)
        os.mkdir(self.path)
        out = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([fsd, "-f", "--db", self.db, *extra, self.path],
                                     stdout=out, stderr=out)
        wait_mounted(self.path, self.proc)

    def close(self):
        subprocess.run(["fusermount3", "-u", self.path], check=False)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Target:
    """One directory under test: a 1 MiB file with an attribute, open for writing."""

    def __init__(self, root, with_xattrs=True):
        d = os.path.join(root, "k")
        os.makedirs(d, exist_ok=True)
        self.path = os.path.join(d, "f.bin")
        with open(self.path, "wb") as f:
            f.write(os.urandom(1 << 20))
        self.fd = os.open(self.path, os.O_RDWR)
        self.with_xattrs = with_xattrs
        self.value = os.urandom(32)
        if with_xattrs:
            os.setxattr(self.path, "user.bench", self.value)

    def ops(self):
        page = os.urandom(4096)
        out = {}
        if self.with_xattrs:
            out["setxattr"] = lambda: os.setxattr(self.path, "user.bench", self.value)
            out["getxattr"] = lambda: os.getxattr(self.path, "user.bench")
        out["fallocate keep_size"] = lambda: fallocate(self.fd, FALLOC_FL_KEEP_SIZE, 8192, 4096)
        out["fallocate punch_hole"] = lambda: fallocate(
            self.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192, 4096)
        out["pwrite 4k"] = lambda: os.pwrite(self.fd, page, 0)
        return out

    def close(self):
        os.close(self.fd)


def per_call_us(fn, calls):
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


def measure(targets, calls, chunks):
    """Per-call medians: for each op, `chunks` chunks of `calls` calls on each target in
    turn, so that the machine's load changes reach every target alike."""
    ops = {name: t.ops() for name, t in targets.items()}
    med = {name: {} for name in targets}
    for op in ops[next(iter(targets))]:
        samples = {name: [] for name in targets}
        for _ in range(chunks):
            for name in targets:
                if op in ops[name]:
                    samples[name].append(per_call_us(ops[name][op], calls))
        for name in targets:
            if samples[name]:
                med[name][op] = statistics.median(samples[name])
    return med


def requests_per_write(fsd, root, name, extra, writes):
    log = os.path.join(root, name + ".log")
    m = Mount(fsd, root, name, ["-d", *extra], log=log)
    try:
        fd = os.open(os.path.join(m.path, "w.bin"), os.O_RDWR | os.O_CREAT, 0o644)
        for _ in range(writes):
            os.pwrite(fd, b"x" * 4096, 0)
        os.close(fd)
    finally:
        m.close()
    with open(log) as f:
        ops = re.findall(r"opcode: ([A-Z_]+)", f.read())
    return ops.count("GETXATTR"), ops.count("WRITE")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--chunks", type=int, default=30)
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--io-uring", action="store_true",
                    help="mount with --io-uring (FUSE over io_uring, where the kernel offers it)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="kcache-xattr-bench-")
    mounts = []
    try:
        plain = os.path.join(root, "plain")
        os.mkdir(plain)
        transport = ["--io-uring"] if args.io_uring else []
        with_x = Mount(args.fsd, root, "mount", transport)
        mounts.append(with_x)
        without_x = Mount(args.fsd, root, "mount-no-xattrs", ["--no-xattrs", *transport])
        mounts.append(without_x)
        targets = {"plain": Target(plain), "mount": Target(with_x.path),
                   "mount --no-xattrs": Target(without_x.path, with_xattrs=False)}
        try:
            med = measure(targets, args.calls, args.chunks)
        finally:
            for t in targets.values():
                t.close()
        print("per call, median of %d alternated chunks of %d calls (us):" % (args.chunks, args.calls))
        print("%-22s %10s %10s %18s %12s" % ("", "plain", "mount", "mount --no-xattrs",
                                             "mount/plain"))
        for op in med["mount"]:
            nx = med["mount --no-xattrs"].get(op)
            print("%-22s %10.2f %10.2f %18s %11.1fx" % (
                op, med["plain"][op], med["mount"][op], "%.2f" % nx if nx else "-",
                med["mount"][op] / med["plain"][op]))
        w, wn = med["mount"]["pwrite 4k"], med["mount --no-xattrs"]["pwrite 4k"]
        print("pwrite 4k with xattrs / with --no-xattrs: %.2fx" % (w / wn))
    finally:
        for m in mounts:
            m.close()
    try:
        for name, extra in (("count", []), ("count-no-xattrs", ["--no-xattrs"])):
            g, wr = requests_per_write(args.fsd, root, name, extra + transport, args.writes)
            print("%-16s %d pwrites: %d WRITE, %d GETXATTR requests (%.2f per WRITE)" % (
                "mount" + (" --no-xattrs" if extra else "") + ":", args.writes, wr, g,
                g / max(wr, 1)))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
