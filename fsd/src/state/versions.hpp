// The writer registry of kcache-fsd: the versions of files being written, per inode,
// under THE RULE (filesystem.hpp; docs/fsd.md, "Several handles on one file").
//
// Contract: join() gives a handle opened for writing its version, waiting while a
// version of the inode is ending (its last handle is publishing it) so that the new
// one starts from what that one published; leave() and ended() take a handle out and
// retire the version its last handle published. The registry never publishes and
// never notifies the kernel: the caller (Filesystem::leave_version) does, between
// leave() returning true and ended(). What may fail: join() (beginning a StagedFile:
// a write transaction, ENOENT for a file removed meanwhile, or truncating the shared
// version); nothing else.
//
// The registry's state is part of each inode's record in the inode table (inodes.hpp:
// Inode::shared, Inode::rewrites).
//
// Locks (lock_order.hpp): the inode table's, level 6; Version::mutex, level 3.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "inodes.hpp"
#include "kcache/core/staged.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"
#include "spill.hpp"

namespace kcache::fsd {

// A version of a file being written.
struct Version {
    Version(core::StagedFile content, bool is_shared, std::uint32_t by)
        : staged(std::move(content)),
          started_from(staged.stored_digest()),
          shared(is_shared),
          opener(by) {}
    Mutex mutex KCACHE_LEVEL(3);
    core::StagedFile staged GUARDED_BY(mutex);  // the content, and the write lease while not ended
    bool ended GUARDED_BY(mutex) = false;       // published and lease released by its last handle
    const core::Digest started_from;  // the stored version it grew from: its readers follow
    // Guarded by the inode table's mutex (another object's: clang cannot name it here):
    std::atomic<bool> shared;  // the inode's shared version (else a private rewrite); read anywhere
    bool ending = false;       // its last handle left: publishing, then out of the registry
    std::uint32_t handles = 0;   // write-capable handles using it
    const std::uint32_t opener;  // rewrites: the process that opened it
    std::uint64_t touched = 0;   // when it was made (m_write_clock): the newest rewrite is promoted
    // Its spill file's id (spill.hpp), fixed once it is in the registry; 0: none.
    std::uint32_t spill_id = 0;
    // As handle records keep it: the id, kRewrite set while it is a private rewrite (a
    // rewrite a sharing handle promoted is recorded shared by that handle's record).
    SpillKey spill_key() const { return spill_id ? (spill_id | (shared ? 0 : kRewrite)) : 0; }
};

class Versions {
  public:
    Versions(core::Store& store, std::uint64_t max_file_size, Inodes& inodes, Spills& spills)
        : m_store(store), m_max_file_size(max_file_size), m_inodes(inodes), m_spills(spills) {}

    // Gives a handle of `ino` opened for writing by `opener` (`truncate` for O_TRUNC)
    // its version under THE RULE, in *joined* (set also when truncating a joined
    // shared version fails: the handle then counts in it). `made` is a StagedFile
    // already begun for it (create), or null: then one is begun here when a new
    // version is needed. Waits while a version of the inode is ending; call with no
    // lock held and no write transaction open.
    core::Status join(core::Ino ino, bool truncate, std::uint32_t opener,
                      std::optional<core::StagedFile> made, std::shared_ptr<Version>* joined);
    // A takeover (state.hpp): gives a rebuilt writer of `ino` the version its spill key
    // names, rebuilt once from its spill file (spill.hpp) by the first of its handles
    // and joined by the others. False when no spill file holds it (the version never
    // changed, or its mirror was dropped): the caller joins as after an open. What may
    // fail: beginning the StagedFile (a write transaction, ENOENT for a removed file).
    core::Result<bool> adopt(core::Ino ino, SpillKey key, std::uint32_t opener,
                             std::shared_ptr<Version>* adopted);
    // Takes one handle out of `version`: true when it was the last, and the version is
    // now ending (new handles wait): the caller publishes it, then calls ended().
    bool leave(Version& version);
    // The ending `version` of `ino` leaves the registry; waiting joins go on.
    void ended(core::Ino ino, const std::shared_ptr<Version>& version);

    std::shared_ptr<Version> shared(core::Ino ino);
    bool has_rewrite(core::Ino ino);
    // Whether any version of `ino` is at work (a writer's answer depends on the caller).
    bool at_work(core::Ino ino);
    // The size the newest rewrite that `process` opened of `ino` has staged, if any.
    std::optional<std::uint64_t> rewrite_size(core::Ino ino, std::uint32_t process);
    // A truncate by path: applied to the shared version (then true, its new size in
    // *shared_size: nothing to store) and to every rewrite; false when the db's
    // content must be truncated too.
    // What may fail: the shared version's first use reads the stored content
    // (core::StagedFile::content), which may be damaged: then its error, nothing cut.
    core::Result<bool> truncate(core::Ino ino, std::uint64_t size, std::uint64_t* shared_size);
    // Every size the kernel is told of a file with a shared version is that version's
    // (lookup, readdirplus, create, setattr, getattr): the kernel applies it to the one
    // inode whose pages the version's handles map, and a smaller one would cut them
    // (SIGBUS in a MAP_SHARED mapping, such as SQLite's -shm).
    void apply_live_size(core::Attr& attr);

  private:
    // Whether a version of `ino` is ending (its last handle is publishing it).
    bool ending(core::Ino ino) REQUIRES(m_inodes.mutex);

    core::Store& m_store;
    const std::uint64_t m_max_file_size;
    Inodes& m_inodes;
    Spills& m_spills;
    std::uint64_t m_write_clock GUARDED_BY(m_inodes.mutex) = 0;
};

}  // namespace kcache::fsd
