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
using records::Inode;

namespace {

// A directory cannot move into its own subtree: EINVAL when `new_parent` is below `src`.
Status check_not_into_itself(const Tx& tx, const Inode& src, Ino new_parent,
                             std::string_view name) {
    for (Ino at = new_parent;;) {
        if (at == src.ino) return fail(EINVAL, fmt::format("cannot move '{}' into itself", name));
        if (at == kRootIno) break;
        auto up = KCACHE_TRY(tx.inode(at));
        at = up.parent;
    }
    return {};
}

// Every name of a node stays in its entry (links.cpp): a node with several names
// (`linked`) moves only where it stays in it, and a directory holding one only inside
// its entry. EXDEV otherwise.
Status check_names_stay(const Tx& tx, const Inode& src, bool linked, Ino parent,
                        std::string_view name, Ino new_parent, std::string_view new_name) {
    auto target_dir = KCACHE_TRY(tx.inode(new_parent));
    bool stays = true;
    if (linked) {
        stays = KCACHE_TRY(
            ops::would_be_in(tx, target_dir, new_name, file_type_of(src.mode), src.entry));
    } else if (is_dir(src.mode)) {
        auto source_dir = KCACHE_TRY(tx.inode(parent));
        const bool inside_entry =
            source_dir.entry && source_dir.entry == target_dir.entry && src.entry != src.ino;
        if (!inside_entry) stays = !KCACHE_TRY(ops::holds_linked_node(tx, src.ino));
    }
    if (stays) return {};
    return fail(EXDEV, fmt::format("'{}' holds a node with several names, which would "
                                   "leave its entry",
                                   name));
}

// Removes the target `dst_d` (named `new_name` in `new_parent`) that the source replaces,
// after checking it may be replaced. The stem entry it leaves to the source (0: none).
Result<Ino> replace_target(Tx& tx, const Dirent& dst_d, bool src_is_dir, unsigned flags,
                           Ino new_parent, std::string_view new_name) {
    if (flags & kRenameNoReplace) return fail(EEXIST, fmt::format("'{}' exists", new_name));
    const bool dst_is_dir = dst_d.type == FileType::directory;
    if (src_is_dir && !dst_is_dir)
        return fail(ENOTDIR, fmt::format("'{}' is not a directory", new_name));
    if (!src_is_dir && dst_is_dir)
        return fail(EISDIR, fmt::format("'{}' is a directory", new_name));
    if (dst_is_dir) {
        auto full = KCACHE_TRY(tx.has_children(dst_d.child));
        if (full) return fail(ENOTEMPTY, fmt::format("directory '{}' is not empty", new_name));
    }
    // Validation is complete: from here on only storage errors can fail.
    auto dst = KCACHE_TRY(tx.inode(dst_d.child));
    auto container = KCACHE_TRY(tx.inode(new_parent));
    // A file replaced in a stem entry keeps the entry for the one that takes its
    // name (a racing duplicate store is not a new entry, nor a miss).
    const bool replaced_in_stem = dst.entry && dst.entry != dst.ino && !dst_is_dir;
    KCACHE_TRY(ops::remove_node(tx, container, dst, new_name, EventKind::remove, replaced_in_stem));
    // A node that keeps other names keeps its entry too.
    return replaced_in_stem && dst.nlink == 1 ? dst.entry : 0;
}

// One of the names of a node with several moves, inside its entry: no placement changes.
Status move_linked_name(Tx& tx, Inode& src, Ino parent, std::string_view name, Ino new_parent,
                        std::string_view new_name) {
    KCACHE_TRY(ops::move_name(tx, src, parent, name, new_parent, new_name));
    auto old_parent = KCACHE_TRY(tx.inode(parent));
    KCACHE_TRY(tx.touch_dir(old_parent, 0));
    if (parent == new_parent) return {};
    auto target_dir = KCACHE_TRY(tx.inode(new_parent));
    return tx.touch_dir(target_dir, 0);
}

// Moves `src`'s dirent and inode to `new_name` in `new_parent` (free now); both
// directories change.
Status move_node(Tx& tx, Inode& src, Ino parent, std::string_view name, Ino new_parent,
                 std::string_view new_name) {
    const bool src_is_dir = is_dir(src.mode);
    KCACHE_TRY(tx.del(tx.db.dirents, records::dirent_key(parent, name)));
    KCACHE_TRY(tx.put(tx.db.dirents, records::dirent_key(new_parent, new_name),
                      records::encode(Dirent{src.ino, file_type_of(src.mode)})));
    auto old_parent = KCACHE_TRY(tx.inode(parent));  // re-read: replacing may have touched it
    KCACHE_TRY(tx.touch_dir(old_parent, src_is_dir && parent != new_parent ? -1 : 0));
    if (parent != new_parent) {
        auto target_dir = KCACHE_TRY(tx.inode(new_parent));
        KCACHE_TRY(tx.touch_dir(target_dir, src_is_dir ? 1 : 0));
    }
    src.parent = new_parent;
    src.name = new_name;
    src.ctime_ns = tx.now();
    return tx.put_inode(src);
}

// The stem entry a replaced file left (`replaced_entry`) normally gets the moved node
// `moved`; when it did not, it is empty now and goes.
Status drop_if_left_empty(Tx& tx, Ino moved, Ino replaced_entry) {
    auto node = KCACHE_TRY(tx.inode(moved));
    if (node.entry == replaced_entry) return {};
    auto gone = KCACHE_TRY(tx.find_entry_record(replaced_entry));
    if (!gone) return {};
    return ops::drop_entry_record(tx, replaced_entry, EventKind::remove, gone->parent, gone->stem);
}

}  // namespace

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
    if (src_is_dir) KCACHE_TRY(check_not_into_itself(tx, src, new_parent, name));
    auto dst_d = KCACHE_TRY(tx.child(new_parent, new_name));
    if (dst_d && dst_d->child == src.ino) {  // two names of one node: rename(2) does nothing
        if (flags & kRenameNoReplace) return fail(EEXIST, fmt::format("'{}' exists", new_name));
        return {};
    }
    const bool linked = !src_is_dir && src.nlink > 1;
    KCACHE_TRY(check_names_stay(tx, src, linked, parent, name, new_parent, new_name));
    Ino replaced_entry = 0;
    if (dst_d) {
        replaced_entry =
            KCACHE_TRY(replace_target(tx, *dst_d, src_is_dir, flags, new_parent, new_name));
    }
    if (linked) return move_linked_name(tx, src, parent, name, new_parent, new_name);
    const std::string old_name = src.name;
    const bool was_entry = src.entry == src.ino;
    KCACHE_TRY(move_node(tx, src, parent, name, new_parent, new_name));
    KCACHE_TRY(ops::retag(tx, src.ino, origin));
    if (replaced_entry) KCACHE_TRY(drop_if_left_empty(tx, src.ino, replaced_entry));
    if (was_entry) {
        // The daemon invalidates the old name; the entry may live on under the new one.
        return tx.log(EventKind::rename, src.ino, parent, old_name);
    }
    return {};
}

}  // namespace kcache::core
