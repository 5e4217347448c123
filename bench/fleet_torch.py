#!/usr/bin/env python3
"""A real torch.compile across a fleet of kcache nodes (issue 31, "Figures").

Not a simulation: every run is a FRESH Python process (the project's .venv: torch CPU)
that torch.compiles a small transformer (--blocks 4 blocks, --shapes input shapes,
dynamic=False: one FX graph per shape) with Inductor on the CPU, TORCHINDUCTOR_CACHE_DIR
inside the place under test, and checks the outputs against eager. Each run reports the
process's wall time (measured here, from exec to exit: Python start and `import torch`
included), its CPU time with its g++ children (did it compile?), and Inductor's counters
from torch._dynamo.utils.counters: fxgraph_cache_hit / fxgraph_cache_miss /
fxgraph_cache_bypass and AOTAutograd's autograd_cache_hit / _miss.

One redis-server (a Unix socket) for the whole run, a namespace of its own per round.
The cases, per round (--rounds N, the median per case):

  plain    a plain directory: cold (empty), then warm (a fresh process, same dir)
  local    a kcache-fsd mount without --remote, empty db: cold, then warm
  A        node A: a mount with --remote, empty db, empty namespace: cold, then warm;
           then waits until A's write-behind has uploaded every entry, and stops A
  B        node B: a new empty db mounted AT THE SAME MOUNT PATH as A (A stopped
           first), the same Redis and namespace, no job tag: its first run is fed by
           the fleet (read-through), then its second (warm) run
  C        `kcache remote push --job-tag J` from A's db, then node C: a new empty db,
           same path, --prefetch-job-tag J: the first run right after the mount is up
           (while the prefetch runs)
  C-wait   again a new empty db with --prefetch-job-tag J, waiting until the prefetch
           is done (remote_prefetched in `kcache stats --json` reaching the job's
           entries) before the first run

The groups plain / local / fleet (A, B, C, C-wait: they depend on each other) rotate
their order every round. Printed: the medians, per run the Inductor counters and the
node's kcache counters (remote_hits, remote_misses, remote_uploads, remote_prefetched,
from `kcache --db DB stats --json`), `uptime`'s load at the start and end, and the
issue's goals:

  new node first run / warm node            <= 1.2   (B, C, C-wait first run / A warm)
  cold with --remote / cold without          <= 1.05  (A cold / local cold)
  warm on a mount / warm plain               <= 1.1   (A warm and local warm / plain warm)

with a `FINDING:` line for each goal missed. Before node C, the job as Redis holds it
is pulled into a scratch db and compared with A's db entry by entry (files, bytes): an
entry Redis holds incomplete is a FINDING too, as is a node whose keeper restarted a dead
kcache-fsd, and a run that gave no figure (failed, past --run-timeout, or its daemon in a
crash loop: the node is then killed and the round goes on). --ccache adds the same for ccache: a
generated C++ project (--ccache-files 20 .cpp) built with CCACHE_DIR on the mount,
on node A (cold, warm) then on node B at the same path (first build: hits from the
fleet?), and in a plain directory for reference; per build the wall time and ccache's
direct / preprocessed hits and misses.

Usage: bench/fleet_torch.py [--fsd build/fsd/kcache-fsd] [--kcache build/cli/kcache]
           [--python .venv/bin/python] [--rounds 3] [--blocks 4] [--dim 64]
           [--shapes 2x16,4x32,8x48] [--groups plain,local,fleet] [--ccache]
           [--ccache-files 20] [--upload-timeout 120] [--run-timeout 900] [--dir DIR]
           [--keep] [--json FILE]
kcache-fsd, kcache and their libkcache_*.so are copied into the work dir first (a
rebuild of build/ meanwhile changes nothing under the run). On exit, Ctrl-C or SIGTERM:
the worker is killed, every node unmounted (fusermount3 -u; a daemon that will not go is
killed and its mount detached), redis-server killed, the work dir removed (not --keep).
The script is also its own worker: `--worker --out FILE` (run by --python) compiles
and writes a JSON report.
"""
import argparse
import atexit
import ctypes
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remote_fleet  # noqa: E402  (the redis-server the fleet benchmarks share)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_FIRST_RUN = 1.2   # a new node's first run / a warm node's run
GOAL_REMOTE_COLD = 1.05  # a cold compile with --remote / without
GOAL_MOUNT_WARM = 1.1  # a warm run on a mount / in a plain directory


# ---- the worker: one fresh process, one torch.compile of the model ---------------------

