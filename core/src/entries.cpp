// Entries: their records and accounting (a file's bytes joining or leaving its entry, a
// file's content replaced), the LRU index, write leases, hits and pins
// (eviction, which removes their files: eviction.cpp).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "kcache/core/roles.hpp"
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
    KCACHE_TRY(tx.scan(tx.db.leases, prefix, prefix, [&](std::string_view key, std::string_view) {
        live = key.size() == 12 && process_alive(be32(key.substr(8)));
        return !live;
    }));
    return live;
}

bool no_leases(const Tx& tx) {
    MDB_stat st{};
    return mdb_stat(tx.txn, tx.db.leases, &st) == 0 && st.ms_entries == 0;
}

Result<Inode> regular_file(const Tx& tx, Ino file) {
    auto node = tx.inode(file);
    if (!node) return node;
    if (!is_regular(node->mode))
        return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    return node;
}

Status change_lease(Tx& tx, Ino file, int delta) {
    const std::string key = records::lease_key(file, static_cast<std::uint32_t>(getpid()));
    auto current = KCACHE_TRY(tx.get(tx.db.leases, key));
    std::int64_t count = 0;
    if (current && current->size() == 4) count = records::Reader(*current).u32();
    count += delta;
    if (count <= 0) return tx.del(tx.db.leases, key);
    std::string value;
    records::Writer(value).u32(static_cast<std::uint32_t>(count));
    return tx.put(tx.db.leases, key, value);
}

}  // namespace

