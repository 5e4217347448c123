// Store: opening the environment, transactions, raw and typed record access,
// statistics, events and configuration.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <xxhash.h>

#include "kcache/core/layout.hpp"
#include "kcache/core/units.hpp"
#include "store_impl.hpp"

namespace kcache::core {
namespace fs = std::filesystem;
using records::Inode;

// ---- small public helpers -------------------------------------------------------

std::int64_t system_clock_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string Digest::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

namespace {
Digest from_xxh(XXH128_hash_t h) {
    Digest d{h.high64, h.low64};
    if (d.empty()) d.low = 1;  // all-zero is reserved for empty content
    return d;
}
// Separates segment-list digests from flat ones: a small file that holds some big
// file's segment list does not share its digest (and so its blob).
constexpr XXH64_hash_t kSegmentListSeed = 0x6b63616368655347;  // "kcacheSG"
}  // namespace

Digest flat_digest_of(std::string_view bytes) {
    if (bytes.empty()) return {};
    return from_xxh(XXH3_128bits(bytes.data(), bytes.size()));
}

Digest digest_of_segments(const std::vector<Digest>& segments) {
    std::string list;
    list.reserve(segments.size() * 16);
    for (const Digest& d : segments) list += records::digest_key(d);
    return from_xxh(XXH3_128bits_withSeed(list.data(), list.size(), kSegmentListSeed));
}

Digest digest_of(std::string_view bytes) {
    if (bytes.size() < kSegmentedSize) return flat_digest_of(bytes);
    std::vector<Digest> segments;
    segments.reserve(segment_count(bytes.size()));
    for (std::uint64_t at = 0; at < bytes.size(); at += kSegmentSize) {
        segments.push_back(flat_digest_of(bytes.substr(at, kSegmentSize)));
    }
    return digest_of_segments(segments);
}

FileType Attr::type() const {
    switch (mode & S_IFMT) {
        case S_IFDIR: return FileType::directory;
        case S_IFLNK: return FileType::symlink;
        default: return FileType::regular;
    }
}

std::string_view counter_name(Counter c) {
    switch (c) {
        case Counter::hits: return "hits";
        case Counter::misses: return "misses";
        case Counter::stores: return "stores";
        case Counter::negative_lookups: return "negative_lookups";
        case Counter::opens: return "opens";
        case Counter::bytes_read: return "bytes_read";
        case Counter::bytes_written: return "bytes_written";
        case Counter::evicted_entries: return "evicted_entries";
        case Counter::evicted_bytes: return "evicted_bytes";
        case Counter::dedup_hits: return "dedup_hits";
        case Counter::errors_nospc: return "errors_nospc";
        case Counter::errors_io: return "errors_io";
        case Counter::errors_other: return "errors_other";
        case Counter::imported_entries: return "imported_entries";
        case Counter::remote_hits: return "remote_hits";
        case Counter::remote_misses: return "remote_misses";
        case Counter::remote_errors: return "remote_errors";
        case Counter::remote_timeouts: return "remote_timeouts";
        case Counter::remote_corrupt: return "remote_corrupt";
        case Counter::remote_dangling: return "remote_dangling";
        case Counter::remote_bytes_up: return "remote_bytes_up";
        case Counter::remote_bytes_down: return "remote_bytes_down";
        case Counter::remote_uploads: return "remote_uploads";
        case Counter::remote_upload_skipped: return "remote_upload_skipped";
        case Counter::remote_upload_queued: return "remote_upload_queued";
        case Counter::remote_upload_dropped: return "remote_upload_dropped";
        case Counter::entries: return "entries";
        case Counter::bytes: return "bytes";
        case Counter::stored_bytes: return "stored_bytes";
        case Counter::blobs: return "blobs";
        case Counter::files: return "files";
        case Counter::blob_raw_bytes: return "blob_raw_bytes";
    }
    return "unknown";
}

static constexpr Counter kAllCounters[] = {
    Counter::hits, Counter::misses, Counter::stores, Counter::negative_lookups, Counter::opens,
    Counter::bytes_read, Counter::bytes_written, Counter::evicted_entries,
    Counter::evicted_bytes, Counter::dedup_hits, Counter::errors_nospc, Counter::errors_io,
    Counter::errors_other, Counter::imported_entries, Counter::remote_hits,
    Counter::remote_misses, Counter::remote_errors, Counter::remote_timeouts,
    Counter::remote_corrupt, Counter::remote_dangling, Counter::remote_bytes_up,
    Counter::remote_bytes_down, Counter::remote_uploads, Counter::remote_upload_skipped,
    Counter::remote_upload_queued, Counter::remote_upload_dropped, Counter::entries, Counter::bytes,
    Counter::stored_bytes, Counter::blobs, Counter::files, Counter::blob_raw_bytes,
};

std::string_view event_kind_name(EventKind k) {
    switch (k) {
        case EventKind::populate: return "populate";
        case EventKind::hit: return "hit";
        case EventKind::evict: return "evict";
        case EventKind::pin: return "pin";
        case EventKind::unpin: return "unpin";
        case EventKind::remove: return "remove";
        case EventKind::rename: return "rename";
        case EventKind::import: return "import";
        case EventKind::reset: return "reset";
        case EventKind::member: return "member";
    }
    return "unknown";
}

std::uint64_t Stats::get(Counter c) const {
    auto it = values.find(c);
    return it == values.end() ? 0 : it->second;
}

Content Content::view(std::string_view bytes) {
    Content c;
    c.m_view = bytes;
    return c;
}

Content Content::owned(std::string bytes) {
    Content c;
    c.m_is_owned = true;
    c.m_owned = std::move(bytes);
    return c;
}

Origin Origin::current() {
    Origin o;
    o.pid = static_cast<std::uint32_t>(getpid());
    std::ifstream comm("/proc/self/comm");
    std::getline(comm, o.name);
    return o;
}

std::string default_db_path() {
    if (const char* db = std::getenv("KCACHE_DB"); db && *db) return db;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
        return std::string(xdg) + "/kcache/db";
    }
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.cache/kcache/db";
}

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