def worker_main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--shapes", default="2x16,4x32,8x48")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import hashlib
    import torch
    import torch.nn.functional as F
    from torch._dynamo.utils import counters
    import_s = time.perf_counter() - t0

    class Block(torch.nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln1 = torch.nn.LayerNorm(d)
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.proj = torch.nn.Linear(d, d)
            self.ln2 = torch.nn.LayerNorm(d)
            self.fc1 = torch.nn.Linear(d, 4 * d)
            self.fc2 = torch.nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (y.view(b, t, self.h, d // self.h).transpose(1, 2) for y in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Transformer(torch.nn.Module):
        def __init__(self, d, h, n):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(d, h) for _ in range(n)])
            self.ln = torch.nn.LayerNorm(d)
            self.head = torch.nn.Linear(d, d)

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    model = Transformer(args.dim, args.heads, args.blocks).eval()
    compiled = torch.compile(model, dynamic=False)
    per_shape, ok, digest = {}, True, hashlib.sha256()
    with torch.no_grad():
        for shape in args.shapes.split(","):
            b, t = (int(x) for x in shape.split("x"))
            x = torch.randn(b, t, args.dim)
            start = time.perf_counter()
            got = compiled(x)
            per_shape[shape] = time.perf_counter() - start
            ok = ok and bool(torch.allclose(got, model(x), rtol=1e-4, atol=1e-4))
            digest.update(got.numpy().round(4).tobytes())
    ind, aot = counters["inductor"], counters["aot_autograd"]
    report = {
        "torch": torch.__version__, "import_s": import_s, "per_shape_s": per_shape,
        "inner_s": time.perf_counter() - t0, "allclose": ok, "digest": digest.hexdigest()[:16],
        "fx_hit": ind.get("fxgraph_cache_hit", 0), "fx_miss": ind.get("fxgraph_cache_miss", 0),
        "fx_bypass": ind.get("fxgraph_cache_bypass", 0),
        "aot_hit": aot.get("autograd_cache_hit", 0), "aot_miss": aot.get("autograd_cache_miss", 0),
        "aot_bypass": aot.get("autograd_cache_bypass", 0),
    }
    with open(args.out, "w") as f:
        json.dump(report, f)
    return 0


# ---- processes of ours: cleaned up on exit, Ctrl-C, SIGTERM ----------------------------

LIVE_NODES = []
LIVE_PROCS = []  # the running worker
LIVE_REDIS = []
FINDINGS = []  # found while running, printed with the goals' findings
CRASH_LOOP = 20  # the keeper's restarts during one run that end it


class RunFailed(Exception):
    """A worker run that gave no figure: it failed, hung, or its daemon kept dying."""


def _pdeathsig():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: dies with this script
    os.setpgrp()  # not in the terminal's group: Ctrl-C reaches us, we stop it in order


def killpg(proc):
    """SIGKILL to the process's own group (_pdeathsig made it a leader): g++ too."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()


def reap(proc, timeout):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def cleanup_nodes():
    for node in list(LIVE_NODES):
        try:
            node.stop(force=True)
        except Exception as e:  # never leave a mount behind because of one failure
            log(f"fleet_torch: stopping {node.name}: {e}")


def cleanup():
    """The worker first (it holds files on the mount), then the daemons, then Redis. A
    worker stuck in a FUSE request (a daemon crash loop) dies only when the connection
    goes: it is waited for again after the daemons."""
    for proc in LIVE_PROCS:
        killpg(proc)
    for proc in LIVE_PROCS:
        reap(proc, 5)
    cleanup_nodes()
    for proc in list(LIVE_PROCS):
        reap(proc, 10)
        LIVE_PROCS.remove(proc)
    for proc in list(LIVE_REDIS):
        killpg(proc)
        reap(proc, 10)
        LIVE_REDIS.remove(proc)


WORK_TO_REMOVE = []  # the work dir, unless --keep


def on_signal(signum, _frame):
    log(f"fleet_torch: signal {signum}: stopping the daemons and redis-server")
    cleanup()
    for d in WORK_TO_REMOVE:
        shutil.rmtree(d, ignore_errors=True)
    os._exit(128 + signum)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(loadavg())


def in_mountinfo(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


class Redis(remote_fleet.Redis):
    """remote_fleet's redis-server, dying with this script, with raw commands."""

    def __init__(self, directory):
        super().__init__(directory, preexec_fn=_pdeathsig)
        LIVE_REDIS.append(self.proc)
        self.url = f"unix:{self.sock}"

    def command(self, *argv):
        cmd = f"*{len(argv)}\r\n".encode()
        for a in argv:
            a = a.encode()
            cmd += f"${len(a)}\r\n".encode() + a + b"\r\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(self.sock)
                s.sendall(cmd)
                return s.recv(1 << 20)
        except OSError:
            return b""

    def used_memory(self):
        m = re.search(rb"used_memory:(\d+)", self.command("INFO", "memory"))
        return int(m.group(1)) if m else 0


class Node:
    """kcache-fsd -f --db ROOT/db [args] MNT; MNT may be shared with other (stopped) nodes."""

    def __init__(self, args, name, root, mnt, extra=()):
        self.args, self.name = args, name
        self.db = os.path.join(root, "db")
        self.mnt = mnt
        os.makedirs(root, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        if os.listdir(self.mnt):
            sys.exit(f"{name}: the mount point {self.mnt} is not empty")
        self.log_path = os.path.join(root, "fsd.out")
        self.log = open(self.log_path, "ab")
        start = time.perf_counter()
        self.proc = subprocess.Popen([args.fsd, "-f", "--db", self.db, *extra, self.mnt],
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, preexec_fn=_pdeathsig)
        LIVE_NODES.append(self)
        end = time.monotonic() + 15
        while not in_mountinfo(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                sys.exit(f"kcache-fsd ({name}) did not mount {self.mnt}: see {self.log_path}")
            time.sleep(0.005)
        self.mount_s = time.perf_counter() - start

    def stats(self):
        return kcache_stats(self.args, self.db)

    def settle(self, timeout=6.0):
        """The daemon adds its counters to the db every second: two reads 1.1 s apart agree."""
        last = self.stats()
        end = time.monotonic() + timeout
        while True:
            time.sleep(1.1)
            now = self.stats()
            if now == last or time.monotonic() > end:
                return now
            last = now

    def restarts(self):
        """How often the keeper restarted a dead serving daemon, and the first death's
        lines (a `terminate called ...` before it, if any)."""
        try:
            with open(self.log_path, "rb") as f:
                text = f.read(8 << 20).decode(errors="replace")
        except OSError:
            return 0, ""
        n = text.count("killed by signal")
        if not n:
            return 0, ""
        lines = text.splitlines()
        i = next(k for k, line in enumerate(lines) if "killed by signal" in line)
        first = [line for line in lines[max(0, i - 3):i + 1]
                 if "terminate" in line or "what()" in line or "killed by signal" in line]
        return n, " / ".join(x.strip() for x in first)

    def kill(self):
        """Ends the daemon and its keeper (one process group): the FUSE connection goes,
        and a process waiting on it gets an error."""
        if self.proc is not None:
            killpg(self.proc)
            reap(self.proc, 10)
        if in_mountinfo(self.mnt):
            subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True, timeout=60)

    def stop(self, force=False):
        """Unmounts (fusermount3 -u) and waits for the daemon; with force, or if that
        fails, kills it and detaches the mount (-uz). Returns the exit code."""
        if self.proc is None:
            return None
        if in_mountinfo(self.mnt):
            r = subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True,
                               timeout=60)
            if r.returncode != 0 and force:
                self.kill()
        try:
            self.proc.wait(timeout=10 if force else 30)
        except subprocess.TimeoutExpired:
            self.kill()
        if in_mountinfo(self.mnt):
            subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True, timeout=60)
        code, self.proc = self.proc.returncode, None
        self.log.close()
        if self in LIVE_NODES:
            LIVE_NODES.remove(self)
        n, first = self.restarts()
        if n:
            FINDINGS.append(f"FINDING: node {self.name} ({self.db}): the keeper restarted a dead "
                            f"kcache-fsd {n} time(s); the first: {first}")
        return code


