// The tree namespace: inodes and directory entries, and how moving nodes around
// moves them between cache entries.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
using records::Dirent;
using records::Inode;

namespace ops {

Status validate_name(std::string_view name) {
    if (name.size() > kMaxNameLength) {
        return fail(ENAMETOOLONG, fmt::format("name of {} bytes is longer than {}", name.size(),
                                              kMaxNameLength));
    }
    if (name.empty() || name == "." || name == ".." ||
        name.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
        return fail(EINVAL, fmt::format("invalid name '{}'", name));
    }
    return {};
}

}  // namespace ops

namespace {

// The entry a node at `depth` belongs to: none above the entry depth, itself at it,
// its parent's below it.
Ino entry_for(const Tx& tx, std::uint16_t depth, Ino self, const Inode& parent) {
    if (depth < tx.config.entry_depth) return 0;
    if (depth == tx.config.entry_depth) return self;
    return parent.entry;
}

Result<Inode> directory(const Tx& tx, Ino ino) {
    auto dir = tx.inode(ino);
    if (!dir) return dir;
    if ((dir->mode & S_IFMT) != S_IFDIR) return fail(ENOTDIR, fmt::format("inode {} is not a directory", ino));
    return dir;
}

Status touch_dir(Tx& tx, Inode& dir, int nlink_delta) {
    dir.mtime_ns = dir.ctime_ns = tx.now();
    dir.nlink = static_cast<std::uint32_t>(static_cast<int>(dir.nlink) + nlink_delta);
    return tx.put_inode(dir);
}

FileType type_of(std::uint32_t mode) {
    switch (mode & S_IFMT) {
        case S_IFDIR: return FileType::directory;
        case S_IFLNK: return FileType::symlink;
        default: return FileType::regular;
    }
}

// Creates a node named `name` in `parent` (which the caller checked is a directory
// without that name).
Result<Attr> make_node(Tx& tx, Inode& parent, std::string_view name, std::uint32_t mode,
                       std::uint32_t uid, std::uint32_t gid, std::string_view target) {
    if (parent.depth >= 0xfffe) return fail(ENAMETOOLONG, "tree too deep");
    auto ino = tx.next_ino();
    if (!ino) return tl::unexpected(ino.error());
    Inode node;
    node.ino = *ino;
    node.mode = mode;
    node.uid = uid;
    node.gid = gid;
    node.nlink = (mode & S_IFMT) == S_IFDIR ? 2 : 1;
    node.size = target.size();
    node.atime_ns = node.mtime_ns = node.ctime_ns = tx.now();
    node.parent = parent.ino;
    node.depth = static_cast<std::uint16_t>(parent.depth + 1);
    node.entry = entry_for(tx, node.depth, node.ino, parent);
    node.name = name;
    node.target = target;
    const FileType type = type_of(mode);
    if (auto s = tx.put(tx.db.dirents, records::dirent_key(parent.ino, name),
                        records::encode(Dirent{node.ino, type}));
        !s) {
        return tl::unexpected(s.error());
    }
    if (auto s = tx.put_inode(node); !s) return tl::unexpected(s.error());
    if (auto s = touch_dir(tx, parent, type == FileType::directory ? 1 : 0); !s) {
        return tl::unexpected(s.error());
    }
    if (node.entry == node.ino) {
        if (auto s = ops::create_entry_record(tx, node); !s) return tl::unexpected(s.error());
    }
    if (type == FileType::regular) {
        if (auto s = tx.add(Counter::files, 1); !s) return tl::unexpected(s.error());
        if (node.entry) {
            if (auto s = ops::add_file_to_entry(tx, node.entry, node, +1); !s) {
                return tl::unexpected(s.error());
            }
        }
    }
    return node.attr();
}

// Looks up `name` in directory `parent` for a creation: the parent, and the
// existing child if any.
Result<std::pair<Inode, std::optional<Dirent>>> prepare_create(Tx& tx, Ino parent,
                                                               std::string_view name) {
    if (auto s = ops::validate_name(name); !s) return tl::unexpected(s.error());
    auto dir = directory(tx, parent);
    if (!dir) return tl::unexpected(dir.error());
    auto existing = tx.child(parent, name);
    if (!existing) return tl::unexpected(existing.error());
    return std::pair{std::move(*dir), *existing};
}

// Removes one node that has no children: its dirent, inode, content and accounting.
Status remove_node(Tx& tx, Inode& parent, const Inode& node, EventKind why) {
    if (auto s = tx.del(tx.db.dirents, records::dirent_key(parent.ino, node.name)); !s) return s;
    if (auto s = tx.del(tx.db.inodes, records::u64_key(node.ino)); !s) return s;
    const bool is_dir = (node.mode & S_IFMT) == S_IFDIR;
    if ((node.mode & S_IFMT) == S_IFREG) {
        if (node.entry && node.entry != node.ino) {
            if (auto s = ops::add_file_to_entry(tx, node.entry, node, -1); !s) return s;
        }
        if (auto s = ops::release_blob(tx, node.digest); !s) return s;
        if (auto s = ops::drop_leases(tx, node.ino); !s) return s;
        if (auto s = tx.add(Counter::files, -1); !s) return s;
        if (auto s = tx.add(Counter::bytes, -static_cast<std::int64_t>(node.size)); !s) return s;
    }
    if (node.entry == node.ino) {
        if (auto s = ops::drop_entry_record(tx, node.ino, why, parent.ino, node.name); !s) return s;
    }
    return touch_dir(tx, parent, is_dir ? -1 : 0);
}

}  // namespace

