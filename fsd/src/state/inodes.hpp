// The inode table of kcache-fsd: what the daemon keeps per inode, one record per
// inode behind one mutex (after passthrough_hp.cc's Inode).
//
// Inode numbers are the store's (stable, never reused): the table translates nothing.
// A record exists while any part of it holds something: the kernel's lookup
// references and the orphan they keep alive (Lookups, lookups.hpp), the page cache's
// state (PageCache, page_cache.hpp), the versions writers build (Versions,
// versions.hpp), the readers a held blob is kept for (BlobHolds, blob_holds.hpp).
// Those units decide what their part means; this table only holds the
// parts and drops a record once all of them are empty (prune).
//
// Why one table: an open, a lookup reply, a getattr or a release touched two or three
// of the maps that held these parts before, each behind its own mutex, and a forget dropped page
// state under the lookups' lock. One record per inode answers them under one lock, and nothing
// nests any more. It is not sharded: under its lock nothing does I/O, replies, or takes another
// lock (a unit that must, such as a writer's open waiting for readers, collects what to do and does
// it after), so it is held for map operations only; bench/README.md, "The inode table", has the
// figures.
//
// Contract: find() and at() return a record that stays valid while `mutex` is held
// (and until prune() drops it, or the record is erased otherwise: a pointer to it must
// not outlive the lock). Nothing here fails.
//
// Locks (lock_order.hpp): mutex, level 6. version_ended is waited on with it (Versions).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

struct FileHandle;
struct Version;

// A file removed (unlink, rename over it) while the kernel still knows its inode: it
// stays readable until the kernel forgets it, as an unlinked inode on a local disk.
struct Orphan {
    core::Attr attr;  // nlink 0
    std::shared_ptr<const std::string> content;
    // Its blob is held in the db (core/holds.hpp) for a successor daemon: released when
    // the kernel forgets the inode (Filesystem::forget).
    bool held = false;
};

// A version of an inode that open reader handles read (BlobHolds, blob_holds.hpp).
struct ReadVersion {
    core::Digest digest;
    std::uint32_t readers = 0;  // counted reader handles (FileHandle::counted_reader)
    bool held = false;          // replaced by a publish, and held in the db for them
};

// Which version of an inode the kernel's page cache holds, and who reads and writes
// through it (PageCache, page_cache.hpp, says what each field means for it).
struct PageState {
    core::Digest digest;               // the version whose pages the kernel caches
    std::uint64_t size = 0;            // its size
    std::vector<FileHandle*> readers;  // open handles reading through the page cache
    // Read-only handles reading a shared version's pages (PageCache::enter_as_follower).
    std::vector<FileHandle*> followers;
    std::uint32_t writers = 0;  // open writer handles: no reader enters meanwhile
    // Of them, closed with their version published (FileHandle::closed_clean).
    std::uint32_t closed_writers = 0;
    core::Digest closed_digest;  // what the last of them published
    // The kernel's pages are known to hold only `digest`: a reader that refilled
    // them (its open made the kernel drop what it held) has sent a READ since.
    // Until then a new reader refills too: a kept page could still be another
    // version's, dropped only when the refilling open completes in the kernel.
    bool settled = false;
    // The version whose attributes the kernel was last told to keep (tell_attr);
    // a reader of another one waits for their invalidation (enter).
    std::optional<core::Digest> told;
    std::shared_ptr<const std::string> kept;  // `digest`'s content once replaced (Contents)
    std::uint32_t lazy = 0;  // of `readers`, those that load their content at the first READ

    // No handle uses it: the kernel forgetting the inode may drop it.
    bool idle() const { return readers.empty() && followers.empty() && writers == 0; }
};

// One inode's record.
struct Inode {
    // The kernel's lookup references (Lookups): 0 when it does not know the inode.
    std::uint64_t lookups = 0;
    std::optional<Orphan> orphan;  // kept while lookups > 0 (Lookups::adopt)
    // The page cache's state (PageCache): none while nothing is known of its pages.
    std::optional<PageState> pages;
    // The versions being written (Versions, THE RULE in filesystem.hpp): at most one
    // shared version, and private O_TRUNC rewrites, oldest first.
    std::shared_ptr<Version> shared;
    std::vector<std::shared_ptr<Version>> rewrites;
    // Its readers by version, and read-only opens not yet counted under one (BlobHolds).
    std::vector<ReadVersion> read_versions;
    std::uint32_t opening_readers = 0;

    bool empty() const {
        return lookups == 0 && !orphan && !pages && !shared && rewrites.empty() &&
               read_versions.empty() && opening_readers == 0;
    }
};

class Inodes {
  public:
    Inodes() = default;
    Inodes(const Inodes&) = delete;
    Inodes& operator=(const Inodes&) = delete;

    Mutex mutex KCACHE_LEVEL(6);
    CondVar version_ended;  // a version of some inode finished ending (Versions::join)

    // The record of `ino`, or null when it has none.
    Inode* find(core::Ino ino) REQUIRES(mutex) {
        auto it = m_table.find(ino);
        return it == m_table.end() ? nullptr : &it->second;
    }
    // The record of `ino`, made (empty) when it has none: prune() it when done.
    Inode& at(core::Ino ino) REQUIRES(mutex) { return m_table[ino]; }
    // Drops the record of `ino` if nothing in it holds anything.
    void prune(core::Ino ino) REQUIRES(mutex) {
        if (auto it = m_table.find(ino); it != m_table.end() && it->second.empty())
            m_table.erase(it);
    }
    std::size_t size() REQUIRES(mutex) { return m_table.size(); }

  private:
    std::unordered_map<core::Ino, Inode> m_table GUARDED_BY(mutex);
};

}  // namespace kcache::fsd
