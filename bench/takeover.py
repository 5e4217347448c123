#!/usr/bin/env python3
"""What a crash and an upgrade of kcache-fsd cost the clients, and what the keeper
costs when nothing happens (issue 20).

Mounts kcache-fsd (with its keeper) on a fresh db and runs THREADS reader threads,
each reading one of E stored entries after another and recording every call's start
and end (monotonic). Then:
  kill     KILLS times, 1 s apart: kill -9 of the serving daemon (the keeper starts
           another, which takes the mount over);
  upgrade  UPGRADES times: kcache-fsd --upgrade MOUNTPOINT.
WRITERS writer threads meanwhile each keep a file open and write 4 KiB after 4 KiB to
it, never closing until the end (their bytes are unpublished across every event: a
spill file keeps them, fsd/src/survival/spill.hpp), then close and check the file's content.
For each event: the stall the clients saw (the duration of every call in flight at
the event or started before service was back: median, p99, max over all events),
and the time from the event until service was back (the first call started after
the event is answered).
Then, on fresh mounts with and without the keeper (--no-keeper), alternated over
ROUNDS rounds, the median time of a hit (open+read+close of a stored file), a store
(write a temp file, rename into a new entry) and a miss (stat of an absent name),
N calls each; the ratio keeper/no-keeper (the keeper is off the request path, so it
should be within noise).
Usage: bench/takeover.py [--fsd build/fsd/kcache-fsd] [--kills 10] [--upgrades 5]
       [--threads 4] [--writers 2] [--calls 2000] [--rounds 3] [--io-uring]
"""
import argparse
import errno
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time


def children(pid):
    out = []
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open(f'/proc/{d}/stat') as f:
                text = f.read()
        except OSError:
            continue
        rest = text[text.rfind(')') + 2:].split()
        if int(rest[1]) == pid and rest[0] != 'Z':
            out.append(int(d))
    return out