namespace ops {

Status remove_subtree(Tx& tx, Ino parent_ino, std::string_view name, EventKind why) {
    auto parent = tx.inode(parent_ino);
    if (!parent) return tl::unexpected(parent.error());
    auto top = tx.child(parent_ino, name);
    if (!top) return tl::unexpected(top.error());
    if (!*top) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent_ino));
    // Depth-first, children before their directory, with an explicit stack so a
    // deep tree cannot overflow the call stack.
    struct Frame {
        Inode node;
        bool expanded = false;
    };
    auto node = tx.inode((*top)->child);
    if (!node) return tl::unexpected(node.error());
    std::vector<Frame> stack;
    stack.push_back({std::move(*node)});
    while (!stack.empty()) {
        Frame& frame = stack.back();
        if ((frame.node.mode & S_IFMT) == S_IFDIR && !frame.expanded) {
            frame.expanded = true;
            auto children = tx.children(frame.node.ino);
            if (!children) return tl::unexpected(children.error());
            for (const auto& [child_name, child] : *children) {
                auto c = tx.inode(child.child);
                if (!c) return tl::unexpected(c.error());
                stack.push_back({std::move(*c)});
            }
            continue;
        }
        Inode done = std::move(frame.node);
        stack.pop_back();
        Inode container;
        if (stack.empty()) {
            container = *parent;
        } else {
            auto p = tx.inode(done.parent);  // re-read: its nlink changes as children go
            if (!p) return tl::unexpected(p.error());
            container = std::move(*p);
        }
        if (auto s = remove_node(tx, container, done, why); !s) return s;
    }
    return {};
}

}  // namespace ops

// ---- reads --------------------------------------------------------------------------

Result<Attr> Txn::lookup(Ino parent, std::string_view name) const {
    Tx tx = TxnAccess::tx(*this);
    if (name.size() > kMaxNameLength) {
        return fail(ENAMETOOLONG, fmt::format("name of {} bytes is longer than {}", name.size(),
                                              kMaxNameLength));
    }
    auto dir = directory(tx, parent);
    if (!dir) return tl::unexpected(dir.error());
    auto d = tx.child(parent, name);
    if (!d) return tl::unexpected(d.error());
    if (!*d) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent));
    auto node = tx.inode((*d)->child);
    if (!node) return tl::unexpected(node.error());
    return node->attr();
}

Result<Attr> Txn::getattr(Ino ino) const {
    auto node = TxnAccess::tx(*this).inode(ino);
    if (!node) return tl::unexpected(node.error());
    return node->attr();
}

Result<std::string> Txn::readlink(Ino ino) const {
    auto node = TxnAccess::tx(*this).inode(ino);
    if (!node) return tl::unexpected(node.error());
    if ((node->mode & S_IFMT) != S_IFLNK) return fail(EINVAL, fmt::format("inode {} is not a symlink", ino));
    return std::move(node->target);
}

Result<Ino> Txn::resolve(std::string_view path) const {
    if (path.size() > kMaxPathLength) {
        return fail(ENAMETOOLONG, fmt::format("path of {} bytes is longer than {}", path.size(),
                                              kMaxPathLength));
    }
    Ino at = kRootIno;
    while (!path.empty()) {
        const auto slash = path.find('/');
        const std::string_view part = path.substr(0, slash);
        path = slash == std::string_view::npos ? std::string_view{} : path.substr(slash + 1);
        if (part.empty() || part == ".") continue;
        auto node = lookup(at, part);
        if (!node) return tl::unexpected(node.error());
        at = node->ino;
    }
    return at;
}

