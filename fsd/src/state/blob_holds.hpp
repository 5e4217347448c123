// The holds kcache-fsd keeps on blobs (core/holds.hpp) for readers a successor daemon
// rebuilds from the db by (inode, digest) after a takeover (state.hpp).
//
// A reader keeps the version it opened (POSIX), served from memory while this daemon
// lives. Its blob must stay in the db for a successor when the last file naming it
// goes while the reader is open:
// - a removal that leaves an orphan holds it (Filesystem::remove_keeping_orphan); the
//   kernel's forget of the orphan lets it go (release);
// - a publish that replaces a version readers have open holds it (hold_replaced, in
//   the publish's transaction); the last of those readers' close lets it go;
// - a successor inherits them all (adopt); each goes when the last rebuilt reader of
//   its blob closes, at once if none reads it.
// A fresh mount clears every hold (serve.cpp): the kernel then knows no open file.
//
// Readers are counted per inode and version in the inode table (Inode::read_versions):
// a read-only open is counted as *opening* from before its read transaction until its
// handle is counted under the version it read (opened) or it fails (abandoned); a
// publish meanwhile holds what it replaces, since the open may have read it.
//
// Contract: nothing here fails the caller but hold_replaced; a hold that cannot be
// released is logged and stays until the next fresh mount (verify counts it).
//
// Locks (lock_order.hpp): the inode table's mutex (level 6), never across a
// transaction but hold_replaced's (level 4 over 6); m_inherited_mutex, level 8, a leaf.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "handles.hpp"
#include "inodes.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class BlobHolds {
  public:
    BlobHolds(core::Store& store, Inodes& inodes) : m_store(store), m_inodes(inodes) {}

    // One hold fewer on `digest`, `count` times, in a write transaction of its own.
    void release(const core::Digest& digest, std::uint64_t count);

    // ---- readers of this daemon ----
    // A read-only open of `ino`, counted as opening while in scope: from before its
    // read transaction until opened() counts its handle (snapshot_digest set) under
    // the version it read; abandoned if it fails first.
    class ReaderOpen {
      public:
        ReaderOpen(BlobHolds& holds, core::Ino ino) : m_holds(holds), m_ino(ino) {
            holds.opening(ino);
        }
        ~ReaderOpen() {
            if (!m_done) m_holds.abandoned(m_ino);
        }
        ReaderOpen(const ReaderOpen&) = delete;
        ReaderOpen& operator=(const ReaderOpen&) = delete;
        void opened(FileHandle& handle) {
            m_done = true;
            m_holds.opened(handle);
        }

      private:
        BlobHolds& m_holds;
        core::Ino m_ino;
        bool m_done = false;
    };
    // A reader closed (release, or an open the kernel did not take): a counted one may
    // let its version's hold go; a rebuilt one its inherited hold.
    void closed(const FileHandle& handle);

    // ---- a publish replacing the stored content of `ino` ----
    // In its write transaction, before the content changes: holds the stored version
    // if a reader may read it; returns what it held (none: nothing to confirm).
    core::Result<std::optional<core::Digest>> hold_replaced(core::WriteTxn& txn, core::Ino ino);
    // After that transaction committed: the hold is the readers' from now on (or let
    // go at once if they closed meanwhile).
    void replaced(core::Ino ino, const core::Digest& held);

    // ---- a takeover ----
    // A reader rebuilt from a predecessor's handle, reading `handle.snapshot_digest`:
    // counted as opened() is, and towards its blob's inherited hold.
    void rebuilt(FileHandle& handle);
    // Once every reader is rebuilt: the holds in the db become this daemon's, each
    // released when the last rebuilt reader of its blob closes (none: at once).
    void adopt();

  private:
    void opening(core::Ino ino);
    void opened(FileHandle& handle);
    void abandoned(core::Ino ino);
    // Drops the versions of `ino` held for readers that are all gone; what to release.
    std::vector<core::Digest> unread(core::Ino ino) REQUIRES(m_inodes.mutex);
    void release_all(const std::vector<core::Digest>& digests);

    core::Store& m_store;
    Inodes& m_inodes;

    // Holds inherited at a takeover: blob, holds on it, rebuilt readers of it not yet
    // closed. Empty after a fresh mount: then closed() looks at nothing.
    struct Inherited {
        core::Digest digest;
        std::uint64_t holds = 0;
        std::uint64_t readers = 0;
    };
    Mutex m_inherited_mutex KCACHE_LEVEL(8);  // a leaf
    std::vector<Inherited> m_inherited GUARDED_BY(m_inherited_mutex);
    std::atomic<bool> m_any_inherited{false};
};

}  // namespace kcache::fsd
