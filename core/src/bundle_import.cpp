// Importing a bundle (bundle_format.hpp): checked whole first, then written in one
// write transaction.
#include <unistd.h>

#include <cerrno>
#include <unordered_map>

#include <fmt/format.h>

#include "bundle_format.hpp"
#include "kcache/core/bundle.hpp"

namespace kcache::core {
using namespace bundle;

Result<ImportReport> import_bundle(Store& store, const std::string& path, bool replace,
                                   const ProgressFn& progress) {
    // Pass 1: validate everything; nothing is written.
    auto noop_entry = [](const std::string&, EntryKind) -> Status { return {}; };
    auto noop_node = [](const BundleNode&) -> Status { return {}; };
    KCACHE_TRY(parse_bundle(path, noop_entry, noop_node, progress));
    // Pass 2: write all of it in one transaction (aborted as a whole on any error).
    auto txn = KCACHE_TRY(store.write());
    ImportReport report;
    const Origin origin = Origin::current();
    bool skipping = false;
    std::unordered_map<std::string, Ino> made;  // path -> ino within the current entry
    EntryKind kind = EntryKind::node;
    auto on_entry = [&](const std::string& entry, EntryKind entry_kind) -> Status {
        made.clear();
        skipping = false;
        kind = entry_kind;
        auto existing = txn.find_entry(entry);
        if (existing) {
            if (!replace) {
                skipping = true;
                ++report.entries_skipped;
                return {};
            }
            Tx tx = TxnAccess::tx(txn);
            std::vector<std::pair<Ino, std::string>> members;
            auto listed = ops::for_each_member(tx, *existing, [&](const records::Inode& member) {
                members.emplace_back(member.parent, member.name);
                return true;
            });
            if (!listed) return listed;
            for (const auto& [parent, name] : members) {
                if (auto s = ops::remove_subtree(tx, parent, name, EventKind::remove); !s) return s;
            }
            ++report.entries_replaced;
        } else if (existing.error().code != ENOENT) {
            return tl::unexpected(existing.error());
        } else {
            // A node of that name that is not an entry (e.g. a plain file) is in the way.
            auto ino = txn.resolve(entry);
            if (ino) return fail(EEXIST, fmt::format("'{}' exists and is not an entry", entry));
            ++report.entries_added;
        }
        if (auto s = txn.add(Counter::imported_entries, 1); !s) return s;
        return {};
    };
    auto on_node = [&](const BundleNode& node) -> Status {
        if (skipping) return {};
        const std::size_t slash = node.path.rfind('/');
        Ino parent;
        const bool top =
            made.empty() || kind == EntryKind::stem;  // an entry's own node, or a stem file
        if (top) {
            // The directories above the entry (entry depth > 1), like mkdir -p.
            parent = KCACHE_TRY(txn.mkdirs(slash == std::string::npos
                                               ? std::string_view()
                                               : std::string_view(node.path).substr(0, slash)));
        } else {
            parent = made.at(node.path.substr(0, slash));
        }
        const std::string_view name = slash == std::string::npos
                                          ? std::string_view(node.path)
                                          : std::string_view(node.path).substr(slash + 1);
        Result<Attr> attr = fail(EINVAL, "unknown node type");
        switch (node.type) {
            case FileType::directory:
                attr = txn.mkdir(parent, name, node.mode, getuid(), getgid());
                break;
            case FileType::symlink:
                attr = txn.symlink(parent, name, node.target, getuid(), getgid());
                break;
            case FileType::regular:
                attr = txn.create(parent, name, node.mode, getuid(), getgid(), true);
                if (attr) attr = txn.write(attr->ino, node.content, origin);
                ++report.files;
                report.bytes += node.content.size();
                break;
            case FileType::special:  // never exported; the parser refuses the type
                break;
        }
        if (!attr) return tl::unexpected(with_context(attr.error(), node.path));
        SetAttr times;
        times.mtime_ns = node.mtime_ns;
        KCACHE_TRY(txn.setattr(attr->ino, times));
        if (top) {  // a name the daemon learns of from the log
            Tx tx = TxnAccess::tx(txn);
            if (auto l =
                    tx.log(EventKind::import, attr->entry ? attr->entry : attr->ino, parent, name);
                !l) {
                return l;
            }
        }
        made[node.path] = attr->ino;
        return {};
    };
    KCACHE_TRY(parse_bundle(path, on_entry, on_node, {}));
    KCACHE_TRY(txn.commit());
    return report;
}

}  // namespace kcache::core
