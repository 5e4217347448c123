#!/usr/bin/env python3
"""Several processes committing SQLite transactions to one database file (issue 11).

Mimics Triton's SQLite cache backend (python/triton/runtime/sqlite_cache.py): one
database file in the cache directory, a new connection per operation, a busy timeout.

  sqlite_writers.py write --db PATH --procs 8 --txns 200 --journal delete|wal [--log DIR]
                          [--strict] [--fresh]
      Runs PROCS processes; each commits TXNS transactions (one row each, a new
      connection per transaction) and, when --log is given, appends the id of every
      row whose commit returned to LOG/<proc>.log (fsynced: the oracle of what was
      acknowledged). Exits 0 when every process committed every transaction.
      By default a transaction that fails "database is locked" is tried again (the
      crash test's writers race a daemon being killed). --strict: never; the busy
      timeout (60 s) is SQLite's only waiting, as on a local disk, where a writer
      never sees "database is locked" before it. --fresh: the processes find no
      database (it is created by whichever gets there first, as Triton's backend
      does); SQLite itself answers SQLITE_BUSY at once, without its busy handler, to
      a connection whose "PRAGMA journal_mode=WAL" converts a new database while
      another does (it would have to upgrade a read lock: deadlock avoidance; seen
      on ext4 too), so with --strict only that pragma of a process's first
      connection is tried again. Any other "database is locked" fails the run.
  sqlite_writers.py check --db PATH [--procs 8 --txns 200] [--log DIR]
      Opens the database, runs PRAGMA integrity_check and checks that every row is
      present: all PROCS*TXNS, or (with --log) every id a log records. Prints the
      row count. Exit 0 when all is well, 1 otherwise.
"""
import argparse
import multiprocessing
import os
import sqlite3
import sys
import time

PAYLOAD = 600  # bytes per row: a few rows per page, so pages split and the file grows
# How many first connections' PRAGMA journal_mode=WAL were tried again (--fresh --strict):
# shared by the forked writers, printed by cmd_write.
CONVERSION_RETRIES = multiprocessing.Value("i", 0)


def set_wal(conn, first_connection, strict):
    """PRAGMA journal_mode=WAL. The one "database is locked" SQLite answers without
    waiting on a local disk too is the conversion of a new database by two
    connections at once: only a process's first connection may see it."""
    for attempt in range(200):
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise RuntimeError("journal_mode is %s, not wal" % mode)
            return
        except sqlite3.OperationalError as e:
            if not (strict and first_connection and "locked" in str(e)):
                raise
            with CONVERSION_RETRIES.get_lock():
                CONVERSION_RETRIES.value += 1
            time.sleep(0.005)
    raise RuntimeError("PRAGMA journal_mode=WAL stayed busy")


def connect(db, journal, first_connection=False, strict=False):
    conn = sqlite3.connect(db, timeout=60, isolation_level=None)
    if journal == "wal":
        set_wal(conn, first_connection, strict)
    # FULL: a commit that returned is on disk in both modes (WAL's NORMAL defers to checkpoints).
    conn.execute("PRAGMA synchronous=FULL")
    return conn


CREATE_TABLE = "CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, proc INT, n INT, value BLOB)"


def create(db, journal):
    conn = connect(db, journal)
    conn.execute("PRAGMA journal_mode=%s" % ("WAL" if journal == "wal" else "DELETE"))
    conn.execute(CREATE_TABLE)
    conn.close()


def writer(db, journal, proc, txns, log_dir, strict=False, fresh=False):
    log = None
    if log_dir:
        log = open(os.path.join(log_dir, "%d.log" % proc), "a")
    for n in range(txns):
        key = "p%d-t%d" % (proc, n)
        value = (key.encode() * (PAYLOAD // len(key) + 1))[:PAYLOAD]
        for attempt in range(1 if strict else 50):
            try:
                # A new connection per operation, as Triton's backend.
                conn = connect(db, journal, first_connection=(n == 0), strict=strict)
                if fresh:
                    conn.execute(CREATE_TABLE)
                with conn:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?, ?)", (key, proc, n, value))
                    # A read inside the transaction: pages written by other processes'
                    # earlier transactions must be the ones it sees.
                    conn.execute("SELECT COUNT(*) FROM cache").fetchone()
                conn.close()
                break
            except sqlite3.OperationalError as e:
                if strict:
                    raise
                # SQLITE_PROTOCOL: a WAL reader lost the race for a read mark too often
                # under heavy contention; SQLite says to retry.
                if "locked" in str(e) or "busy" in str(e) or "locking protocol" in str(e):
                    time.sleep(0.01)
                    continue
                raise
        else:
            raise RuntimeError("gave up on " + key)
        if log:
            log.write(key + "\n")
            log.flush()
            os.fsync(log.fileno())
    return 0


def run_writer(args, proc):
    try:
        sys.exit(writer(args.db, args.journal, proc, args.txns, args.log, args.strict, args.fresh))
    except Exception as e:  # the daemon may be killed under us (crash test)
        sys.stderr.write("writer %d: %s: %s %s\n" % (proc, type(e).__name__, e, getattr(e, "sqlite_errorname", "")))
        sys.exit(3)


def cmd_write(args):
    if not args.fresh:
        create(args.db, args.journal)
    procs = [multiprocessing.Process(target=run_writer, args=(args, p)) for p in range(args.procs)]
    started = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    took = time.monotonic() - started
    print("%d processes x %d transactions (%s): %.2f s" % (args.procs, args.txns, args.journal, took))
    if CONVERSION_RETRIES.value:
        print("first connections' PRAGMA journal_mode=WAL tried again: %d" % CONVERSION_RETRIES.value)
    for i, p in enumerate(procs):
        if p.exitcode != 0:
            print("writer %d: exit code %s" % (i, p.exitcode))
    return 0 if all(p.exitcode == 0 for p in procs) else 1


def cmd_check(args):
    conn = sqlite3.connect(args.db, timeout=60)
    ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
    if ok != "ok":
        print("integrity_check: %s" % ok)
        return 1
    keys = set(k for (k,) in conn.execute("SELECT key FROM cache"))
    expected = set()
    if args.log:
        for name in os.listdir(args.log):
            with open(os.path.join(args.log, name)) as f:
                expected.update(line.strip() for line in f if line.strip())
    else:
        expected = set("p%d-t%d" % (p, n) for p in range(args.procs) for n in range(args.txns))
    missing = sorted(expected - keys)
    print("rows %d, expected %d, missing %d %s" % (len(keys), len(expected), len(missing), missing[:10]))
    conn.close()
    return 1 if missing else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["write", "check"])
    ap.add_argument("--db", required=True)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--txns", type=int, default=200)
    ap.add_argument("--journal", choices=["delete", "wal"], default="delete")
    ap.add_argument("--log")
    ap.add_argument("--strict", action="store_true", help='a "database is locked" fails the run')
    ap.add_argument("--fresh", action="store_true", help="the writers create the database")
    args = ap.parse_args()
    return cmd_write(args) if args.cmd == "write" else cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
