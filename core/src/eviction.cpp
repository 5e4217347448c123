// Eviction: an entry removed whole (its members' subtrees, then its record), and the
// passes that evict least-recently-used entries down to a bound or an age. Above the
// namespace (tree.cpp's remove_subtree) and the entries (entries.cpp).
#include <cerrno>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
using records::Inode;

Status WriteTxn::evict_entry(Ino entry_ino, bool force) {
    Tx tx = TxnAccess::tx(*this);
    auto entry = KCACHE_TRY(tx.entry(entry_ino));
    if (entry.pinned && !force) return fail(EPERM, fmt::format("entry '{}' is pinned", entry.name));
    if (!force) {
        auto busy = KCACHE_TRY(ops::entry_in_flight(tx, entry_ino));
        if (busy) return fail(EBUSY, fmt::format("entry '{}' has a write in flight", entry.name));
    }
    // Whole or nothing: every member goes in this transaction. A stem entry's record
    // goes with its last file (logging the evict event), a directory's with it.
    std::vector<std::pair<Ino, std::string>> members;
    auto listed = ops::for_each_member(tx, entry, [&](const Inode& member) {
        members.emplace_back(member.parent, member.name);
        return true;
    });
    if (!listed) return listed;
    for (const auto& [parent, name] : members) {
        if (auto s = ops::remove_subtree(tx, parent, name, EventKind::evict); !s) return s;
    }
    if (entry.kind == EntryKind::stem) {  // an entry with no file left (or none yet)
        if (auto s =
                ops::drop_entry_record(tx, entry_ino, EventKind::evict, entry.parent, entry.stem);
            !s) {
            return s;
        }
    }
    if (auto s = tx.add(Counter::evicted_entries, 1); !s) return s;
    return tx.add(Counter::evicted_bytes, static_cast<std::int64_t>(entry.bytes));
}

Result<EvictReport> Store::evict(const EvictRequest& request, const ProgressFn& progress) {
    // Bounded transactions keep the writer lock short for the daemon and other tools.
    constexpr std::size_t kBatch = 256;
    EvictReport report;
    const std::int64_t cutoff = request.older_than_ns ? now_ns() - *request.older_than_ns
                                                      : std::numeric_limits<std::int64_t>::min();
    auto over_bounds = [&](const Tx& tx) -> Result<bool> {
        if (request.max_bytes) {
            auto stored = KCACHE_TRY(tx.counter(Counter::stored_bytes));
            if (stored > *request.max_bytes) return true;
        }
        if (request.max_entries) {
            auto entries = KCACHE_TRY(tx.counter(Counter::entries));
            if (entries > *request.max_entries) return true;
        }
        return false;
    };
    std::string resume;
    std::uint64_t total = 0;
    for (bool done = false; !done;) {
        auto txn = KCACHE_TRY(write());
        Tx tx = TxnAccess::tx(txn);
        if (total == 0) {
            auto n = KCACHE_TRY(tx.counter(Counter::entries));
            total = n;
        }
        std::vector<std::string> batch;
        KCACHE_TRY(tx.scan(tx.db.lru, {}, resume, [&](std::string_view key, std::string_view) {
            batch.emplace_back(key);
            return batch.size() < kBatch;
        }));
        done = batch.size() < kBatch;
        for (const std::string& key : batch) {
            const auto time = static_cast<std::int64_t>(records::u64_from_key(key));
            auto over = KCACHE_TRY(over_bounds(tx));
            if (!over && time >= cutoff) {
                done = true;
                break;
            }
            const Ino ino = records::u64_from_key(key.substr(8));
            auto busy = KCACHE_TRY(ops::entry_in_flight(tx, ino));
            if (busy) {
                ++report.skipped_in_flight;
                continue;
            }
            auto entry = KCACHE_TRY(tx.entry(ino));
            const auto stored_before = tx.counter(Counter::stored_bytes);
            KCACHE_TRY(txn.evict_entry(ino, true));
            const auto stored_after = tx.counter(Counter::stored_bytes);
            if (stored_before && stored_after)
                report.stored_bytes_freed += *stored_before - *stored_after;
            ++report.entries;
            report.bytes += entry.bytes;
        }
        if (!batch.empty()) resume = batch.back() + std::string(1, '\0');
        KCACHE_TRY(txn.commit());
        if (progress) progress(report.entries, total);
    }
    auto txn = KCACHE_TRY(read());
    Tx tx = TxnAccess::tx(txn);
    auto over = KCACHE_TRY(over_bounds(tx));
    bool old_left = false;  // an entry idle longer than asked is still there (in flight)
    if (request.older_than_ns) {
        KCACHE_TRY(tx.scan(tx.db.lru, {}, {}, [&](std::string_view key, std::string_view) {
            old_left = static_cast<std::int64_t>(records::u64_from_key(key)) < cutoff;
            return false;
        }));
    }
    report.satisfied = !over && !old_left;
    return report;
}

Result<EvictReport> Store::enforce_limits() {
    EvictRequest request;
    {  // the snapshot ends before eviction starts writing
        auto txn = KCACHE_TRY(read());
        const Config& config = txn.config();
        auto stored = KCACHE_TRY(txn.counter(Counter::stored_bytes));
        auto entries = KCACHE_TRY(txn.counter(Counter::entries));
        if (config.max_bytes && stored > config.max_bytes) {
            request.max_bytes = config.max_bytes / 100 * config.low_mark_percent;
        }
        if (config.max_entries && entries > config.max_entries) {
            request.max_entries = config.max_entries * config.low_mark_percent / 100;
        }
    }
    if (!request.max_bytes && !request.max_entries) return EvictReport{};
    return evict(request);
}

}  // namespace kcache::core
