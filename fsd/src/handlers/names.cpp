// The namespace: Filesystem's mkdir, symlink, unlink, rmdir and rename handlers, the
// node maker they and mknod share (make_node), the directory a LOOKUP makes for the
// shared tier (make_container), and a resent request the dead daemon had done answered
// as it was (answer_resent, for non_idempotent: resend.hpp). mknod and link: nodes.cpp.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>  // RENAME_NOREPLACE, RENAME_EXCHANGE
#include <functional>

#include "filesystem.hpp"
#include "kernel_attrs.hpp"
#include "log.hpp"
#include "process.hpp"
#include "resend.hpp"

namespace kcache::fsd {
using core::Attr;
using core::Ino;

core::Result<Attr> Filesystem::make_node(
    fuse_req_t req,
    const std::function<core::Result<Attr>(core::WriteTxn&, const fuse_ctx&)>& make) {
    const fuse_ctx* ctx = fuse_req_ctx(req);
    Attr attr;
    auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
        auto a = KCACHE_TRY(make(txn, *ctx));
        attr = a;
        return {};
    });
    if (!s) return tl::unexpected(s.error());
    return attr;
}

void Filesystem::reply_node(fuse_req_t req, const core::Result<Attr>& made) {
    if (!made) return reply_error(req, made.error());
    // A filler at work (single flight): one that made a file, not a directory. mkdir -p
    // by several processes at once is no compile to wait for, and the lookup a sibling's
    // mkdir makes of its new name cannot take the ESTALE a wait starts with.
    if (made->entry && !made->is_dir() && m_flights.enabled())
        m_flights.created(made->entry, process_of(fuse_req_ctx(req)->pid));
    reply_entry(req, *made);
}

bool Filesystem::answer_resent(fuse_req_t req, const NonIdempotent& request, const Target& target) {
    using resend::Op;
    const Op which = request.op();
    // Proven from a name, before the change; the others in their body (or redone).
    if (which == Op::none || which == Op::create || resend::proven_in_transaction(which))
        return false;
    const auto ino = request.recorded();
    if (!ino) return false;
    const Ino parent = target.parent;
    const char* name = target.name;
    auto txn = m_store.read();
    if (!txn) return false;
    auto at = txn->lookup(parent, name);
    const bool holds = at && at->ino == *ino;
    switch (which) {
        case Op::mkdir:
        case Op::mknod:
        case Op::symlink:
        case Op::link:  // `parent` and `name`: the new name's
            if (!holds) return false;
            log::info("a resent {} of {} was done by the previous daemon: answered as it was",
                      resend::name_of(which), name);
            reply_entry(req, *at);
            return true;
        case Op::unlink:
        case Op::rmdir:
            if (holds) return false;
            log::info("a resent removal of {} was done by the previous daemon: answered 0", name);
            fuse_reply_err(req, 0);
            return true;
        case Op::rename: {
            auto moved = txn->lookup(target.new_parent, target.new_name);
            if (holds || !moved || moved->ino != *ino) return false;
            log::info("a resent rename of {} was done by the previous daemon: answered 0", name);
            fuse_reply_err(req, 0);
            return true;
        }
        default:
            return false;
    }
}

void Filesystem::make_container(fuse_req_t req, Ino parent, const char* name) {
    // As the process whose lookup asked would have made it on its way to a store (its
    // user, mode 0777 less its umask): the compiler writes below it later. A LOOKUP
    // carries no umask (FUSE sends one with MKDIR and CREATE only): /proc says it.
    const mode_t mode = 0777 & ~umask_of(fuse_req_ctx(req)->pid);
    bool made = false;
    reply_node(req,
               make_node(req, [&](core::WriteTxn& txn, const fuse_ctx& ctx) -> core::Result<Attr> {
                   if (auto there = txn.lookup(parent, name)) return there;  // made meanwhile
                   auto dir = txn.mkdir(parent, name, mode, ctx.uid, ctx.gid);
                   made = dir.has_value();
                   return dir;
               }));
    if (made) m_counters.count(core::Counter::remote_containers);
}