def snapshot_binaries(args):
    """Copies kcache-fsd, kcache and their libkcache_*.so into WORK/bin (run with
    LD_LIBRARY_PATH there: their RUNPATH comes after it), so that a rebuild of build/
    while this runs (other people build too) changes nothing under it."""
    bin_dir = os.path.join(args.work, "bin")
    os.makedirs(bin_dir)
    for attempt in range(30):
        try:
            libs = {}
            for prog in (args.fsd, args.kcache):
                out = subprocess.run(["ldd", prog], capture_output=True, text=True,
                                     timeout=30).stdout
                for m in re.finditer(r"(libkcache_\S+) => (\S+)", out):
                    libs[m.group(1)] = m.group(2)
            for name, path in libs.items():
                shutil.copy2(path, os.path.join(bin_dir, name))
            fsd, kc = (os.path.join(bin_dir, os.path.basename(p)) for p in (args.fsd, args.kcache))
            shutil.copy2(args.fsd, fsd)
            shutil.copy2(args.kcache, kc)
            os.environ["LD_LIBRARY_PATH"] = bin_dir + (
                ":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
            for prog in (fsd, kc):
                subprocess.run([prog, "--help"], capture_output=True, timeout=30, check=True)
            built = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(args.fsd)))
            args.fsd, args.kcache = fsd, kc
            return built
        except (OSError, subprocess.SubprocessError):
            time.sleep(10)  # being relinked: try again
    sys.exit("could not copy kcache-fsd and kcache (a build keeps rewriting them?)")


def source_state():
    """HEAD and the files changed from it under the daemon's and the tier's sources."""
    def git(*argv):
        return subprocess.run(["git", "-C", REPO, *argv], capture_output=True, text=True,
                              timeout=30).stdout.rstrip("\n")
    head = git("log", "-1", "--format=%h %cd", "--date=format:%Y-%m-%d %H:%M")
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "fsd", "remote", "core",
                                      "cli").splitlines()]
    return head + (f", {len(dirty)} file(s) changed in fsd/ remote/ core/ cli/: "
                   + " ".join(dirty[:12]) + (" ..." if len(dirty) > 12 else "")
                   if dirty else ", no local change in fsd/ remote/ core/ cli/")


