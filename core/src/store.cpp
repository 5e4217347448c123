// Store: opening the environment (the per-process registry, map size, durability),
// the schema and its upgrades, sync and stale readers.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include <fmt/format.h>

#include "kcache/core/units.hpp"
#include "store_impl.hpp"

namespace kcache::core {
namespace fs = std::filesystem;
using records::Inode;

// ---- opening ----------------------------------------------------------------------

Store::Impl::~Impl() {
    if (env) mdb_env_close(env);
    if (lock_fd >= 0) close(lock_fd);
}

namespace {

// Environments open in this process, by the db directory's (device, inode).
struct Registry {
    Mutex mutex;  // held across an environment's opening: a second open waits for it
    std::unordered_map<std::string, std::weak_ptr<Store::Impl>> open GUARDED_BY(mutex);
};
Registry& registry() {
    static Registry r;
    return r;
}

unsigned durability_flags(Durability d) {
    switch (d) {
        case Durability::full:
            return 0;
        case Durability::no_meta_sync:
            return MDB_NOMETASYNC;
        case Durability::none:
            return MDB_NOSYNC;
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

bool denied(int code) {
    return code == EACCES || code == EROFS || code == EPERM;
}

// Opens the LMDB environment at `path`, read-write when the filesystem allows it
// even for a read-only Store (read-only is enforced by Store::write), so that one
// environment can serve every Store of the process. Only where writing is denied
// (a read-only filesystem or directory) is it opened MDB_RDONLY.
int open_lmdb(MDB_env** env, const OpenOptions& options, std::uint64_t map_size, bool read_only) {
    if (const int rc = mdb_env_create(env); rc != 0) return rc;
    mdb_env_set_maxdbs(*env, 32);
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
    impl->lock_fd = ::open(lock_path.c_str(),
                           (options.read_only ? O_RDWR : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    if (impl->lock_fd < 0 && options.read_only && denied(errno)) {
        impl->lock_fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (impl->lock_fd < 0 && options.read_only && errno == ENOENT) {
        return fail(ENOENT, fmt::format("no kcache db at {} (no kcache.lock)", path));
    }
    if (impl->lock_fd < 0 && errno == EROFS) {
        return fail(
            EROFS,
            fmt::format("db {} is on a read-only filesystem: it can only be opened read-only",
                        path));
    }
    if (impl->lock_fd < 0) {
        return fail(errno,
                    fmt::format("db {}: cannot open kcache.lock: {}", path, std::strerror(errno)));
    }
    if (flock(impl->lock_fd, LOCK_SH | LOCK_NB) != 0) {
        return fail(EBUSY, fmt::format("db {}: locked by a compaction in progress", path));
    }

    auto map_size = KCACHE_TRY(requested_map_size(options));
    int rc = open_lmdb(&impl->env, options, map_size, false);
    if (rc != 0 && options.read_only && denied(rc)) {
        rc = open_lmdb(&impl->env, options, map_size, true);
        impl->read_only = true;
    }
    if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH || rc == MDB_CORRUPTED) {
        // kCorruptDb (integrity.hpp) only for damage: an LMDB file of another version is
        // no reason to set a db aside.
        return fail(rc == MDB_VERSION_MISMATCH ? EIO : EUCLEAN,
                    fmt::format("db {}: data.mdb is corrupt or not an LMDB database ({})", path,
                                mdb_strerror(rc)));
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

// The tables of misses.hpp (schema 4): created when `create`, else opened where they
// exist (a db before schema 4 opened read-only has none: has_misses stays false).
Status open_misses_tables(Store::Impl& impl, MDB_txn* txn, bool create) {
    const std::pair<const char*, MDB_dbi Store::Impl::*> tables[] = {
        {"misses", &Store::Impl::misses},
        {"evictions", &Store::Impl::evictions},
        {"families", &Store::Impl::families},
    };
    bool all = true;
    for (const auto& [name, member] : tables) {
        const int rc = mdb_dbi_open(txn, name, create ? MDB_CREATE : 0, &(impl.*member));
        if (rc == MDB_NOTFOUND) {
            all = false;
            continue;
        }
        if (rc != 0) {
            return tl::unexpected(
                lmdb::error(rc, fmt::format("db {}: open table {}", impl.path, name)));
        }
    }
    impl.has_misses = all;
    return {};
}

// Opens table `name` into `dbi`, made if `create`. An existing db opened read-only may
// lack a table a later schema added (`missing_ok`: then false); any other failure is
// an error naming `verb`.
Result<bool> open_table(Store::Impl& impl, MDB_txn* txn, const char* name, MDB_dbi& dbi,
                        bool create, bool missing_ok, std::string_view verb) {
    const int rc = mdb_dbi_open(txn, name, create ? MDB_CREATE : 0, &dbi);
    if (rc == MDB_NOTFOUND && missing_ok) return false;
    if (rc != 0) {
        return tl::unexpected(
            lmdb::error(rc, fmt::format("db {}: {} table {}", impl.path, verb, name)));
    }
    return true;
}

// The tables every schema has (kDbis): created only for a new db, never added to some
// other LMDB file.
Status open_base_tables(Store::Impl& impl, MDB_txn* txn, bool may_create) {
    for (const auto& spec : kDbis) {
        const int rc =
            mdb_dbi_open(txn, spec.name, may_create ? MDB_CREATE : 0, &(impl.*spec.member));
        if (rc == MDB_NOTFOUND) {
            return fail(ENOENT, fmt::format("db {}: not a kcache db (no '{}' table)", impl.path,
                                            spec.name));
        }
        if (rc != 0) {
            return tl::unexpected(
                lmdb::error(rc, fmt::format("db {}: open table {}", impl.path, spec.name)));
        }
    }
    return {};
}

// An existing db of schema `version`: the tables later schemas added are opened, and
// added (with the version raised) by the first process that opens it for writing.
Status upgrade_schema(Store::Impl& impl, MDB_txn* txn, Tx& tx, std::uint64_t version,
                      bool writable) {
    // Schema 1 had no stem entries.
    impl.has_stems = KCACHE_TRY(
        open_table(impl, txn, "stems", impl.stems, version < 2 && writable, true, "open"));
    // Schema 4 added the dicts table, the tables of misses.hpp and the links table.
    impl.has_dicts = KCACHE_TRY(
        open_table(impl, txn, "dicts", impl.dicts, version < 4 && writable, true, "open"));
    KCACHE_TRY(open_misses_tables(impl, txn, version < 4 && writable));
    impl.has_links = KCACHE_TRY(
        open_table(impl, txn, "links", impl.links, version < 4 && writable, true, "open"));
    // The xattrs table (xattrs.hpp) needs no schema change: made by the first
    // process that opens the db for writing, whatever its schema.
    impl.has_xattrs =
        KCACHE_TRY(open_table(impl, txn, "xattrs", impl.xattrs, writable, true, "open"));
    if (version < kSchemaVersion && writable) {
        KCACHE_TRY(tx.put(impl.meta, kMetaSchema, records::encode_u64(kSchemaVersion)));
    }
    return {};
}

// A new db: every table, the meta records (the config `defaults`) and the root.
Status create_schema(Store& store, MDB_txn* txn, Tx& tx, const Config& defaults) {
    Store::Impl& impl = TxnAccess::impl(store);
    impl.has_stems = KCACHE_TRY(open_table(impl, txn, "stems", impl.stems, true, false, "create"));
    impl.has_dicts = KCACHE_TRY(open_table(impl, txn, "dicts", impl.dicts, true, false, "create"));
    KCACHE_TRY(open_misses_tables(impl, txn, true));
    impl.has_links = KCACHE_TRY(open_table(impl, txn, "links", impl.links, true, false, "create"));
    impl.has_xattrs =
        KCACHE_TRY(open_table(impl, txn, "xattrs", impl.xattrs, true, false, "create"));
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
    if (s)
        s = tx.put(impl.meta, kMetaCreated, records::encode_u64(static_cast<std::uint64_t>(now)));
    if (s) s = tx.put_inode(root);
    return s;
}

// Opens the named databases and, for a new db, writes the meta records and root.
Status init_schema(Store& store, const OpenOptions& options) {
    Store::Impl& impl = TxnAccess::impl(store);
    MDB_txn* txn = nullptr;
    const bool ro = impl.read_only;  // the environment itself is read-only
    if (int rc = mdb_txn_begin(impl.env, nullptr, ro ? MDB_RDONLY : 0, &txn); rc != 0) {
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: begin", impl.path)));
    }
    auto abort = [&](Error e) {
        mdb_txn_abort(txn);
        return tl::unexpected(std::move(e));
    };
    if (auto s = open_base_tables(impl, txn, !ro && !options.read_only && options.create); !s)
        return abort(s.error());
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
                                               "supports ({})",
                                               impl.path, *version, kSchemaVersion)});
        }
        if (auto s = upgrade_schema(impl, txn, tx, *version, !ro && !options.read_only); !s)
            return abort(s.error());
        // Commit, not abort: aborting would close the table handles opened here.
        if (int rc = mdb_txn_commit(txn); rc != 0) {
            return tl::unexpected(lmdb::error(rc, fmt::format("db {}: open", impl.path)));
        }
        return {};
    }
    if (ro || options.read_only || !options.create) {
        return abort({ENOENT, fmt::format("db {}: not a kcache db (no schema)", impl.path)});
    }
    if (auto s = create_schema(store, txn, tx, defaults); !s) return abort(s.error());
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
        if (ec)
            return fail(ec.value(), fmt::format("db {}: cannot create: {}", path, ec.message()));
        // Cache contents are code and the db is its owner's alone: on a node shared by
        // users who do not trust each other, no other user reads or writes a db
        // kcache made (docs/operations.md, "A node shared by users"). Who shares one
        // on purpose opens its mode themselves; kcache never changes an existing db's.
        if (::chmod(path.c_str(), 0700) != 0) {
            return fail(errno, fmt::format("db {}: cannot make it private: {}", path,
                                           std::strerror(errno)));
        }
    } else if (!fs::is_directory(path, ec)) {
        return fail(ENOTDIR, fmt::format("db {}: not a directory", path));
    }
    if (!options.create && !fs::exists(path + "/data.mdb", ec)) {
        return fail(ENOENT, fmt::format("no kcache db at {} (no data.mdb)", path));
    }

    struct stat st {};
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
    MutexLock lock(reg.mutex);
    std::shared_ptr<Impl> impl = reg.open[key].lock();
    if (impl && impl->read_only && !options.read_only) {
        // Only where the filesystem denies writing: the environment could not be
        // opened for writing then, and cannot be now.
        return fail(EROFS,
                    fmt::format("db {}: the db is on a read-only filesystem or directory", path));
    }
    const bool fresh = !impl;
    if (fresh) {
        auto opened = KCACHE_TRY(open_env(options));
        impl = std::move(opened);
    }
    store->m_impl = impl;
    if (fresh) {
        KCACHE_TRY(init_schema(*store, options));
        reg.open[key] = impl;
    }
    return store;
}

Store::~Store() = default;

std::uint64_t Store::data_file_bytes() const {
    struct stat st {};
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

}  // namespace kcache::core