// ---- Tx: typed access ---------------------------------------------------------------

Result<Inode> Tx::inode(Ino ino) const {
    auto bytes = get(db.inodes, records::u64_key(ino));
    if (!bytes) return tl::unexpected(bytes.error());
    if (!*bytes) return fail(ENOENT, fmt::format("no inode {}", ino));
    return records::decode_inode(ino, **bytes);
}

Status Tx::put_inode(const Inode& inode) {
    return put(db.inodes, records::u64_key(inode.ino), records::encode(inode));
}

Result<std::optional<records::Dirent>> Tx::child(Ino parent, std::string_view name) const {
    auto bytes = get(db.dirents, records::dirent_key(parent, name));
    if (!bytes) return tl::unexpected(bytes.error());
    if (!*bytes) return std::optional<records::Dirent>{};
    auto d = records::decode_dirent(**bytes);
    if (!d) return tl::unexpected(d.error());
    return std::optional<records::Dirent>{*d};
}

Result<bool> Tx::has_children(Ino dir) const {
    bool any = false;
    const std::string prefix = records::u64_key(dir);
    auto s = scan(db.dirents, prefix, prefix, [&](std::string_view, std::string_view) {
        any = true;
        return false;
    });
    if (!s) return tl::unexpected(s.error());
    return any;
}

Result<std::vector<std::pair<std::string, records::Dirent>>> Tx::children(Ino dir) const {
    std::vector<std::pair<std::string, records::Dirent>> out;
    Status result;
    const std::string prefix = records::u64_key(dir);
    auto s = scan(db.dirents, prefix, prefix, [&](std::string_view key, std::string_view value) {
        auto d = records::decode_dirent(value);
        if (!d) {
            result = tl::unexpected(d.error());
            return false;
        }
        out.emplace_back(key.substr(8), *d);
        return true;
    });
    if (!s) return tl::unexpected(s.error());
    if (!result) return tl::unexpected(result.error());
    return out;
}

