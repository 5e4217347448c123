// Importing a bundle (bundle_format.hpp): checked whole first, then written in one
// write transaction.
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "bundle_format.hpp"
#include "kcache/core/bundle.hpp"

namespace kcache::core {
using namespace bundle;

Result<ImportReport> import_bundle(Store& store, const std::string& path, bool replace,
                                   const ProgressFn& progress) {
    // Pass 1: validate everything; nothing is written.
    KCACHE_TRY(parse_bundle(
        path, [](EntryImage&&) -> Status { return {}; }, progress));
    // Pass 2: write all of it in one transaction (aborted as a whole on any error).
    auto txn = KCACHE_TRY(store.write());
    ImportReport report;
    ImageWrite how;
    how.log_import = true;   // names the daemon learns of from the log
    how.same_entry = false;  // entries may move between layouts
    auto on_image = [&](EntryImage&& image) -> Status {
        auto existing = txn.find_entry(image.name);
        if (existing) {
            if (!replace) {
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
            auto ino = txn.resolve(image.name);
            if (ino)
                return fail(EEXIST, fmt::format("'{}' exists and is not an entry", image.name));
            ++report.entries_added;
        }
        KCACHE_TRY(txn.add(Counter::imported_entries, 1));
        for (const ImageFile& f : image.files) {
            if (f.type != FileType::regular) continue;
            ++report.files;
            report.bytes += f.content.size();
        }
        return write_image(txn, image, how);
    };
    KCACHE_TRY(parse_bundle(path, on_image, {}));
    KCACHE_TRY(txn.commit());
    return report;
}

}  // namespace kcache::core