void Filesystem::mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
    auto node = non_idempotent(req, {resend::Op::mkdir, parent, name}, [&](NonIdempotent& request) {
        return make_node(req, [&](core::WriteTxn& txn, const fuse_ctx& ctx) {
            auto made = txn.mkdir(parent, name, mode, ctx.uid, ctx.gid);
            if (made) request.record(made->ino);
            return made;
        });
    });
    if (node) reply_node(req, *node);
}

void Filesystem::symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
    auto node =
        non_idempotent(req, {resend::Op::symlink, parent, name}, [&](NonIdempotent& request) {
            return make_node(req, [&](core::WriteTxn& txn, const fuse_ctx& ctx) {
                auto made = txn.symlink(parent, name, target, ctx.uid, ctx.gid);
                if (made) request.record(made->ino);
                return made;
            });
        });
    if (node) reply_node(req, *node);
}

// The inode `name` in `parent` names, for a removal's record (resend.hpp); 0 if none.
static Ino named(const core::WriteTxn& txn, Ino parent, const char* name) {
    auto attr = txn.lookup(parent, name);
    return attr ? attr->ino : 0;
}

void Filesystem::unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
    auto s = non_idempotent(req, {resend::Op::unlink, parent, name}, [&](NonIdempotent& request) {
        return remove_keeping_orphan(parent, name, [&](core::WriteTxn& txn) {
            const Ino ino = named(txn, parent, name);
            auto removed = txn.unlink(parent, name);
            if (removed) request.record(ino);
            return removed;
        });
    });
    if (!s) return;
    if (!*s) return reply_error(req, s->error());
    fuse_reply_err(req, 0);
}

void Filesystem::rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
    auto s = non_idempotent(req, {resend::Op::rmdir, parent, name}, [&](NonIdempotent& request) {
        return m_store.update([&](core::WriteTxn& txn) {
            const Ino ino = named(txn, parent, name);
            auto removed = txn.rmdir(parent, name);
            if (removed) request.record(ino);
            return removed;
        });
    });
    if (!s) return;
    if (!*s) return reply_error(req, s->error());
    fuse_reply_err(req, 0);
}

void Filesystem::rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
                        const char* new_name, unsigned int flags) {
    unsigned ours = 0;
    if (flags & RENAME_NOREPLACE) ours |= core::kRenameNoReplace;
    if (flags & RENAME_EXCHANGE) ours |= core::kRenameExchange;
    if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE))
        return reply_error(req, {EINVAL, "rename flags"});
    // The file a rename replaces may still be open (or about to be): keep it. A file
    // renamed into place populates its entry on behalf of the renaming process.
    const core::Origin origin = kernel::origin_of(req);
    Ino moved_into = 0;  // the entry the renamed node is in now (single flight)
    const bool exchange = (ours & core::kRenameExchange) != 0;  // redone when resent
    const Target target(exchange ? resend::Op::none : resend::Op::rename, parent, name, new_parent,
                        new_name);
    auto s = non_idempotent(req, target, [&](NonIdempotent& request) {
        return remove_keeping_orphan(new_parent, new_name, [&](core::WriteTxn& txn) {
            const Ino ino = exchange ? 0 : named(txn, parent, name);
            auto r = txn.rename(parent, name, new_parent, new_name, ours, &origin);
            if (r && ino) request.record(ino);
            if (r && m_flights.enabled()) {
                if (auto moved = txn.lookup(new_parent, new_name)) moved_into = moved->entry;
            }
            return r;
        });
    });
    if (!s) return;
    if (!*s) return reply_error(req, s->error());
    if (moved_into) m_flights.created(moved_into, origin.pid);
    fuse_reply_err(req, 0);
}
}  // namespace kcache::fsd
