// THE LOCK ORDER of kcache-fsd: the one order in which the daemon's locks nest.
//
// A thread that holds a lock takes only locks that come *after* it below, and never
// two locks of one level at once (two handles' mutexes, two versions' mutexes). Every
// unit's header names the locks it owns and the level of each; a function that is
// documented "takes no lock of ours" may be called under any of them.
//
//  1. HandleTable::m_rebuild_mutex (state.hpp), above them all: taken with none of
//     these held (a handler's first step, looking its handle up); under it a handle
//     left by a dead daemon is rebuilt: read transactions, Contents, Lookups,
//     Versions::join.
//  2. FileHandle::mutex, DirHandle::mutex (handles.hpp). Under a FileHandle's mutex
//     follow_shared locks the handle's version and the inode table, and read()
//     loads a lazy reader's content (Contents: the pin, the snapshots, the inode
//     table, read transactions).
//  3. Version::mutex (versions.hpp). Held across a publish: its write transaction
//     (LMDB's writer lock), eviction, Contents::keep_for_readers, Background.
//  4. LMDB's writer lock: an open write transaction (core::WriteTxn, StagedFile
//     begin and commit, Store::update, Store::evict). Under it a removal records the
//     orphan it leaves (the inode table) and its content (Contents' snapshots), and a
//     publish looks for readers of what it replaces (BlobHolds: the inode table).
//  5. Contents::m_pin_mutex (contents.hpp). Held across renew_pin's scan and swap and
//     a lazy open's check (pinned); under it: the inode table and the snapshots.
//  6. Inodes::mutex (inodes.hpp): the inode table, one record per inode with the
//     state of Lookups (lookup references, orphans), PageCache (page state) and
//     Versions (the writer registry). Nothing under it does I/O, replies or takes
//     another lock: replies a waiting writer is owed are sent after it is let go.
//     Versions::join waits on its condition variable for an ending version, so it is
//     called with nothing else held (no write transaction: create() joins after its
//     commit; no version's mutex).
//  7. Contents::m_snapshots_mutex: a leaf below the inode table.
//  8. Leaves of other units, none taken under another: HitCounter::m_mutex,
//     Background's parts (KernelNotifier::m_mutex, Counters::m_mutex,
//     MissClassifier::m_mutex), RemoteTier's, SingleFlight::m_mutex (its answers run
//     with none of these held); with --io-uring, UringTransport's hand-off mutex of each
//     ring (a reply sent from another thread than the ring's is queued under it;
//     uring_transport.hpp) and its start-up handshake mutex (only while INIT is
//     answered); HandleTable's free-slot mutex (state.hpp); Filesystem::m_handover_mutex
//     (an upgrade's gate); BlobHolds::m_inherited_mutex (the holds a takeover
//     inherited); takeover's replay and pending-INIT mutexes (takeover.cpp).
//
// (Until issue 34 the levels ran 0 to 9, with 7 and 8 left empty when the page cache's
// and the writer registry's own mutexes went into the inode table; they are numbered in
// order now, from the outermost.)
//
// LMDB read transactions (Store::read) take no lock that conflicts with these (a
// reader slot); they are opened under any level.
//
// The compiler checks this order (scripts/check_thread_safety.sh, a CTest test: clang's
// -Wthread-safety -Wthread-safety-beta -Werror over fsd): every mutex below is a
// kcache::Mutex (core/thread_annotations.hpp) declared with KCACHE_LEVEL(n), and the
// fields it guards with GUARDED_BY. Taking a lock of a lower level while one of a
// higher level is held fails the build ("mutex 'a' must be acquired before 'b'"), as
// does touching a guarded field without its lock. What clang cannot check: two locks of
// one level at once (it tells mutexes apart by their declaration, not their object);
// LMDB's writer lock (level 4, core's); and a pointer into guarded state kept after the
// lock is let go.
//
// Replies and callbacks: no reply is sent while a handle's mutex is held (a reply
// may let the kernel release that handle on another thread at once), and deferred
// replies (PageCache::admit_writer, KernelNotifier::invalidate_attr and grow_size,
// RemoteTier::read_through, SingleFlight::wait) run with none of the daemon's locks held: such a
// reply may discard its open, which publishes (levels 3 and 4).
#pragma once

#include "kcache/core/thread_annotations.hpp"

namespace kcache::fsd::lock_order {

// The boundaries between levels, for clang's analysis only: declared, never defined
// nor locked. boundary<n> lies above level n; each is acquired before the next, and a
// mutex of level n after boundary<n> and before boundary<n+1>, so the analysis orders
// every mutex of a lower level before every mutex of a higher one.
extern Mutex boundary9;
extern Mutex boundary8 ACQUIRED_BEFORE(boundary9);
extern Mutex boundary7 ACQUIRED_BEFORE(boundary8);
extern Mutex boundary6 ACQUIRED_BEFORE(boundary7);
extern Mutex boundary5 ACQUIRED_BEFORE(boundary6);
extern Mutex boundary4 ACQUIRED_BEFORE(boundary5);
extern Mutex boundary3 ACQUIRED_BEFORE(boundary4);
extern Mutex boundary2 ACQUIRED_BEFORE(boundary3);
extern Mutex boundary1 ACQUIRED_BEFORE(boundary2);

}  // namespace kcache::fsd::lock_order

// On a mutex of level `n` (1 to 8): `Mutex m_mutex KCACHE_LEVEL(6);`
#define KCACHE_LEVEL(n) KCACHE_LEVEL_##n
#define KCACHE_LEVEL_1                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary1) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary2)
#define KCACHE_LEVEL_2                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary2) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary3)
#define KCACHE_LEVEL_3                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary3) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary4)
#define KCACHE_LEVEL_4                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary4) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary5)
#define KCACHE_LEVEL_5                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary5) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary6)
#define KCACHE_LEVEL_6                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary6) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary7)
#define KCACHE_LEVEL_7                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary7) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary8)
#define KCACHE_LEVEL_8                                   \
    ACQUIRED_AFTER(::kcache::fsd::lock_order::boundary8) \
    ACQUIRED_BEFORE(::kcache::fsd::lock_order::boundary9)
