// Hard links (schema 4): a node's further names. A node's own parent and name are in its
// inode (so a path can be rebuilt from a number); each further name is a dirent plus a
// row of the `links` table (records::link_key), and nlink counts them all. Every name of
// a node stays in its entry (link, rename and placement refuse what would split them),
// so an eviction still removes an entry whole and exactly: it reaches each name of a
// node inside the entry it removes, and the last one removes the node.
#include <sys/stat.h>

#include <cerrno>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
using records::Inode;

namespace ops {

Status forget_name(Tx& tx, Inode& parent, const Inode& linked, std::string_view name,
                   EventKind why) {
    Inode node = linked;
    if (auto s = tx.del(tx.db.dirents, records::dirent_key(parent.ino, name)); !s) return s;
    if (node.parent == parent.ino && node.name == name) {
        // Its own name goes: its first further name becomes its own.
        std::optional<records::LinkName> next;
        const std::string prefix = records::links_prefix(node.ino);
        KCACHE_TRY(
            tx.scan(tx.db.links, prefix, prefix, [&](std::string_view key, std::string_view) {
                next = records::decode_link_key(key);
                return false;
            }));
        if (!next || next->parent == 0) {
            return fail(EIO, fmt::format("inode {}: {} names but no further one recorded", node.ino,
                                         node.nlink));
        }
        KCACHE_TRY(tx.del(tx.db.links, records::link_key(node.ino, next->parent, next->name)));
        auto dir = KCACHE_TRY(tx.inode(next->parent));
        node.parent = next->parent;
        node.name = std::move(next->name);
        node.depth = static_cast<std::uint16_t>(dir.depth + 1);
    } else {
        const std::string key = records::link_key(node.ino, parent.ino, name);
        auto row = KCACHE_TRY(tx.get(tx.db.links, key));
        if (!row) {
            return fail(EIO, fmt::format("inode {}: name '{}' in inode {} is not recorded",
                                         node.ino, name, parent.ino));
        }
        KCACHE_TRY(tx.del(tx.db.links, key));
    }
    // Another process evicts a stem entry: the daemon forgets each of its names (as
    // left_stem_entry logs the last one).
    if (why == EventKind::evict && node.entry && node.entry != parent.entry) {
        KCACHE_TRY(tx.log(EventKind::member, node.entry, parent.ino, name));
    }
    node.nlink -= 1;
    node.ctime_ns = tx.now();
    KCACHE_TRY(tx.put_inode(node));
    return tx.touch_dir(parent, 0);
}

Status move_name(Tx& tx, Inode& node, Ino parent, std::string_view name, Ino new_parent,
                 std::string_view new_name) {
    KCACHE_TRY(tx.del(tx.db.dirents, records::dirent_key(parent, name)));
    KCACHE_TRY(tx.put(tx.db.dirents, records::dirent_key(new_parent, new_name),
                      records::encode(records::Dirent{node.ino, file_type_of(node.mode)})));
    if (node.parent == parent && node.name == name) {
        auto dir = KCACHE_TRY(tx.inode(new_parent));
        node.parent = new_parent;
        node.name = new_name;
        node.depth = static_cast<std::uint16_t>(dir.depth + 1);
    } else {
        KCACHE_TRY(tx.del(tx.db.links, records::link_key(node.ino, parent, name)));
        KCACHE_TRY(tx.put(tx.db.links, records::link_key(node.ino, new_parent, new_name), {}));
    }
    node.ctime_ns = tx.now();
    return tx.put_inode(node);
}

Result<bool> holds_linked_node(const Tx& tx, Ino ino) {
    std::vector<Ino> work{ino};
    while (!work.empty()) {
        const Ino at = work.back();
        work.pop_back();
        auto children = KCACHE_TRY(tx.children(at));
        for (const auto& [name, d] : children) {
            if (d.type == FileType::directory) {
                work.push_back(d.child);
                continue;
            }
            auto node = KCACHE_TRY(tx.inode(d.child));
            if (node.nlink > 1) return true;
        }
    }
    return false;
}

}  // namespace ops

}  // namespace kcache::core
