// The walk over an entry's files, or the files below a directory (entry_files.hpp).
#include "kcache/core/entry_files.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "kcache/core/roles.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::Inode;

namespace {

struct Item {
    Inode node;
    std::string path;  // "": a root of the walk, not visited itself
};

// Depth first from `roots` (in order), a directory before its children, children in
// name order. A root with an empty path is not visited: its children are, a file
// root as its own name (a schema-1 file entry).
Status walk(const Tx& tx, std::vector<Item> roots,
            const std::function<Walk(const EntryFile&)>& fn) {
    std::vector<Item> work(std::make_move_iterator(roots.rbegin()),
                           std::make_move_iterator(roots.rend()));
    while (!work.empty()) {
        Item item = std::move(work.back());
        work.pop_back();
        if (is_dir(item.node.mode)) {
            if (!item.path.empty()) {
                const Walk next = fn(EntryFile{item.path, item.node.attr(), {}, Role::other});
                if (next == Walk::stop) return {};
                if (next == Walk::skip) continue;
            }
            auto children = KCACHE_TRY(tx.children(item.node.ino));
            for (auto it = children.rbegin(); it != children.rend(); ++it) {
                auto child = KCACHE_TRY(tx.inode(it->second.child));
                work.push_back({std::move(child),
                                item.path.empty() ? it->first : item.path + "/" + it->first});
            }
            continue;
        }
        // Fifos, sockets and devices are no files of an entry: nothing to export, push,
        // load or show (they go with the entry's directory all the same).
        if (file_type_of(item.node.mode) == FileType::special) continue;
        if (item.path.empty()) item.path = item.node.name;
        const Role role = role_of(item.node.name);
        if (fn(EntryFile{std::move(item.path), item.node.attr(), item.node.target, role}) ==
            Walk::stop) {
            return {};
        }
    }
    return {};
}

}  // namespace

Status walk_below(const Txn& txn, Ino dir, const std::function<Walk(const EntryFile&)>& fn) {
    Tx tx = TxnAccess::tx(txn);
    auto node = KCACHE_TRY(tx.inode(dir));
    if (!is_dir(node.mode)) {
        return fail(ENOTDIR, fmt::format("inode {} is not a directory", dir));
    }
    return walk(tx, {Item{std::move(node), {}}}, fn);
}

Status Txn::for_each_entry_file(const EntryInfo& entry,
                                const std::function<bool(const EntryFile&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    // Below each member, in name order; paths relative to the entry's directory (stem
    // members) or to the entry's own directory (node entries).
    std::vector<Item> members;
    KCACHE_TRY(ops::for_each_member(tx, entry, [&](const Inode& member) {
        members.push_back({member, entry.kind == EntryKind::node ? std::string() : member.name});
        return true;
    }));
    return walk(tx, std::move(members),
                [&](const EntryFile& file) { return fn(file) ? Walk::next : Walk::stop; });
}

Result<std::vector<EntryFile>> entry_files(const Txn& txn, const EntryInfo& entry) {
    std::vector<EntryFile> files;
    KCACHE_TRY(txn.for_each_entry_file(entry, [&](const EntryFile& file) {
        if (!file.attr.is_dir()) files.push_back(file);
        return true;
    }));
    std::sort(files.begin(), files.end(),
              [](const EntryFile& a, const EntryFile& b) { return a.path < b.path; });
    return files;
}

}  // namespace kcache::core
