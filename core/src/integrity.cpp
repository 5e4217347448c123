// Damage checks of a db: the start-up walk, setting a damaged db aside
// (kcache/core/integrity.hpp). The content check and its switch: content.cpp.
#include "kcache/core/integrity.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {

namespace {

// Walks the keys of table `dbi` (`name`): a cursor step reads branch and leaf pages, and
// for a big value only computes where its overflow pages are (they are checked when
// read). Records (blob chunks only when `deep`): the header of a big one's overflow
// page, and its bytes, which the daemon reads at start. kCorruptDb when LMDB counts
// other keys than the walk finds.
Status check_table(const Tx& tx, const char* name, MDB_dbi dbi, bool deep) {
    const Store::Impl& db = tx.db;
    std::uint64_t keys = 0;
    volatile std::uint64_t touched = 0;  // every record's first and last byte read
    const bool chunks = deep && dbi == db.blob_data;
    KCACHE_TRY(tx.scan_checked(
        dbi, {}, {}, [&](std::string_view key, std::string_view value) -> Result<bool> {
            ++keys;
            if (chunks || dbi != db.blob_data) KCACHE_TRY(ops::check_chunk_page(tx, key, value));
            if (dbi != db.blob_data && !value.empty())
                touched = touched + static_cast<unsigned char>(value.front()) +
                          static_cast<unsigned char>(value.back());
            return true;
        }));
    MDB_stat st{};
    if (const int rc = mdb_stat(tx.txn, dbi, &st); rc != 0)
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: stat", db.path)));
    if (st.ms_entries != keys) {
        return fail(kCorruptDb, fmt::format("db {}: table {} holds {} keys where LMDB counts {}",
                                            db.path, name, keys, st.ms_entries));
    }
    return {};
}

// LMDB's own trees: the main one (the tables' records) and the free list, which every
// write transaction reads when it needs pages: each record a list of page numbers
// (a count, then the numbers), all inside the file.
Status check_lmdb_trees(const Tx& tx) {
    const Store::Impl& db = tx.db;
    MDB_envinfo info{};
    if (const int rc = mdb_env_info(db.env, &info); rc != 0)
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: env info", db.path)));
    for (const MDB_dbi own : {MDB_dbi{0}, MDB_dbi{1}}) {
        const bool free_list = own == 0;
        Status bad;
        KCACHE_TRY(tx.scan(own, {}, {}, [&](std::string_view, std::string_view value) {
            if (!free_list) return true;
            std::uint64_t count = 0;
            if (value.size() >= 8) std::memcpy(&count, value.data(), 8);
            bool ok = value.size() >= 8 && value.size() == 8 * (count + 1);
            for (std::uint64_t i = 0; ok && i < count; ++i) {
                std::uint64_t pgno = 0;
                std::memcpy(&pgno, value.data() + 8 * (i + 1), 8);
                ok = pgno >= 2 && pgno <= info.me_last_pgno;
            }
            if (!ok) {
                bad = fail(kCorruptDb,
                           fmt::format("db {}: LMDB's free list holds a damaged record", db.path));
            }
            return ok;
        }));
        KCACHE_TRY(bad);
    }
    return {};
}

}  // namespace

Status check_structure(const Store& store, bool deep) {
    auto txn = KCACHE_TRY(store.read());
    const Tx tx = TxnAccess::tx(txn);
    const Store::Impl& db = tx.db;
    const std::pair<const char*, MDB_dbi> tables[] = {
        {"inodes", db.inodes},       {"dirents", db.dirents}, {"blob_refs", db.blob_refs},
        {"blob_data", db.blob_data}, {"entries", db.entries}, {"lru", db.lru},
        {"leases", db.leases},       {"stats", db.stats},     {"events", db.events},
        {"meta", db.meta},           {"stems", db.stems},     {"dicts", db.dicts},
        {"links", db.links},         {"misses", db.misses},   {"evictions", db.evictions},
        {"families", db.families},
    };
    const bool present[] = {true,         true,          true,          true,
                            true,         true,          true,          true,
                            true,         true,          db.has_stems,  db.has_dicts,
                            db.has_links, db.has_misses, db.has_misses, db.has_misses};
    for (std::size_t i = 0; i < std::size(tables); ++i) {
        if (present[i]) KCACHE_TRY(check_table(tx, tables[i].first, tables[i].second, deep));
    }
    KCACHE_TRY(check_lmdb_trees(tx));
    auto root = txn.getattr(kRootIno);
    if (!root) return tl::unexpected(with_context(root.error(), "the root directory"));
    if (!root->is_dir())
        return fail(kCorruptDb, fmt::format("db {}: the root is not a directory", db.path));
    KCACHE_TRY(txn.readdir(kRootIno, {}, [](const DirEntry&) { return true; }));
    KCACHE_TRY(txn.stats());
    return {};
}

Result<std::string> set_aside(const std::string& path, std::int64_t now_ns) {
    namespace fs = std::filesystem;
    const std::time_t seconds = static_cast<std::time_t>(now_ns / 1000000000);
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
    std::string base = path;
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    std::string aside = fmt::format("{}.damaged-{}", base, stamp);
    // Private, as the db it comes from (Store::open makes a new db 0700).
    for (int n = 2; ::mkdir(aside.c_str(), 0700) != 0; ++n) {
        if (errno != EEXIST || n > 1000) {
            return fail(errno, fmt::format("db {}: cannot make {} to set the damaged db aside: {}",
                                           path, aside, std::strerror(errno)));
        }
        aside = fmt::format("{}.damaged-{}-{}", base, stamp, n);
    }
    for (const char* name : {"data.mdb", "lock.mdb"}) {
        const std::string from = fmt::format("{}/{}", base, name);
        const std::string to = fmt::format("{}/{}", aside, name);
        if (::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT) {
            return fail(errno, fmt::format("db {}: cannot move {} to {}: {}", path, from, to,
                                           std::strerror(errno)));
        }
    }
    // `kcache verify --db` opens a db read-only, which needs its kcache.lock.
    const int fd = ::open((aside + "/kcache.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
    return aside;
}

Status start_inodes_at(WriteTxn& txn, std::uint64_t floor) {
    Tx tx = TxnAccess::tx(txn);
    auto next = KCACHE_TRY(tx.get(tx.db.meta, kMetaNextIno));
    if (next) {
        auto value = records::decode_u64(*next, "meta next_ino");
        if (value && *value >= floor) return {};
    }
    return tx.put(tx.db.meta, kMetaNextIno, records::encode_u64(floor));
}

}  // namespace kcache::core
