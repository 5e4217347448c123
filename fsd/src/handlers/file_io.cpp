// The file handlers of kcache-fsd once a file is open: read, write, flush, fsync,
// release, and publishing (the Filesystem class, filesystem.hpp; open and create:
// files.cpp). Every handler replies only after it let go of the handle's lock: the
// reply may let the kernel release the handle on another thread at once.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "filesystem.hpp"
#include "kernel_attrs.hpp"
#include "log.hpp"
#include "process.hpp"
#include "resend.hpp"

namespace kcache::fsd {
using core::Attr;
using core::Ino;

void Filesystem::read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    if (!fi->fh) return read_unopened(req, ino, size, off);
    FileHandle* handle = m_handles.file(fi->fh);
    if (!handle) return reply_error(req, {EBADF, "no such handle"});
    if (handle->lost) return reply_error(req, {EIO, "this open file was lost with a daemon"});
    std::shared_ptr<Version> version;
    std::shared_ptr<const std::string> shared;  // keeps a reader's snapshot alive for the reply
    bool lost = false;
    core::Error damage;  // code set: the stored content did not match its digest
    if (handle->refilling.load(std::memory_order_relaxed)) m_pages.settle(handle);
    {
        MutexLock lock(handle->mutex);
        follow_shared(handle);
        version = handle->version;
        if (!version && handle->lazy && !handle->snapshot) {
            handle->snapshot = m_contents.load(ino, handle->snapshot_digest, &damage);
            // renew_pin keeps a version that left the db for its lazy readers; null
            // only if reading it from the pin failed (logged there).
            lost = !handle->snapshot;
        }
        shared = handle->snapshot;
    }
    if (lost && damage.code) {
        // A read in progress: EIO (the kernel has no page to give); the entry is evicted,
        // so the next open finds nothing (a miss).
        const core::Error answer = damaged_content(ino, damage);
        return reply_error(req, {EIO, answer.message});
    }
    if (lost)
        return reply_error(
            req, {EIO, "content removed by another process before its first read, and not kept"});
    std::string copy;  // a version's bytes, which may change after the lock
    std::string_view slice;
    if (version) {
        MutexLock lock(version->mutex);
        auto content = version->staged.content();  // its first use reads it (staged.hpp)
        if (!content) return reply_error(req, content.error());
        copy.assign(
            content->substr(std::min(static_cast<std::size_t>(off), content->size()), size));
        slice = copy;
    } else if (shared) {
        const std::string_view content = *shared;
        slice = content.substr(std::min(static_cast<std::size_t>(off), content.size()), size);
    }
    m_counters.count(core::Counter::bytes_read, slice.size());
    fuse_reply_buf(req, slice.data(), slice.size());
}

void Filesystem::read_unopened(fuse_req_t req, Ino ino, size_t size, off_t off) {
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto content = txn->read(ino);
    if (!content && content.error().code == core::kDamagedContent) {
        txn = core::fail(EIO, "released");  // the snapshot ends before the eviction
        const core::Error answer = damaged_content(ino, content.error());
        return reply_error(req, {EIO, answer.message});
    }
    if (!content) return reply_error(req, content.error());
    const std::string_view bytes = content->bytes();
    const std::string_view slice =
        bytes.substr(std::min(static_cast<std::size_t>(off), bytes.size()), size);
    m_counters.count(core::Counter::bytes_read, slice.size());
    fuse_reply_buf(req, slice.data(), slice.size());  // from the map: before the snapshot ends
}

void Filesystem::write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
                       fuse_file_info* fi) {
    std::optional<Dirtying> dirtying;
    auto change = start_change(req, fi, dirtying);
    if (!change) return;
    if (change->orphan) {  // its bytes go nowhere; a successor still learns it was written
        if (change->version) m_handles.set_unpublished(change->handle->fh, true);
        return (void)fuse_reply_write(req, size);
    }
    m_pages.close_writer(change->handle, false, {});  // written again after its close
    core::Status s;
    {
        MutexLock lock(change->version->mutex);
        s = change->version->staged.write(static_cast<std::uint64_t>(off), {buf, size});
    }
    if (!s) return reply_error(req, s.error());
    m_handles.set_unpublished(change->handle->fh, true);  // for a successor (state.hpp)
    fuse_reply_write(req, size);
}

std::optional<Filesystem::Change> Filesystem::start_change(fuse_req_t req, fuse_file_info* fi,
                                                           std::optional<Dirtying>& dirtying) {
    FileHandle* handle = m_handles.file(fi->fh);
    if (!handle) {
        reply_error(req, {EBADF, "no such handle"});
        return std::nullopt;
    }
    if (handle->lost) {
        reply_error(req, {EIO, "this open file was lost with a daemon"});
        return std::nullopt;
    }
    if (dirtying.emplace(*this).refused()) return std::nullopt;  // the successor answers it
    Change change{.handle = handle};
    {
        MutexLock lock(handle->mutex);
        change.orphan = handle->orphan;
        if (handle->writable) change.version = handle->version;
    }
    if (!change.orphan && !change.version) {
        reply_error(req, {EBADF, "not open for writing"});
        return std::nullopt;
    }
    return change;
}

