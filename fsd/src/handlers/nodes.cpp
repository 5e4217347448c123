// Special nodes and hard links: Filesystem's mknod and link handlers (filesystem.hpp).
// A cache never needs a fifo, socket or device, nor a second name for a file, but a file
// system holds them (ccache's hard_link mode and link-based lock files use links; POSIX
// suites make the rest), so the mount stores them as the core does (WriteTxn::mknod,
// WriteTxn::link): no content of their own, never counted as an entry's file.
#include <sys/stat.h>

#include "filesystem.hpp"
#include "resend.hpp"

namespace kcache::fsd {

void Filesystem::mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                       dev_t rdev) {
    auto node = non_idempotent(req, {resend::Op::mknod, parent, name}, [&](NonIdempotent& request) {
        return make_node(req, [&](core::WriteTxn& txn, const fuse_ctx& ctx) {
            auto made = txn.mknod(parent, name, mode, rdev, ctx.uid, ctx.gid);
            if (made) request.record(made->ino);
            return made;
        });
    });
    if (node) reply_node(req, *node);
}

void Filesystem::link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name) {
    // A name in another entry is EXDEV (core: an eviction removes an entry whole and
    // exactly); the kernel adds the name and counts the link itself on success.
    const Target target(resend::Op::link, new_parent, new_name);
    auto linked =
        non_idempotent(req, target, [&](NonIdempotent& request) -> core::Result<core::Attr> {
            core::Attr attr;
            auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
                auto made = KCACHE_TRY(txn.link(ino, new_parent, new_name));
                request.record(made.ino);
                attr = made;
                return {};
            });
            if (!s) return tl::unexpected(s.error());
            return attr;
        });
    if (!linked) return;
    if (!*linked) return reply_error(req, linked->error());
    reply_entry(req, **linked);
}

}  // namespace kcache::fsd