Status Txn::readdir(Ino dir, std::string_view after,
                    const std::function<bool(const DirEntry&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    if (auto d = directory(tx, dir); !d) return tl::unexpected(d.error());
    const std::string prefix = records::u64_key(dir);
    std::string start = records::dirent_key(dir, after);
    if (!after.empty()) start.push_back('\0');  // strictly after `after`
    Status result;
    auto s = tx.scan(tx.db.dirents, prefix, start, [&](std::string_view key, std::string_view value) {
        auto d = records::decode_dirent(value);
        if (!d) {
            result = tl::unexpected(d.error());
            return false;
        }
        return fn(DirEntry{key.substr(8), d->child, d->type});
    });
    return s ? result : s;
}

// ---- writes -------------------------------------------------------------------------

Result<Attr> WriteTxn::mkdir(Ino parent, std::string_view name, std::uint32_t mode,
                             std::uint32_t uid, std::uint32_t gid) {
    Tx tx = TxnAccess::tx(*this);
    auto prep = prepare_create(tx, parent, name);
    if (!prep) return tl::unexpected(prep.error());
    if (prep->second) return fail(EEXIST, fmt::format("'{}' exists", name));
    return make_node(tx, prep->first, name, S_IFDIR | (mode & 07777), uid, gid, {});
}

Result<Attr> WriteTxn::create(Ino parent, std::string_view name, std::uint32_t mode,
                              std::uint32_t uid, std::uint32_t gid, bool exclusive) {
    Tx tx = TxnAccess::tx(*this);
    auto prep = prepare_create(tx, parent, name);
    if (!prep) return tl::unexpected(prep.error());
    if (const auto& existing = prep->second) {
        if (exclusive) return fail(EEXIST, fmt::format("'{}' exists", name));
        if (existing->type == FileType::directory) return fail(EISDIR, fmt::format("'{}' is a directory", name));
        return getattr(existing->child);
    }
    return make_node(tx, prep->first, name, S_IFREG | (mode & 07777), uid, gid, {});
}

Result<Attr> WriteTxn::symlink(Ino parent, std::string_view name, std::string_view target,
                               std::uint32_t uid, std::uint32_t gid) {
    Tx tx = TxnAccess::tx(*this);
    if (target.empty() || target.size() > kMaxPathLength) {
        return fail(target.empty() ? ENOENT : ENAMETOOLONG, "invalid symlink target length");
    }
    auto prep = prepare_create(tx, parent, name);
    if (!prep) return tl::unexpected(prep.error());
    if (prep->second) return fail(EEXIST, fmt::format("'{}' exists", name));
    return make_node(tx, prep->first, name, S_IFLNK | 0777, uid, gid, target);
}

namespace {

// The directory `parent` and its child `name`, which must exist (ENOENT).
Result<std::pair<Inode, Inode>> existing_child(const Tx& tx, Ino parent, std::string_view name) {
    auto dir = directory(tx, parent);
    if (!dir) return tl::unexpected(dir.error());
    auto d = tx.child(parent, name);
    if (!d) return tl::unexpected(d.error());
    if (!*d) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent));
    auto node = tx.inode((*d)->child);
    if (!node) return tl::unexpected(node.error());
    return std::pair{std::move(*dir), std::move(*node)};
}

}  // namespace

Status WriteTxn::unlink(Ino parent, std::string_view name) {
    Tx tx = TxnAccess::tx(*this);
    auto found = existing_child(tx, parent, name);
    if (!found) return tl::unexpected(found.error());
    auto& [dir, node] = *found;
    if ((node.mode & S_IFMT) == S_IFDIR) return fail(EISDIR, fmt::format("'{}' is a directory", name));
    return remove_node(tx, dir, node, EventKind::remove);
}

Status WriteTxn::rmdir(Ino parent, std::string_view name) {
    Tx tx = TxnAccess::tx(*this);
    auto found = existing_child(tx, parent, name);
    if (!found) return tl::unexpected(found.error());
    auto& [dir, node] = *found;
    if ((node.mode & S_IFMT) != S_IFDIR) return fail(ENOTDIR, fmt::format("'{}' is not a directory", name));
    auto full = tx.has_children(node.ino);
    if (!full) return tl::unexpected(full.error());
    if (*full) return fail(ENOTEMPTY, fmt::format("directory '{}' is not empty", name));
    return remove_node(tx, dir, node, EventKind::remove);
}