core::Status Filesystem::publish(fuse_req_t req, Version& version) {
    if (version.ended || !version.staged.dirty()) return {};  // an unchanged file publishes nothing
    const std::uint64_t size = version.staged.size();
    // Make room first. If the cache cannot get under its bound (everything left is
    // pinned or being written), the writer gets ENOSPC and nothing is published.
    std::uint64_t max = 0, stored = 0;
    {
        auto txn = KCACHE_TRY(m_store.read());
        max = txn.config().max_bytes;
        stored = txn.counter(core::Counter::stored_bytes).value_or(0);
    }
    if (max && stored + size > max) {
        auto evicted = KCACHE_TRY(m_store.evict({.max_bytes = size > max ? 0 : max - size}));
        if (!evicted.satisfied) {
            return core::fail(ENOSPC,
                              fmt::format("cache full: {} bytes do not fit under the {} byte bound "
                                          "(the rest is pinned or being written)",
                                          size, max));
        }
    }
    // Readers of the stored version that load it lazily (open()) may still need it,
    // and a successor rebuilds every reader from the db (blob_holds.hpp).
    const Ino ino = version.staged.ino();
    m_contents.keep_for_readers(ino);
    std::optional<core::Digest> held;
    auto s = version.staged.commit(req ? kernel::origin_of(req) : core::Origin{},
                                   [&](core::WriteTxn& txn) -> core::Status {
                                       held = KCACHE_TRY(m_holds.hold_replaced(txn, ino));
                                       return {};
                                   });
    if (!s && s.error().code == ENOENT) return {};  // removed while open: its bytes go nowhere
    if (!s) return s;
    if (held) m_holds.replaced(ino, *held);
    // A rewrite's pages may be cached by its own process's readers of the old version.
    // A shared version's are the page cache its handles read: nothing is stale, but
    // its attributes (times) changed.
    if (!version.shared)
        m_notifier.invalidate_inode(version.staged.ino());
    else
        m_notifier.invalidate_attr(version.staged.ino());
    m_upkeep.check_limits();
    return {};
}

void Filesystem::flush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    // Every close() of a descriptor flushes, also a forked child closing the copy it
    // inherited (at exec, or at exit) while the opener is still writing. Only the
    // opener's close publishes here; release (the last descriptor gone) always does.
    // A process killed by a signal closes its files too: a rewriter killed mid-file
    // must not publish what it had written so far.
    if (!fi->fh)
        return (void)fuse_reply_err(req, m_no_open ? ENOSYS : 0);  // read-only: never again
    FileHandle* handle = m_handles.file(fi->fh);
    if (!handle) return reply_error(req, {EBADF, "no such handle"});
    if (handle->lost) return reply_error(req, {EIO, "this open file was lost with a daemon"});
    const pid_t tid = fuse_req_ctx(req)->pid;
    std::shared_ptr<Version> version;
    {
        MutexLock lock(handle->mutex);
        if (handle->writable && !handle->killed) version = handle->version;
    }
    bool dirty = false;
    if (version) {
        MutexLock lock(version->mutex);
        dirty = version->staged.dirty();
    }
    core::Status s;
    bool killed = false;
    if (dirty && killed_by_signal(tid)) {
        killed = true;
        MutexLock lock(handle->mutex);
        handle->killed = true;
    } else if (dirty && process_of(tid) == handle->opener) {
        MutexLock lock(version->mutex);
        s = publish(req, *version);
    }
    if (!killed && version) {  // another thread's FLUSH of a killed writer may mark it meanwhile
        MutexLock lock(handle->mutex);
        killed = handle->killed;
    }
    if (s && version && !killed) {
        core::Digest published;
        bool clean = false;
        {
            MutexLock lock(version->mutex);
            clean = !version->staged.dirty();
            published = version->staged.stored_digest();
        }
        if (clean) m_pages.close_writer(handle, true, published);
        if (clean) m_handles.set_unpublished(handle->fh, false);
    }
    if (!s) return reply_error(req, s.error());
    fuse_reply_err(req, 0);
}

void Filesystem::fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
    // fsync and fdatasync alike publish the version the handle writes (every handle's
    // writes, for the shared version); with durability=full the commit is synced.
    FileHandle* handle = fi->fh ? m_handles.file(fi->fh) : nullptr;
    if (fi->fh && !handle) return reply_error(req, {EBADF, "no such handle"});
    if (handle && handle->lost)
        return reply_error(req, {EIO, "this open file was lost with a daemon"});
    std::shared_ptr<Version> version;
    if (handle) {
        MutexLock lock(handle->mutex);
        if (handle->writable) version = handle->version;
    }
    core::Status s;
    if (version) {
        MutexLock lock(version->mutex);
        s = publish(req, *version);
    }
    if (s && version) {
        MutexLock lock(version->mutex);
        if (!version->staged.dirty()) m_handles.set_unpublished(handle->fh, false);
    }
    if (s) s = m_store.sync();
    if (!s) return reply_error(req, s.error());
    fuse_reply_err(req, 0);
}

void Filesystem::release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    // The slot is freed last: a daemon that dies before the reply leaves it for the next
    // one, whose RELEASE (resent) ends it; one freed already is answered 0.
    FileHandle* handle = fi->fh ? m_handles.file(fi->fh) : nullptr;
    if (!handle) return (void)fuse_reply_err(req, 0);
    // flush() published already unless a write came after it (or it failed, in which
    // case the writer was told), or its writer was killed. The last handle of a
    // version publishes it and ends its lease, before readers may use the page cache.
    if (handle->writable) leave_version(req, handle);
    if (handle->page_cached) m_pages.leave(handle);
    if (handle->page_writer) m_pages.leave_as_writer(handle);
    m_holds.closed(*handle);
    (void)m_handles.take_file(fi->fh);  // deletes it
    fuse_reply_err(req, 0);
}

}  // namespace kcache::fsd
