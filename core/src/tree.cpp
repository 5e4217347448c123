// The tree namespace: inodes and directory entries; making, looking up, listing and
// removing nodes, hard links (a node's further names: links.cpp), their attributes, and
// an entry found by its name. Where a node belongs: placement.cpp; rename: rename.cpp.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "kcache/core/layout.hpp"
#include "kcache/core/names.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::Dirent;
using records::Inode;

namespace ops {

// Removes the name `name` (in `parent`) of a node that has no children: with it the last
// name, its dirent, inode, content and accounting; a node with other names keeps them.
// `keep_entry`: a stem entry it leaves empty stays (a rename is replacing the file).
Status remove_node(Tx& tx, Inode& parent, const Inode& node, std::string_view name, EventKind why,
                   bool keep_entry) {
    if (!is_dir(node.mode) && node.nlink > 1) return forget_name(tx, parent, node, name, why);
    // The only name is the inode's own (forget_name keeps it so).
    if (auto s = tx.del(tx.db.dirents, records::dirent_key(parent.ino, name)); !s) return s;
    if (auto s = tx.del(tx.db.inodes, records::u64_key(node.ino)); !s) return s;
    if (auto s = ops::drop_xattrs(tx, node.ino); !s) return s;
    const bool dir = is_dir(node.mode);
    if (is_regular(node.mode)) {
        if (node.entry && node.entry != node.ino) {
            auto before = KCACHE_TRY(tx.find_entry_record(node.entry));
            if (auto s = ops::add_file_to_entry(tx, node.entry, node, -1); !s) return s;
            if (keep_entry && before && before->populated) {  // still populated: no new miss
                auto after = KCACHE_TRY(tx.entry(node.entry));
                after.populated = true;
                if (auto s = tx.put_entry(after); !s) return s;
            }
        }
        if (auto s = ops::release_blob(tx, node.digest); !s) return s;
        if (auto s = ops::drop_leases(tx, node.ino); !s) return s;
        if (auto s = tx.add(Counter::files, -1); !s) return s;
        if (auto s = tx.add(Counter::bytes, -static_cast<std::int64_t>(node.size)); !s) return s;
    }
    if (node.entry == node.ino) {
        if (auto s = ops::drop_entry_record(tx, node.ino, why, parent.ino, node.name); !s) return s;
    } else if (node.entry && node.entry != parent.entry && !dir) {
        // In a container, not inside a directory entry: a file of a stem entry.
        if (auto s = ops::left_stem_entry(tx, node.entry, node, why, keep_entry); !s) return s;
    }
    return tx.touch_dir(parent, dir ? -1 : 0);
}

Status remove_subtree(Tx& tx, Ino parent_ino, std::string_view name, EventKind why) {
    auto top = KCACHE_TRY(tx.child(parent_ino, name));
    if (!top) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent_ino));
    // Depth-first, children before their directory, with an explicit stack so a deep
    // tree cannot overflow the call stack. A node is read when its name is removed, not
    // when it is listed: one with several names (all inside this subtree's entry) is
    // reached once per name, and each visit removes that name, the last one the node.
    struct Frame {
        Ino parent = 0;
        std::string name;
        bool expanded = false;
    };
    std::vector<Frame> stack;
    stack.push_back({parent_ino, std::string(name)});
    while (!stack.empty()) {
        const auto d = KCACHE_TRY(tx.child(stack.back().parent, stack.back().name));
        if (!d) {
            return fail(EIO, fmt::format("'{}' in inode {} went during its removal",
                                         stack.back().name, stack.back().parent));
        }
        if (d->type == FileType::directory && !stack.back().expanded) {
            stack.back().expanded = true;
            auto children = KCACHE_TRY(tx.children(d->child));
            for (auto& [child_name, child] : children)
                stack.push_back({d->child, std::move(child_name)});
            continue;
        }
        const Frame done = std::move(stack.back());
        stack.pop_back();
        auto node = KCACHE_TRY(tx.inode(d->child));
        auto container = KCACHE_TRY(tx.inode(done.parent));  // its nlink changes as children go
        if (auto s = remove_node(tx, container, node, done.name, why); !s) return s;
    }
    return {};
}

}  // namespace ops

