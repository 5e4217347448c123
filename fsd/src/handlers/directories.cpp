// Directories and the filesystem's statistics: opendir, readdir, releasedir, statfs
// (Filesystem's handlers, filesystem.hpp).
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <vector>

#include "filesystem.hpp"
#include "handles.hpp"
#include "kernel_attrs.hpp"

namespace kcache::fsd {
using kernel::to_stat;

// ---- directories ----------------------------------------------------------------

void Filesystem::opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto attr = txn->getattr(ino);
    if (!attr) return reply_error(req, attr.error());
    if (!attr->is_dir()) return reply_error(req, {ENOTDIR, "not a directory"});
    auto* dir = new DirHandle;
    fi->fh = m_handles.add_dir(dir, ino);
    if (!fi->fh) {
        delete dir;
        return reply_error(req, {ENFILE, "too many open directories on the mount"});
    }
    if (fuse_reply_open(req, fi) != 0) (void)m_handles.take_dir(fi->fh);
}

void Filesystem::readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi,
                         bool plus) {
    DirHandle* dir = m_handles.dir(fi->fh);
    if (!dir) return reply_error(req, {EBADF, "no such directory handle"});
    MutexLock lock(dir->mutex);
    auto txn = m_store.read();
    if (!txn) {
        lock.unlock();
        return reply_error(req, txn.error());
    }
    if (!dir->loaded || off == 0) {  // a rewind takes a fresh snapshot
        dir->children.clear();
        auto self_attr = txn->getattr(ino);
        if (!self_attr) {
            lock.unlock();
            return reply_error(req, self_attr.error());
        }
        dir->children.push_back({".", ino, core::FileType::directory});
        dir->children.push_back({"..", self_attr->parent, core::FileType::directory});
        std::vector<DirHandle::Child> listed;  // not dir->children: a lambda is analyzed alone
        auto s = txn->readdir(ino, {}, [&](const core::DirEntry& d) {
            listed.push_back({std::string(d.name), d.ino, d.type});
            return true;
        });
        dir->children.insert(dir->children.end(), std::make_move_iterator(listed.begin()),
                             std::make_move_iterator(listed.end()));
        if (!s) {
            lock.unlock();
            return reply_error(req, s.error());
        }
        dir->loaded = true;
    }
    std::vector<char> buf(size);
    std::size_t used = 0;
    for (auto i = static_cast<std::size_t>(off); i < dir->children.size(); ++i) {
        const auto& child = dir->children[i];
        const auto next = static_cast<off_t>(i + 1);
        std::size_t n = 0;
        if (plus) {
            auto attr = txn->getattr(child.ino);
            if (!attr) continue;  // removed since the snapshot
            m_versions.apply_live_size(*attr);
            fuse_entry_param e{};
            if (child.name == "." || child.name == "..") {
                e.attr = to_stat(*attr);  // no entry: the kernel takes no reference on these
            } else {
                e = kernel::entry_param(*attr, attr_timeout(*attr));
            }
            n = fuse_add_direntry_plus(req, buf.data() + used, size - used, child.name.c_str(), &e,
                                       next);
            if (n <= size - used && e.ino)
                m_lookups.remember(e.ino);  // the kernel takes a reference
        } else {
            struct stat st {};
            st.st_ino = child.ino;
            // A special node's kind is in its mode only: DT_UNKNOWN, readers stat it.
            st.st_mode = child.type == core::FileType::directory ? S_IFDIR
                         : child.type == core::FileType::symlink ? S_IFLNK
                         : child.type == core::FileType::special ? 0
                                                                 : S_IFREG;
            n = fuse_add_direntry(req, buf.data() + used, size - used, child.name.c_str(), &st,
                                  next);
        }
        if (n > size - used) break;  // did not fit: the kernel asks again from `next`
        used += n;
    }
    lock.unlock();
    fuse_reply_buf(req, buf.data(), used);
}

void Filesystem::releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    (void)m_handles.take_dir(fi->fh);  // deletes it; one freed already is answered 0 too
    fuse_reply_err(req, 0);
}

void Filesystem::statfs(fuse_req_t req, fuse_ino_t) {
    struct statvfs st {};
    if (::statvfs(m_store.path().c_str(), &st) != 0) return reply_error(req, {errno, "statvfs"});
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    const std::uint64_t max = txn->config().max_bytes;
    const std::uint64_t stored = txn->counter(core::Counter::stored_bytes).value_or(0);
    const std::uint64_t files = txn->counter(core::Counter::files).value_or(0);
    const std::uint64_t block = 4096;
    const std::uint64_t disk_free = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
    std::uint64_t total = max ? max : static_cast<std::uint64_t>(st.f_blocks) * st.f_frsize;
    std::uint64_t free = max ? (stored < max ? max - stored : 0) : disk_free;
    free = std::min(free, disk_free);
    total = std::max(total, stored);
    struct statvfs out {};
    out.f_bsize = block;
    out.f_frsize = block;
    out.f_blocks = total / block;
    out.f_bfree = free / block;
    out.f_bavail = free / block;
    out.f_files = files + st.f_ffree;
    out.f_ffree = st.f_ffree;
    out.f_favail = st.f_ffree;
    out.f_namemax = core::kMaxNameLength;
    fuse_reply_statfs(req, &out);
}

}  // namespace kcache::fsd
