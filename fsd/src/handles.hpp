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
#include <mutex>
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

    // ---- guarded by `mutex` (level 1): threads sharing a descriptor call concurrently ----
    std::mutex mutex;
    std::shared_ptr<const std::string> snapshot;  // readers that do not read a version
    // Writers: the version they write (fixed at open; taken by leave_version at
    // release). Read-only handles: the shared version they read, once they follow one
    // (follow_shared), else null.
    std::shared_ptr<Version> version;
    bool killed = false;  // its writer died by a signal: its close publishes nothing
    // A writer inherited from a daemon that died with bytes of it unpublished (state.hpp):
    // WRITE, FLUSH and FSYNC are answered EIO; its entry keeps what was published.
    bool lost = false;

    // ---- guarded by PageCache's mutex (level 7) ----
    // A page-cache reader whose open made the kernel drop its pages: its first READ
    // shows the drop is done (PageCache::settle). Written under the page cache's mutex;
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
    std::mutex mutex;  // level 1; guards the fields below
    bool loaded = false;
    std::vector<Child> children;  // a snapshot: offsets stay stable while the dir changes
};

}  // namespace kcache::fsd