namespace {

// Creates a node named `name` in `parent` (which the caller checked is a directory
// without that name).
Result<Attr> make_node(Tx& tx, Inode& parent, std::string_view name, std::uint32_t mode,
                       std::uint32_t uid, std::uint32_t gid, std::string_view target,
                       std::uint64_t rdev = 0) {
    if (parent.depth >= 0xfffe) return fail(ENAMETOOLONG, "tree too deep");
    const FileType type = file_type_of(mode);
    KCACHE_TRY(ops::dissolve_if_container(tx, parent, name, type));
    auto where = KCACHE_TRY(ops::place(tx, parent, name, type));
    auto ino = KCACHE_TRY(tx.next_ino());
    Inode node;
    node.ino = ino;
    node.mode = mode;
    node.uid = uid;
    node.gid = gid;
    node.nlink = is_dir(mode) ? 2 : 1;
    node.size = target.size();
    node.atime_ns = node.mtime_ns = node.ctime_ns = tx.now();
    node.parent = parent.ino;
    node.depth = static_cast<std::uint16_t>(parent.depth + 1);
    node.entry = where.forms_entry ? node.ino : where.entry;
    node.bookkeeping = where.bookkeeping;
    node.name = name;
    node.target = target;
    node.rdev = rdev;
    KCACHE_TRY(tx.put(tx.db.dirents, records::dirent_key(parent.ino, name),
                      records::encode(Dirent{node.ino, type})));
    KCACHE_TRY(tx.put_inode(node));
    KCACHE_TRY(tx.touch_dir(parent, type == FileType::directory ? 1 : 0));
    if (where.forms_entry) {
        KCACHE_TRY(ops::create_entry_record(tx, node, where.producer, where.by_rule));
    }
    if (type == FileType::regular) {
        KCACHE_TRY(tx.add(Counter::files, 1));
        if (node.entry) {
            KCACHE_TRY(ops::add_file_to_entry(tx, node.entry, node, +1));
        }
    }
    return node.attr();
}

// Looks up `name` in directory `parent` for a creation: the parent, and the
// existing child if any.
Result<std::pair<Inode, std::optional<Dirent>>> prepare_create(Tx& tx, Ino parent,
                                                               std::string_view name) {
    KCACHE_TRY(check_name(name));
    auto dir = KCACHE_TRY(tx.directory(parent));
    auto existing = KCACHE_TRY(tx.child(parent, name));
    return std::pair{std::move(dir), existing};
}

}  // namespace

// ---- reads --------------------------------------------------------------------------

Result<Attr> Txn::lookup(Ino parent, std::string_view name) const {
    Tx tx = TxnAccess::tx(*this);
    if (name.size() > kMaxNameLength) {
        return fail(ENAMETOOLONG,
                    fmt::format("name of {} bytes is longer than {}", name.size(), kMaxNameLength));
    }
    KCACHE_TRY(tx.directory(parent));
    auto d = KCACHE_TRY(tx.child(parent, name));
    if (!d) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent));
    auto node = KCACHE_TRY(tx.inode(d->child));
    return node.attr();
}

Result<Attr> Txn::getattr(Ino ino) const {
    auto node = KCACHE_TRY(TxnAccess::tx(*this).inode(ino));
    return node.attr();
}

Result<std::string> Txn::readlink(Ino ino) const {
    auto node = KCACHE_TRY(TxnAccess::tx(*this).inode(ino));
    if (!is_symlink(node.mode)) return fail(EINVAL, fmt::format("inode {} is not a symlink", ino));
    return std::move(node.target);
}

Result<std::string> Txn::path(Ino ino) const {
    return TxnAccess::tx(*this).path_of(ino);
}

Result<Ino> Txn::resolve(std::string_view path) const {
    if (path.size() > kMaxPathLength) {
        return fail(ENAMETOOLONG,
                    fmt::format("path of {} bytes is longer than {}", path.size(), kMaxPathLength));
    }
    Ino at = kRootIno;
    while (!path.empty()) {
        const auto slash = path.find('/');
        const std::string_view part = path.substr(0, slash);
        path = slash == std::string_view::npos ? std::string_view{} : path.substr(slash + 1);
        if (part.empty() || part == ".") continue;
        auto node = KCACHE_TRY(lookup(at, part));
        at = node.ino;
    }
    return at;
}

