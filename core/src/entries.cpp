// Entries: their records and accounting, the LRU index, write leases, hits, pins and
// eviction.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
using records::Inode;

namespace {

bool process_alive(std::uint32_t pid) {
    return pid != 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::uint32_t be32(std::string_view bytes) {
    std::uint32_t v = 0;
    for (char c : bytes.substr(0, 4)) v = (v << 8) | static_cast<unsigned char>(c);
    return v;
}

Result<bool> file_in_flight(const Tx& tx, Ino file) {
    bool live = false;
    const std::string prefix = records::u64_key(file);
    auto s = tx.scan(tx.db.leases, prefix, prefix, [&](std::string_view key, std::string_view) {
        live = key.size() == 12 && process_alive(be32(key.substr(8)));
        return !live;
    });
    if (!s) return tl::unexpected(s.error());
    return live;
}

bool no_leases(const Tx& tx) {
    MDB_stat st{};
    return mdb_stat(tx.txn, tx.db.leases, &st) == 0 && st.ms_entries == 0;
}

Result<bool> entry_in_flight(const Tx& tx, Ino entry) {
    if (no_leases(tx)) return false;  // the common case costs one stat
    std::vector<Ino> work{entry};
    while (!work.empty()) {
        const Ino ino = work.back();
        work.pop_back();
        auto live = file_in_flight(tx, ino);
        if (!live) return live;
        if (*live) return true;
        auto children = tx.children(ino);
        if (!children) return tl::unexpected(children.error());
        for (const auto& [name, d] : *children) work.push_back(d.child);
    }
    return false;
}

Result<Inode> regular_file(const Tx& tx, Ino file) {
    auto node = tx.inode(file);
    if (!node) return node;
    if ((node->mode & S_IFMT) != S_IFREG) return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    return node;
}

Status change_lease(Tx& tx, Ino file, int delta) {
    const std::string key = records::lease_key(file, static_cast<std::uint32_t>(getpid()));
    auto current = tx.get(tx.db.leases, key);
    if (!current) return tl::unexpected(current.error());
    std::int64_t count = 0;
    if (*current && (*current)->size() == 4) count = records::Reader(**current).u32();
    count += delta;
    if (count <= 0) return tx.del(tx.db.leases, key);
    std::string value;
    records::Writer(value).u32(static_cast<std::uint32_t>(count));
    return tx.put(tx.db.leases, key, value);
}

}  // namespace

namespace ops {

Status create_entry_record(Tx& tx, const Inode& node) {
    auto path = tx.path_of(node.ino);
    if (!path) return tl::unexpected(path.error());
    EntryInfo entry;
    entry.ino = node.ino;
    entry.name = std::move(*path);
    entry.created_ns = entry.last_access_ns = tx.now();
    if (auto s = tx.put_entry(entry); !s) return s;
    if (auto s = tx.put(tx.db.lru, records::lru_key(entry.last_access_ns, entry.ino), {}); !s) return s;
    return tx.add(Counter::entries, 1);
}

Status drop_entry_record(Tx& tx, Ino entry_ino, EventKind why, Ino parent, std::string_view name) {
    auto entry = tx.find_entry_record(entry_ino);
    if (!entry) return tl::unexpected(entry.error());
    if (!*entry) return {};
    if (auto s = tx.del(tx.db.entries, records::u64_key(entry_ino)); !s) return s;
    if (!(*entry)->pinned) {
        if (auto s = tx.del(tx.db.lru, records::lru_key((*entry)->last_access_ns, entry_ino)); !s) return s;
    }
    if (auto s = tx.add(Counter::entries, -1); !s) return s;
    return tx.log(why, entry_ino, parent, name);
}

Status move_in_lru(Tx& tx, EntryInfo& entry, std::int64_t new_time) {
    if (!entry.pinned && new_time != entry.last_access_ns) {
        if (auto s = tx.del(tx.db.lru, records::lru_key(entry.last_access_ns, entry.ino)); !s) return s;
        if (auto s = tx.put(tx.db.lru, records::lru_key(new_time, entry.ino), {}); !s) return s;
    }
    entry.last_access_ns = new_time;
    return {};
}

Status drop_leases(Tx& tx, Ino file) {
    if (no_leases(tx)) return {};
    std::vector<std::string> keys;
    const std::string prefix = records::u64_key(file);
    auto s = tx.scan(tx.db.leases, prefix, prefix, [&](std::string_view key, std::string_view) {
        keys.emplace_back(key);
        return true;
    });
    if (!s) return s;
    for (const auto& key : keys) {
        if (auto d = tx.del(tx.db.leases, key); !d) return d;
    }
    return {};
}

}  // namespace ops

// ---- reads --------------------------------------------------------------------------

Result<EntryInfo> Txn::entry(Ino entry) const { return TxnAccess::tx(*this).entry(entry); }

Result<EntryInfo> Txn::find_entry(std::string_view name) const {
    auto ino = resolve(name);
    if (!ino) return tl::unexpected(ino.error());
    auto record = TxnAccess::tx(*this).find_entry_record(*ino);
    if (!record) return tl::unexpected(record.error());
    if (!*record) return fail(ENOENT, fmt::format("'{}' is not a cache entry", name));
    return std::move(**record);
}

Status Txn::for_each_entry(const std::function<bool(const EntryInfo&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    Status result;
    auto s = tx.scan(tx.db.entries, {}, {}, [&](std::string_view key, std::string_view value) {
        auto entry = records::decode_entry(records::u64_from_key(key), value);
        if (!entry) {
            result = tl::unexpected(entry.error());
            return false;
        }
        return fn(*entry);
    });
    return s ? result : s;
}

Status Txn::for_each_lru(const std::function<bool(const EntryInfo&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    Status result;
    auto s = tx.scan(tx.db.lru, {}, {}, [&](std::string_view key, std::string_view) {
        auto entry = tx.entry(records::u64_from_key(key.substr(8)));
        if (!entry) {
            result = tl::unexpected(entry.error());
            return false;
        }
        return fn(*entry);
    });
    return s ? result : s;
}

Result<bool> Txn::in_flight(Ino entry) const { return entry_in_flight(TxnAccess::tx(*this), entry); }

// ---- writes -------------------------------------------------------------------------

Status WriteTxn::begin_write(Ino file) {
    Tx tx = TxnAccess::tx(*this);
    if (auto node = regular_file(tx, file); !node) return tl::unexpected(node.error());
    return change_lease(tx, file, +1);
}

Status WriteTxn::end_write(Ino file) {
    Tx tx = TxnAccess::tx(*this);
    return change_lease(tx, file, -1);  // the file may be gone already: then a no-op
}

Status WriteTxn::record_hit(Ino entry_ino) {
    Tx tx = TxnAccess::tx(*this);
    auto entry = tx.entry(entry_ino);
    if (!entry) return tl::unexpected(entry.error());
    auto node = tx.inode(entry_ino);
    if (!node) return tl::unexpected(node.error());
    const std::int64_t now = tx.now();
    ++entry->hits;
    entry->last_hit_ns = now;
    if (auto s = ops::move_in_lru(tx, *entry, now); !s) return s;
    if (auto s = tx.put_entry(*entry); !s) return s;
    if (auto s = tx.add(Counter::hits, 1); !s) return s;
    return tx.log(EventKind::hit, entry_ino, node->parent, node->name);
}

Status WriteTxn::set_pinned(Ino entry_ino, bool pinned) {
    Tx tx = TxnAccess::tx(*this);
    auto entry = tx.entry(entry_ino);
    if (!entry) return tl::unexpected(entry.error());
    if (entry->pinned == pinned) return {};
    auto node = tx.inode(entry_ino);
    if (!node) return tl::unexpected(node.error());
    const std::string key = records::lru_key(entry->last_access_ns, entry_ino);
    // Pinned entries leave the LRU index, so eviction never even looks at them.
    if (auto s = pinned ? tx.del(tx.db.lru, key) : tx.put(tx.db.lru, key, {}); !s) return s;
    entry->pinned = pinned;
    if (auto s = tx.put_entry(*entry); !s) return s;
    return tx.log(pinned ? EventKind::pin : EventKind::unpin, entry_ino, node->parent, node->name);
}

Status WriteTxn::evict_entry(Ino entry_ino, bool force) {
    Tx tx = TxnAccess::tx(*this);
    auto entry = tx.entry(entry_ino);
    if (!entry) return tl::unexpected(entry.error());
    if (entry->pinned && !force) return fail(EPERM, fmt::format("entry '{}' is pinned", entry->name));
    if (!force) {
        auto busy = entry_in_flight(tx, entry_ino);
        if (!busy) return tl::unexpected(busy.error());
        if (*busy) return fail(EBUSY, fmt::format("entry '{}' has a write in flight", entry->name));
    }
    auto node = tx.inode(entry_ino);
    if (!node) return tl::unexpected(node.error());
    if (auto s = ops::remove_subtree(tx, node->parent, node->name, EventKind::evict); !s) return s;
    if (auto s = tx.add(Counter::evicted_entries, 1); !s) return s;
    return tx.add(Counter::evicted_bytes, static_cast<std::int64_t>(entry->bytes));
}

// ---- eviction -------------------------------------------------------------------------

Result<EvictReport> Store::evict(const EvictRequest& request, const ProgressFn& progress) {
    // Bounded transactions keep the writer lock short for the daemon and other tools.
    constexpr std::size_t kBatch = 256;
    EvictReport report;
    const std::int64_t cutoff = request.older_than_ns ? now_ns() - *request.older_than_ns
                                                      : std::numeric_limits<std::int64_t>::min();
    auto over_bounds = [&](const Tx& tx) -> Result<bool> {
        if (request.max_bytes) {
            auto stored = tx.counter(Counter::stored_bytes);
            if (!stored) return tl::unexpected(stored.error());
            if (*stored > *request.max_bytes) return true;
        }
        if (request.max_entries) {
            auto entries = tx.counter(Counter::entries);
            if (!entries) return tl::unexpected(entries.error());
            if (*entries > *request.max_entries) return true;
        }
        return false;
    };
    std::string resume;
    std::uint64_t total = 0;
    for (bool done = false; !done;) {
        auto txn = write();
        if (!txn) return tl::unexpected(txn.error());
        Tx tx = TxnAccess::tx(*txn);
        if (total == 0) {
            auto n = tx.counter(Counter::entries);
            if (!n) return tl::unexpected(n.error());
            total = *n;
        }
        std::vector<std::string> batch;
        auto s = tx.scan(tx.db.lru, {}, resume, [&](std::string_view key, std::string_view) {
            batch.emplace_back(key);
            return batch.size() < kBatch;
        });
        if (!s) return tl::unexpected(s.error());
        done = batch.size() < kBatch;
        for (const std::string& key : batch) {
            const auto time = static_cast<std::int64_t>(records::u64_from_key(key));
            auto over = over_bounds(tx);
            if (!over) return tl::unexpected(over.error());
            if (!*over && time >= cutoff) {
                done = true;
                break;
            }
            const Ino ino = records::u64_from_key(key.substr(8));
            auto busy = entry_in_flight(tx, ino);
            if (!busy) return tl::unexpected(busy.error());
            if (*busy) {
                ++report.skipped_in_flight;
                continue;
            }
            auto entry = tx.entry(ino);
            if (!entry) return tl::unexpected(entry.error());
            const auto stored_before = tx.counter(Counter::stored_bytes);
            if (auto e = txn->evict_entry(ino, true); !e) return tl::unexpected(e.error());
            const auto stored_after = tx.counter(Counter::stored_bytes);
            if (stored_before && stored_after) report.stored_bytes_freed += *stored_before - *stored_after;
            ++report.entries;
            report.bytes += entry->bytes;
        }
        if (!batch.empty()) resume = batch.back() + std::string(1, '\0');
        if (auto c = txn->commit(); !c) return tl::unexpected(c.error());
        if (progress) progress(report.entries, total);
    }
    auto txn = read();
    if (!txn) return tl::unexpected(txn.error());
    Tx tx = TxnAccess::tx(*txn);
    auto over = over_bounds(tx);
    if (!over) return tl::unexpected(over.error());
    bool old_left = false;  // an entry idle longer than asked is still there (in flight)
    if (request.older_than_ns) {
        auto s = tx.scan(tx.db.lru, {}, {}, [&](std::string_view key, std::string_view) {
            old_left = static_cast<std::int64_t>(records::u64_from_key(key)) < cutoff;
            return false;
        });
        if (!s) return tl::unexpected(s.error());
    }
    report.satisfied = !*over && !old_left;
    return report;
}

Result<EvictReport> Store::enforce_limits() {
    EvictRequest request;
    {  // the snapshot ends before eviction starts writing
        auto txn = read();
        if (!txn) return tl::unexpected(txn.error());
        const Config& config = txn->config();
        auto stored = txn->counter(Counter::stored_bytes);
        if (!stored) return tl::unexpected(stored.error());
        auto entries = txn->counter(Counter::entries);
        if (!entries) return tl::unexpected(entries.error());
        if (config.max_bytes && *stored > config.max_bytes) {
            request.max_bytes = config.max_bytes / 100 * config.low_mark_percent;
        }
        if (config.max_entries && *entries > config.max_entries) {
            request.max_entries = config.max_entries * config.low_mark_percent / 100;
        }
    }
    if (!request.max_bytes && !request.max_entries) return EvictReport{};
    return evict(request);
}

}  // namespace kcache::core
