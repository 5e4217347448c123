// Tx: raw and typed access to the tables inside one LMDB transaction.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
using records::Inode;

// ---- Tx: raw access ---------------------------------------------------------------

Result<std::optional<std::string_view>> Tx::get(MDB_dbi dbi, std::string_view key) const {
    MDB_val k = lmdb::val(key), v{};
    const int rc = mdb_get(txn, dbi, &k, &v);
    if (rc == MDB_NOTFOUND) return std::optional<std::string_view>{};
    if (rc != 0) return tl::unexpected(lmdb::error(rc, fmt::format("db {}: read", db.path)));
    return std::optional<std::string_view>{lmdb::view(v)};
}

tl::unexpected<Error> Tx::storage_error(int rc, std::string_view what) {
    Error e = lmdb::error(rc, fmt::format("db {}: {}", db.path, what));
    if (write && !write->poisoned) write->poisoned = e;
    return tl::unexpected(std::move(e));
}

Status Tx::put(MDB_dbi dbi, std::string_view key, std::string_view value) {
    if (write && write->poisoned) return tl::unexpected(*write->poisoned);
    MDB_val k = lmdb::val(key), v = lmdb::val(value);
    if (const int rc = mdb_put(txn, dbi, &k, &v, 0); rc != 0) return storage_error(rc, "write");
    return {};
}

Result<char*> Tx::reserve(MDB_dbi dbi, std::string_view key, std::size_t size) {
    if (write && write->poisoned) return tl::unexpected(*write->poisoned);
    MDB_val k = lmdb::val(key), v{size, nullptr};
    if (const int rc = mdb_put(txn, dbi, &k, &v, MDB_RESERVE); rc != 0) {
        return storage_error(rc, "write");
    }
    return static_cast<char*>(v.mv_data);
}

Status Tx::del(MDB_dbi dbi, std::string_view key) {
    if (write && write->poisoned) return tl::unexpected(*write->poisoned);
    MDB_val k = lmdb::val(key);
    const int rc = mdb_del(txn, dbi, &k, nullptr);
    if (rc != 0 && rc != MDB_NOTFOUND) return storage_error(rc, "delete");
    return {};
}

Status Tx::scan(MDB_dbi dbi, std::string_view prefix, std::string_view start,
                const std::function<bool(std::string_view, std::string_view)>& fn) const {
    lmdb::Cursor cursor;
    if (const int rc = cursor.open(txn, dbi); rc != 0) {
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: cursor", db.path)));
    }
    std::string from(start.size() < prefix.size() ? prefix : start);
    MDB_val k = lmdb::val(from), v{};
    int rc = mdb_cursor_get(cursor.get(), &k, &v, from.empty() ? MDB_FIRST : MDB_SET_RANGE);
    while (rc == 0) {
        const std::string_view key = lmdb::view(k);
        if (key.substr(0, prefix.size()) != prefix) break;
        if (!fn(key, lmdb::view(v))) return {};
        rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_NEXT);
    }
    if (rc != 0 && rc != MDB_NOTFOUND) {
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: scan", db.path)));
    }
    return {};
}

Status Tx::scan_checked(
    MDB_dbi dbi, std::string_view prefix, std::string_view start,
    const std::function<Result<bool>(std::string_view, std::string_view)>& fn) const {
    Status result;
    KCACHE_TRY(scan(dbi, prefix, start, [&](std::string_view key, std::string_view value) {
        auto more = fn(key, value);
        if (!more) result = tl::unexpected(std::move(more.error()));
        return more && *more;
    }));
    return result;
}

// ---- Tx: typed access ---------------------------------------------------------------

Result<Inode> Tx::inode(Ino ino) const {
    auto bytes = KCACHE_TRY(get(db.inodes, records::u64_key(ino)));
    if (!bytes) return fail(ENOENT, fmt::format("no inode {}", ino));
    return records::decode_inode(ino, *bytes);
}

Status Tx::put_inode(const Inode& inode) {
    return put(db.inodes, records::u64_key(inode.ino), records::encode(inode));
}

Result<Inode> Tx::directory(Ino ino) const {
    auto dir = inode(ino);
    if (!dir) return dir;
    if (!is_dir(dir->mode)) return fail(ENOTDIR, fmt::format("inode {} is not a directory", ino));
    return dir;
}

Status Tx::touch_dir(Inode& dir, int nlink_delta) {
    dir.mtime_ns = dir.ctime_ns = now();
    dir.nlink = static_cast<std::uint32_t>(static_cast<int>(dir.nlink) + nlink_delta);
    return put_inode(dir);
}

Result<std::optional<records::Dirent>> Tx::child(Ino parent, std::string_view name) const {
    auto bytes = KCACHE_TRY(get(db.dirents, records::dirent_key(parent, name)));
    if (!bytes) return std::optional<records::Dirent>{};
    auto d = KCACHE_TRY(records::decode_dirent(*bytes));
    return std::optional<records::Dirent>{d};
}