Status Txn::readdir(Ino dir, std::string_view after,
                    const std::function<bool(const DirEntry&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    KCACHE_TRY(tx.directory(dir));
    const std::string prefix = records::u64_key(dir);
    std::string start = records::dirent_key(dir, after);
    if (!after.empty()) start.push_back('\0');  // strictly after `after`
    return tx.scan_checked(tx.db.dirents, prefix, start,
                           [&](std::string_view key, std::string_view value) -> Result<bool> {
                               const auto d = KCACHE_TRY(records::decode_dirent(value));
                               return fn(DirEntry{key.substr(8), d.child, d.type});
                           });
}

Result<EntryInfo> Txn::find_entry(std::string_view name) const {
    Tx tx = TxnAccess::tx(*this);
    std::optional<Ino> id;
    if (auto ino = resolve(name); ino) {
        auto record = KCACHE_TRY(tx.find_entry_record(*ino));
        if (record) return std::move(*record);
    } else if (ino.error().code != ENOENT) {
        return tl::unexpected(ino.error());
    }
    // A stem entry: its name is the directory's path and the stem its files share.
    const auto slash = name.rfind('/');
    const std::string_view dir =
        slash == std::string_view::npos ? std::string_view{} : name.substr(0, slash);
    const std::string_view stem = slash == std::string_view::npos ? name : name.substr(slash + 1);
    if (auto parent = resolve(dir); parent && !stem.empty()) {
        auto found = KCACHE_TRY(ops::find_stem_entry(tx, *parent, stem));
        id = found;
    }
    if (!id) return fail(ENOENT, fmt::format("'{}' is not a cache entry", name));
    return tx.entry(*id);
}

// ---- writes -------------------------------------------------------------------------

Result<Ino> WriteTxn::mkdirs(std::string_view dir) {
    Ino at = kRootIno;
    for (std::size_t from = 0; from < dir.size();) {
        const std::size_t slash = std::min(dir.find('/', from), dir.size());
        const std::string_view part = dir.substr(from, slash - from);
        from = slash + 1;
        auto existing = lookup(at, part);
        if (existing) {
            if (!existing->is_dir())
                return fail(ENOTDIR, fmt::format("'{}' is not a directory", part));
            at = existing->ino;
            continue;
        }
        if (existing.error().code != ENOENT) return tl::unexpected(existing.error());
        auto made = KCACHE_TRY(mkdir(at, part, 0755, getuid(), getgid()));
        at = made.ino;
    }
    return at;
}

Result<Attr> WriteTxn::mkdir(Ino parent, std::string_view name, std::uint32_t mode,
                             std::uint32_t uid, std::uint32_t gid) {
    Tx tx = TxnAccess::tx(*this);
    auto prep = KCACHE_TRY(prepare_create(tx, parent, name));
    if (prep.second) return fail(EEXIST, fmt::format("'{}' exists", name));
    return make_node(tx, prep.first, name, S_IFDIR | (mode & 07777), uid, gid, {});
}

Result<Attr> WriteTxn::create(Ino parent, std::string_view name, std::uint32_t mode,
                              std::uint32_t uid, std::uint32_t gid, bool exclusive) {
    Tx tx = TxnAccess::tx(*this);
    auto prep = KCACHE_TRY(prepare_create(tx, parent, name));
    if (const auto& existing = prep.second) {
        if (exclusive) return fail(EEXIST, fmt::format("'{}' exists", name));
        if (existing->type == FileType::directory)
            return fail(EISDIR, fmt::format("'{}' is a directory", name));
        return getattr(existing->child);
    }
    return make_node(tx, prep.first, name, S_IFREG | (mode & 07777), uid, gid, {});
}

Result<Attr> WriteTxn::symlink(Ino parent, std::string_view name, std::string_view target,
                               std::uint32_t uid, std::uint32_t gid) {
    Tx tx = TxnAccess::tx(*this);
    if (target.empty() || target.size() > kMaxPathLength) {
        return fail(target.empty() ? ENOENT : ENAMETOOLONG, "invalid symlink target length");
    }
    auto prep = KCACHE_TRY(prepare_create(tx, parent, name));
    if (prep.second) return fail(EEXIST, fmt::format("'{}' exists", name));
    return make_node(tx, prep.first, name, S_IFLNK | 0777, uid, gid, target);
}

Result<Attr> WriteTxn::mknod(Ino parent, std::string_view name, std::uint32_t mode,
                             std::uint64_t rdev, std::uint32_t uid, std::uint32_t gid) {
    Tx tx = TxnAccess::tx(*this);
    const std::uint32_t type = mode & S_IFMT;
    if (type == S_IFREG || type == 0) return create(parent, name, mode, uid, gid, true);
    if (type != S_IFIFO && type != S_IFSOCK && type != S_IFCHR && type != S_IFBLK)
        return fail(EINVAL, fmt::format("mknod of '{}': mode {:o} is no node type", name, mode));
    auto prep = KCACHE_TRY(prepare_create(tx, parent, name));
    if (prep.second) return fail(EEXIST, fmt::format("'{}' exists", name));
    const bool device = type == S_IFCHR || type == S_IFBLK;
    return make_node(tx, prep.first, name, type | (mode & 07777), uid, gid, {}, device ? rdev : 0);
}

// Another name for `ino` (links.cpp: the names of a node).
Result<Attr> WriteTxn::link(Ino ino, Ino new_parent, std::string_view new_name) {
    Tx tx = TxnAccess::tx(*this);
    KCACHE_TRY(check_name(new_name));
    auto node = KCACHE_TRY(tx.inode(ino));
    auto dir = KCACHE_TRY(tx.directory(new_parent));
    auto existing = KCACHE_TRY(tx.child(new_parent, new_name));
    if (existing) return fail(EEXIST, fmt::format("'{}' exists", new_name));
    if (is_dir(node.mode))
        return fail(EPERM, fmt::format("inode {} is a directory: no hard link to it", ino));
    if (node.nlink >= kMaxLinks)
        return fail(EMLINK, fmt::format("inode {} has {} names already", ino, node.nlink));
    if (dir.depth >= 0xfffe) return fail(ENAMETOOLONG, "tree too deep");
    const bool same_entry =
        KCACHE_TRY(ops::would_be_in(tx, dir, new_name, file_type_of(node.mode), node.entry));
    if (!same_entry) {
        return fail(EXDEV, fmt::format("'{}' would be in another entry than inode {}: every name "
                                       "of a node stays in its entry",
                                       new_name, ino));
    }
    KCACHE_TRY(tx.put(tx.db.dirents, records::dirent_key(new_parent, new_name),
                      records::encode(records::Dirent{node.ino, file_type_of(node.mode)})));
    KCACHE_TRY(tx.put(tx.db.links, records::link_key(node.ino, new_parent, new_name), {}));
    node.nlink += 1;
    node.ctime_ns = tx.now();
    KCACHE_TRY(tx.put_inode(node));
    KCACHE_TRY(tx.touch_dir(dir, 0));
    return node.attr();
}

namespace {

// The directory `parent` and its child `name`, which must exist (ENOENT).
Result<std::pair<Inode, Inode>> existing_child(const Tx& tx, Ino parent, std::string_view name) {
    auto dir = KCACHE_TRY(tx.directory(parent));
    auto d = KCACHE_TRY(tx.child(parent, name));
    if (!d) return fail(ENOENT, fmt::format("no '{}' in inode {}", name, parent));
    auto node = KCACHE_TRY(tx.inode(d->child));
    return std::pair{std::move(dir), std::move(node)};
}

}  // namespace

Status WriteTxn::unlink(Ino parent, std::string_view name) {
    Tx tx = TxnAccess::tx(*this);
    auto found = KCACHE_TRY(existing_child(tx, parent, name));
    auto& [dir, node] = found;
    if (is_dir(node.mode)) return fail(EISDIR, fmt::format("'{}' is a directory", name));
    return ops::remove_node(tx, dir, node, name, EventKind::remove);
}

Status WriteTxn::rmdir(Ino parent, std::string_view name) {
    Tx tx = TxnAccess::tx(*this);
    auto found = KCACHE_TRY(existing_child(tx, parent, name));
    auto& [dir, node] = found;
    if (!is_dir(node.mode)) return fail(ENOTDIR, fmt::format("'{}' is not a directory", name));
    auto full = KCACHE_TRY(tx.has_children(node.ino));
    if (full) return fail(ENOTEMPTY, fmt::format("directory '{}' is not empty", name));
    return ops::remove_node(tx, dir, node, name, EventKind::remove);
}

Result<Attr> WriteTxn::setattr(Ino ino, const SetAttr& changes) {
    Tx tx = TxnAccess::tx(*this);
    auto node = KCACHE_TRY(tx.inode(ino));
    if (changes.size) {
        if (is_dir(node.mode)) return fail(EISDIR, fmt::format("inode {} is a directory", ino));
        if (!is_regular(node.mode))
            return fail(EINVAL, fmt::format("inode {} is not a regular file", ino));
        if (*changes.size > kMaxFileSize) {
            return fail(EFBIG,
                        fmt::format("cannot extend inode {} to {} bytes", ino, *changes.size));
        }
        if (*changes.size != node.size) {
            auto content = KCACHE_TRY(read(ino));
            std::string resized(content.bytes().substr(0, *changes.size));
            resized.resize(*changes.size, '\0');
            auto written = write(ino, resized, Origin::current());
            if (!written) return written;
            auto again = KCACHE_TRY(tx.inode(ino));
            node = std::move(again);
        }
    }
    if (changes.mode) node.mode = (node.mode & S_IFMT) | (*changes.mode & 07777);
    if (changes.uid) node.uid = *changes.uid;
    if (changes.gid) node.gid = *changes.gid;
    if (changes.atime_ns) node.atime_ns = *changes.atime_ns;
    if (changes.mtime_ns) node.mtime_ns = *changes.mtime_ns;
    node.ctime_ns = tx.now();
    KCACHE_TRY(tx.put_inode(node));
    return node.attr();
}

}  // namespace kcache::core