Result<std::optional<EntryInfo>> Tx::find_entry_record(Ino entry) const {
    auto bytes = get(db.entries, records::u64_key(entry));
    if (!bytes) return tl::unexpected(bytes.error());
    if (!*bytes) return std::optional<EntryInfo>{};
    auto e = records::decode_entry(entry, **bytes);
    if (!e) return tl::unexpected(e.error());
    return std::optional<EntryInfo>{std::move(*e)};
}

Result<EntryInfo> Tx::entry(Ino entry) const {
    auto e = find_entry_record(entry);
    if (!e) return tl::unexpected(e.error());
    if (!*e) return fail(ENOENT, fmt::format("no entry with inode {}", entry));
    return std::move(**e);
}

Status Tx::put_entry(const EntryInfo& entry) {
    return put(db.entries, records::u64_key(entry.ino), records::encode(entry));
}

Result<std::optional<records::BlobRef>> Tx::blob_ref(const Digest& digest) const {
    auto bytes = get(db.blob_refs, records::digest_key(digest));
    if (!bytes) return tl::unexpected(bytes.error());
    if (!*bytes) return std::optional<records::BlobRef>{};
    auto r = records::decode_blob_ref(**bytes);
    if (!r) return tl::unexpected(r.error());
    return std::optional<records::BlobRef>{*r};
}

Result<std::uint64_t> Tx::counter(Counter c) const {
    auto bytes = get(db.stats, records::counter_key(c));
    if (!bytes) return tl::unexpected(bytes.error());
    if (!*bytes) return std::uint64_t{0};
    return records::decode_u64(**bytes, "statistics");
}

Status Tx::add(Counter c, std::int64_t delta) {
    if (delta == 0) return {};
    auto value = counter(c);
    if (!value) return tl::unexpected(value.error());
    // Gauges never go below zero, even if a damaged db under-counted before.
    const std::int64_t next = static_cast<std::int64_t>(*value) + delta;
    return put(db.stats, records::counter_key(c),
               records::encode_u64(static_cast<std::uint64_t>(next < 0 ? 0 : next)));
}

Status Tx::log(EventKind kind, Ino entry, Ino parent, std::string_view name) {
    auto next = get(db.meta, kMetaNextEvent);
    if (!next) return tl::unexpected(next.error());
    std::uint64_t seq = 1;
    if (*next) {
        auto n = records::decode_u64(**next, "meta next_event");
        if (!n) return tl::unexpected(n.error());
        seq = *n;
    }
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
    auto next = get(db.meta, kMetaNextIno);
    if (!next) return tl::unexpected(next.error());
    if (!*next) return fail(EIO, fmt::format("db {}: corrupt meta: no next_ino", db.path));
    auto ino = records::decode_u64(**next, "meta next_ino");
    if (!ino) return tl::unexpected(ino.error());
    if (auto s = put(db.meta, kMetaNextIno, records::encode_u64(*ino + 1)); !s) {
        return tl::unexpected(s.error());
    }
    return *ino;
}

Result<std::string> Tx::path_of(Ino ino) const {
    std::vector<std::string> parts;
    for (Ino at = ino; at != kRootIno;) {
        auto node = inode(at);
        if (!node) return tl::unexpected(node.error());
        parts.push_back(std::move(node->name));
        if (parts.size() > kMaxPathLength) return fail(EIO, "corrupt tree: parent cycle");
        at = node->parent;
    }
    std::string path;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (!path.empty()) path.push_back('/');
        path.append(*it);
    }
    return path;
}

// ---- opening ----------------------------------------------------------------------

Store::Impl::~Impl() {
    if (env) mdb_env_close(env);
    if (lock_fd >= 0) close(lock_fd);
}

