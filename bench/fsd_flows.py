#!/usr/bin/env python3
"""Compiler-like cache flows: plain directory, the FUSE floor, kcache-fsd, and
kcache-fsd --read-only.

Mounts kcache-fsd on a fresh db and the floor (bench/floor/floor_fsd.cpp: an
in-memory FUSE daemon with kcache-fsd's protocol choices and nothing else) next to
a plain directory on the same disk, then runs each phase on the three, alternated
(the order rotates every round), several rounds, and prints the median time per
phase, the ratios against the plain directory and against the floor, and the FUSE
round trips per file by opcode for each daemon. With --io-uring (default: auto, when
root and the kernel has FUSE over io_uring; the fuse module's enable_uring is set for
the run and restored) two more columns: `uring`, kcache-fsd --io-uring on its own db,
rotated with the others, and `ro-uring`, --read-only --io-uring serving that db. The read-only daemon (`ro`) serves the
db the read-write one (`kcache`) fills, mounted beside it: it runs the hit and miss
phases right after `kcache` in each round, reading what that round stored. Phases:
  store  one process stores N Triton-style entries (tmp dir, write, os.replace,
         os.removedirs; three files: 8 KiB binary, 1 KiB JSON, 16 KiB IR)
  hit-py P fresh Python processes each look up and read every entry
  hit-c  P fresh native processes (kcache-bench-c-reader) each open, fstat and read
         every file, as nvcc or ccache do
  miss   one process looks up N keys that are absent (os.path.exists)
  remove one process removes the N entries the round stored (shutil.rmtree each, as
         a user clearing a cache dir does); at the end of each round, after the
         read-only daemons have read what the round stored, in the same order
Round trips: the floor's from its own counters (SIGUSR1 dumps, over the timed
rounds); kcache-fsd's from a separate, untimed pass with `-d` (libfuse logs every
request as `unique: N, opcode: NAME (..)`) on a fresh db, parsed here.
Usage: bench/fsd_flows.py [--fsd build/fsd/kcache-fsd] [--floor build/bench/kcache-bench-floor-fsd]
       [--c-reader build/bench/kcache-bench-c-reader] [--entries 200] [--procs 4] [--rounds 3]
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
REMOVE = r'''
import os, shutil, sys
root, n, salt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for i in range(n):
    shutil.rmtree(os.path.join(root, f"{salt}{i:06d}"))
'''
READS = ("hit-py", "hit-c", "miss")  # the phases a read-only daemon runs too
WRITES_FIRST = ("store",) + READS  # each target in turn; then, at the round's end, remove
PHASES = WRITES_FIRST + ("remove",)
WHERE = ("plain", "floor", "kcache", "ro", "uring", "ro-uring")
READ_ONLY = {"ro": "kcache", "ro-uring": "uring"}  # each follows the daemon whose db it serves
URING_PARAM = "/sys/module/fuse/parameters/enable_uring"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmds):
    start = time.perf_counter()
    procs = [subprocess.Popen(c) for c in cmds]
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"flow failed: {p.args}")
    return time.perf_counter() - start


def phase_cmds(args, phase, root, salt):
    py, n = sys.executable, str(args.entries)
    if phase == "store":
        return [[py, "-c", STORE, root, n, salt]]
    if phase == "hit-py":
        return [[py, "-c", HIT, root, n, salt]] * args.procs
    if phase == "hit-c":
        return [[args.c_reader, root, n, salt]] * args.procs
    if phase == "remove":
        return [[py, "-c", REMOVE, root, n, salt]]
    return [[py, "-c", MISS, root, n, salt]]


def files_per_phase(args, phase):
    """What the round trips are divided by: files stored, files read, keys missed, files removed."""
    return {"store": 3 * args.entries, "hit-py": 3 * args.entries * args.procs,
            "hit-c": 3 * args.entries * args.procs, "miss": args.entries, "remove": 3 * args.entries}[phase]


def wait_mounted(path, proc=None, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.ismount(path):
            return
        if proc is not None and proc.poll() is not None:
            sys.exit(f"the daemon for {path} exited with {proc.returncode}")
        time.sleep(0.05)
    sys.exit(f"{path} did not mount")


def unmount(path, proc=None):
    """Always called (finally): unmount if mounted, then reap a foreground daemon."""
    if os.path.ismount(path):
        subprocess.call(["fusermount3", "-u", path])
    if proc is not None:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def floor_counts(proc, path):
    """The floor's cumulative counters: remove the file, SIGUSR1, wait for it again."""
    time.sleep(0.05)  # RELEASE and FORGET arrive asynchronously after the flow exits
    if os.path.exists(path):
        os.remove(path)
    proc.send_signal(signal.SIGUSR1)
    deadline = time.time() + 5
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit("the floor did not write its counts")
        time.sleep(0.01)
    with open(path) as f:
        return collections.Counter({k: int(v) for k, v in (line.split() for line in f if line.strip())})


OPCODE = re.compile(r"^unique: \d+, opcode: (\w+) ")


