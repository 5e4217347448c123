#!/usr/bin/python3
"""fsx and fsstress (xfstests' tools) on a fresh kcache mount: CTest tests of label `posix`.

The tools come from ../shared/third_party/xfstests (read-only in CI): its BUILD-HERE.sh
builds fsx and fsstress into WORK/bin (needs Debian's xfslibs-dev: scripts/setup.sh). A
kcache-fsd serves a fresh db with allow_other over /dev/fuse or, with --io-uring, over
io_uring rings; `kcache verify` checks the db each test leaves. Three tests (MODE):

  fsx           fsx with SEEDS seeds x OPS operations (reads, writes, truncates, mapped
                reads and writes, copy ranges; every read checked against fsx's model) on
                a file of the mount: each must end "All N operations completed A-OK!".
                fsx turns off by itself what the file system refuses (fallocate modes,
                clone and dedupe ranges): those lines are printed.
  differential  `fsstress -p 1 -n 3000 -s SEED -v -V` on the mount and on a plain
                directory (the tests' temporary directory, on local disk): one process and
                a fixed seed make the same operations in the same order, so their outputs
                are compared line by line (-V leaves out inode numbers; block counts are
                masked). The operations DIFFERENCES (tests/posix/fsstress_differences.txt)
                lists behave differently on the mount: they are turned off (-f OP=0) in
                that run, since one result that differs (a file size) changes every later
                line, and each is checked apart by a small probe (creat, write, mkdir,
                mknod, symlink and OP, 200 operations) on both: a probe whose outputs are
                the same means that difference is gone, and fails the test until its line
                is taken off the file. Any difference in the main run fails the test.
  kills         `fsstress -p 4 -n 2000` on the mount while the serving daemon is killed
                (kill -9) every KILL_EVERY seconds (the keeper starts a successor), then
                the tree (names, types, modes, owners, sizes, link counts, contents, link
                targets) compared with the same run on the plain directory. Always
                checked: fsstress and the mount go on (exit 0, the keeper never gives up),
                no writer lost its bytes (a writer's unpublished bytes outlive the daemon
                in its spill file, fsd/src/survival/spill.hpp: the daemons log no writer lost), and
                the db is clean. Over /dev/fuse the trees must be the same: any path
                that differs fails the test (it did in 1 run in 12, more under load,
                until the daemon's request buffers were made resident: the kernel ends
                with EIO a request it cannot copy whole into a dying daemon's buffer,
                and a write() split in several WRITEs returned short; fsd/src/survival/takeover.cpp,
                make_resident). Over io_uring this kernel
                ends the calls in flight at a kill with ECANCELED and resends none
                (docs/operations.md), which fsstress ignores, so the trees part there
                (hundreds of paths): printed, never required.

Exit 0: all as expected; 1: otherwise; 77 (CTest's skip): no xfstests source, no
xfslibs-dev, not root, no FUSE, or io_uring asked for where the kernel does not serve it.
"""

import argparse
import collections
import difflib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

