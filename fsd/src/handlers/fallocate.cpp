// FALLOCATE on the mount: preallocation, hole punching and zeroing of a file being
// written (its version's content, versions.hpp), checked against the room the cache has.
//
// The modes the kernel passes to a FUSE file system (it answers EOPNOTSUPP itself for
// COLLAPSE_RANGE, INSERT_RANGE and UNSHARE_RANGE, which never reach the daemon):
// - 0 and KEEP_SIZE: reserve. Nothing is stored for a reservation (a file's bytes are
//   stored when it is published, compressed): the check is that a file of the new size
//   can be: ENOSPC now when it is bigger than the cache's size bound (nothing could be
//   evicted to make room for it) or than what the db's file system has free; EFBIG past
//   --max-file-size. Mode 0 then extends the file with zeros. The room is checked, not
//   set aside: another writer may fill the cache meanwhile, and a publish then evicts
//   least recently used entries for this file as for any (ENOSPC at close only when all
//   that is left is pinned or being written, docs/operations.md).
// - PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE (with or without KEEP_SIZE): the range reads as
//   zeros at once, through every handle of the version. While the file is written its
//   content is held whole in memory, so a hole is zeros there; once published, zeros
//   cost almost nothing in the db: a file under 1 MiB is compressed (a run of zeros to a
//   few bytes), a bigger one is stored by 64 KiB segment and every all-zero segment of
//   every file is one shared blob.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include <fmt/format.h>

#include "filesystem.hpp"

namespace kcache::fsd {

namespace {

constexpr int kKnownModes = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;

// Zeros `[from, to)` of `staged` (inside its content), a bounded buffer at a time.
core::Status zero_range(core::StagedFile& staged, std::uint64_t from, std::uint64_t to) {
    static const std::string zeros(1 << 20, '\0');
    for (std::uint64_t at = from; at < to;) {
        const std::uint64_t n = std::min<std::uint64_t>(to - at, zeros.size());
        KCACHE_TRY(staged.write(at, std::string_view(zeros).substr(0, n)));
        at += n;
    }
    return {};
}

}  // namespace

core::Status Filesystem::check_room(std::uint64_t size, std::uint64_t added) {
    if (size > m_options.max_file_size) {
        return core::fail(EFBIG, fmt::format("a file of {} bytes is over --max-file-size ({})",
                                             size, m_options.max_file_size));
    }
    auto txn = KCACHE_TRY(m_store.read());
    const std::uint64_t max = txn.config().max_bytes;
    if (max && size > max) {
        return core::fail(ENOSPC, fmt::format("a file of {} bytes cannot fit under the cache's "
                                              "size bound of {} bytes",
                                              size, max));
    }
    struct statvfs st {};
    if (added && ::statvfs(m_store.path().c_str(), &st) == 0) {
        const std::uint64_t free = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
        if (added > free) {
            return core::fail(ENOSPC, fmt::format("{} more bytes do not fit: the db's file "
                                                  "system has {} bytes free",
                                                  added, free));
        }
    }
    return {};
}

void Filesystem::fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t offset, off_t length,
                           fuse_file_info* fi) {
    if (mode & ~kKnownModes) {
        return reply_error(req, {EOPNOTSUPP, fmt::format("fallocate mode {:#x}", mode)});
    }
    const bool punch = (mode & FALLOC_FL_PUNCH_HOLE) != 0;
    const bool zero = (mode & FALLOC_FL_ZERO_RANGE) != 0;
    const bool keep_size = (mode & FALLOC_FL_KEEP_SIZE) != 0;
    if (punch && zero) return reply_error(req, {EINVAL, "PUNCH_HOLE with ZERO_RANGE"});
    if (punch && !keep_size) return reply_error(req, {EOPNOTSUPP, "PUNCH_HOLE without KEEP_SIZE"});
    if (offset < 0 || length <= 0) return reply_error(req, {EINVAL, "fallocate range"});
    const auto from = static_cast<std::uint64_t>(offset);
    const std::uint64_t end = from + static_cast<std::uint64_t>(length);
    if (end < from) return reply_error(req, {EFBIG, "fallocate range overflows"});

    std::optional<Dirtying> dirtying;
    auto change = start_change(req, fi, dirtying);
    if (!change) return;
    if (change->orphan) return (void)fuse_reply_err(req, 0);  // the file is gone: as its writes
    FileHandle* handle = change->handle;
    const std::shared_ptr<Version>& version = change->version;
    std::uint64_t size = 0;
    {
        MutexLock lock(version->mutex);
        size = version->staged.size();
    }
    // The room a reservation or a growth needs, checked before anything changes (no
    // lock held: it reads the db and the disk's free space).
    const bool grows = !keep_size && end > size;
    if (!punch) {
        const bool reserves = !zero;
        if (reserves || grows) {
            if (auto s = check_room(end, end > size ? end - size : 0); !s)
                return reply_error(req, s.error());
        }
    }
    m_pages.close_writer(handle, false, {});  // changed again after its close
    core::Status s;
    bool changed = false;
    {
        MutexLock lock(version->mutex);
        core::StagedFile& staged = version->staged;
        const std::uint64_t now = staged.size();  // another handle may have written
        if ((punch || zero) && from < now) {
            s = zero_range(staged, from, std::min(end, now));
            changed = true;
        }
        if (s && !keep_size && end > now) {
            s = staged.truncate(end);  // zeros up to `end`
            changed = true;
        }
    }
    if (!s) return reply_error(req, s.error());
    if (changed) m_handles.set_unpublished(handle->fh, true);  // for a successor (state.hpp)
    fuse_reply_err(req, 0);
}

}  // namespace kcache::fsd
