// Open file and directory handles (fuse_file_info::fh) of kcache-fsd.
//
// A handle is made by OPEN/CREATE (OPENDIR), given to the kernel with the reply, and
// deleted at RELEASE (RELEASEDIR), or by discard_open when the kernel did not take
// the reply. Fields "fixed at open" are written before the handle is given to the
// kernel and only read afterwards. Other fields name the lock that guards them (levels
// in lock_order.hpp).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kcache/core/store.hpp"
#include "lock_order.hpp"
#include "versions.hpp"

namespace kcache::fsd {

struct FileHandle {
    // ---- fixed at open ----
    std::uint64_t fh = 0;  // its slot in the handle table (state.hpp), set by HandleTable
    core::Ino ino = 0;
    core::Attr attr;        // as opened: answers getattr once the file is gone from the db
    bool orphan = false;    // opened after its removal: writes are accepted and dropped
    bool writable = false;  // opened for writing (O_WRONLY or O_RDWR)
    bool readable = false;  // opened for reading (O_RDONLY or O_RDWR)
    std::uint32_t opener =
        0;                 // writers: the process that opened it; only its close publishes early
    pid_t reader_tid = 0;  // readers: the thread that opened it
    core::Digest snapshot_digest;  // readers that do not read a version: the version they read
    // A reader opened with the kernel's pages of its version kept: its content is
    // loaded at its first READ (Contents::load), if one comes; null snapshot until then.
    // Set by PageCache::enter (under its mutex) during the open.
    bool lazy = false;
    // A reader counted in the page cache's readers (PageCache::leave at release). Set
    // by PageCache::enter during the open.
    bool page_cached = false;
    // A reader that opened following a shared version (PageState::followers): the
    // version it reads. Set by PageCache::enter_as_follower. Weak: a version freed once
    // the follower moved on (follow_shared) must not match a new one at its address.
    std::weak_ptr<const Version> followed;
    // A handle inherited from a daemon that died (state.hpp), set when it is rebuilt: a
    // writer with bytes unpublished (WRITE, FLUSH and FSYNC are answered EIO; its entry
    // keeps what was published), or a reader whose version left the db (READ: EIO).
    bool lost = false;
    // A reader counted among its inode's readers (BlobHolds::opened, rebuilt), and one
    // rebuilt from a dead daemon's handle (counted towards its blob's inherited hold).
    bool counted_reader = false;
    bool rebuilt_reader = false;

    // ---- guarded by `mutex`: threads sharing a descriptor call concurrently ----
    Mutex mutex KCACHE_LEVEL(2);
    // Readers that do not read a version.
    std::shared_ptr<const std::string> snapshot GUARDED_BY(mutex);
    // Writers: the version they write (set at open; taken by leave_version at
    // release). Read-only handles: the shared version they read, once they follow one
    // (follow_shared), else null.
    std::shared_ptr<Version> version GUARDED_BY(mutex);
    // Its writer died by a signal: its close publishes nothing.
    bool killed GUARDED_BY(mutex) = false;

    // ---- guarded by the inode table's mutex (level 6; another object's: not checked) ----
    // A page-cache reader whose open made the kernel drop its pages: its first READ
    // shows the drop is done (PageCache::settle). Written under the inode table's mutex;
    // read anywhere (atomic) to skip that lock on every other READ.
    std::atomic<bool> refilling{false};
    bool page_writer =
        false;  // a writer counted in the page cache (PageCache::leave_as_writer at release)
    bool closed_clean = false;  // a page writer whose close published it, nothing written since
};

struct DirHandle {
    struct Child {
        std::string name;
        core::Ino ino;
        core::FileType type;
    };
    Mutex mutex KCACHE_LEVEL(2);
    bool loaded GUARDED_BY(mutex) = false;
    // A snapshot: offsets stay stable while the dir changes.
    std::vector<Child> children GUARDED_BY(mutex);
};

}  // namespace kcache::fsd