def kcache_stats(args, db):
    r = subprocess.run([args.kcache, "--db", db, "stats", "--json"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        return {}
    out = json.loads(r.stdout)
    return {k: v for k, v in out.items() if isinstance(v, int)}


def kcache(args, db, *argv, timeout=600):
    return subprocess.run([args.kcache, "--db", db, *argv], capture_output=True, text=True,
                          timeout=timeout)


COUNTERS = ("hits", "misses", "remote_hits", "remote_misses", "remote_uploads",
            "remote_prefetched", "remote_errors", "remote_timeouts")


# ---- one run of the worker ------------------------------------------------------------

def watch(proc, node, restarts_before, timeout):
    """Waits for proc; None, or why it was killed: past `timeout`, or the node's daemon
    died CRASH_LOOP times meanwhile (then the node is killed too: a process waiting in a
    FUSE request dies only with the connection)."""
    start = time.monotonic()
    why = None
    while why is None:
        try:
            proc.wait(timeout=1)
            return None
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() - start > timeout:
            why = f"ran past its timeout ({timeout:g} s)"
        elif node is not None:
            n, first = node.restarts()
            if n - restarts_before >= CRASH_LOOP:
                why = (f"kcache-fsd of node {node.name} died {n - restarts_before} times "
                       f"during the run (the keeper restarts it; the kernel resends the "
                       f"request): {first}")
    killpg(proc)
    reap(proc, 5)
    if proc.poll() is None and node is not None:
        node.kill()
    reap(proc, 30)
    return why


def run_worker(args, cache_dir, label, node=None):
    """One fresh process; its report with wall_s (exec to exit), cpu_s (it and its
    children: g++), load1. Raises RunFailed if it fails, runs past --run-timeout, or the
    node's daemon keeps dying under it (then the node is killed: a process waiting in a
    FUSE request dies only with the connection)."""
    out = os.path.join(args.work, "worker.json")
    if os.path.exists(out):
        os.unlink(out)
    env = dict(os.environ)
    env.pop("KCACHE_DB", None)
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    argv = [args.python, os.path.abspath(__file__), "--worker", "--out", out,
            "--blocks", str(args.blocks), "--dim", str(args.dim), "--shapes", args.shapes]
    load = loadavg()[0]
    restarts_before = node.restarts()[0] if node else 0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    output_path = os.path.join(args.work, "worker.out")
    with open(output_path, "wb") as output:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                stderr=subprocess.STDOUT, preexec_fn=_pdeathsig)
    LIVE_PROCS.append(proc)
    failed = watch(proc, node, restarts_before, args.run_timeout)
    wall = time.perf_counter() - start
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the worker and its g++ (waited for)
    cpu = (ru2.ru_utime - ru.ru_utime) + (ru2.ru_stime - ru.ru_stime)
    if proc in LIVE_PROCS:
        LIVE_PROCS.remove(proc)
    if not failed and (proc.returncode != 0 or not os.path.exists(out)):
        with open(output_path, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        failed = f"the worker exited {proc.returncode}: {tail}"
    if failed:
        log(f"  {label:<14} FAILED after {wall:.1f} s: {failed[:600]}")
        raise RunFailed(f"{label}: no figure: {failed[:2000]}")
    with open(out) as f:
        rep = json.load(f)
    rep["wall_s"], rep["cpu_s"], rep["load1"], rep["label"] = wall, cpu, load, label
    log(f"  {label:<14} {wall:7.2f} s (CPU {cpu:6.2f} s)  fx hit/miss {rep['fx_hit']}/{rep['fx_miss']}  "
        f"aot hit/miss {rep['aot_hit']}/{rep['aot_miss']}  allclose {rep['allclose']}  "
        f"load {load}")
    if not rep["allclose"]:
        FINDINGS.append(f"FINDING: {label}: torch.compile's output differs from eager")
    return rep


# ---- the cases --------------------------------------------------------------------------

def group_plain(args, rd, rec):
    cache = os.path.join(rd, "plain", "inductor")
    os.makedirs(cache)
    rec("plain cold", run_worker(args, cache, "plain cold"))
    rec("plain warm", run_worker(args, cache, "plain warm"))


def group_local(args, rd, rec):
    node = Node(args, "local", os.path.join(rd, "local"), os.path.join(rd, "local", "mnt"))
    try:
        cache = os.path.join(node.mnt, "inductor")
        rec("local cold", run_worker(args, cache, "local cold", node))
        rec("local warm", run_worker(args, cache, "local warm", node), node.settle())
    finally:
        node.stop()


def wait_uploads(node, want, timeout):
    """Until remote_uploads reaches `want`; seconds waited, or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if node.stats().get("remote_uploads", 0) >= want:
            return time.monotonic() - start
        time.sleep(0.5)
    return None


def entry_count(args, db):
    r = kcache(args, db, "ls", "--json")
    if r.returncode != 0:
        return 0
    return sum(1 for e in json.loads(r.stdout) if e.get("files", 1) > 0)


def prefetch_log(node):
    """(seconds, entries, bytes) from the daemon's "prefetched job" line, or None."""
    text = ""
    for path in (node.log_path, os.path.join(node.db, "fsd.log")):  # -f: stdout
        try:
            with open(path, errors="replace") as f:
                text += f.read()
        except OSError:
            pass
    m = re.search(r"prefetched job \S+ in ([0-9.]+) s: (\d+) pulled \((\d+) bytes\)", text)
    return (float(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def entries_of(args, db):
    """{name: (files, bytes)} of a db's entries."""
    r = kcache(args, db, "ls", "--json")
    if r.returncode != 0:
        return {}
    return {e["name"]: (e.get("files", 0), e.get("bytes", 0)) for e in json.loads(r.stdout)}


def check_remote(args, redis_args, tag, a_db, scratch):
    """What Redis holds of job `tag`, pulled into an empty scratch db, against A's db:
    (entries in A, missing from Redis, incomplete in Redis (fewer files or bytes), the
    bytes Redis gave, A's bytes, a few names of incomplete entries)."""
    subprocess.run([args.kcache, "--db", scratch, "remote", *redis_args, "pull", "--job-tag",
                    tag], capture_output=True, text=True, timeout=600)
    mine, there = entries_of(args, a_db), entries_of(args, scratch)
    missing = [n for n in mine if n not in there]
    short = [n for n in mine if n in there and there[n] != mine[n]]
    return (len(mine), len(missing), len(short), sum(b for _, b in there.values()),
            sum(b for _, b in mine.values()),
            [f"{n} ({there[n][0]} of {mine[n][0]} files)" for n in short[:3]])


def failed(k, e):
    """A run that gave no figure: a finding; the round goes on with the next node."""
    FINDINGS.append(f"FINDING: round {k + 1}: {e}")


def group_fleet(args, rd, rec, redis, k, notes):
    ns = f"fleet-r{k}"
    tag = f"fleet-job-r{k}"
    remote = ["--remote", redis.url, "--remote-namespace", ns]
    mnt = os.path.join(args.work, "node", "mnt")  # every node mounts its cache here
    cache = os.path.join(mnt, "inductor")

    a = Node(args, "A", os.path.join(rd, "A"), mnt, remote)
    try:
        rec("A cold", run_worker(args, cache, "A cold", a))
        rec("A warm", run_worker(args, cache, "A warm", a))
        n = entry_count(args, a.db)
        waited = wait_uploads(a, n, args.upload_timeout)
        st = a.settle()
        rec(None, None, st, "A")
        notes.append(f"round {k + 1}: A holds {n} entries; uploads reached "
                     + (f"{st.get('remote_uploads', 0)} {waited:.1f} s after A's warm run"
                        if waited is not None else
                        f"only {st.get('remote_uploads', 0)} after {args.upload_timeout} s")
                     + f"; Redis used_memory {redis.used_memory() / 2**20:.1f} MiB")
    finally:
        a.stop()

    b = Node(args, "B", os.path.join(rd, "B"), mnt, remote)
    try:
        rec("B first (read-through)", run_worker(args, cache, "B first", b), b.settle())
        rec("B warm", run_worker(args, cache, "B warm", b), b.settle())
    except RunFailed as e:
        failed(k, e)
    finally:
        b.stop()

    r = subprocess.run([args.kcache, "--db", a.db, "remote", *remote, "push", "--job-tag", tag],
                       capture_output=True, text=True, timeout=600)
    m = re.search(r"pushed (\d+), already remote (\d+), failed (\d+)", r.stdout)
    job = int(m.group(1)) + int(m.group(2)) if m else n
    notes.append(f"round {k + 1}: push --job-tag from A's db: "
                 + (m.group(0) if m else f"exit {r.returncode}: {r.stderr.strip()[-300:]}"))
    # What the fleet can get: the job as Redis holds it, against A's db.
    n_a, missing, short, got_b, a_b, names = check_remote(args, remote, tag, a.db,
                                                          os.path.join(rd, "scratch"))
    notes.append(f"round {k + 1}: Redis against A's db: {n_a} entries in A, {missing} missing from "
                 f"Redis, {short} with fewer files or bytes in Redis; {got_b} of A's {a_b} bytes"
                 + (f" (e.g. {', '.join(names)})" if names else ""))
    if missing or short:
        FINDINGS.append(
            f"FINDING: round {k + 1}: Redis holds {short} of A's {n_a} entries incomplete and "
            f"misses {missing} ({got_b} of A's {a_b} bytes): a node fed by the fleet gets "
            f"those without all their files (e.g. {', '.join(names)})")

    c = Node(args, "C", os.path.join(rd, "C"), mnt, [*remote, "--prefetch-job-tag", tag])
    try:
        rec("C first (prefetch running)", run_worker(args, cache, "C first", c), c.settle())
    except RunFailed as e:
        failed(k, e)
    finally:
        c.stop()

    c2 = Node(args, "C-wait", os.path.join(rd, "C-wait"), mnt,
              [*remote, "--prefetch-job-tag", tag])
    try:
        start = time.monotonic()
        done = None
        while time.monotonic() - start < args.upload_timeout:
            got = c2.stats().get("remote_prefetched", 0)
            if got >= job or prefetch_log(c2):
                done = time.monotonic() - start
                break
            time.sleep(0.2)
        plog = prefetch_log(c2)
        notes.append(f"round {k + 1}: C-wait: mount up in {c2.mount_s * 1e3:.0f} ms; prefetch of {job} "
                     f"entries " + (f"seen done after {done:.1f} s" if done is not None else
                                    "NOT done") +
                     (f" (daemon's log: {plog[1]} pulled, {plog[2]} bytes, in {plog[0]:.2f} s)"
                      if plog else ""))
        rec("C first (after prefetch)", run_worker(args, cache, "C-wait first", c2),
            c2.settle())
    except RunFailed as e:
        failed(k, e)
    finally:
        c2.stop()


# ---- ccache ----------------------------------------------------------------------------

CPP = r'''
#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>
#include "common.hpp"
namespace unit{i} {{
template <typename T, int N> struct Poly {{
    std::vector<T> c = std::vector<T>(N, T({i}));
    T eval(T x) const {{ T r = 0; for (int k = N - 1; k >= 0; --k) r = r * x + c[k]; return r; }}
}};
std::string describe(int n) {{
    std::map<std::string, double> m;
    for (int k = 0; k < n; ++k) m["k" + std::to_string(k)] = Poly<double, {deg}>().eval(k * 0.5);
    std::vector<double> v;
    for (auto& kv : m) v.push_back(kv.second);
    std::sort(v.begin(), v.end());
    return common::join(v) + std::to_string(std::accumulate(v.begin(), v.end(), 0.0));
}}
}}  // namespace unit{i}
'''
HPP = r'''
#pragma once
#include <sstream>
#include <string>
#include <vector>
namespace common {
inline std::string join(const std::vector<double>& v) {
    std::ostringstream o;
    for (double x : v) o << x << ',';
    return o.str();
}
}  // namespace common
'''


def ccache_project(src, files):
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "common.hpp"), "w") as f:
        f.write(HPP)
    for i in range(files):
        with open(os.path.join(src, f"unit{i}.cpp"), "w") as f:
            f.write(CPP.format(i=i, deg=3 + i % 5))


def ccache_stats(env):
    r = subprocess.run(["ccache", "--print-stats"], env=env, capture_output=True, text=True,
                       timeout=60)
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def ccache_build(args, src, ccache_dir, label, node=None):
    """Compiles every unit with `ccache g++ -O2 -c` (one at a time, as -j1), into a fresh
    object dir; wall time and ccache's counters for this build."""
    env = dict(os.environ)
    env.update({"CCACHE_DIR": ccache_dir, "CCACHE_NOHASHDIR": "1", "CCACHE_TEMPDIR":
                os.path.join(args.work, "ccache-tmp")})
    os.makedirs(ccache_dir, exist_ok=True)
    subprocess.run(["ccache", "--zero-stats"], env=env, capture_output=True, timeout=60)
    obj = tempfile.mkdtemp(prefix="obj-", dir=args.work)
    start = time.perf_counter()
    restarts_before = node.restarts()[0] if node else 0
    for i in range(args.ccache_files):
        with open(os.path.join(args.work, "ccache.out"), "wb") as output:
            p = subprocess.Popen(["ccache", "g++", "-O2", "-std=c++17", "-c", f"unit{i}.cpp",
                                  "-o", os.path.join(obj, f"unit{i}.o")], cwd=src, env=env,
                                 stdin=subprocess.DEVNULL, stdout=output,
                                 stderr=subprocess.STDOUT, preexec_fn=_pdeathsig)
        LIVE_PROCS.append(p)
        why = watch(p, node, restarts_before, 300)
        LIVE_PROCS.remove(p)
        if why or p.returncode != 0:
            with open(os.path.join(args.work, "ccache.out"), "rb") as f:
                tail = f.read()[-2000:].decode(errors="replace")
            log(f"  {label:<14} FAILED: unit{i}.cpp: {why or tail}"[:800])
            raise RunFailed(f"{label}: ccache g++ unit{i}.cpp: {why or tail}")
    wall = time.perf_counter() - start
    shutil.rmtree(obj)
    st = ccache_stats(env)
    rep = {"label": label, "wall_s": wall, "direct": st.get("direct_cache_hit", 0),
           "preprocessed": st.get("preprocessed_cache_hit", 0), "miss": st.get("cache_miss", 0)}
    log(f"  {label:<14} {wall:7.2f} s  direct {rep['direct']} preprocessed "
        f"{rep['preprocessed']} miss {rep['miss']}")
    return rep


def group_ccache(args, rd, rec, redis, k, notes):
    src = os.path.join(args.work, "ccache-src")  # the same source path on every node
    if not os.path.isdir(src):
        ccache_project(src, args.ccache_files)
    plain = os.path.join(rd, "cc-plain", "ccache")
    rec("cc plain cold", ccache_build(args, src, plain, "cc plain cold"))
    rec("cc plain warm", ccache_build(args, src, plain, "cc plain warm"))
    remote = ["--remote", redis.url, "--remote-namespace", f"fleet-cc-r{k}"]
    mnt = os.path.join(args.work, "node", "mnt")
    a = Node(args, "ccA", os.path.join(rd, "ccA"), mnt, remote)
    try:
        rec("cc A cold", ccache_build(args, src, os.path.join(mnt, "ccache"), "cc A cold", a))
        rec("cc A warm", ccache_build(args, src, os.path.join(mnt, "ccache"), "cc A warm", a))
        n = entry_count(args, a.db)
        waited = wait_uploads(a, n, args.upload_timeout)
        st = a.settle()
        rec(None, None, st, "ccA")
        notes.append(f"round {k + 1}: ccache A holds {n} entries; uploads "
                     f"{st.get('remote_uploads', 0)}"
                     + (f" after {waited:.1f} s" if waited is not None else " (timed out)"))
    finally:
        a.stop()
    b = Node(args, "ccB", os.path.join(rd, "ccB"), mnt, remote)
    try:
        rec("cc B first",
            ccache_build(args, src, os.path.join(mnt, "ccache"), "cc B first", b), b.settle())
        rec("cc B warm",
            ccache_build(args, src, os.path.join(mnt, "ccache"), "cc B warm", b), b.settle())
    finally:
        b.stop()


# ---- the driver -------------------------------------------------------------------------

def main():
    if "--worker" in sys.argv[1:]:
        return worker_main(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsd", default=os.path.join(REPO, "build", "fsd", "kcache-fsd"))
    ap.add_argument("--kcache", default=os.path.join(REPO, "build", "cli", "kcache"))
    venv = os.path.join(REPO, ".venv", "bin", "python")
    ap.add_argument("--python", default=venv if os.path.exists(venv) else sys.executable,
                    help="the Python with torch (default: the project's .venv)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shapes", default="2x16,4x32,8x48",
                    help="input shapes BATCHxSEQ, one FX graph each (dynamic=False)")
    ap.add_argument("--groups", default="plain,local,fleet",
                    help="which groups run (rotated every round)")
    ap.add_argument("--ccache", action="store_true", help="also the ccache fleet")
    ap.add_argument("--ccache-files", type=int, default=20)
    ap.add_argument("--upload-timeout", type=float, default=120,
                    help="seconds to wait for A's uploads / C's prefetch")
    ap.add_argument("--run-timeout", type=float, default=900, help="seconds per worker run")
    ap.add_argument("--dir", default=None, help="where the work dir goes (default $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    args = ap.parse_args()
    for prog in (args.fsd, args.kcache):
        if not os.access(prog, os.X_OK):
            sys.exit(f"{prog} is not built (cmake --build build)")
    args.fsd, args.kcache = os.path.abspath(args.fsd), os.path.abspath(args.kcache)
    if subprocess.run([args.python, "-c", "import torch"], capture_output=True).returncode:
        sys.exit(f"{args.python} has no torch (scripts/setup.sh installs .venv)")

    atexit.register(cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    args.work = tempfile.mkdtemp(prefix="kcache-fleet-torch-", dir=args.dir)
    if not args.keep:
        WORK_TO_REMOVE.append(args.work)
    up_start = uptime()
    args.source = source_state()
    args.built = snapshot_binaries(args)
    log(f"fleet_torch: work dir {args.work}; kcache-fsd built {args.built} from {args.source}; "
        f"{up_start}")
    runs = {}     # case -> [worker report per round]
    counters = {}  # case or node -> [kcache counters per round]
    order_log, notes = [], []
    try:
        redis = Redis(os.path.join(args.work, "redis"))
        groups = args.groups.split(",")
        if args.ccache:
            groups.append("ccache")
        for k in range(args.rounds):
            rd = os.path.join(args.work, f"r{k}")
            os.makedirs(rd)
            order = groups[k % len(groups):] + groups[:k % len(groups)]
            order_log.append(order)
            log(f"round {k + 1}/{args.rounds}: {', '.join(order)}")

            def rec(case, rep, st=None, node=None):
                if case is not None:
                    runs.setdefault(case, []).append(rep)
                if st is not None:
                    counters.setdefault(case or node, []).append(
                        {c: st.get(c, 0) for c in COUNTERS})
            for g in order:
                try:
                    if g == "plain":
                        group_plain(args, rd, rec)
                    elif g == "local":
                        group_local(args, rd, rec)
                    elif g == "fleet":
                        group_fleet(args, rd, rec, redis, k, notes)
                    elif g == "ccache":
                        group_ccache(args, rd, rec, redis, k, notes)
                    else:
                        sys.exit(f"unknown group {g}")
                except RunFailed as e:  # the rest of this group, this round, is skipped
                    failed(k, e)
                    cleanup_nodes()
            if not args.keep:
                shutil.rmtree(rd, ignore_errors=True)
    finally:
        cleanup()
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    up_end = uptime()
    report(args, runs, counters, notes, order_log, up_start, up_end)
    return 0


CASE_ORDER = ["plain cold", "plain warm", "local cold", "local warm", "A cold", "A warm",
              "B first (read-through)", "B warm", "C first (prefetch running)",
              "C first (after prefetch)"]


def med(runs, case, key="wall_s"):
    xs = [r[key] for r in runs.get(case, [])]
    return statistics.median(xs) if xs else None


def report(args, runs, counters, notes, order_log, up_start, up_end):
    torch_cases = sorted((c for c in runs if not c.startswith("cc ")),
                         key=lambda c: CASE_ORDER.index(c) if c in CASE_ORDER else 99)
    first = next(iter(runs.values()))[0] if runs else {}
    print(f"fleet_torch: torch {first.get('torch', '?')} (Inductor, CPU), a {args.blocks}-block "
          f"transformer (dim {args.dim}), shapes {args.shapes} (dynamic=False); "
          f"{args.rounds} round(s), groups rotated: "
          f"{' | '.join(','.join(o) for o in order_log)}; {os.cpu_count()} cores")
    print(f"kcache-fsd built {args.built}; source at the start: {args.source}")
    print(f"uptime at start: {up_start}")
    print(f"uptime at end:   {up_end}")
    print()
    print("| case | wall (median) | runs | CPU (median; the process and its g++) "
          "| inside the process: all (import torch) |")
    print("|---|---|---|---|---|")
    for case in torch_cases:
        rs = runs[case]
        print(f"| {case} | {med(runs, case):.2f} s | {', '.join('%.2f' % r['wall_s'] for r in rs)} "
              f"| {med(runs, case, 'cpu_s'):.2f} s "
              f"| {med(runs, case, 'inner_s'):.2f} s ({med(runs, case, 'import_s'):.2f} s) |")
    print()
    print("Inductor's counters per run (torch._dynamo.utils.counters), load: 1-min loadavg at "
          "the run's start")
    print()
    print("| round | case | wall | CPU | fxgraph_cache_hit | fxgraph_cache_miss | bypass "
          "| autograd_cache_hit | autograd_cache_miss | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in range(args.rounds):
        for case in torch_cases:
            if k < len(runs[case]):
                r = runs[case][k]
                print(f"| {k + 1} | {case} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s | {r['fx_hit']} | {r['fx_miss']} "
                      f"| {r['fx_bypass']} | {r['aot_hit']} | {r['aot_miss']} | {r['load1']} |")
    digests = {r["digest"] for c in torch_cases for r in runs[c]}
    print(f"\noutputs: {len(digests)} distinct digest(s) over all runs (1 expected); allclose to "
          f"eager in every run: {all(r['allclose'] for c in torch_cases for r in runs[c])}")
    if counters:
        print()
        print("kcache counters of the node after the case (`kcache --db DB stats --json`; "
              "cumulative for the node's db, per round r1/r2/...):")
        print()
        print("| node after | " + " | ".join(COUNTERS) + " |")
        print("|---|" + "---|" * len(COUNTERS))
        for case, rows in counters.items():
            print(f"| {case} | " + " | ".join("/".join(str(r[c]) for r in rows)
                                              for c in COUNTERS) + " |")
    if notes:
        print()
        for n in notes:
            print(f"- {n}")

    findings = []
    print("\ngoals (ratios of medians):\n")

    def goal(name, num, den, limit):
        a, b = med(runs, num), med(runs, den)
        if a is None or b is None:
            return
        ratio = a / b
        ok = ratio <= limit
        print(f"  {name}: {num} / {den} = {a:.2f} / {b:.2f} s = {ratio:.2f}x "
              f"(goal <= {limit}x: {'met' if ok else 'MISSED'})")
        if not ok:
            findings.append(f"FINDING: {name}: {num} {a:.2f} s / {den} {b:.2f} s = {ratio:.2f}x, "
                            f"goal <= {limit}x")

    for first_case in ("B first (read-through)", "C first (prefetch running)",
                       "C first (after prefetch)"):
        goal("new node's first run / warm node", first_case, "A warm", GOAL_FIRST_RUN)
    goal("cold with --remote / cold without", "A cold", "local cold", GOAL_REMOTE_COLD)
    goal("warm on a mount / warm plain", "A warm", "plain warm", GOAL_MOUNT_WARM)
    goal("warm on a mount / warm plain", "local warm", "plain warm", GOAL_MOUNT_WARM)
    scale = []
    if med(runs, "B first (read-through)") and med(runs, "A cold"):
        scale.append(f"B first / A cold = "
                     f"{med(runs, 'B first (read-through)') / med(runs, 'A cold'):.2f}x")
    if med(runs, "plain cold") and med(runs, "plain warm"):
        scale.append(f"plain cold / plain warm = "
                     f"{med(runs, 'plain cold') / med(runs, 'plain warm'):.2f}x")
    if scale:
        print(f"  (for scale: {'; '.join(scale)})")

    cc = [c for c in runs if c.startswith("cc ")]
    if cc:
        print()
        print(f"ccache {shutil.which('ccache')}: {args.ccache_files} .cpp, `ccache g++ -O2 -c` "
              f"one after another, CCACHE_DIR on the place")
        print()
        print("| build | wall (median) | runs | direct hits | preprocessed hits | misses |")
        print("|---|---|---|---|---|---|")
        for case in cc:
            rs = runs[case]
            print(f"| {case} | {med(runs, case):.2f} s | {', '.join('%.2f' % r['wall_s'] for r in rs)} "
                  f"| {'/'.join(str(r['direct']) for r in rs)} "
                  f"| {'/'.join(str(r['preprocessed']) for r in rs)} "
                  f"| {'/'.join(str(r['miss']) for r in rs)} |")
        goal("ccache: new node's first build / warm node", "cc B first", "cc A warm",
             GOAL_FIRST_RUN)
        goal("ccache: warm on a mount / warm plain", "cc A warm", "cc plain warm",
             GOAL_MOUNT_WARM)
    findings = FINDINGS + findings
    if findings:
        print()
        for f in findings:
            print(f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "counters": counters, "notes": notes,
                       "uptime": [up_start, up_end]}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