Result<bool> Tx::has_children(Ino dir) const {
    bool any = false;
    const std::string prefix = records::u64_key(dir);
    KCACHE_TRY(scan(db.dirents, prefix, prefix, [&](std::string_view, std::string_view) {
        any = true;
        return false;
    }));
    return any;
}

Result<std::vector<std::pair<std::string, records::Dirent>>> Tx::children(Ino dir) const {
    std::vector<std::pair<std::string, records::Dirent>> out;
    const std::string prefix = records::u64_key(dir);
    KCACHE_TRY(scan_checked(db.dirents, prefix, prefix,
                            [&](std::string_view key, std::string_view value) -> Result<bool> {
                                out.emplace_back(key.substr(8),
                                                 KCACHE_TRY(records::decode_dirent(value)));
                                return true;
                            }));
    return out;
}

Result<std::optional<EntryInfo>> Tx::find_entry_record(Ino entry) const {
    auto bytes = KCACHE_TRY(get(db.entries, records::u64_key(entry)));
    if (!bytes) return std::optional<EntryInfo>{};
    auto e = KCACHE_TRY(records::decode_entry(entry, *bytes));
    return std::optional<EntryInfo>{std::move(e)};
}

Result<EntryInfo> Tx::entry(Ino entry) const {
    auto e = KCACHE_TRY(find_entry_record(entry));
    if (!e) return fail(ENOENT, fmt::format("no entry with inode {}", entry));
    return std::move(*e);
}

Status Tx::put_entry(const EntryInfo& entry) {
    if (write) write->written_entries.push_back(entry.ino);
    return put(db.entries, records::u64_key(entry.ino), records::encode(entry));
}

Result<std::optional<records::BlobRef>> Tx::blob_ref(const Digest& digest) const {
    auto bytes = KCACHE_TRY(get(db.blob_refs, records::digest_key(digest)));
    if (!bytes) return std::optional<records::BlobRef>{};
    auto r = KCACHE_TRY(records::decode_blob_ref(*bytes));
    return std::optional<records::BlobRef>{r};
}

Result<std::uint64_t> Tx::counter(Counter c) const {
    auto bytes = KCACHE_TRY(get(db.stats, records::counter_key(c)));
    if (!bytes) return std::uint64_t{0};
    return records::decode_u64(*bytes, "statistics");
}

Status Tx::add(Counter c, std::int64_t delta) {
    if (delta == 0) return {};
    auto value = KCACHE_TRY(counter(c));
    // Gauges never go below zero, even if a damaged db under-counted before.
    const std::int64_t next = static_cast<std::int64_t>(value) + delta;
    return put(db.stats, records::counter_key(c),
               records::encode_u64(static_cast<std::uint64_t>(next < 0 ? 0 : next)));
}

Status Tx::log(EventKind kind, Ino entry, Ino parent, std::string_view name) {
    auto next = KCACHE_TRY(get(db.meta, kMetaNextEvent));
    std::uint64_t seq = 1;
    if (next) {
        auto n = KCACHE_TRY(records::decode_u64(*next, "meta next_event"));
        seq = n;
    }
    if (write && entry != 0) write->logged_entries.push_back(entry);
    Event event{seq, now(), kind, entry, parent, std::string(name)};
    if (auto s = put(db.events, records::u64_key(seq), records::encode(event)); !s) return s;
    if (auto s = put(db.meta, kMetaNextEvent, records::encode_u64(seq + 1)); !s) return s;
    // Trim from the oldest end so the log keeps config.max_events records.
    if (seq <= config.max_events) return {};
    const std::uint64_t keep_from = seq - config.max_events + 1;
    std::vector<std::string> old;
    auto s = scan(db.events, {}, {}, [&](std::string_view key, std::string_view) {
        if (records::u64_from_key(key) >= keep_from) return false;
        old.emplace_back(key);
        return true;
    });
    if (!s) return s;
    for (const auto& key : old) {
        if (auto d = del(db.events, key); !d) return d;
    }
    return {};
}

Result<Ino> Tx::next_ino() {
    auto next = KCACHE_TRY(get(db.meta, kMetaNextIno));
    if (!next) return fail(EIO, fmt::format("db {}: corrupt meta: no next_ino", db.path));
    auto ino = KCACHE_TRY(records::decode_u64(*next, "meta next_ino"));
    KCACHE_TRY(put(db.meta, kMetaNextIno, records::encode_u64(ino + 1)));
    return ino;
}

Result<std::string> Tx::path_of(Ino ino) const {
    std::vector<std::string> parts;
    for (Ino at = ino; at != kRootIno;) {
        auto node = KCACHE_TRY(inode(at));
        parts.push_back(std::move(node.name));
        if (parts.size() > kMaxPathLength) return fail(EIO, "corrupt tree: parent cycle");
        at = node.parent;
    }
    std::string path;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (!path.empty()) path.push_back('/');
        path.append(*it);
    }
    return path;
}

}  // namespace kcache::core
