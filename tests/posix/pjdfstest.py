#!/usr/bin/python3
"""pjdfstest on a fresh kcache mount: the CTest tests of label `posix` (tests/posix).

pjdfstest (a peer's POSIX suite, about 8,800 checks; ../shared/third_party/pjdfstest) is
built with its BUILD-HERE.sh into WORK, a kcache-fsd serves a fresh db with allow_other
(the suite runs steps as other users; default_permissions comes with it) over /dev/fuse
or, with --io-uring, over io_uring rings, and `prove -r` runs the suite from inside the
mount, and `kcache verify` checks the db it leaves. Its failing checks (file and check
number) are compared with EXPECTED
(tests/posix/expected_failures.txt): a failure the list does not name fails the test,
and so does a listed failure that now passes, so the list stays true.

Exit 0: exactly the listed failures; 1: otherwise; 77 (CTest's skip): no suite source,
not root, no FUSE, no prove, or io_uring asked for where the kernel does not serve it.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def in_mountinfo(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def parse_expected(path):
    """{(file, check): reason}; a line is `FILE CHECKS # reason`, CHECKS as 3 or 3-5,9."""
    expected = {}
    reason = ""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            text, _, comment = line.partition("#")
            text = text.strip()
            if not text:
                if comment.strip() and not line.lstrip().startswith("#"):
                    raise SystemExit(f"{path}:{n}: a reason without checks")
                continue
            fields = text.split()
            if len(fields) != 2 or not comment.strip():
                raise SystemExit(f"{path}:{n}: expected `FILE CHECKS # reason`, got: {line!r}")
            reason = comment.strip()
            for check in parse_ranges(fields[1]):
                expected[(fields[0], check)] = reason
    return expected


def parse_ranges(text):
    out = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def parse_prove(output, tests_dir):
    """The failing checks from prove's "Test Summary Report": {(file, check)}, where a
    file whose run broke off (a bad plan, a non-zero exit) adds (file, 0)."""
    failed = set()
    current = None
    in_list = False
    header = re.compile(r"^(\S.*\.t)\s+\(Wstat: (\d+) Tests: (\d+) Failed: (\d+)\)$")
    for line in output.splitlines():
        m = header.match(line)
        if m:
            current = os.path.relpath(m.group(1), tests_dir)
            in_list = False
            if int(m.group(2)) != 0:
                failed.add((current, 0))
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("Failed test"):
            in_list = True
            stripped = stripped.split(":", 1)[1]
        elif stripped.startswith("Parse errors") or stripped.startswith("Non-zero"):
            failed.add((current, 0))
            in_list = False
            continue
        elif not re.fullmatch(r"[\d\-, ]+", stripped):
            in_list = False
            continue
        if in_list:
            for check in parse_ranges(stripped):
                failed.add((current, check))
    return failed


def ranges(numbers):
    """[1, 2, 3, 7] -> '1-3,7'."""
    out, numbers = [], sorted(numbers)
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        out.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return ",".join(out)


def by_file(checks):
    """{(file, n)} -> ['file 1-3,7', ...], one line per file (0: the file broke off)."""
    files = {}
    for f, n in checks:
        files.setdefault(f, []).append(n)
    return [f"{f} {ranges(ns)}" for f, ns in sorted(files.items())]


def describe(checks):
    files = sorted({f for f, _ in checks})
    return f"{len(files)} files, {len(checks)} checks"


daemon_exit = [None]  # how the daemon ended: run() sets it, main() judges it


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsd", required=True)
    ap.add_argument("--cli", help="kcache: `kcache verify` of the db the suite left")
    ap.add_argument("--suite", required=True, help="pjdfstest's source (BUILD-HERE.sh)")
    ap.add_argument("--work", required=True, help="where the suite is built")
    ap.add_argument("--expected", required=True)
    ap.add_argument("--io-uring", action="store_true")
    ap.add_argument("--timeout", type=float, default=1500)
    args = ap.parse_args()

    if not os.path.isfile(os.path.join(args.suite, "BUILD-HERE.sh")):
        skip(f"no pjdfstest source at {args.suite} (CI has ../shared beside the clone)")
    if os.geteuid() != 0:
        skip("pjdfstest runs as root (it changes owners and runs steps as other users)")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        skip("no /dev/fuse or fusermount3")
    if not shutil.which("prove"):
        skip("no prove (Debian's perl)")
    if args.io_uring:
        try:
            with open("/sys/module/fuse/parameters/enable_uring") as f:
                on = f.read().startswith("Y")
        except OSError:
            on = False
        if not on:
            skip("FUSE over io_uring is off (the fuse module's enable_uring; the uring "
                 "CTest fixture sets it as root)")
    expected = parse_expected(args.expected)

    transport = "io_uring" if args.io_uring else "/dev/fuse"
    suite = os.path.join(args.work, "io-uring" if args.io_uring else "dev-fuse")
    shutil.rmtree(suite, ignore_errors=True)
    subprocess.run(["bash", os.path.join(args.suite, "BUILD-HERE.sh"), suite], check=True,
                   stdout=subprocess.DEVNULL)
    tests_dir = os.path.join(suite, "tests")

    tmp = os.path.realpath(tempfile.mkdtemp(prefix="kcache-pjdfstest-"))
    db, mnt = os.path.join(tmp, "db"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    os.chmod(tmp, 0o755)  # the suite's other users walk through it
    log_path = os.path.join(tmp, "daemon.stderr")
    argv = [args.fsd, "-f", "--db", db, "-o", "allow_other"]
    if args.io_uring:
        argv.append("--io-uring")
    argv.append(mnt)
    with open(log_path, "w") as log:
        daemon = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True)

    def daemon_log():
        with open(log_path) as f:
            return f.read()

    def stop():  # idempotent
        if in_mountinfo(mnt):
            subprocess.run(["fusermount3", "-u", mnt])
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        if in_mountinfo(mnt):
            subprocess.run(["fusermount3", "-uz", mnt])
        daemon_exit[0] = daemon.returncode
        if daemon.returncode != 0:
            print(f"kcache-fsd's stderr:\n{daemon_log()}")

    try:
        deadline = time.monotonic() + 10
        while not in_mountinfo(mnt) and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not in_mountinfo(mnt):
            print(f"kcache-fsd did not mount {mnt}:\n{daemon_log()}")
            return 1
        if args.io_uring:
            deadline = time.monotonic() + 10
            while "serving over" not in daemon_log() and time.monotonic() < deadline:
                time.sleep(0.02)
            if "serving over io_uring" not in daemon_log():
                print(f"--io-uring: the rings do not serve:\n{daemon_log()}")
                return 1
        # From the mount's root, as the suite says. Most of its files work in a directory
        # they make there (named like a hash: an entry), some in the root itself, where
        # each file (named like a hash too) is an entry of its own.
        print(f"pjdfstest on a kcache mount over {transport}: prove -r {tests_dir} in {mnt}",
              flush=True)
        started = time.monotonic()
        try:
            run = subprocess.run(["prove", "-r", tests_dir], cwd=mnt, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"prove ran longer than {args.timeout:.0f} s\n{daemon_log()}")
            return 1
        output = run.stdout
        with open(os.path.join(suite, "prove.log"), "w") as f:  # the whole run, for a look
            f.write(output)
        failed = parse_prove(output, tests_dir)
        print(f"prove's output: {os.path.join(suite, 'prove.log')}")
        if run.returncode != 0 and not failed:
            print(f"prove failed (exit {run.returncode}) without a failing check")
            return 1
        unexpected = sorted(failed - expected.keys())
        now_pass = sorted(expected.keys() - failed)
        print(f"{transport}: {describe(failed)} failing ({describe(set(expected))} listed), "
              f"{time.monotonic() - started:.0f} s")
        for line in by_file(unexpected):
            print(f"UNEXPECTED failure: {line}")
        for line in by_file(now_pass):
            print(f"NOW PASSES (take it off {os.path.basename(args.expected)}): {line}")
        if unexpected or now_pass:
            return 1
        stop()
        if args.cli:
            verify = subprocess.run([args.cli, "--db", db, "verify"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if verify.returncode != 0:
                print(f"kcache verify of the db the suite left:\n{verify.stdout}")
                return 1
            print("kcache verify: the db the suite left is clean")
        return 0
    finally:
        stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    result = run()
    if daemon_exit[0] not in (0, None):
        print(f"kcache-fsd exited {daemon_exit[0]} (a clean unmount exits 0)")
        return 1
    return result


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # CTest's timeout: clean up
    sys.exit(main())