namespace ops {

namespace {

Status insert_entry(Tx& tx, EntryInfo& entry) {
    entry.created_ns = entry.last_access_ns = tx.now();
    if (auto s = tx.put_entry(entry); !s) return s;
    if (auto s = tx.put(tx.db.lru, records::lru_key(entry.last_access_ns, entry.ino), {}); !s)
        return s;
    return tx.add(Counter::entries, 1);
}

}  // namespace

Status create_entry_record(Tx& tx, const Inode& node, Producer producer, bool by_rule) {
    auto path = KCACHE_TRY(tx.path_of(node.ino));
    EntryInfo entry;
    entry.ino = node.ino;
    entry.name = std::move(path);
    entry.kind = EntryKind::node;
    entry.parent = node.parent;
    entry.producer = producer;
    entry.by_rule = by_rule;
    return insert_entry(tx, entry);
}

Result<std::optional<Ino>> find_stem_entry(const Tx& tx, Ino parent, std::string_view stem) {
    if (!tx.db.has_stems) return std::optional<Ino>{};
    auto id = KCACHE_TRY(tx.get(tx.db.stems, records::stem_key(parent, stem)));
    if (!id) return std::optional<Ino>{};
    auto value = KCACHE_TRY(records::decode_u64(*id, "stem"));
    return std::optional<Ino>{value};
}

Result<Ino> stem_entry(Tx& tx, const Inode& parent, std::string_view stem, Producer producer,
                       bool by_rule) {
    auto existing = KCACHE_TRY(find_stem_entry(tx, parent.ino, stem));
    if (existing) return *existing;
    if (!tx.db.has_stems) return fail(EROFS, fmt::format("db {}: schema 1, read-only", tx.db.path));
    // Stem entries take their id from the inode numbers, so ids never collide.
    auto id = KCACHE_TRY(tx.next_ino());
    auto dir = KCACHE_TRY(tx.path_of(parent.ino));
    EntryInfo entry;
    entry.ino = id;
    entry.name = dir.empty() ? std::string(stem) : dir + "/" + std::string(stem);
    entry.kind = EntryKind::stem;
    entry.parent = parent.ino;
    entry.stem = stem;
    entry.producer = producer;
    entry.by_rule = by_rule;
    KCACHE_TRY(tx.put(tx.db.stems, records::stem_key(parent.ino, stem), records::encode_u64(id)));
    KCACHE_TRY(insert_entry(tx, entry));
    return id;
}

Status for_each_member(const Tx& tx, const EntryInfo& entry,
                       const std::function<bool(const Inode&)>& fn) {
    if (entry.kind == EntryKind::node) {
        auto node = KCACHE_TRY(tx.inode(entry.ino));
        fn(node);
        return {};
    }
    // The stem's files are the parent's children whose entry is this one. Their names
    // start with the stem, so one range of the dirents holds them all.
    // A file with several names there (links.cpp) is visited once per name, as that name.
    std::vector<std::pair<std::string, Ino>> members;
    const std::string prefix = records::stem_key(entry.parent, entry.stem);
    auto s =
        tx.scan(tx.db.dirents, prefix, prefix, [&](std::string_view key, std::string_view value) {
            auto d = records::decode_dirent(value);
            if (d) members.emplace_back(key.substr(8), d->child);
            return true;
        });
    if (!s) return s;
    for (auto& [name, ino] : members) {
        auto node = KCACHE_TRY(tx.inode(ino));
        node.parent = entry.parent;
        node.name = std::move(name);
        if (node.entry == entry.ino && !fn(node)) break;
    }
    return {};
}

std::pair<Ino, std::string> event_target(const Tx& tx, const EntryInfo& entry) {
    if (entry.kind == EntryKind::stem) return {entry.parent, entry.stem};
    auto node = tx.inode(entry.ino);
    if (!node) return {0, {}};
    return {node->parent, node->name};
}

Status populate(Tx& tx, EntryInfo& entry, const Origin& origin) {
    if (entry.populated) return {};
    entry.populated = true;
    entry.populated_by_pid = origin.pid;
    entry.populated_by_name = origin.name.substr(0, 64);
    const auto [parent, name] = event_target(tx, entry);
    // Fetched from the shared tier: another node compiled it; no miss here.
    if (origin.fetched) return tx.log(EventKind::import, entry.ino, parent, name);
    if (auto s = tx.add(Counter::misses, 1); !s) return s;
    return tx.log(EventKind::populate, entry.ino, parent, name);
}

Status add_file_to_entry(Tx& tx, Ino entry_ino, const Inode& file, int sign) {
    auto entry = KCACHE_TRY(tx.entry(entry_ino));
    std::uint64_t stored = 0;
    if (!file.digest.empty()) {
        auto ref = KCACHE_TRY(tx.blob_ref(file.digest));
        if (ref) stored = records::file_footprint(*ref);
    }
    auto apply = [sign](std::uint64_t& value, std::uint64_t delta) {
        value = sign > 0 ? value + delta : (value > delta ? value - delta : 0);
    };
    apply(entry.files, 1);
    apply(entry.bytes, file.size);
    apply(entry.stored_bytes, stored);
    if (entry.files == 0) entry.populated = false;  // empty again: the next store is a miss
    if (sign > 0 && entry.producer == Producer::unknown) entry.producer = producer_of(file.name);
    return tx.put_entry(entry);
}

namespace {

// The entry of `node`, whose content was just replaced (it had `old_size` bytes taking
// `old_stored` in blobs; now `ref` holds it), follows: the file stays in its entry, only
// its bytes change; the store populates the entry (a miss) unless the file is
// bookkeeping, and moves it in the LRU.
Status account_write(Tx& tx, const Inode& node, std::uint64_t old_size, std::uint64_t old_stored,
                     const records::BlobRef& ref, const Origin& origin) {
    auto entry = KCACHE_TRY(tx.entry(node.entry));
    entry.bytes = entry.bytes + node.size - std::min<std::uint64_t>(entry.bytes, old_size);
    entry.stored_bytes = entry.stored_bytes + records::file_footprint(ref) -
                         std::min(entry.stored_bytes, old_stored);
    if (entry.producer == Producer::unknown) entry.producer = producer_of(node.name);
    // Absent or empty until now: this store is the miss. Temp files and locks are not.
    if (!node.bookkeeping) KCACHE_TRY(populate(tx, entry, origin));
    KCACHE_TRY(move_in_lru(tx, entry, tx.now()));
    return tx.put_entry(entry);
}

}  // namespace

Result<Attr> write_file(Tx& tx, Inode& node, std::string_view content,
                        const ContentDigests& digests, const Origin& origin) {
    if (content.size() > kMaxFileSize) {
        return fail(EFBIG, fmt::format("content of {} bytes is over the limit of {}",
                                       content.size(), kMaxFileSize));
    }
    std::uint64_t old_stored = 0;
    if (!node.digest.empty()) {
        auto old_ref = KCACHE_TRY(tx.blob_ref(node.digest));
        if (old_ref) old_stored = records::file_footprint(*old_ref);
    }
    const auto stored = KCACHE_TRY(store_content(tx, node, content, digests));
    const std::uint64_t old_size = node.size;
    node.digest = stored.address;
    node.size = content.size();
    node.mtime_ns = node.ctime_ns = tx.now();
    KCACHE_TRY(tx.put_inode(node));
    KCACHE_TRY(tx.add(Counter::bytes, static_cast<std::int64_t>(content.size()) -
                                          static_cast<std::int64_t>(old_size)));
    KCACHE_TRY(tx.add(Counter::stores, 1));
    KCACHE_TRY(tx.add(Counter::bytes_written, static_cast<std::int64_t>(content.size())));
    if (node.entry) KCACHE_TRY(account_write(tx, node, old_size, old_stored, stored.ref, origin));
    return node.attr();
}

Status drop_entry_record(Tx& tx, Ino entry_ino, EventKind why, Ino parent, std::string_view name) {
    auto entry = KCACHE_TRY(tx.find_entry_record(entry_ino));
    if (!entry) return {};
    if (auto s = tx.del(tx.db.entries, records::u64_key(entry_ino)); !s) return s;
    if (!entry->pinned) {
        if (auto s = tx.del(tx.db.lru, records::lru_key(entry->last_access_ns, entry_ino)); !s)
            return s;
    }
    if (entry->kind == EntryKind::stem && tx.db.has_stems) {
        if (auto s = tx.del(tx.db.stems, records::stem_key(entry->parent, entry->stem)); !s)
            return s;
    }
    if (auto s = tx.add(Counter::entries, -1); !s) return s;
    return tx.log(why, entry_ino, parent, name);
}

// After `node` left stem entry `entry_ino` (removed, or moved elsewhere): the entry
// goes when no file of it is left, unless `keep` (a rename replaces its file).
Status left_stem_entry(Tx& tx, Ino entry_ino, const Inode& node, EventKind why, bool keep) {
    auto entry = KCACHE_TRY(tx.find_entry_record(entry_ino));
    if (!entry || entry->kind != EntryKind::stem) return {};
    // Another process evicted it: the daemon must forget this file's name too.
    if (why == EventKind::evict) {
        if (auto s = tx.log(EventKind::member, entry_ino, node.parent, node.name); !s) return s;
    }
    if (keep) return {};
    bool empty = true;
    auto s = ops::for_each_member(tx, *entry, [&](const Inode&) {
        empty = false;
        return false;
    });
    if (!s) return s;
    if (!empty) return {};
    return ops::drop_entry_record(tx, entry_ino, why, entry->parent, entry->stem);
}

Result<bool> entry_in_flight(const Tx& tx, Ino entry_ino) {
    if (no_leases(tx)) return false;  // the common case costs one stat
    auto entry = KCACHE_TRY(tx.entry(entry_ino));
    std::vector<Ino> work;
    KCACHE_TRY(ops::for_each_member(tx, entry, [&](const Inode& member) {
        work.push_back(member.ino);
        return true;
    }));
    while (!work.empty()) {
        const Ino ino = work.back();
        work.pop_back();
        auto live = file_in_flight(tx, ino);
        if (!live) return live;
        if (*live) return true;
        auto children = KCACHE_TRY(tx.children(ino));
        for (const auto& [name, d] : children) work.push_back(d.child);
    }
    return false;
}

Status move_in_lru(Tx& tx, EntryInfo& entry, std::int64_t new_time) {
    if (!entry.pinned && new_time != entry.last_access_ns) {
        if (auto s = tx.del(tx.db.lru, records::lru_key(entry.last_access_ns, entry.ino)); !s)
            return s;
        if (auto s = tx.put(tx.db.lru, records::lru_key(new_time, entry.ino), {}); !s) return s;
    }
    entry.last_access_ns = new_time;
    return {};
}

Status log_updates(Tx& tx) {
    if (!tx.write || tx.write->written_entries.empty()) return {};
    std::vector<Ino> written = std::move(tx.write->written_entries);
    tx.write->written_entries.clear();
    std::sort(written.begin(), written.end());
    written.erase(std::unique(written.begin(), written.end()), written.end());
    std::vector<Ino> logged = tx.write->logged_entries;
    std::sort(logged.begin(), logged.end());
    for (Ino ino : written) {
        if (std::binary_search(logged.begin(), logged.end(), ino)) continue;
        auto entry = KCACHE_TRY(tx.find_entry_record(ino));
        if (!entry) continue;  // dropped again later in the transaction
        const auto [parent, name] = event_target(tx, *entry);
        if (auto s = tx.log(EventKind::update, ino, parent, name); !s) return s;
    }
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

Result<EntryInfo> Txn::entry(Ino entry) const {
    return TxnAccess::tx(*this).entry(entry);
}

Status Txn::for_each_entry(const std::function<bool(const EntryInfo&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    return tx.scan_checked(
        tx.db.entries, {}, {}, [&](std::string_view key, std::string_view value) -> Result<bool> {
            return fn(KCACHE_TRY(records::decode_entry(records::u64_from_key(key), value)));
        });
}

Status Txn::for_each_lru(const std::function<bool(const EntryInfo&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    return tx.scan_checked(
        tx.db.lru, {}, {}, [&](std::string_view key, std::string_view) -> Result<bool> {
            return fn(KCACHE_TRY(tx.entry(records::u64_from_key(key.substr(8)))));
        });
}

Result<bool> Txn::in_flight(Ino entry) const {
    return ops::entry_in_flight(TxnAccess::tx(*this), entry);
}

// ---- writes -------------------------------------------------------------------------

Result<Attr> WriteTxn::write(Ino file, std::string_view content, const Origin& origin) {
    Tx tx = TxnAccess::tx(*this);
    auto node = KCACHE_TRY(ops::writable_file(tx, file));
    if (content.size() > kMaxFileSize) {  // before hashing it
        return fail(EFBIG, fmt::format("content of {} bytes is over the limit of {}",
                                       content.size(), kMaxFileSize));
    }
    return ops::write_file(tx, node, content, ops::digests_of(content), origin);
}

Status WriteTxn::begin_write(Ino file) {
    Tx tx = TxnAccess::tx(*this);
    KCACHE_TRY(regular_file(tx, file));
    return change_lease(tx, file, +1);
}

Status WriteTxn::end_write(Ino file) {
    Tx tx = TxnAccess::tx(*this);
    return change_lease(tx, file, -1);  // the file may be gone already: then a no-op
}

Status WriteTxn::record_hit(Ino entry_ino) {
    Tx tx = TxnAccess::tx(*this);
    auto entry = KCACHE_TRY(tx.entry(entry_ino));
    const std::int64_t now = tx.now();
    ++entry.hits;
    entry.last_hit_ns = now;
    if (auto s = ops::move_in_lru(tx, entry, now); !s) return s;
    if (auto s = tx.put_entry(entry); !s) return s;
    if (auto s = tx.add(Counter::hits, 1); !s) return s;
    if (is_fleet_entry(entry)) {
        if (auto s = tx.add(Counter::hits_fleet, 1); !s) return s;
    }
    const auto [parent, name] = ops::event_target(tx, entry);
    return tx.log(EventKind::hit, entry_ino, parent, name);
}

Status WriteTxn::set_pinned(Ino entry_ino, bool pinned) {
    Tx tx = TxnAccess::tx(*this);
    auto entry = KCACHE_TRY(tx.entry(entry_ino));
    if (entry.pinned == pinned) return {};
    const std::string key = records::lru_key(entry.last_access_ns, entry_ino);
    // Pinned entries leave the LRU index, so eviction never even looks at them.
    if (auto s = pinned ? tx.del(tx.db.lru, key) : tx.put(tx.db.lru, key, {}); !s) return s;
    entry.pinned = pinned;
    if (auto s = tx.put_entry(entry); !s) return s;
    const auto [parent, name] = ops::event_target(tx, entry);
    return tx.log(pinned ? EventKind::pin : EventKind::unpin, entry_ino, parent, name);
}

}  // namespace kcache::core
