// Transactions: read snapshots, write transactions, commit and Store::update.
#include <sys/statvfs.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
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

// The config of the snapshot `txn` began on, decoded once per environment: its stored
// bytes are read (one lookup in the meta table: another process may have changed them)
// and decoded only when they differ from the ones decoded last (Store::Impl's
// decoded_config); otherwise the transaction shares that decoded config.
Result<std::shared_ptr<const Config>> load_config(Store& store, MDB_txn* txn) {
    static const Config kNone;  // Tx wants one; get() reads none of it
    Store::Impl& impl = TxnAccess::impl(store);
    auto bytes = KCACHE_TRY(Tx(store, txn, kNone, nullptr).get(impl.meta, kMetaConfig));
    if (!bytes) return fail(EIO, fmt::format("db {}: corrupt meta: no config", store.path()));
    Store::Impl::DecodedConfig& cache = impl.decoded_config;
    {
        MutexLock lock(cache.mutex);
        if (cache.config && cache.bytes == *bytes) return cache.config;
    }
    auto config = records::decode_config(*bytes);
    if (!config) return tl::unexpected(with_context(config.error(), "db " + store.path()));
    auto decoded = std::make_shared<const Config>(std::move(*config));
    MutexLock lock(cache.mutex);
    cache.bytes.assign(*bytes);
    cache.config = decoded;
    return decoded;
}

}  // namespace

Txn::Txn(Store* store, MDB_txn* txn) : m_store(store), m_txn(txn) {}

Txn::Txn(Txn&& other) noexcept
    : m_store(other.m_store),
      m_txn(std::exchange(other.m_txn, nullptr)),
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

const Config& Txn::config() const {
    return *m_config;
}
std::uint64_t Txn::id() const {
    return m_txn ? mdb_txn_id(m_txn) : 0;
}

Result<ReadTxn> Store::read() const {
    auto txn = KCACHE_TRY(begin_txn(*m_impl, MDB_RDONLY));
    Txn t(const_cast<Store*>(this), txn);
    auto config = KCACHE_TRY(load_config(*t.m_store, txn));
    t.m_config = std::move(config);
    return t;
}

WriteTxn::WriteTxn(Store* store, MDB_txn* txn)
    : Txn(store, txn), m_state(std::make_unique<WriteState>()) {}
WriteTxn::WriteTxn(WriteTxn&& other) noexcept = default;
WriteTxn& WriteTxn::operator=(WriteTxn&& other) noexcept = default;
WriteTxn::~WriteTxn() = default;

Result<WriteTxn> Store::write() {
    if (m_read_only) return fail(EROFS, fmt::format("db {}: opened read-only", m_path));
    auto txn = KCACHE_TRY(begin_txn(*m_impl, 0));
    WriteTxn t(this, txn);
    auto config = KCACHE_TRY(load_config(*this, txn));
    t.m_config = std::move(config);
    return t;
}

Status WriteTxn::commit() {
    if (!m_txn) return fail(EINVAL, "transaction already ended");
    if (!m_state->poisoned) {
        Tx tx = TxnAccess::tx(*this);
        if (auto s = ops::log_updates(tx); !s && !m_state->poisoned) m_state->poisoned = s.error();
    }
    MDB_txn* txn = std::exchange(m_txn, nullptr);
    if (m_state->poisoned) {
        mdb_txn_abort(txn);
        return tl::unexpected(*m_state->poisoned);
    }
    if (const int rc = mdb_txn_commit(txn); rc != 0) {
        // LMDB reports a short write (what a full filesystem gives) as EIO; tell the
        // caller the truth when the filesystem under the db is out of space.
        struct statvfs fs {};
        if (rc == EIO && statvfs(m_store->path().c_str(), &fs) == 0 &&
            static_cast<std::uint64_t>(fs.f_bavail) * fs.f_bsize < (1u << 20)) {
            return fail(ENOSPC,
                        fmt::format("db {}: commit: no space left on device", m_store->path()));
        }
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: commit", m_store->path())));
    }
    return {};
}

Status Store::update(const std::function<Status(WriteTxn&)>& fn) {
    auto txn = KCACHE_TRY(write());
    if (auto s = fn(txn); !s) return s;
    return txn.commit();
}

}  // namespace kcache::core
