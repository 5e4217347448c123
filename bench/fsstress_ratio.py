#!/usr/bin/env python3
"""fsstress (xfstests) on a kcache mount against a plain directory (issue 33's figure).

  bench/fsstress_ratio.py --fsd build/fsd/kcache-fsd [--io-uring] [--seeds 3] [--requests]
                          [--baseline-fsd OTHER/kcache-fsd]
                          [--floor build/bench/kcache-bench-floor-fsd]

Builds fsx and fsstress from ../shared/third_party/xfstests (BUILD-HERE.sh, needs
xfslibs-dev) into a temporary directory, mounts kcache-fsd on a fresh db (allow_other,
as tests/posix/xfstests.py does) and, for each seed, runs the two loads of the issue on
the mount and on a plain directory beside the db (the same disk), alternating which goes
first, and prints each time, the medians and the ratio mount/plain:

  4 x 2,000   fsstress -p 4 -n 2000 -s SEED
  1 x 3,000   fsstress -p 1 -n 3000 -s SEED

The operations tests/posix/fsstress_differences.txt lists (those the mount refuses:
extended attributes, fallocate, ...) are turned off on both sides, so both do the same
work. --baseline-fsd: a second kcache-fsd (another build, e.g. before a change) mounted
on a db of its own and timed in the same rounds, and the ratio mount/baseline (the spill
files' cost was measured so). --floor: the FUSE floor (bench/floor/: kcache-fsd's
protocol choices in memory, nothing else; /dev/fuse only) timed in the same rounds, with
the ratio mount/floor and its requests per operation by opcode. --requests: one more 1 x 3,000 run on a mount started with -d (libfuse's log of
every request; not timed), and the FUSE requests per fsstress operation by opcode.
Root (fsstress changes owners and makes devices). The figures depend on the machine's
load: say what else ran.
"""
import argparse
import collections
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DIFFERENCES = os.path.join(ROOT, "tests", "posix", "fsstress_differences.txt")
LOADS = [("4 x 2,000", ["-p", "4", "-n", "2000"], 8000), ("1 x 3,000", ["-p", "1", "-n", "3000"], 3000)]
OPCODE = re.compile(r"^unique: \d+, opcode: (\w+) ", re.M)