SKIP = 77
SEED = 11  # the differential's seed (the issue's)
PROBE_BASE = ["creat=4", "write=4", "mkdir=2", "mknod=2", "symlink=1"]


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def in_mountinfo(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def parse_differences(path, known_ops):
    """{op: reason}: a line is `OP # reason` (fsstress's operation name)."""
    ops = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            text, _, comment = line.partition("#")
            text = text.strip()
            if not text:
                continue
            if len(text.split()) != 1 or not comment.strip():
                raise SystemExit(f"{path}:{n}: expected `OP # reason`, got: {line!r}")
            if text not in known_ops:
                raise SystemExit(f"{path}:{n}: {text} is not an fsstress operation "
                                 f"({' '.join(sorted(known_ops))})")
            ops[text] = comment.strip()
    return ops


def fsstress_ops(fsstress):
    """The operation names fsstress knows (its usage lists them)."""
    out = subprocess.run([fsstress, "-H"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True).stdout
    listing = out.split("the valid operation names are:", 1)[1].split("-i filenum", 1)[0]
    return set(listing.split())


def build_tools(source, work):
    """fsx and fsstress in WORK/bin, built once (under a lock: the tests run in parallel)."""
    out = os.path.join(work, "bin")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(os.path.exists(os.path.join(out, t)) for t in ("fsx", "fsstress")):
            return out
        if not os.path.exists("/usr/include/xfs/xfs.h"):
            skip("fsstress needs Debian's xfslibs-dev (xfs/xfs.h): scripts/setup.sh installs it")
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run(["bash", os.path.join(source, "BUILD-HERE.sh"), tmp],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise SystemExit(f"building fsx and fsstress failed:\n{r.stdout}")
        shutil.rmtree(out, ignore_errors=True)
        os.rename(tmp, out)
    return out


class Mount:
    """kcache-fsd in the foreground (the keeper; the serving daemon is its child) on a
    fresh db in TMP, with allow_other, over /dev/fuse or io_uring."""

    def __init__(self, fsd, tmp, io_uring):
        self.db, self.mnt = os.path.join(tmp, "db"), os.path.join(tmp, "mnt")
        os.mkdir(self.mnt)
        self.log_path = os.path.join(tmp, "daemon.stderr")
        argv = [fsd, "-f", "--db", self.db, "-o", "allow_other"]
        if io_uring:
            argv.append("--io-uring")
        argv.append(self.mnt)
        with open(self.log_path, "w") as log:
            self.keeper = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=log, start_new_session=True)
        deadline = time.monotonic() + 10
        while (not in_mountinfo(self.mnt) and self.keeper.poll() is None and
               time.monotonic() < deadline):
            time.sleep(0.02)
        if not in_mountinfo(self.mnt):
            raise SystemExit(f"kcache-fsd did not mount {self.mnt}:\n{self.log()}")
        if io_uring:
            deadline = time.monotonic() + 10
            while "serving over" not in self.log() and time.monotonic() < deadline:
                time.sleep(0.02)
            if "serving over io_uring" not in self.log():
                raise SystemExit(f"--io-uring: the rings do not serve:\n{self.log()}")
        self.exit_code = None

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def serving_daemon(self):
        """The keeper's one child once it serves (the keeper logged it ready); None while
        there is none. A daemon still starting is left alone: killing every start under
        load is a crash loop, which the keeper ends by unmounting (keeper.hpp)."""
        try:
            with open(f"/proc/{self.keeper.pid}/task/{self.keeper.pid}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            return None
        if len(kids) != 1:
            return None
        log = self.log()
        ready = (f"keeper: daemon {kids[0]} serves ", f"through daemon {kids[0]}\n")
        return kids[0] if any(r in log for r in ready) else None

    def stop(self):  # idempotent
        if self.exit_code is not None:
            return
        if in_mountinfo(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt])
        try:
            self.keeper.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.keeper.pid, signal.SIGKILL)
            self.keeper.wait()
        if in_mountinfo(self.mnt):
            subprocess.run(["fusermount3", "-uz", self.mnt])
        self.exit_code = self.keeper.returncode

    def stop_and_verify(self, cli):
        """Unmount; 0 when the daemon exited 0 and `kcache verify` finds the db clean."""
        self.stop()
        if self.exit_code != 0:
            print(f"kcache-fsd exited {self.exit_code} (a clean unmount exits 0):\n{self.log()}")
            return 1
        if cli:
            v = subprocess.run([cli, "--db", self.db, "verify"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if v.returncode != 0:
                print(f"kcache verify of the db left:\n{v.stdout}")
                return 1
            print("kcache verify: the db left is clean")
        return 0


# ---- fsx ---------------------------------------------------------------------------


def run_fsx(args, tools, mount, work):
    fsx = os.path.join(tools, "fsx")
    logs = os.path.join(work, "fsx-logs")
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    failed = 0
    for seed in range(1, args.seeds + 1):
        path = os.path.join(mount.mnt, f"fsx-{seed}")
        started = time.monotonic()
        r = subprocess.run([fsx, "-N", str(args.ops), "-S", str(seed), "-P", logs, path],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
        took = time.monotonic() - started
        if seed == 1:  # what fsx turned off, once
            for line in r.stdout.splitlines():
                if "disabling" in line:
                    print(f"fsx: {line}")
        ok = r.returncode == 0 and f"All {args.ops} operations completed A-OK!" in r.stdout
        print(f"fsx seed {seed}, {args.ops} operations: {'A-OK' if ok else 'FAILED'} "
              f"({took:.1f} s)", flush=True)
        if not ok:
            failed += 1
            print(f"fsx exit {r.returncode}; the end of its output:\n"
                  + "\n".join(r.stdout.splitlines()[-60:]))
    return 1 if failed else 0


# ---- fsstress ------------------------------------------------------------------------

# [ino nlink uid gid blocks size]: block counts depend on the file system's allocation.
INODE_INFO = re.compile(r"\[(-?\d+) (\d+) (\d+) (\d+) (\d+) (\d+)\]")


def mask(line):
    return INODE_INFO.sub(lambda m: f"[{m[1]} {m[2]} {m[3]} {m[4]} - {m[6]}]", line)


def fsstress_run(fsstress, directory, argv, timeout):
    """fsstress ARGV in a new DIRECTORY: (exit code, masked output lines)."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    r = subprocess.run([fsstress, "-d", directory] + argv, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return r.returncode, [mask(line) for line in r.stdout.splitlines()]


def off(ops):
    argv = []
    for op in sorted(ops):
        argv += ["-f", f"{op}=0"]
    return argv


def run_differential(args, tools, mount, plain):
    fsstress = os.path.join(tools, "fsstress")
    listed = parse_differences(args.differences, fsstress_ops(fsstress))
    name = os.path.basename(args.differences)
    argv = ["-p", "1", "-n", str(args.ops), "-s", str(SEED), "-v", "-V"] + off(listed)
    fs_type = subprocess.run(["stat", "-f", "-c", "%T", plain], stdout=subprocess.PIPE,
                             text=True).stdout.strip()
    print(f"fsstress {' '.join(argv)}: on the mount and on {plain} ({fs_type}: the "
          f"differences {name} lists are against ext4)", flush=True)
    t0 = time.monotonic()
    rc_m, out_m = fsstress_run(fsstress, os.path.join(mount.mnt, "fsstress"), argv, args.timeout)
    t1 = time.monotonic()
    rc_p, out_p = fsstress_run(fsstress, os.path.join(plain, "fsstress"), argv, args.timeout)
    t2 = time.monotonic()
    print(f"mount: exit {rc_m}, {len(out_m)} lines, {t1 - t0:.1f} s; plain directory: exit "
          f"{rc_p}, {len(out_p)} lines, {t2 - t1:.1f} s")
    result = 0
    if rc_m != rc_p or out_m != out_p:
        result = 1
        diff = list(difflib.unified_diff(out_p, out_m, "plain directory", "mount", n=3,
                                         lineterm=""))
        print(f"DIFFERENT results (exit {rc_p} vs {rc_m}); the first of {len(diff)} diff lines "
              f"(a difference not in {name}):")
        print("\n".join(diff[:60]))
    else:
        print(f"the same {len(out_m)} results (the {len(listed)} operations {name} lists "
              "turned off)")
    # Each listed difference, checked apart: still different, or taken off the file.
    for op, reason in sorted(listed.items()):
        probe = ["-z"] + [a for f in PROBE_BASE + [f"{op}=4"] for a in ("-f", f)]
        probe += ["-p", "1", "-n", "200", "-s", "7", "-v", "-V"]
        rc_m, out_m = fsstress_run(fsstress, os.path.join(mount.mnt, "probe"), probe, 300)
        rc_p, out_p = fsstress_run(fsstress, os.path.join(plain, "probe"), probe, 300)
        differs = [(p, m) for p, m in zip(out_p, out_m) if p != m]
        if rc_m == rc_p and out_m == out_p:
            result = 1
            print(f"NOW THE SAME (take `{op}` off {name}): {reason}")
        else:
            first = differs[0] if differs else (f"{len(out_p)} lines", f"{len(out_m)} lines")
            print(f"still different, as listed: {op} ({reason}); first: plain `{first[0]}`, "
                  f"mount `{first[1]}`")
    return result


def tree(root):
    """{relative path: what a file system must keep}: no times, inode numbers or blocks."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            common = (oct(st.st_mode), st.st_uid, st.st_gid)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()[:16]
                out[rel] = common + (st.st_size, st.st_nlink, digest)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = common + (os.readlink(p),)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = common
            else:
                out[rel] = common + (st.st_rdev,)
    return out


def first_different_results(killed, plain):
    """Per fsstress process, the first operation whose result (-v) differs between the
    run under kills and the one without, with the lines before it."""
    def by_process(lines):
        # Inode numbers differ between the two file systems: masked.
        out = collections.defaultdict(list)
        for line in lines:
            proc, sep, _ = line.partition("/")
            if sep and proc.isdigit():
                line = re.sub(r"\[-?\d+ (\d+ \d+ \d+ - \d+)\]", r"[ino \1]", line)
                out[proc].append(re.sub(r"\breal ino \d+", "real ino -", line))
        return out
    mine, theirs = by_process(killed), by_process(plain)
    text = []
    for proc in sorted(set(mine) | set(theirs), key=int):
        a, b = mine.get(proc, []), theirs.get(proc, [])
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if at == len(a) == len(b):
            continue
        text.append(f"process {proc}: the first result that differs (operation {at}):")
        text += [f"    {line}" for line in b[max(0, at - 3):at]]
        text.append(f"  without kills: {b[at] if at < len(b) else '(none)'}")
        text.append(f"  under kills:   {a[at] if at < len(a) else '(none)'}")
    return "\n".join(text) or "every operation's result was the same"


def history(lines, path):
    """The operations (-v lines, inode numbers masked) of the process whose directory
    holds `path` that name its file (by its last component: fsstress logs paths relative
    to its process's directory)."""
    name = os.path.basename(path)
    pattern = re.compile(rf"/{re.escape(name)}\b|\b{re.escape(name)}\[")
    # Process N works in pN/: its own lines only (the processes' lines interleave).
    proc = path.split(os.sep)[0][1:] + "/"
    return [re.sub(r"\[-?\d+ (\d+ \d+ \d+ - \d+)\]", r"[ino \1]", line)
            for line in lines if line.startswith(proc) and pattern.search(line)]


def first_different_history(killed, plain, path, context=8):
    """Around the first operation on `path` whose line differs between the runs: what
    changed a file whose content differs, though no result did."""
    a, b = history(killed, path), history(plain, path)
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lines = [f"the operations on {os.path.basename(path)} up to the first that differs "
             f"(#{at}), without kills:"]
    lines += ["    " + line for line in b[max(0, at - context):at + 2]]
    lines.append("under kills:")
    lines += ["    " + line for line in a[max(0, at - context):at + 2]]
    return "\n".join(lines)


def run_kills(args, tools, mount, plain):
    fsstress = os.path.join(tools, "fsstress")
    listed = parse_differences(args.differences, fsstress_ops(fsstress))
    # -v: every operation's result, so that a difference names the first operation of
    # each process whose result differed (fsstress ignores most errors and goes on).
    argv = ["-p", "4", "-n", "2000", "-s", "7", "-v"] + off(listed)
    target = os.path.join(mount.mnt, "fsstress")
    os.makedirs(target)
    print(f"fsstress {' '.join(argv)} on the mount, the serving daemon killed every "
          f"{args.kill_every} s", flush=True)
    log = tempfile.TemporaryFile("w+")  # a pipe nobody reads meanwhile would fill
    run = subprocess.Popen([fsstress, "-d", target] + argv, stdin=subprocess.DEVNULL,
                           stdout=log, stderr=subprocess.STDOUT, text=True)
    kills = 0
    deadline = time.monotonic() + args.timeout
    while run.poll() is None and time.monotonic() < deadline:
        time.sleep(args.kill_every)
        pid = mount.serving_daemon()
        if run.poll() is None and pid:
            os.kill(pid, signal.SIGKILL)
            kills += 1
    if run.poll() is None:
        run.kill()
    run.wait()
    log.seek(0)
    out = [mask(line) for line in log.read().splitlines()]
    print(f"fsstress exit {run.returncode} after {kills} kills")
    if not in_mountinfo(mount.mnt) or mount.keeper.poll() is not None:
        print(f"the mount ended during the run (the keeper gave up?):\n{mount.log()[-4000:]}")
        return 1
    rc_p, out_p = fsstress_run(fsstress, os.path.join(plain, "fsstress"), argv, args.timeout)
    if kills == 0:
        print("no kill happened while fsstress ran (it ended first): nothing was checked")
        return 1
    mine, theirs = tree(target), tree(os.path.join(plain, "fsstress"))
    differ = sorted(p for p in set(mine) | set(theirs) if mine.get(p) != theirs.get(p))
    lost = [line for line in mount.log().splitlines() if "unpublished bytes died" in line]
    if lost:
        print(f"{len(lost)} writers lost their bytes to a kill (EIO):\n" + "\n".join(lost[:10]))
        return 1
    if differ and args.io_uring and run.returncode == 0 and rc_p == 0:
        why = ("the calls in flight at a kill end with ECANCELED (this kernel resends none "
               "over io_uring), which fsstress ignores")
        print(f"KNOWN: {len(differ)} of {len(theirs)} paths differ from the run without kills: "
              f"{why}; fsstress and the mount went on, no writer lost its bytes")
        for p in differ[:5]:
            print(f"  {p}: mount {mine.get(p)}, plain {theirs.get(p)}")
        print(first_different_results(out, out_p))
        return 0
    if run.returncode != 0 or rc_p != 0 or differ:
        print(f"DIFFERENT from the run without kills: {len(differ)} of {len(theirs)} paths "
              f"(fsstress exit {run.returncode}, without kills {rc_p})")
        for p in differ[:20]:
            print(f"  {p}: mount {mine.get(p)}, plain {theirs.get(p)}")
        print(first_different_results(out, out_p))
        for p in differ[:2]:
            print(first_different_history(out, out_p, p))
        # What the daemons said about writers they could not carry over.
        said = [line for line in mount.log().splitlines()
                if " warning: " in line or (" error: " in line and "keeper:" not in line)]
        print(f"the daemons' warnings and errors ({len(said)}):")
        print("\n".join(said[:30]))
        return 1
    print(f"the same tree as without kills: {len(mine)} paths")
    return 0


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["fsx", "differential", "kills"])
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--cli", help="kcache: `kcache verify` of the db a test left")
    ap.add_argument("--xfstests", required=True, help="the tools' source (BUILD-HERE.sh)")
    ap.add_argument("--work", required=True, help="where the tools are built")
    ap.add_argument("--differences", required=True, help="fsstress_differences.txt")
    ap.add_argument("--io-uring", action="store_true")
    ap.add_argument("--seeds", type=int, default=4, help="fsx: seeds 1..SEEDS")
    ap.add_argument("--ops", type=int, help="fsx: 5000 per seed; differential: 3000")
    ap.add_argument("--kill-every", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if args.ops is None:
        args.ops = 5000 if args.mode == "fsx" else 3000

    if not os.path.isfile(os.path.join(args.xfstests, "BUILD-HERE.sh")):
        skip(f"no xfstests source at {args.xfstests} (CI has ../shared beside the clone)")
    if os.geteuid() != 0:
        skip("fsstress runs as root (it changes owners, makes devices; allow_other)")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        skip("no /dev/fuse or fusermount3")
    if args.io_uring:
        try:
            with open("/sys/module/fuse/parameters/enable_uring") as f:
                on = f.read().startswith("Y")
        except OSError:
            on = False
        if not on:
            skip("FUSE over io_uring is off (the fuse module's enable_uring; the uring "
                 "CTest fixture sets it as root)")
    tools = build_tools(args.xfstests, args.work)

    transport = "io_uring" if args.io_uring else "/dev/fuse"
    tmp = os.path.realpath(tempfile.mkdtemp(prefix=f"kcache-{args.mode}-"))
    os.chmod(tmp, 0o755)
    plain = os.path.join(tmp, "plain")
    os.mkdir(plain)
    mount = None
    try:
        mount = Mount(args.fsd, tmp, args.io_uring)
        print(f"{args.mode} on a kcache mount over {transport} ({mount.mnt})", flush=True)
        if args.mode == "fsx":
            result = run_fsx(args, tools, mount, args.work)
        elif args.mode == "differential":
            result = run_differential(args, tools, mount, plain)
        else:
            result = run_kills(args, tools, mount, plain)
        verified = mount.stop_and_verify(args.cli)
        return result or verified
    except subprocess.TimeoutExpired as e:
        print(f"{e.cmd[0]} ran longer than {e.timeout:.0f} s")
        return 1
    finally:
        if mount:
            mount.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # CTest's timeout: clean up
    sys.exit(run())
