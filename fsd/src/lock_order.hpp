// THE LOCK ORDER of kcache-fsd: the one order in which the daemon's locks nest.
//
// A thread that holds a lock takes only locks that come *after* it below, and never
// two locks of one level at once (two handles' mutexes, two versions' mutexes). Every
// unit's header names the locks it owns and the level of each; a function that is
// documented "takes no lock of ours" may be called under any of them.
//
//  1. FileHandle::mutex, DirHandle::mutex (handles.hpp). Under a FileHandle's mutex
//     follow_shared locks the handle's version and the writer registry, and read()
//     loads a lazy reader's content (Contents: the pin, the snapshots, Lookups, the
//     page cache, read transactions).
//  2. Version::mutex (versions.hpp). Held across a publish: its write transaction
//     (LMDB's writer lock), eviction, Contents::keep_for_readers, Background.
//  3. LMDB's writer lock: an open write transaction (core::WriteTxn, StagedFile
//     begin and commit, Store::update, Store::evict). Under it a removal records the
//     orphan it leaves (Lookups) and its content (Contents' snapshots).
//  4. Contents::m_pin_mutex (contents.hpp). Held across renew_pin's scan and swap and
//     a lazy open's check (pinned); under it: the page cache and the snapshots.
//  5. Lookups::m_mutex (lookups.hpp): lookup references and orphans. Under it forget
//     drops the page-cache state of an inode the kernel no longer knows.
//  6. Contents::m_snapshots_mutex: a leaf.
//  7. PageCache::m_mutex (page_cache.hpp): a leaf. Replies a waiting writer is owed
//     are sent after it is let go.
//  8. Versions::m_mutex (versions.hpp): a leaf. join() waits on its condition
//     variable for an ending version, so it is called with nothing else held (no
//     write transaction: create() joins after its commit; no version's mutex).
//  9. Leaves of other units: HitCounter::m_mutex, Background::m_mutex, RemoteTier's,
//     SingleFlight::m_mutex (its answers run with none of these held); with
//     --io-uring, UringTransport's hand-off mutex of each ring (a reply sent from
//     another thread than the ring's is queued under it; uring_transport.hpp) and its
//     start-up handshake mutex (only while INIT is answered); HandleTable's free-slot
//     mutex (state.hpp); Filesystem::m_handover_mutex (an upgrade's gate); takeover's
//     replay and pending-INIT mutexes (takeover.cpp).
//
// HandleTable::m_rebuild_mutex (state.hpp) is taken with none of these held (a
// handler's first step, looking its handle up); under it a handle left by a dead
// daemon is rebuilt: read transactions, Contents, Lookups, Versions::join.
//
// LMDB read transactions (Store::read) take no lock that conflicts with these (a
// reader slot); they are opened under any level.
//
// Replies and callbacks: no reply is sent while a handle's mutex is held (a reply
// may let the kernel release that handle on another thread at once), and deferred
// replies (PageCache::admit_writer, Background::invalidate_attr and grow_size,
// RemoteTier::read_through, SingleFlight::wait) run with none of the daemon's locks held: such a
// reply may discard its open, which publishes (levels 2 and 3).
#pragma once
