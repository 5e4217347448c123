// rename(2) in the tree: validation, replacing the target, moving the dirent, and
// re-placing the moved subtree (placement.cpp).
#include <sys/stat.h>

#include <cerrno>
#include <string>

#include <fmt/format.h>

#include "kcache/core/names.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::Dirent;

Status WriteTxn::rename(Ino parent, std::string_view name, Ino new_parent,
                        std::string_view new_name, unsigned flags, const Origin* origin) {
    Tx tx = TxnAccess::tx(*this);
    if (flags & kRenameExchange) return fail(EINVAL, "RENAME_EXCHANGE is not supported");
    if (flags & ~kRenameNoReplace) return fail(EINVAL, "unknown rename flags");
    if (auto s = check_name(new_name); !s) return s;
    KCACHE_TRY(tx.directory(parent));
    KCACHE_TRY(tx.directory(new_parent));
    auto src_d = KCACHE_TRY(tx.child(parent, name));
    if (!src_d) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent));
    if (parent == new_parent && name == new_name) return {};
    auto src = KCACHE_TRY(tx.inode(src_d->child));
    const bool src_is_dir = is_dir(src.mode);

    if (src_is_dir) {  // a directory cannot move into its own subtree
        for (Ino at = new_parent;;) {
            if (at == src.ino)
                return fail(EINVAL, fmt::format("cannot move '{}' into itself", name));
            if (at == kRootIno) break;
            auto up = KCACHE_TRY(tx.inode(at));
            at = up.parent;
        }
    }
    auto dst_d = KCACHE_TRY(tx.child(new_parent, new_name));
    if (dst_d && dst_d->child == src.ino) {  // two names of one node: rename(2) does nothing
        if (flags & kRenameNoReplace) return fail(EEXIST, fmt::format("'{}' exists", new_name));
        return {};
    }
    // Every name of a node stays in its entry (links.cpp): a node with several names moves
    // only where it stays in it, and a directory holding one only inside its entry.
    const bool linked = !src_is_dir && src.nlink > 1;
    {
        auto target_dir = KCACHE_TRY(tx.inode(new_parent));
        bool stays = true;
        if (linked) {
            stays = KCACHE_TRY(
                ops::would_be_in(tx, target_dir, new_name, file_type_of(src.mode), src.entry));
        } else if (src_is_dir) {
            auto source_dir = KCACHE_TRY(tx.inode(parent));
            const bool inside_entry =
                source_dir.entry && source_dir.entry == target_dir.entry && src.entry != src.ino;
            if (!inside_entry) stays = !KCACHE_TRY(ops::holds_linked_node(tx, src.ino));
        }
        if (!stays) {
            return fail(EXDEV, fmt::format("'{}' holds a node with several names, which would "
                                           "leave its entry",
                                           name));
        }
    }
    Ino replaced_entry = 0;
    if (dst_d) {
        if (flags & kRenameNoReplace) return fail(EEXIST, fmt::format("'{}' exists", new_name));
        const bool dst_is_dir = dst_d->type == FileType::directory;
        if (src_is_dir && !dst_is_dir)
            return fail(ENOTDIR, fmt::format("'{}' is not a directory", new_name));
        if (!src_is_dir && dst_is_dir)
            return fail(EISDIR, fmt::format("'{}' is a directory", new_name));
        if (dst_is_dir) {
            auto full = KCACHE_TRY(tx.has_children(dst_d->child));
            if (full) return fail(ENOTEMPTY, fmt::format("directory '{}' is not empty", new_name));
        }
        // Validation is complete: from here on only storage errors can fail.
        auto dst = KCACHE_TRY(tx.inode(dst_d->child));
        auto container = KCACHE_TRY(tx.inode(new_parent));
        // A file replaced in a stem entry keeps the entry for the one that takes its
        // name (a racing duplicate store is not a new entry, nor a miss).
        const bool replaced_in_stem = dst.entry && dst.entry != dst.ino && !dst_is_dir;
        if (auto s =
                ops::remove_node(tx, container, dst, new_name, EventKind::remove, replaced_in_stem);
            !s) {
            return s;
        }
        // A node that keeps other names keeps its entry too.
        replaced_entry = replaced_in_stem && dst.nlink == 1 ? dst.entry : 0;
    }

    if (linked) {  // one of its names moves, inside its entry: no placement changes
        if (auto s = ops::move_name(tx, src, parent, name, new_parent, new_name); !s) return s;
        auto old_parent = KCACHE_TRY(tx.inode(parent));
        if (auto s = tx.touch_dir(old_parent, 0); !s) return s;
        if (parent == new_parent) return {};
        auto target_dir = KCACHE_TRY(tx.inode(new_parent));
        return tx.touch_dir(target_dir, 0);
    }
    const std::string old_name = src.name;
    const bool was_entry = src.entry == src.ino;
    if (auto s = tx.del(tx.db.dirents, records::dirent_key(parent, name)); !s) return s;
    if (auto s = tx.put(tx.db.dirents, records::dirent_key(new_parent, new_name),
                        records::encode(Dirent{src.ino, file_type_of(src.mode)}));
        !s) {
        return s;
    }
    auto old_parent = KCACHE_TRY(tx.inode(parent));  // re-read: replacing may have touched it
    if (auto s = tx.touch_dir(old_parent, src_is_dir && parent != new_parent ? -1 : 0); !s)
        return s;
    if (parent != new_parent) {
        auto target_dir = KCACHE_TRY(tx.inode(new_parent));
        if (auto s = tx.touch_dir(target_dir, src_is_dir ? 1 : 0); !s) return s;
    }
    src.parent = new_parent;
    src.name = new_name;
    src.ctime_ns = tx.now();
    if (auto s = tx.put_inode(src); !s) return s;

    if (auto s = ops::retag(tx, src.ino, origin); !s) return s;
    if (replaced_entry) {  // normally the renamed file joined it; if not, it is empty now
        auto moved = KCACHE_TRY(tx.inode(src.ino));
        if (moved.entry != replaced_entry) {
            auto gone = KCACHE_TRY(tx.find_entry_record(replaced_entry));
            if (gone) {
                if (auto s = ops::drop_entry_record(tx, replaced_entry, EventKind::remove,
                                                    gone->parent, gone->stem);
                    !s) {
                    return s;
                }
            }
        }
    }
    if (was_entry) {
        // The daemon invalidates the old name; the entry may live on under the new one.
        return tx.log(EventKind::rename, src.ino, parent, old_name);
    }
    return {};
}

}  // namespace kcache::core
