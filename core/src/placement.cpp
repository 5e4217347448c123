// Where nodes belong: placing a node by the layout rules when it is made or moved,
// re-placing a moved subtree (entries form or dissolve, files carry their bytes from
// entry to entry), and dissolving an entry the depth fallback formed once a
// compiler's layout shows up inside it.
#include <cerrno>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kcache/core/layout.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::Inode;

namespace {

Result<Classified> classify_in(const Tx& tx, const Inode& parent, std::string_view name,
                               FileType type) {
    auto path = KCACHE_TRY(tx.path_of(parent.ino));  // the ancestors' names, root first
    LayoutContext context;
    context.entry_depth = tx.config.entry_depth;
    for (std::string_view rest = path; !rest.empty();) {  // views into `path`, alive for this call
        const auto slash = rest.find('/');
        context.ancestors.push_back(rest.substr(0, slash));
        rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    }
    std::vector<LayoutRule> rules;
    if (!tx.config.layout_rules.empty()) {  // set_config checked them: a few lines, parsed here
        auto parsed = KCACHE_TRY(parse_layout_rules(tx.config.layout_rules));
        rules = std::move(parsed);
        context.rules = &rules;
    }
    return classify(context, name, type);
}

}  // namespace

namespace ops {

Result<Place> place(Tx& tx, const Inode& parent, std::string_view name, FileType type) {
    Place p;
    if (type == FileType::special) {  // no content: never forms, joins or populates an entry
        p.entry = parent.entry;       // but goes with the entry it is made in
        p.bookkeeping = true;
        return p;
    }
    if (parent.entry) {
        p.entry = parent.entry;
        p.bookkeeping = parent.bookkeeping || is_bookkeeping_name(name);
        return p;
    }
    if (parent.bookkeeping) {
        p.bookkeeping = true;
        return p;
    }
    auto c = KCACHE_TRY(classify_in(tx, parent, name, type));
    p.producer = c.producer;
    p.by_rule = c.by_rule;
    switch (c.placement) {
        case Placement::container:
            break;
        case Placement::bookkeeping:
            p.bookkeeping = true;
            break;
        case Placement::entry_dir:
            p.forms_entry = true;
            break;
        case Placement::entry_stem: {
            auto id = KCACHE_TRY(stem_entry(tx, parent, c.stem, c.producer, c.by_rule));
            p.entry = id;
            break;
        }
    }
    return p;
}

Result<bool> would_be_in(const Tx& tx, const Inode& parent, std::string_view name, FileType type,
                         Ino entry) {
    if (parent.entry || parent.bookkeeping || type == FileType::special)
        return parent.entry == entry;
    auto c = KCACHE_TRY(classify_in(tx, parent, name, type));
    switch (c.placement) {
        case Placement::container:
        case Placement::bookkeeping:
            return entry == 0;
        case Placement::entry_dir:
            return false;  // an entry of its own
        case Placement::entry_stem: {
            auto id = KCACHE_TRY(find_stem_entry(tx, parent.ino, c.stem));
            return id && *id == entry;
        }
    }
    return false;
}

// A directory the depth fallback made an entry turns out to hold a compiler's cache
// (a kernel directory, an entry file or a known container is made in it): it becomes
// a container and what it holds is placed again. `dir` is updated in place.
Status dissolve_if_container(Tx& tx, Inode& dir, std::string_view name, FileType type) {
    if (dir.entry == 0 || dir.entry != dir.ino || type == FileType::special) return {};
    auto entry = KCACHE_TRY(tx.find_entry_record(dir.ino));
    if (!entry || entry->by_rule || entry->kind != EntryKind::node) return {};
    auto c = KCACHE_TRY(classify_in(tx, dir, name, type));
    if (!c.by_rule || c.placement == Placement::bookkeeping) return {};
    // A node with several names inside would have them placed apart: the entry stays whole
    // (what the compiler makes inside joins it, as in any entry).
    if (KCACHE_TRY(ops::holds_linked_node(tx, dir.ino))) return {};
    if (auto s = drop_entry_record(tx, dir.ino, EventKind::remove, dir.parent, dir.name); !s)
        return s;
    dir.entry = 0;
    if (auto s = tx.put_inode(dir); !s) return s;
    auto children = KCACHE_TRY(tx.children(dir.ino));
    for (const auto& [child_name, child] : children) {
        if (auto s = retag(tx, child.child, nullptr); !s) return s;
    }
    return {};
}

// After `moved` got its new parent and name (or its parent stopped being an entry),
// places it and its subtree again: entries dissolve or form, files move their bytes
// from their old entry to their new one, entry names follow. A file that joins an
// entry under a name that is not bookkeeping populates it (a temp file renamed into
// place is the store a compiler means), on behalf of `origin` (null: this process).
Status retag(Tx& tx, Ino moved, const Origin* origin) {
    std::vector<Ino> work{moved};
    while (!work.empty()) {
        auto node = KCACHE_TRY(tx.inode(work.back()));
        work.pop_back();
        auto parent = KCACHE_TRY(tx.inode(node.parent));
        const FileType type = file_type_of(node.mode);
        const bool was_entry = node.entry == node.ino;
        if (auto s = dissolve_if_container(tx, parent, node.name, type); !s) return s;
        auto where = KCACHE_TRY(place(tx, parent, node.name, type));
        const Ino old_entry = node.entry;
        const Ino new_entry = where.forms_entry ? node.ino : where.entry;
        node.depth = static_cast<std::uint16_t>(parent.depth + 1);
        node.bookkeeping = where.bookkeeping;
        if (was_entry && where.forms_entry) {
            // Still the same entry: only its name (path) may have changed.
            if (auto s = tx.put_inode(node); !s) return s;
            auto e = KCACHE_TRY(tx.entry(node.ino));
            auto path = KCACHE_TRY(tx.path_of(node.ino));
            e.name = std::move(path);
            e.parent = node.parent;
            if (auto s = tx.put_entry(e); !s) return s;
            continue;
        }
        if (was_entry) {
            if (auto s = drop_entry_record(tx, node.ino, EventKind::remove, 0, {}); !s) return s;
        }
        node.entry = new_entry;
        if (auto s = tx.put_inode(node); !s) return s;
        if (where.forms_entry) {
            if (auto s = create_entry_record(tx, node, where.producer, where.by_rule); !s) return s;
        }
        const bool moved_out = old_entry && old_entry != node.ino && old_entry != new_entry;
        if (type == FileType::regular) {
            if (moved_out) {
                auto still = KCACHE_TRY(tx.find_entry_record(old_entry));
                if (still) {
                    if (auto s = add_file_to_entry(tx, old_entry, node, -1); !s) return s;
                }
            }
            if (new_entry && new_entry != old_entry) {  // incl. a flat file that became an entry
                if (auto s = add_file_to_entry(tx, new_entry, node, +1); !s) return s;
            }
            if (new_entry && !node.bookkeeping) {
                auto e = KCACHE_TRY(tx.entry(new_entry));
                if (!e.populated) {
                    if (auto s = populate(tx, e, origin ? *origin : Origin::current()); !s)
                        return s;
                    if (auto s = tx.put_entry(e); !s) return s;
                }
            }
        }
        if (moved_out) {
            if (auto s = left_stem_entry(tx, old_entry, node, EventKind::remove, false); !s)
                return s;
        }
        if (type == FileType::directory) {
            auto children = KCACHE_TRY(tx.children(node.ino));
            for (const auto& [name, d] : children) work.push_back(d.child);
        }
    }
    return {};
}

}  // namespace ops

}  // namespace kcache::core