def in_mountinfo(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def listed_ops():
    ops = []
    with open(DIFFERENCES) as f:
        for line in f:
            text = line.partition("#")[0].strip()
            if text:
                ops.append(text)
    return ops


def mount(fsd, db, mnt, io_uring, debug=False):
    os.makedirs(mnt, exist_ok=True)
    argv = [fsd, "-f", "--db", db, "-o", "allow_other"] + (["--io-uring"] if io_uring else [])
    if debug:
        argv.append("-d")
    log = open(db + ".log", "w")
    p = subprocess.Popen(argv + [mnt], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True)
    deadline = time.monotonic() + 10
    while not in_mountinfo(mnt) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not in_mountinfo(mnt):
        sys.exit("kcache-fsd did not mount: " + open(db + ".log").read())
    return p


def mount_floor(floor, mnt, counts):
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen([floor, "--counts", counts, mnt], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + 10
    while not in_mountinfo(mnt) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not in_mountinfo(mnt):
        sys.exit("the floor daemon did not mount")
    return p


def floor_counts(p, counts):
    """The floor's requests so far, by opcode (it writes them on SIGUSR1)."""
    if os.path.exists(counts):
        os.unlink(counts)
    p.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not os.path.exists(counts) and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(counts) as f:
        return collections.Counter({k: int(v) for k, v in (line.split() for line in f)})


def print_per_operation(title, counts, operations):
    total = sum(counts.values())
    print(f"\n{title}: {total / operations:.2f}")
    for op, n in counts.most_common():
        if n >= 30:
            print(f"  {op:14}{n / operations:6.2f}")


def unmount(p, mnt):
    subprocess.run(["fusermount3", "-u", mnt])
    p.wait(timeout=30)


def timed(fsstress, directory, argv):
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    t = time.monotonic()
    r = subprocess.run([fsstress, "-d", directory] + argv, stdout=subprocess.DEVNULL,
                       stderr=subprocess.STDOUT)
    took = time.monotonic() - t
    if r.returncode != 0:
        sys.exit(f"fsstress {' '.join(argv)} in {directory}: exit {r.returncode}")
    return took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--xfstests", default=os.path.join(ROOT, "..", "shared", "third_party", "xfstests"))
    ap.add_argument("--io-uring", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", action="store_true")
    ap.add_argument("--baseline-fsd", help="another kcache-fsd, timed beside --fsd")
    ap.add_argument("--floor", help="the FUSE floor daemon (kcache-bench-floor-fsd), timed beside --fsd")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (fsstress changes owners and makes devices)")
    tmp = tempfile.mkdtemp(prefix="kcache-fsstress-bench-")
    try:
        subprocess.run(["bash", os.path.join(args.xfstests, "BUILD-HERE.sh"), os.path.join(tmp, "bin")],
                       check=True, stdout=subprocess.DEVNULL)
        fsstress = os.path.join(tmp, "bin", "fsstress")
        off = [a for op in listed_ops() for a in ("-f", f"{op}=0")]
        db, mnt, plain = (os.path.join(tmp, n) for n in ("db", "mnt", "plain"))
        p = mount(args.fsd, db, mnt, args.io_uring)
        places = [("mount", mnt), ("plain", plain)]
        base = None
        if args.baseline_fsd:
            bdb, bmnt = os.path.join(tmp, "bdb"), os.path.join(tmp, "bmnt")
            base = mount(args.baseline_fsd, bdb, bmnt, args.io_uring)
            places.insert(1, ("baseline", bmnt))
        floor = None
        if args.floor:
            if args.io_uring:
                sys.exit("--floor: the floor daemon serves /dev/fuse only")
            fmnt, fcounts = os.path.join(tmp, "fmnt"), os.path.join(tmp, "floor.counts")
            floor = mount_floor(args.floor, fmnt, fcounts)
            places.insert(1, ("floor", fmnt))
        times = collections.defaultdict(list)
        try:
            for seed in range(1, args.seeds + 1):
                for name, load, _ in LOADS:
                    argv = load + ["-s", str(seed)] + off
                    order = list(places)
                    if seed % 2 == 0:
                        order.reverse()
                    for where, d in order:
                        times[(name, where)].append(timed(fsstress, os.path.join(d, f"s{seed}"), argv))
                    print(f"seed {seed} {name}: " + ", ".join(
                        f"{where} {times[(name, where)][-1]:.2f} s" for where, _ in places), flush=True)
        finally:
            unmount(p, mnt)
            if base:
                unmount(base, bmnt)
            if floor:
                unmount(floor, fmnt)
        transport = "io_uring" if args.io_uring else "/dev/fuse"
        print(f"\nfsstress on a kcache mount over {transport} against a plain directory on the "
              f"same disk, {args.seeds} seeds, medians (the {len(off) // 2} operations "
              f"fsstress_differences.txt lists turned off on both)")
        others = [w for w in ("baseline", "floor") if any(where == w for where, _ in places)]
        print(f"{'load':12}{'mount s':>10}{'plain s':>10}{'ratio':>8}" +
              "".join(f"{w + ' s':>12}{'mount/' + w:>16}" for w in others))
        for name, _, _ in LOADS:
            m = statistics.median(times[(name, "mount")])
            pl = statistics.median(times[(name, "plain")])
            line = f"{name:12}{m:10.2f}{pl:10.3f}{m / pl:8.1f}x"
            for w in others:
                b = statistics.median(times[(name, w)])
                line += f"{b:12.2f}{m / b:15.2f}x"
            if "floor" in others:
                line += f"   (floor/plain {statistics.median(times[(name, 'floor')]) / pl:.1f}x)"
            print(line)
        if args.requests:
            ddb, dmnt = os.path.join(tmp, "ddb"), os.path.join(tmp, "dmnt")
            p = mount(args.fsd, ddb, dmnt, args.io_uring, debug=True)
            try:
                timed(fsstress, os.path.join(dmnt, "r"), ["-p", "1", "-n", "3000", "-s", "1"] + off)
            finally:
                unmount(p, dmnt)
            with open(ddb + ".log") as f:
                counts = collections.Counter(OPCODE.findall(f.read()))
            print_per_operation("FUSE requests per fsstress operation (1 x 3,000, seed 1)", counts, 3000)
            if args.floor:
                p = mount_floor(args.floor, fmnt, fcounts)
                try:
                    before = floor_counts(p, fcounts)
                    timed(fsstress, os.path.join(fmnt, "r"), ["-p", "1", "-n", "3000", "-s", "1"] + off)
                    counts = floor_counts(p, fcounts) - before
                finally:
                    unmount(p, fmnt)
                print_per_operation("The floor's FUSE requests per fsstress operation (the same run)",
                                    counts, 3000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