namespace {

// After `moved` got its new parent and name, recomputes depth and entry for it and
// its subtree: entries dissolve or form where nodes cross the entry depth, files
// move their bytes from their old entry to their new one, entry names follow.
Status retag(Tx& tx, Inode moved, const Inode& new_parent) {
    struct Item {
        Ino ino;
        std::uint16_t depth;
        Ino parent_entry;
    };
    std::vector<Item> work{{moved.ino, static_cast<std::uint16_t>(new_parent.depth + 1),
                            new_parent.entry}};
    const std::uint32_t entry_depth = tx.config.entry_depth;
    while (!work.empty()) {
        const Item item = work.back();
        work.pop_back();
        auto node = tx.inode(item.ino);
        if (!node) return tl::unexpected(node.error());
        const std::uint16_t old_depth = node->depth;
        const Ino old_entry = node->entry;
        const Ino new_entry = item.depth < entry_depth ? 0
                              : item.depth == entry_depth ? node->ino
                                                          : item.parent_entry;
        const bool was_entry = old_entry == node->ino && old_depth == entry_depth;
        const bool is_entry = new_entry == node->ino;
        if (was_entry && is_entry) {
            // Still the same entry: only its name (path) may have changed.
            auto e = tx.entry(node->ino);
            if (!e) return tl::unexpected(e.error());
            auto path = tx.path_of(node->ino);
            if (!path) return tl::unexpected(path.error());
            e->name = std::move(*path);
            if (auto s = tx.put_entry(*e); !s) return s;
            continue;
        }
        if (was_entry) {
            if (auto s = ops::drop_entry_record(tx, node->ino, EventKind::remove, 0, {}); !s) return s;
        }
        node->depth = item.depth;
        node->entry = new_entry;
        if (auto s = tx.put_inode(*node); !s) return s;
        if (is_entry) {
            if (auto s = ops::create_entry_record(tx, *node); !s) return s;
        }
        if ((node->mode & S_IFMT) == S_IFREG) {
            if (old_entry && old_entry != node->ino && old_entry != new_entry) {
                auto still = tx.find_entry_record(old_entry);
                if (!still) return tl::unexpected(still.error());
                if (*still) {
                    if (auto s = ops::add_file_to_entry(tx, old_entry, *node, -1); !s) return s;
                }
            }
            if (new_entry && new_entry != old_entry) {  // incl. a flat file that became an entry
                if (auto s = ops::add_file_to_entry(tx, new_entry, *node, +1); !s) return s;
            }
        }
        if ((node->mode & S_IFMT) == S_IFDIR) {
            auto children = tx.children(node->ino);
            if (!children) return tl::unexpected(children.error());
            for (const auto& [name, d] : *children) {
                work.push_back({d.child, static_cast<std::uint16_t>(item.depth + 1), new_entry});
            }
        }
    }
    return {};
}

}  // namespace