def debug_counts(log, start):
    """Requests per opcode in a libfuse -d log from byte offset `start`; new offset."""
    time.sleep(0.2)  # asynchronous RELEASE/FORGET; -d slows the daemon down
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read()
    counts = collections.Counter()
    for line in text.decode(errors="replace").splitlines():
        if m := OPCODE.match(line):
            counts[m.group(1)] += 1
    return counts, start + len(text)


def wait_said(log, text, timeout=10):
    """True once the daemon's log (DB/fsd.log) says `text`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(log) and text in open(log, errors="replace").read():
            return True
        time.sleep(0.05)
    return False


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsd", default=os.path.join(REPO, "build/fsd/kcache-fsd"))
    ap.add_argument("--floor", default=os.path.join(REPO, "build/bench/kcache-bench-floor-fsd"))
    ap.add_argument("--c-reader", default=os.path.join(REPO, "build/bench/kcache-bench-c-reader"))
    ap.add_argument("--entries", type=int, default=200)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--durability", default="batched")
    ap.add_argument("--dir", default=None, help="where to put the db and the plain dir (default: a temp dir)")
    ap.add_argument("--no-count-pass", action="store_true", help="skip kcache-fsd's -d counting pass")
    ap.add_argument("--io-uring", choices=("auto", "on", "off"), default="auto",
                    help="the uring and ro-uring columns (auto: when root and the kernel has FUSE over io_uring)")
    args = ap.parse_args()
    uring = args.io_uring == "on" or (args.io_uring == "auto" and os.geteuid() == 0 and os.path.exists(URING_PARAM))
    where_all = WHERE if uring else WHERE[:4]
    rotated = [w for w in where_all if w not in READ_ONLY]
    for exe in (args.fsd, args.floor, args.c_reader):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{exe}: not built (see bench/README.md)")
    load_before = loadavg()
    work = tempfile.mkdtemp(prefix="kcache-bench-", dir=args.dir)
    p = {x: os.path.join(work, x) for x in ("db", "db-count", "kcache", "floor", "plain", "kcache-count", "ro",
                                            "ro-count", "db-uring", "uring", "ro-uring")}
    for d in ("kcache", "floor", "plain", "kcache-count", "ro", "ro-count", "uring", "ro-uring"):
        os.makedirs(p[d])
    old_param = None
    counts_file = os.path.join(work, "floor.counts")
    floor = count_proc = ro_count_proc = None
    results = {(ph, w): [] for ph in PHASES for w in WHERE}
    floor_rt = {ph: collections.Counter() for ph in PHASES}
    kcache_rt = {ph: collections.Counter() for ph in PHASES}
    ro_rt = {ph: collections.Counter() for ph in PHASES}
    try:
        if uring:
            with open(URING_PARAM) as f:
                old_param = f.read().strip()
            with open(URING_PARAM, "w") as f:
                f.write("Y\n")
        subprocess.check_call([args.fsd, "--db", p["db"], "--durability", args.durability, p["kcache"]])
        wait_mounted(p["kcache"])
        subprocess.check_call([args.fsd, "--db", p["db"], "--read-only", p["ro"]])
        wait_mounted(p["ro"])
        if uring:
            subprocess.check_call([args.fsd, "--db", p["db-uring"], "--durability", args.durability, "--io-uring",
                                   p["uring"]])
            wait_mounted(p["uring"])
            if not wait_said(os.path.join(p["db-uring"], "fsd.log"), "serving over io_uring"):
                sys.exit("kcache-fsd --io-uring did not serve over io_uring (see its fsd.log)")
            # The read-only daemon logs to stderr: it does not write into the db.
            ro_uring_log = os.path.join(work, "ro-uring.log")
            with open(ro_uring_log, "wb") as err:
                ro_uring = subprocess.Popen([args.fsd, "-f", "--db", p["db-uring"], "--read-only", "--io-uring",
                                             p["ro-uring"]], stdout=subprocess.DEVNULL, stderr=err)
            wait_mounted(p["ro-uring"], ro_uring)
            if not wait_said(ro_uring_log, "serving over io_uring"):
                sys.exit("kcache-fsd --read-only --io-uring did not serve over io_uring")
        floor = subprocess.Popen([args.floor, "--counts", counts_file, p["floor"]])
        wait_mounted(p["floor"], floor)
        for r in range(args.rounds):
            k = r % len(rotated)
            order = rotated[k:] + rotated[:k]  # each target goes first in turn
            for ro, rw in READ_ONLY.items():
                if rw in order:
                    order.insert(order.index(rw) + 1, ro)
            salt = f"r{r}x"
            steps = [(where, phase) for where in order for phase in WRITES_FIRST
                     if not (where in READ_ONLY and phase == "store")]  # read-only
            steps += [(where, "remove") for where in order if where not in READ_ONLY]
            for where, phase in steps:
                before = floor_counts(floor, counts_file) if where == "floor" else None
                results[(phase, where)].append(timed(phase_cmds(args, phase, p[where], salt)))
                if where == "floor":
                    floor_rt[phase] += floor_counts(floor, counts_file) - before
        if not args.no_count_pass:
            log = os.path.join(work, "kcache-d.log")
            with open(log, "wb") as err:
                count_proc = subprocess.Popen([args.fsd, "--db", p["db-count"], "--durability", args.durability,
                                               "-d", p["kcache-count"]], stdout=subprocess.DEVNULL, stderr=err)
            wait_mounted(p["kcache-count"], count_proc)
            _, offset = debug_counts(log, 0)  # INIT and the mount's own requests
            for phase in WRITES_FIRST:  # remove: after the read-only pass below
                timed(phase_cmds(args, phase, p["kcache-count"], "cx"))
                kcache_rt[phase], offset = debug_counts(log, offset)
            ro_log = os.path.join(work, "ro-d.log")
            with open(ro_log, "wb") as err:
                ro_count_proc = subprocess.Popen([args.fsd, "--db", p["db-count"], "--read-only", "-d", p["ro-count"]],
                                                 stdout=subprocess.DEVNULL, stderr=err)
            wait_mounted(p["ro-count"], ro_count_proc)
            _, ro_offset = debug_counts(ro_log, 0)
            for phase in READS:  # what the read-write pass stored
                timed(phase_cmds(args, phase, p["ro-count"], "cx"))
                ro_rt[phase], ro_offset = debug_counts(ro_log, ro_offset)
            _, offset = debug_counts(log, offset)  # skip what it logged meanwhile
            timed(phase_cmds(args, "remove", p["kcache-count"], "cx"))
            kcache_rt["remove"], offset = debug_counts(log, offset)
    finally:
        unmount(p["ro"])
        unmount(p["kcache"])
        if uring:
            unmount(p["ro-uring"], ro_uring if "ro_uring" in locals() else None)
            unmount(p["uring"])
            if old_param is not None:
                with open(URING_PARAM, "w") as f:
                    f.write(old_param + "\n")
        unmount(p["ro-count"], ro_count_proc)
        unmount(p["floor"], floor)
        unmount(p["kcache-count"], count_proc)
    load_after = loadavg()

    print(f"fsd flows: {args.entries} entries x 3 files, {args.procs} reader processes, {args.rounds} rounds "
          f"alternated, kcache-fsd durability {args.durability}, dir {work}")
    print(f"load average (1/5/15 min) before {load_before}, after {load_after}; {os.cpu_count()} CPUs")
    daemons = [w for w in where_all if w != "plain"]
    print(f"\n{'phase':7}" + "".join(f" {w + ' ms':>12}" for w in where_all)
          + "".join(f" {w + '/plain':>15}" for w in daemons)
          + "".join(f" {w + '/floor':>15}" for w in daemons if w != "floor"))
    for phase in PHASES:
        m = {w: statistics.median(results[(phase, w)]) * 1000 for w in where_all if results[(phase, w)]}
        cell = lambda w, v: f" {v:>12.1f}" if w in m else f" {'-':>12}"
        ratio = lambda w, base: f" {m[w] / m[base]:>14.2f}x" if w in m else f" {'-':>15}"
        print(f"{phase:7}" + "".join(cell(w, m.get(w)) for w in where_all)
              + "".join(ratio(w, "plain") for w in daemons)
              + "".join(ratio(w, "floor") for w in daemons if w != "floor"))
    if uring:
        print("\nio_uring against /dev/fuse: " + ", ".join(
            f"{ph} uring/kcache {statistics.median(results[(ph, 'uring')]) / statistics.median(results[(ph, 'kcache')]):.2f}x"
            for ph in PHASES)
            + ", " + ", ".join(
            f"{ph} ro-uring/plain {statistics.median(results[(ph, 'ro-uring')]) / statistics.median(results[(ph, 'plain')]):.2f}x"
            for ph in READS))

    per = {ph: files_per_phase(args, ph) for ph in PHASES}
    print("\nFUSE requests per file (store: per file stored; hit: per file read by one process; "
          "miss: per absent key; remove: per file removed).\nfloor (fl): its counters over the timed rounds; kcache (kc) and read-only "
          "(ro): one -d pass"
          + (" (skipped)" if args.no_count_pass else ""))
    ops = sorted({op for ph in PHASES for c in (floor_rt[ph], kcache_rt[ph], ro_rt[ph]) for op, v in c.items() if v})
    header = "".join(f" {ph + ' fl':>10} {ph + ' kc':>10} {ph + ' ro':>10}" for ph in PHASES)
    print(f"{'opcode':13}{header}")
    for op in ops + ["total"]:
        row = ""
        for ph in PHASES:
            fl = (sum(floor_rt[ph].values()) if op == "total" else floor_rt[ph][op]) / (per[ph] * args.rounds)
            kc = (sum(kcache_rt[ph].values()) if op == "total" else kcache_rt[ph][op]) / per[ph]
            ro = (sum(ro_rt[ph].values()) if op == "total" else ro_rt[ph][op]) / per[ph]
            row += f" {fl:10.2f} {kc:10.2f} " + (f"{ro:10.2f}" if ph in READS else f"{'-':>10}")
        print(f"{op:13}{row}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
