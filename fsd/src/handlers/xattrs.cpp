// Extended attributes on the mount: SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR over
// core's xattrs table (kcache/core/xattrs.hpp: namespaces, limits, errors).
//
// The kernel checks first what it can: names over 255 bytes (ERANGE) and values over
// 64 KiB (E2BIG) never arrive; trusted.* needs CAP_SYS_ADMIN; user.* needs a regular file
// or directory; with default_permissions (implied by allow_other) the owner or write
// permission. Core applies the limits and namespace rules again for every caller. What
// the kernel cannot do for a FUSE file system is leave trusted.* out of a listing for
// unprivileged callers: this does, by the caller's uid (0: root).
//
// The kernel asks for security.capability before every write(2) to a file (FUSE clears
// SB_NOSEC, so file_remove_privs never trusts a cached "no capability"): one GETXATTR
// round trip per write call, answered from one read transaction. bench/README.md,
// "Extended attributes and fallocate", measures what that adds to a write; --no-xattrs
// answers ENOSYS to every attribute request, after which the kernel sends none.
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "filesystem.hpp"
#include "kcache/core/xattrs.hpp"
#include "resend.hpp"

namespace kcache::fsd {
using core::Ino;

namespace {

bool privileged(fuse_req_t req) {
    return fuse_req_ctx(req)->uid == 0;
}

// ENOENT from core for an inode the kernel still knows: it was removed (unlinked while
// open, evicted) and its attributes went with it. Like writes to such a file (file_io.cpp),
// a change is accepted and dropped, and a read finds none.
bool removed(const core::Error& error) {
    return error.code == ENOENT;
}

}  // namespace

void Filesystem::setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value,
                          size_t size, int flags) {
    if (m_options.no_xattrs) return (void)fuse_reply_err(req, ENOSYS);
    const std::string_view wanted(value, size);
    const bool exclusive = (flags & XATTR_CREATE) != 0;
    auto s = non_idempotent(req, {resend::Op::setxattr}, [&](NonIdempotent& request) {
        return m_store.update([&](core::WriteTxn& txn) -> core::Status {
            auto done = core::set_xattr(txn, ino, name, wanted, flags);
            // Resent after a takeover (resend.hpp): EEXIST because the dead daemon created
            // it, as its record proves; its creator is told it succeeded.
            if (!done && done.error().code == EEXIST && exclusive && request.recorded() == ino)
                return {};
            if (done && exclusive) request.record(ino);
            return done;
        });
    });
    if (!s) return;  // never: an attribute's resend is proven in the transaction
    if (!*s && removed(s->error())) return (void)fuse_reply_err(req, 0);
    if (!*s) return reply_error(req, s->error());
    fuse_reply_err(req, 0);
}

void Filesystem::getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    if (m_options.no_xattrs) return (void)fuse_reply_err(req, ENOSYS);
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto value = core::get_xattr(*txn, ino, name);
    if (!value) {
        // Quietly: most of these are the kernel's security.capability probe of a write.
        return (void)fuse_reply_err(req, removed(value.error()) ? ENODATA : value.error().code);
    }
    if (size == 0) return (void)fuse_reply_xattr(req, value->size());
    if (value->size() > size) return (void)fuse_reply_err(req, ERANGE);
    fuse_reply_buf(req, value->data(), value->size());
}

void Filesystem::listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    if (m_options.no_xattrs) return (void)fuse_reply_err(req, ENOSYS);
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto names = core::list_xattrs(*txn, ino, privileged(req));
    if (!names && removed(names.error())) names = std::vector<std::string>{};
    if (!names) return reply_error(req, names.error());
    std::string list;  // each name NUL-terminated, as listxattr(2) returns them
    for (const auto& name : *names) {
        list.append(name);
        list.push_back('\0');
    }
    if (size == 0) return (void)fuse_reply_xattr(req, list.size());
    if (list.size() > size) return (void)fuse_reply_err(req, ERANGE);
    fuse_reply_buf(req, list.data(), list.size());
}

void Filesystem::removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
    if (m_options.no_xattrs) return (void)fuse_reply_err(req, ENOSYS);
    auto s = non_idempotent(req, {resend::Op::removexattr}, [&](NonIdempotent& request) {
        return m_store.update([&](core::WriteTxn& txn) -> core::Status {
            auto done = core::remove_xattr(txn, ino, name);
            // Resent after a takeover: ENODATA because the dead daemon removed it, as its
            // record proves (an attribute that never existed is ENODATA still).
            if (!done && done.error().code == ENODATA && request.recorded() == ino) return {};
            if (done) request.record(ino);
            return done;
        });
    });
    if (!s) return;  // never: an attribute's resend is proven in the transaction
    if (!*s && removed(s->error())) return (void)fuse_reply_err(req, ENODATA);
    if (!*s) return reply_error(req, s->error());
    fuse_reply_err(req, 0);
}

}  // namespace kcache::fsd