Status WriteTxn::rename(Ino parent, std::string_view name, Ino new_parent,
                        std::string_view new_name, unsigned flags) {
    Tx tx = TxnAccess::tx(*this);
    if (flags & kRenameExchange) return fail(EINVAL, "RENAME_EXCHANGE is not supported");
    if (flags & ~kRenameNoReplace) return fail(EINVAL, "unknown rename flags");
    if (auto s = ops::validate_name(new_name); !s) return s;
    auto from_dir = directory(tx, parent);
    if (!from_dir) return tl::unexpected(from_dir.error());
    auto to_dir = directory(tx, new_parent);
    if (!to_dir) return tl::unexpected(to_dir.error());
    auto src_d = tx.child(parent, name);
    if (!src_d) return tl::unexpected(src_d.error());
    if (!*src_d) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent));
    if (parent == new_parent && name == new_name) return {};
    auto src = tx.inode((*src_d)->child);
    if (!src) return tl::unexpected(src.error());
    const bool src_is_dir = (src->mode & S_IFMT) == S_IFDIR;

    if (src_is_dir) {  // a directory cannot move into its own subtree
        for (Ino at = new_parent;; ) {
            if (at == src->ino) return fail(EINVAL, fmt::format("cannot move '{}' into itself", name));
            if (at == kRootIno) break;
            auto up = tx.inode(at);
            if (!up) return tl::unexpected(up.error());
            at = up->parent;
        }
    }
    auto dst_d = tx.child(new_parent, new_name);
    if (!dst_d) return tl::unexpected(dst_d.error());
    if (*dst_d) {
        if (flags & kRenameNoReplace) return fail(EEXIST, fmt::format("'{}' exists", new_name));
        const bool dst_is_dir = (*dst_d)->type == FileType::directory;
        if (src_is_dir && !dst_is_dir) return fail(ENOTDIR, fmt::format("'{}' is not a directory", new_name));
        if (!src_is_dir && dst_is_dir) return fail(EISDIR, fmt::format("'{}' is a directory", new_name));
        if (dst_is_dir) {
            auto full = tx.has_children((*dst_d)->child);
            if (!full) return tl::unexpected(full.error());
            if (*full) return fail(ENOTEMPTY, fmt::format("directory '{}' is not empty", new_name));
        }
        // Validation is complete: from here on only storage errors can fail.
        auto dst = tx.inode((*dst_d)->child);
        if (!dst) return tl::unexpected(dst.error());
        auto container = tx.inode(new_parent);
        if (!container) return tl::unexpected(container.error());
        if (auto s = remove_node(tx, *container, *dst, EventKind::remove); !s) return s;
    }

    const std::string old_name = src->name;
    const bool was_entry = src->entry == src->ino;
    if (auto s = tx.del(tx.db.dirents, records::dirent_key(parent, name)); !s) return s;
    if (auto s = tx.put(tx.db.dirents, records::dirent_key(new_parent, new_name),
                        records::encode(Dirent{src->ino, type_of(src->mode)}));
        !s) {
        return s;
    }
    auto old_parent = tx.inode(parent);  // re-read: replacing may have touched it
    if (!old_parent) return tl::unexpected(old_parent.error());
    if (auto s = touch_dir(tx, *old_parent, src_is_dir && parent != new_parent ? -1 : 0); !s) return s;
    if (parent != new_parent) {
        auto target_dir = tx.inode(new_parent);
        if (!target_dir) return tl::unexpected(target_dir.error());
        if (auto s = touch_dir(tx, *target_dir, src_is_dir ? 1 : 0); !s) return s;
    }
    src->parent = new_parent;
    src->name = new_name;
    src->ctime_ns = tx.now();
    if (auto s = tx.put_inode(*src); !s) return s;

    auto target_dir = tx.inode(new_parent);
    if (!target_dir) return tl::unexpected(target_dir.error());
    const auto new_depth = static_cast<std::uint16_t>(target_dir->depth + 1);
    const bool same_place = new_depth == src->depth &&
                            (new_depth > tx.config.entry_depth ? src->entry == target_dir->entry
                                                               : false);
    if (!same_place) {
        if (auto s = retag(tx, *src, *target_dir); !s) return s;
    }
    if (was_entry) {
        // The daemon invalidates the old name; the entry may live on under the new one.
        return tx.log(EventKind::rename, src->ino, parent, old_name);
    }
    return {};
}

Result<Attr> WriteTxn::setattr(Ino ino, const SetAttr& changes) {
    Tx tx = TxnAccess::tx(*this);
    auto node = tx.inode(ino);
    if (!node) return tl::unexpected(node.error());
    if (changes.size) {
        if ((node->mode & S_IFMT) == S_IFDIR) return fail(EISDIR, fmt::format("inode {} is a directory", ino));
        if ((node->mode & S_IFMT) != S_IFREG) return fail(EINVAL, fmt::format("inode {} is not a regular file", ino));
        if (*changes.size > kMaxFileSize) {
            return fail(EFBIG, fmt::format("cannot extend inode {} to {} bytes", ino, *changes.size));
        }
        if (*changes.size != node->size) {
            auto content = read(ino);
            if (!content) return tl::unexpected(content.error());
            std::string resized(content->bytes().substr(0, *changes.size));
            resized.resize(*changes.size, '\0');
            auto written = write(ino, resized, Origin::current());
            if (!written) return written;
            auto again = tx.inode(ino);
            if (!again) return tl::unexpected(again.error());
            node = std::move(again);
        }
    }
    if (changes.mode) node->mode = (node->mode & S_IFMT) | (*changes.mode & 07777);
    if (changes.uid) node->uid = *changes.uid;
    if (changes.gid) node->gid = *changes.gid;
    if (changes.atime_ns) node->atime_ns = *changes.atime_ns;
    if (changes.mtime_ns) node->mtime_ns = *changes.mtime_ns;
    node->ctime_ns = tx.now();
    if (auto s = tx.put_inode(*node); !s) return tl::unexpected(s.error());
    return node->attr();
}

}  // namespace kcache::core