class Mount:
    def __init__(self, fsd, root, keeper=True, io_uring=False):
        self.root = root
        self.db = os.path.join(root, 'db')
        self.mnt = os.path.join(root, 'mnt')
        os.makedirs(self.mnt, exist_ok=True)
        args = [fsd, '-f', '--db', self.db] + ([] if keeper else ['--no-keeper'])
        args += (['--io-uring'] if io_uring else []) + [self.mnt]
        self.log = open(os.path.join(root, 'fsd.log'), 'ab')
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log)
        deadline = time.time() + 10
        while not os.path.ismount(self.mnt):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError('kcache-fsd did not mount; see ' + self.log.name)
            time.sleep(0.01)

    def daemon(self):
        kids = children(self.proc.pid)
        return kids[0] if len(kids) == 1 else None

    def stop(self):
        subprocess.run(['fusermount3', '-u', self.mnt], check=False)
        self.proc.wait(timeout=30)


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def events_figures(m, fsd, n_events, threads, kind, writers=0):
    entries = 64
    for i in range(entries):
        os.makedirs(os.path.join(m.mnt, f'h{i}'), exist_ok=True)
        with open(os.path.join(m.mnt, f'h{i}', 'kernel.bin'), 'wb') as f:
            f.write(os.urandom(16384 + i * 97))
    calls = []  # (start, end) of every read, all threads
    failed = {}  # errno name -> count
    lock = threading.Lock()
    stop = threading.Event()

    def reader(t):
        mine = []
        i = t
        while not stop.is_set():
            path = os.path.join(m.mnt, f'h{i % entries}', 'kernel.bin')
            start = time.monotonic()
            try:
                with open(path, 'rb') as f:
                    f.read()
            except OSError as e:
                with lock:
                    name = errno.errorcode.get(e.errno, str(e.errno))
                    failed[name] = failed.get(name, 0) + 1
            mine.append((start, time.monotonic()))
            i += threads
        with lock:
            calls.extend(mine)

    writes = []  # (start, end) of every write, all writer threads
    write_failures = {}  # errno name (or 'content') -> count

    def writer(t):
        mine, chunk, expected = [], 4096, bytearray()
        path = os.path.join(m.mnt, f'w{t}', 'growing.bin')
        os.makedirs(os.path.dirname(path), exist_ok=True)

        def failed(name):
            with lock:
                write_failures[name] = write_failures.get(name, 0) + 1
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            return failed(errno.errorcode.get(e.errno, str(e.errno)))
        n = 0
        while not stop.is_set() and n < 16384:  # at most 64 MiB a writer
            data = bytes([(t * 31 + n) % 251]) * chunk
            start = time.monotonic()
            try:
                os.pwrite(fd, data, n * chunk)
                expected += data
            except OSError as e:
                failed(errno.errorcode.get(e.errno, str(e.errno)))
            mine.append((start, time.monotonic()))
            n += 1
            time.sleep(0.001)
        try:
            os.close(fd)
        except OSError as e:
            failed(errno.errorcode.get(e.errno, str(e.errno)))
        with open(path, 'rb') as f:
            if f.read() != bytes(expected):
                failed('content')
        with lock:
            writes.extend(mine)

    workers = [threading.Thread(target=reader, args=(t,)) for t in range(threads)]
    workers += [threading.Thread(target=writer, args=(t,)) for t in range(writers)]
    for w in workers:
        w.start()
    event_times = []
    for _ in range(n_events):
        time.sleep(1.0)
        if kind == 'kill':
            old = m.daemon()
            event_times.append(time.monotonic())
            os.kill(old, signal.SIGKILL)
            while m.daemon() in (None, old):
                time.sleep(0.002)
        else:
            event_times.append(time.monotonic())
            subprocess.run([fsd, '--upgrade', m.mnt], check=True, stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    stop.set()
    for w in workers:
        w.join()
    stalls, first, write_stalls = [], [], []
    for t in event_times:
        # Service is back when a call that started after the event is answered (calls in
        # flight may still be answered by the old daemon as the signal lands).
        first_end = min(e for (s, e) in calls if s >= t)
        first.append(first_end - t)
        # The calls in flight at the event, or started before service was back.
        stalls += [e - s for (s, e) in calls if s <= first_end and e >= t]
        write_stalls += [e - s for (s, e) in writes if s <= first_end and e >= t]
    return len(calls), failed, stalls, first, len(writes), write_failures, write_stalls


def ms(x):
    return f'{x * 1000:.1f} ms'


def latency_round(m, n):
    os.makedirs(os.path.join(m.mnt, 'hit'), exist_ok=True)
    with open(os.path.join(m.mnt, 'hit', 'kernel.bin'), 'wb') as f:
        f.write(os.urandom(16384))
    out = {}
    t = []
    for i in range(n):
        s = time.perf_counter()
        with open(os.path.join(m.mnt, 'hit', 'kernel.bin'), 'rb') as f:
            f.read()
        t.append(time.perf_counter() - s)
    out['hit'] = statistics.median(t)
    t = []
    data = os.urandom(8192)
    for i in range(n):
        d = os.path.join(m.mnt, f's{i}')
        s = time.perf_counter()
        os.mkdir(d)
        tmp = os.path.join(d, '.tmp')
        with open(tmp, 'wb') as f:
            f.write(data)
        os.rename(tmp, os.path.join(d, 'kernel.bin'))
        t.append(time.perf_counter() - s)
    out['store'] = statistics.median(t)
    t = []
    for i in range(n):
        s = time.perf_counter()
        os.path.exists(os.path.join(m.mnt, f'absent{i}'))
        t.append(time.perf_counter() - s)
    out['miss'] = statistics.median(t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--fsd', default='build/fsd/kcache-fsd')
    ap.add_argument('--kills', type=int, default=10)
    ap.add_argument('--upgrades', type=int, default=5)
    ap.add_argument('--threads', type=int, default=4)
    ap.add_argument('--writers', type=int, default=2)
    ap.add_argument('--calls', type=int, default=2000)
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--io-uring', action='store_true',
                    help='serve over FUSE over io_uring (the fuse module enable_uring=Y)')
    a = ap.parse_args()
    fsd = os.path.abspath(a.fsd)
    base = tempfile.mkdtemp(prefix='kcache-bench-takeover-')
    try:
        for kind, n in (('kill', a.kills), ('upgrade', a.upgrades)):
            if n == 0:
                continue
            m = Mount(fsd, os.path.join(base, kind), io_uring=a.io_uring)
            try:
                (total, failed, stalls, first, wtotal, wfailed,
                 wstalls) = events_figures(m, fsd, n, a.threads, kind, a.writers)
            finally:
                m.stop()
            failures = ', '.join(f'{c} {name}' for name, c in sorted(failed.items())) or '0'
            print(f'{kind} x{n} ({a.threads} reader threads, {total} reads, {failures} failed): '
                  f'stall median {ms(statistics.median(stalls))}, p99 {ms(percentile(stalls, 99))}, '
                  f'max {ms(max(stalls))}; service back after: median '
                  f'{ms(statistics.median(first))}, max {ms(max(first))}')
            if a.writers:
                wfail = ', '.join(f'{c} {name}' for name, c in sorted(wfailed.items())) or '0'
                line = (f'  {a.writers} writers with unpublished bytes ({wtotal} writes of 4 KiB, '
                        f'{wfail} failed)')
                if wstalls:
                    line += (f': stall median {ms(statistics.median(wstalls))}, p99 '
                             f'{ms(percentile(wstalls, 99))}, max {ms(max(wstalls))}')
                print(line)
        results = {True: [], False: []}
        for r in range(a.rounds):
            for keeper in ((True, False) if r % 2 == 0 else (False, True)):
                m = Mount(fsd, os.path.join(base, f'lat{r}{int(keeper)}'), keeper, a.io_uring)
                try:
                    results[keeper].append(latency_round(m, a.calls))
                finally:
                    m.stop()
        for op in ('hit', 'store', 'miss'):
            k = statistics.median(x[op] for x in results[True])
            n = statistics.median(x[op] for x in results[False])
            print(f'{op:5s} keeper {k * 1e6:7.1f} us   --no-keeper {n * 1e6:7.1f} us   '
                  f'ratio {k / n:.2f}')
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == '__main__':
    main()