namespace {

// Environments open in this process, by the db directory's (device, inode).
struct Registry {
    std::mutex mutex;
    std::unordered_map<std::string, std::weak_ptr<Store::Impl>> open;
};
Registry& registry() {
    static Registry r;
    return r;
}

unsigned durability_flags(Durability d) {
    switch (d) {
        case Durability::full: return 0;
        case Durability::no_meta_sync: return MDB_NOMETASYNC;
        case Durability::none: return MDB_NOSYNC;
    }
    return 0;
}

// A size as people write it ("1T" is a tebibyte); a value that is not one is an
// error rather than a silently different reservation.
Result<std::uint64_t> requested_map_size(const OpenOptions& options) {
    if (options.map_size) return options.map_size;
    if (const char* env = std::getenv("KCACHE_MAP_SIZE"); env && *env) {
        auto v = parse_size(env);
        if (!v) return tl::unexpected(with_context(v.error(), "KCACHE_MAP_SIZE"));
        if (*v) return *v;
    }
    return kDefaultMapSize;
}

bool denied(int code) { return code == EACCES || code == EROFS || code == EPERM; }

// Opens the LMDB environment at `path`, read-write when the filesystem allows it
// even for a read-only Store (read-only is enforced by Store::write), so that one
// environment can serve every Store of the process. Only where writing is denied
// (a read-only filesystem or directory) is it opened MDB_RDONLY.
int open_lmdb(MDB_env** env, const OpenOptions& options, std::uint64_t map_size, bool read_only) {
    if (const int rc = mdb_env_create(env); rc != 0) return rc;
    mdb_env_set_maxdbs(*env, 16);
    mdb_env_set_maxreaders(*env, options.max_readers);
    // MDB_NORDAHEAD even for read-only opens: with kernel readahead each cold page
    // fault reads up to 128 KiB around it, which on a 20,000-entry db (1.4 GB) loading
    // 300 random entries read 2.1 MiB per entry and doubled the cold load time
    // (bench/README.md, loader section). Multi-chunk blob reads ask for their own
    // pages instead (prefetch in content.cpp).
    const unsigned flags = MDB_NOTLS | MDB_NORDAHEAD | durability_flags(options.durability) |
                           (read_only ? MDB_RDONLY : 0);
    // The map is address space, not disk. Where the reservation cannot be had
    // (ulimit -v, valgrind), fall back to smaller ones down to 1 GiB.
    int rc = ENOMEM;
    for (std::uint64_t size = map_size;; size /= 2) {
        mdb_env_set_mapsize(*env, size);
        rc = mdb_env_open(*env, options.path.c_str(), flags, 0644);
        if (rc != ENOMEM || size / 2 < (1ull << 30)) break;
    }
    if (rc != 0) {
        mdb_env_close(*env);  // a failed open leaves the handle unusable
        *env = nullptr;
    }
    return rc;
}

Result<std::shared_ptr<Store::Impl>> open_env(const OpenOptions& options) {
    const std::string& path = options.path;
    auto impl = std::make_shared<Store::Impl>();
    impl->path = path;

    // Every user of a db holds kcache.lock shared; compaction holds it exclusively.
    const std::string lock_path = path + "/kcache.lock";
    impl->lock_fd = ::open(lock_path.c_str(), (options.read_only ? O_RDWR : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    if (impl->lock_fd < 0 && options.read_only && denied(errno)) {
        impl->lock_fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (impl->lock_fd < 0 && options.read_only && errno == ENOENT) {
        return fail(ENOENT, fmt::format("no kcache db at {} (no kcache.lock)", path));
    }
    if (impl->lock_fd < 0 && errno == EROFS) {
        return fail(EROFS, fmt::format("db {} is on a read-only filesystem: it can only be opened read-only", path));
    }
    if (impl->lock_fd < 0) {
        return fail(errno, fmt::format("db {}: cannot open kcache.lock: {}", path, std::strerror(errno)));
    }
    if (flock(impl->lock_fd, LOCK_SH | LOCK_NB) != 0) {
        return fail(EBUSY, fmt::format("db {}: locked by a compaction in progress", path));
    }

    auto map_size = requested_map_size(options);
    if (!map_size) return tl::unexpected(map_size.error());
    int rc = open_lmdb(&impl->env, options, *map_size, false);
    if (rc != 0 && options.read_only && denied(rc)) {
        rc = open_lmdb(&impl->env, options, *map_size, true);
        impl->read_only = true;
    }
    if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH || rc == MDB_CORRUPTED) {
        return fail(EIO, fmt::format("db {}: data.mdb is corrupt or not an LMDB database ({})",
                                     path, mdb_strerror(rc)));
    }
    if (rc != 0) return tl::unexpected(lmdb::error(rc, fmt::format("db {}: open", path)));
    int dead = 0;
    mdb_reader_check(impl->env, &dead);
    return impl;
}

struct DbiSpec {
    const char* name;
    MDB_dbi Store::Impl::*member;
};
constexpr DbiSpec kDbis[] = {
    {"inodes", &Store::Impl::inodes},       {"dirents", &Store::Impl::dirents},
    {"blob_refs", &Store::Impl::blob_refs}, {"blob_data", &Store::Impl::blob_data},
    {"entries", &Store::Impl::entries},     {"lru", &Store::Impl::lru},
    {"leases", &Store::Impl::leases},       {"stats", &Store::Impl::stats},
    {"events", &Store::Impl::events},       {"meta", &Store::Impl::meta},
};

// Opens the named databases and, for a new db, writes the meta records and root.
Status init_schema(Store& store, const OpenOptions& options) {
    Store::Impl& impl = store.impl();
    MDB_txn* txn = nullptr;
    const bool ro = impl.read_only;  // the environment itself is read-only
    if (int rc = mdb_txn_begin(impl.env, nullptr, ro ? MDB_RDONLY : 0, &txn); rc != 0) {
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: begin", impl.path)));
    }
    auto abort = [&](Error e) {
        mdb_txn_abort(txn);
        return tl::unexpected(std::move(e));
    };
    for (const auto& spec : kDbis) {
        // Tables are created only for a new db, never added to some other LMDB file.
        const bool may_create = !ro && !options.read_only && options.create;
        const int rc = mdb_dbi_open(txn, spec.name, may_create ? MDB_CREATE : 0, &(impl.*spec.member));
        if (rc == MDB_NOTFOUND) {
            return abort({ENOENT, fmt::format("db {}: not a kcache db (no '{}' table)",
                                              impl.path, spec.name)});
        }
        if (rc != 0) {
            return abort(lmdb::error(rc, fmt::format("db {}: open table {}", impl.path, spec.name)));
        }
    }
    Config defaults;
    defaults.entry_depth = options.entry_depth ? options.entry_depth : 1;
    defaults.max_bytes = kDefaultMaxBytes;  // a new cache is bounded; `kcache config` changes it
    WriteState state;
    Tx tx(store, txn, defaults, ro ? nullptr : &state);
    auto schema = tx.get(impl.meta, kMetaSchema);
    if (!schema) return abort(schema.error());
    if (*schema) {
        auto version = records::decode_u64(**schema, "meta schema");
        if (!version) return abort(with_context(version.error(), "db " + impl.path));
        if (*version > kSchemaVersion) {
            return abort({ENOTSUP, fmt::format("db {}: schema {} is newer than this kcache "
                                               "supports ({})", impl.path, *version,
                                               kSchemaVersion)});
        }
        // Schema 1 had no stem entries: the table is added (and the version raised)
        // by the first process that opens the db for writing.
        const bool writable = !ro && !options.read_only;
        const int stems_rc = mdb_dbi_open(txn, "stems", *version < 2 && writable ? MDB_CREATE : 0, &impl.stems);
        if (stems_rc != 0 && stems_rc != MDB_NOTFOUND) {
            return abort(lmdb::error(stems_rc, fmt::format("db {}: open table stems", impl.path)));
        }
        impl.has_stems = stems_rc == 0;
        if (*version < kSchemaVersion && writable) {
            if (auto s = tx.put(impl.meta, kMetaSchema, records::encode_u64(kSchemaVersion)); !s) {
                return abort(s.error());
            }
        }
        // Commit, not abort: aborting would close the table handles opened here.
        if (int rc = mdb_txn_commit(txn); rc != 0) {
            return tl::unexpected(lmdb::error(rc, fmt::format("db {}: open", impl.path)));
        }
        return {};
    }
    if (ro || options.read_only || !options.create) {
        return abort({ENOENT, fmt::format("db {}: not a kcache db (no schema)", impl.path)});
    }
    if (int rc = mdb_dbi_open(txn, "stems", MDB_CREATE, &impl.stems); rc != 0) {
        return abort(lmdb::error(rc, fmt::format("db {}: create table stems", impl.path)));
    }
    impl.has_stems = true;
    const std::int64_t now = store.now_ns();
    Inode root;
    root.ino = kRootIno;
    root.mode = S_IFDIR | 0755;
    root.uid = getuid();
    root.gid = getgid();
    root.nlink = 2;
    root.atime_ns = root.mtime_ns = root.ctime_ns = now;
    root.parent = kRootIno;
    Status s = tx.put(impl.meta, kMetaSchema, records::encode_u64(kSchemaVersion));
    if (s) s = tx.put(impl.meta, kMetaConfig, records::encode(defaults));
    if (s) s = tx.put(impl.meta, kMetaNextIno, records::encode_u64(kRootIno + 1));
    if (s) s = tx.put(impl.meta, kMetaCreated, records::encode_u64(static_cast<std::uint64_t>(now)));
    if (s) s = tx.put_inode(root);
    if (!s) return abort(s.error());
    if (int rc = mdb_txn_commit(txn); rc != 0) {
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: create", impl.path)));
    }
    return {};
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const OpenOptions& options) {
    if (options.path.empty()) return fail(EINVAL, "no db path given");
    const std::string& path = options.path;
    std::error_code ec;
    if (!fs::exists(path, ec)) {
        if (!options.create || options.read_only) {
            return fail(ENOENT, fmt::format("no kcache db at {}", path));
        }
        fs::create_directories(path, ec);
        if (ec) return fail(ec.value(), fmt::format("db {}: cannot create: {}", path, ec.message()));
    } else if (!fs::is_directory(path, ec)) {
        return fail(ENOTDIR, fmt::format("db {}: not a directory", path));
    }
    if (!options.create && !fs::exists(path + "/data.mdb", ec)) {
        return fail(ENOENT, fmt::format("no kcache db at {} (no data.mdb)", path));
    }

    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) {
        return fail(errno, fmt::format("db {}: {}", path, std::strerror(errno)));
    }
    // Per process: an environment must not be used across fork(), so a forked child
    // opens its own (and its reader slots carry its own pid).
    const std::string key = fmt::format("{}:{}:{}", st.st_dev, st.st_ino, getpid());

    std::unique_ptr<Store> store(new Store());
    store->m_path = path;
    store->m_read_only = options.read_only;
    store->m_clock = options.clock;

    auto& reg = registry();
    std::lock_guard lock(reg.mutex);
    std::shared_ptr<Impl> impl = reg.open[key].lock();
    if (impl && impl->read_only && !options.read_only) {
        // Only where the filesystem denies writing: the environment could not be
        // opened for writing then, and cannot be now.
        return fail(EROFS, fmt::format("db {}: the db is on a read-only filesystem or directory", path));
    }
    const bool fresh = !impl;
    if (fresh) {
        auto opened = open_env(options);
        if (!opened) return tl::unexpected(opened.error());
        impl = std::move(*opened);
    }
    store->m_impl = impl;
    if (fresh) {
        if (auto s = init_schema(*store, options); !s) return tl::unexpected(s.error());
        reg.open[key] = impl;
    }
    return store;
}

Store::~Store() = default;

std::uint64_t Store::data_file_bytes() const {
    struct stat st{};
    if (::stat((m_path + "/data.mdb").c_str(), &st) != 0) return 0;
    return static_cast<std::uint64_t>(st.st_size);
}

Status Store::sync() {
    if (m_read_only) return {};
    if (const int rc = mdb_env_sync(m_impl->env, 1); rc != 0) {
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: sync", m_path)));
    }
    return {};
}

Result<std::uint64_t> Store::clear_stale_readers() {
    int dead = 0;
    if (const int rc = mdb_reader_check(m_impl->env, &dead); rc != 0) {
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: reader check", m_path)));
    }
    return static_cast<std::uint64_t>(dead);
}

// ---- transactions -------------------------------------------------------------------

namespace {

Result<MDB_txn*> begin_txn(Store::Impl& impl, unsigned flags) {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(impl.env, nullptr, flags, &txn);
    if (rc == MDB_MAP_RESIZED) {
        // Another process grew the map beyond ours: adopt its size and retry.
        mdb_env_set_mapsize(impl.env, 0);
        rc = mdb_txn_begin(impl.env, nullptr, flags, &txn);
    }
    if (rc != 0) return tl::unexpected(lmdb::error(rc, fmt::format("db {}: begin", impl.path)));
    return txn;
}

Result<Config> load_config(Store& store, MDB_txn* txn) {
    Config defaults;
    Tx tx(store, txn, defaults, nullptr);
    auto bytes = tx.get(store.impl().meta, kMetaConfig);
    if (!bytes) return tl::unexpected(bytes.error());
    if (!*bytes) return fail(EIO, fmt::format("db {}: corrupt meta: no config", store.path()));
    auto config = records::decode_config(**bytes);
    if (!config) return tl::unexpected(with_context(config.error(), "db " + store.path()));
    return *config;
}

}  // namespace

Txn::Txn(Store* store, MDB_txn* txn) : m_store(store), m_txn(txn) {}

Txn::Txn(Txn&& other) noexcept
    : m_store(other.m_store), m_txn(std::exchange(other.m_txn, nullptr)),
      m_config(other.m_config) {}

Txn& Txn::operator=(Txn&& other) noexcept {
    if (this != &other) {
        if (m_txn) mdb_txn_abort(m_txn);
        m_store = other.m_store;
        m_txn = std::exchange(other.m_txn, nullptr);
        m_config = other.m_config;
    }
    return *this;
}

Txn::~Txn() {
    if (m_txn) mdb_txn_abort(m_txn);
}

const Config& Txn::config() const { return m_config; }
std::uint64_t Txn::id() const { return m_txn ? mdb_txn_id(m_txn) : 0; }

Result<ReadTxn> Store::read() const {
    auto txn = begin_txn(*m_impl, MDB_RDONLY);
    if (!txn) return tl::unexpected(txn.error());
    Txn t(const_cast<Store*>(this), *txn);
    auto config = load_config(*t.m_store, *txn);
    if (!config) return tl::unexpected(config.error());
    t.m_config = *config;
    return t;
}

WriteTxn::WriteTxn(Store* store, MDB_txn* txn)
    : Txn(store, txn), m_state(std::make_unique<WriteState>()) {}
WriteTxn::WriteTxn(WriteTxn&& other) noexcept = default;
WriteTxn& WriteTxn::operator=(WriteTxn&& other) noexcept = default;
WriteTxn::~WriteTxn() = default;

Result<WriteTxn> Store::write() {
    if (m_read_only) return fail(EROFS, fmt::format("db {}: opened read-only", m_path));
    auto txn = begin_txn(*m_impl, 0);
    if (!txn) return tl::unexpected(txn.error());
    WriteTxn t(this, *txn);
    auto config = load_config(*this, *txn);
    if (!config) return tl::unexpected(config.error());
    t.m_config = *config;
    return t;
}

Status WriteTxn::commit() {
    if (!m_txn) return fail(EINVAL, "transaction already ended");
    MDB_txn* txn = std::exchange(m_txn, nullptr);
    if (m_state->poisoned) {
        mdb_txn_abort(txn);
        return tl::unexpected(*m_state->poisoned);
    }
    if (const int rc = mdb_txn_commit(txn); rc != 0) {
        // LMDB reports a short write (what a full filesystem gives) as EIO; tell the
        // caller the truth when the filesystem under the db is out of space.
        struct statvfs fs{};
        if (rc == EIO && statvfs(m_store->path().c_str(), &fs) == 0 &&
            static_cast<std::uint64_t>(fs.f_bavail) * fs.f_bsize < (1u << 20)) {
            return fail(ENOSPC, fmt::format("db {}: commit: no space left on device", m_store->path()));
        }
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: commit", m_store->path())));
    }
    return {};
}

Status Store::update(const std::function<Status(WriteTxn&)>& fn) {
    auto txn = write();
    if (!txn) return tl::unexpected(txn.error());
    if (auto s = fn(*txn); !s) return s;
    return txn->commit();
}

// ---- statistics, events, configuration ------------------------------------------

Result<Stats> Txn::stats() const {
    Tx tx = TxnAccess::tx(*this);
    Stats stats;
    for (Counter c : kAllCounters) stats.values[c] = 0;
    Status s = tx.scan(tx.db.stats, {}, {}, [&](std::string_view key, std::string_view value) {
        if (key.size() != 4 || value.size() != 8) return true;
        std::uint32_t id = 0;
        for (char c : key) id = (id << 8) | static_cast<unsigned char>(c);
        records::Reader r(value);
        stats.values[static_cast<Counter>(id)] = r.u64();
        return true;
    });
    if (!s) return tl::unexpected(s.error());
    auto reset = tx.get(tx.db.meta, kMetaResetTime);
    if (!reset) return tl::unexpected(reset.error());
    if (*reset) {
        auto v = records::decode_u64(**reset, "meta reset_ns");
        if (!v) return tl::unexpected(v.error());
        stats.reset_ns = static_cast<std::int64_t>(*v);
    }
    return stats;
}

Result<std::uint64_t> Txn::counter(Counter c) const { return TxnAccess::tx(*this).counter(c); }

Status Txn::for_each_event(std::uint64_t after_seq,
                           const std::function<bool(const Event&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    Status result;
    Status s = tx.scan(tx.db.events, {}, records::u64_key(after_seq + 1),
                       [&](std::string_view key, std::string_view value) {
                           auto event = records::decode_event(records::u64_from_key(key), value);
                           if (!event) {
                               result = tl::unexpected(event.error());
                               return false;
                           }
                           return fn(*event);
                       });
    return s ? result : s;
}

Status WriteTxn::add(Counter c, std::uint64_t delta) {
    Tx tx = TxnAccess::tx(*this);
    return tx.add(c, static_cast<std::int64_t>(delta));
}

Status WriteTxn::reset_stats() {
    Tx tx = TxnAccess::tx(*this);
    for (Counter c : kAllCounters) {
        if (is_gauge(c)) continue;
        if (auto s = tx.del(tx.db.stats, records::counter_key(c)); !s) return s;
    }
    const auto now = static_cast<std::uint64_t>(tx.now());
    if (auto s = tx.put(tx.db.meta, kMetaResetTime, records::encode_u64(now)); !s) return s;
    return tx.log(EventKind::reset, 0, 0, {});
}

Status WriteTxn::set_config(const Config& config) {
    Tx tx = TxnAccess::tx(*this);
    if (auto rules = parse_layout_rules(config.layout_rules); !rules) return tl::unexpected(rules.error());
    if (config.entry_depth == 0 || config.entry_depth > 64) {
        return fail(EINVAL, "entry depth must be between 1 and 64");
    }
    if (config.low_mark_percent == 0 || config.low_mark_percent > 100) {
        return fail(EINVAL, "low mark must be between 1 and 100 percent");
    }
    if (config.entry_depth != m_config.entry_depth) {
        auto any = tx.has_children(kRootIno);
        if (!any) return tl::unexpected(any.error());
        if (*any) return fail(EBUSY, "entry depth can only change while the cache is empty");
    }
    if (auto s = tx.put(tx.db.meta, kMetaConfig, records::encode(config)); !s) return s;
    m_config = config;
    return {};
}

}  // namespace kcache::core
