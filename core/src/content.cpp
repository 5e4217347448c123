// File content: content-addressed blobs with reference counts, compression, zero-copy
// reads, atomic publication, and staged writes.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include <fmt/format.h>
#include <zstd.h>

#include "kcache/core/roles.hpp"
#include "kcache/core/staged.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::BlobRef;
using records::Codec;
using records::Inode;

namespace {

// Below this size compression cannot pay for its frame. Above it, zstd is kept only
// when it saves at least an eighth of the blob's footprint in data.mdb: content that
// would take the same pages compressed is stored raw, and read zero-copy.
constexpr std::size_t kMinCompressSize = 128;
constexpr int kZstdLevel = 3;

struct ZstdContexts {
    ZSTD_CCtx* compress = ZSTD_createCCtx();
    ZSTD_DCtx* decompress = ZSTD_createDCtx();
    ~ZstdContexts() {
        ZSTD_freeCCtx(compress);
        ZSTD_freeDCtx(decompress);
    }
};
ZstdContexts& zstd() {
    thread_local ZstdContexts contexts;
    return contexts;
}

// The compressed form of `content` if it saves space, else empty.
std::string compress(std::string_view content) {
    if (content.size() < kMinCompressSize) return {};
    std::string out(ZSTD_compressBound(content.size()), '\0');
    const std::size_t n = ZSTD_compressCCtx(zstd().compress, out.data(), out.size(),
                                            content.data(), content.size(), kZstdLevel);
    const std::uint64_t raw = records::footprint(content.size());
    if (ZSTD_isError(n) || records::footprint(n) > raw - raw / 8) return {};
    out.resize(n);
    return out;
}

// Asks the kernel to start reading the map pages behind `pieces` (a blob's chunks)
// before they are copied. The environment is opened MDB_NORDAHEAD (the map is
// MADV_RANDOM), so otherwise each chunk's overflow page is its own synchronous read
// on first touch, one after the other; with the advice they are read concurrently and
// the copy waits once. mdb_get on an overflow value only computes its address in the
// (non-WRITEMAP) map, so collecting the pieces first touches none of them. Runs of
// adjacent pages are advised in one call, to keep the warm cost to a few syscalls.
// Only advice: a failure (EAGAIN, ENOMEM, EBADF on an odd map) is ignored and the
// copy then faults the pages in as before.
void prefetch(const std::vector<std::string_view>& pieces) {
    static const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    std::uintptr_t run_begin = 0, run_end = 0;
    auto advise = [&] {
        if (run_end > run_begin) {
            (void)::madvise(reinterpret_cast<void*>(run_begin), run_end - run_begin, MADV_WILLNEED);
        }
    };
    for (const std::string_view piece : pieces) {
        if (piece.empty()) continue;
        const auto at = reinterpret_cast<std::uintptr_t>(piece.data());
        const std::uintptr_t begin = at & ~(page - 1);
        const std::uintptr_t end = (at + piece.size() + page - 1) & ~(page - 1);
        if (begin >= run_begin && begin <= run_end) {
            run_end = std::max(run_end, end);
            continue;
        }
        advise();
        run_begin = begin;
        run_end = end;
    }
    advise();
}

}  // namespace

namespace ops {

Result<BlobRef> acquire_blob(Tx& tx, const Digest& digest, std::string_view content) {
    if (digest.empty()) return BlobRef{};
    auto existing = tx.blob_ref(digest);
    if (!existing) return tl::unexpected(existing.error());
    const std::string key = records::digest_key(digest);
    if (*existing) {
        BlobRef ref = **existing;
        ++ref.refcount;
        if (auto s = tx.put(tx.db.blob_refs, key, records::encode(ref)); !s) return tl::unexpected(s.error());
        if (auto s = tx.add(Counter::dedup_hits, 1); !s) return tl::unexpected(s.error());
        return ref;
    }
    const std::string compressed = compress(content);
    const std::string_view stored = compressed.empty() ? content : std::string_view(compressed);
    BlobRef ref{1, content.size(), stored.size(), compressed.empty() ? Codec::raw : Codec::zstd};
    for (std::uint64_t i = 0; i < records::chunk_count(stored.size()); ++i) {
        const std::string_view chunk = stored.substr(i * records::kChunkSize, records::kChunkSize);
        auto place = tx.reserve(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i)),
                                chunk.size());
        if (!place) return tl::unexpected(place.error());
        std::memcpy(*place, chunk.data(), chunk.size());
    }
    if (auto s = tx.put(tx.db.blob_refs, key, records::encode(ref)); !s) return tl::unexpected(s.error());
    Status s = tx.add(Counter::blobs, 1);
    if (s) s = tx.add(Counter::stored_bytes, static_cast<std::int64_t>(records::footprint(ref)));
    if (s) s = tx.add(Counter::blob_raw_bytes, static_cast<std::int64_t>(ref.raw_size));
    if (!s) return tl::unexpected(s.error());
    return ref;
}

Status release_blob(Tx& tx, const Digest& digest) {
    if (digest.empty()) return {};
    auto existing = tx.blob_ref(digest);
    if (!existing) return tl::unexpected(existing.error());
    if (!*existing) {
        // A reference to a blob that is gone: the db was damaged before. Dropping the
        // reference is the repair; `kcache verify` reports such damage.
        return tx.add(Counter::errors_io, 1);
    }
    BlobRef ref = **existing;
    const std::string key = records::digest_key(digest);
    if (ref.refcount > 1) {
        --ref.refcount;
        return tx.put(tx.db.blob_refs, key, records::encode(ref));
    }
    Status s = tx.del(tx.db.blob_refs, key);
    for (std::uint64_t i = 0; s && i < records::chunk_count(ref.stored_size); ++i) {
        s = tx.del(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i)));
    }
    if (s) s = tx.add(Counter::blobs, -1);
    if (s) s = tx.add(Counter::stored_bytes, -static_cast<std::int64_t>(records::footprint(ref)));
    if (s) s = tx.add(Counter::blob_raw_bytes, -static_cast<std::int64_t>(ref.raw_size));
    return s;
}

// The views of a blob's stored chunks, in order, their pages not yet touched.
static Result<std::vector<std::string_view>> chunk_views(const Tx& tx, const Digest& digest, const BlobRef& ref) {
    const std::uint64_t chunks = records::chunk_count(ref.stored_size);
    std::vector<std::string_view> pieces;
    pieces.reserve(chunks);
    for (std::uint64_t i = 0; i < chunks; ++i) {
        auto data = tx.get(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i)));
        if (!data) return tl::unexpected(data.error());
        const std::uint64_t expected = std::min<std::uint64_t>(records::kChunkSize, ref.stored_size - i * records::kChunkSize);
        if (!*data || (*data)->size() != expected) {
            return fail(EIO, fmt::format("db {}: blob {} is missing or has the wrong size (chunk {})", tx.db.path,
                                         digest.hex(), i));
        }
        pieces.push_back(**data);
    }
    return pieces;
}

Result<Content> stored_form(const Tx& tx, const Digest& digest, const BlobRef& ref) {
    auto pieces = chunk_views(tx, digest, ref);
    if (!pieces) return tl::unexpected(pieces.error());
    if (pieces->size() == 1) return Content::view(pieces->front());  // zero-copy from the map
    prefetch(*pieces);
    std::string assembled;
    assembled.reserve(ref.stored_size);
    for (const std::string_view piece : *pieces) assembled.append(piece);
    return Content::owned(std::move(assembled));
}

Result<Content> read_blob(const Tx& tx, const Digest& digest, std::uint64_t size) {
    if (digest.empty()) return Content::view({});
    auto ref = tx.blob_ref(digest);
    if (!ref) return tl::unexpected(ref.error());
    if (!*ref) return fail(EIO, fmt::format("db {}: blob {} is missing", tx.db.path, digest.hex()));
    const BlobRef& r = **ref;
    if (r.raw_size != size) {
        return fail(EIO, fmt::format("db {}: blob {} has the wrong size", tx.db.path, digest.hex()));
    }
    auto stored_content = stored_form(tx, digest, r);
    if (!stored_content) return stored_content;
    if (r.codec == Codec::raw) return stored_content;
    const std::string_view stored = stored_content->bytes();
    std::string raw(r.raw_size, '\0');
    const std::size_t n = ZSTD_decompressDCtx(zstd().decompress, raw.data(), raw.size(),
                                              stored.data(), stored.size());
    if (ZSTD_isError(n) || n != r.raw_size) {
        return fail(EIO, fmt::format("db {}: blob {} does not decompress", tx.db.path, digest.hex()));
    }
    return Content::owned(std::move(raw));
}

Status add_file_to_entry(Tx& tx, Ino entry_ino, const Inode& file, int sign) {
    auto entry = tx.entry(entry_ino);
    if (!entry) return tl::unexpected(entry.error());
    std::uint64_t stored = 0;
    if (!file.digest.empty()) {
        auto ref = tx.blob_ref(file.digest);
        if (!ref) return tl::unexpected(ref.error());
        if (*ref) stored = records::footprint(**ref);
    }
    auto apply = [sign](std::uint64_t& value, std::uint64_t delta) {
        value = sign > 0 ? value + delta : (value > delta ? value - delta : 0);
    };
    apply(entry->files, 1);
    apply(entry->bytes, file.size);
    apply(entry->stored_bytes, stored);
    if (entry->files == 0) entry->populated = false;  // empty again: the next store is a miss
    if (sign > 0 && entry->producer == Producer::unknown) entry->producer = producer_of(file.name);
    return tx.put_entry(*entry);
}

}  // namespace ops

Result<Content> Txn::read(Ino file) const {
    Tx tx = TxnAccess::tx(*this);
    auto node = tx.inode(file);
    if (!node) return tl::unexpected(node.error());
    if ((node->mode & S_IFMT) == S_IFDIR) return fail(EISDIR, fmt::format("inode {} is a directory", file));
    if ((node->mode & S_IFMT) != S_IFREG) return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    return ops::read_blob(tx, node->digest, node->size);
}

Status Txn::read_pieces(Ino file, const std::function<void(std::string_view)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    auto node = tx.inode(file);
    if (!node) return tl::unexpected(node.error());
    if ((node->mode & S_IFMT) != S_IFREG) return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    if (node->digest.empty()) return {};
    auto ref = tx.blob_ref(node->digest);
    if (!ref) return tl::unexpected(ref.error());
    if (!*ref || (*ref)->raw_size != node->size) {
        return fail(EIO, fmt::format("db {}: blob {} is missing or has the wrong size", tx.db.path, node->digest.hex()));
    }
    if ((*ref)->codec != Codec::raw) {
        auto content = ops::read_blob(tx, node->digest, node->size);
        if (!content) return tl::unexpected(content.error());
        fn(content->bytes());
        return {};
    }
    auto pieces = ops::chunk_views(tx, node->digest, **ref);
    if (!pieces) return tl::unexpected(pieces.error());
    if (pieces->size() > 1) prefetch(*pieces);
    for (const std::string_view piece : *pieces) fn(piece);
    return {};
}

Result<Attr> WriteTxn::write(Ino file, std::string_view content, const Origin& origin) {
    Tx tx = TxnAccess::tx(*this);
    auto node = tx.inode(file);
    if (!node) return tl::unexpected(node.error());
    if ((node->mode & S_IFMT) == S_IFDIR) return fail(EISDIR, fmt::format("inode {} is a directory", file));
    if ((node->mode & S_IFMT) != S_IFREG) return fail(EINVAL, fmt::format("inode {} is not a regular file", file));

    if (content.size() > kMaxFileSize) {
        return fail(EFBIG, fmt::format("content of {} bytes is over the limit of {}", content.size(), kMaxFileSize));
    }
    const Digest digest = digest_of(content);
    auto fail_with = [](const Error& e) { return tl::unexpected(e); };
    std::uint64_t old_stored = 0;
    if (!node->digest.empty()) {
        auto old_ref = tx.blob_ref(node->digest);
        if (!old_ref) return tl::unexpected(old_ref.error());
        if (*old_ref) old_stored = records::footprint(**old_ref);
    }
    // Take the new reference before dropping the old one: rewriting the same content
    // must not free the blob in between.
    auto ref = ops::acquire_blob(tx, digest, content);
    if (!ref) return tl::unexpected(ref.error());
    if (auto s = ops::release_blob(tx, node->digest); !s) return fail_with(s.error());
    const auto old_size = static_cast<std::int64_t>(node->size);
    node->digest = digest;
    node->size = content.size();
    node->mtime_ns = node->ctime_ns = tx.now();
    if (auto s = tx.put_inode(*node); !s) return fail_with(s.error());

    Status s = tx.add(Counter::bytes, static_cast<std::int64_t>(content.size()) - old_size);
    if (s) s = tx.add(Counter::stores, 1);
    if (s) s = tx.add(Counter::bytes_written, static_cast<std::int64_t>(content.size()));
    if (!s) return fail_with(s.error());
    if (!node->entry) return node->attr();

    auto entry = tx.entry(node->entry);
    if (!entry) return tl::unexpected(entry.error());
    // The file stays in its entry: only its bytes change.
    entry->bytes = entry->bytes + content.size() - std::min<std::uint64_t>(entry->bytes, static_cast<std::uint64_t>(old_size));
    entry->stored_bytes = entry->stored_bytes + records::footprint(*ref) - std::min(entry->stored_bytes, old_stored);
    if (entry->producer == Producer::unknown) entry->producer = producer_of(node->name);
    // Absent or empty until now: this store is the miss. Temp files and locks are not.
    if (!node->bookkeeping) {
        if (auto a = ops::populate(tx, *entry, origin); !a) return fail_with(a.error());
    }
    if (auto a = ops::move_in_lru(tx, *entry, tx.now()); !a) return fail_with(a.error());
    if (auto a = tx.put_entry(*entry); !a) return fail_with(a.error());
    return node->attr();
}

// ---- StagedFile ---------------------------------------------------------------------

StagedFile::StagedFile(Store* store, Ino ino, std::string content)
    : m_store(store), m_ino(ino), m_content(std::move(content)), m_open(true) {}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : m_store(other.m_store), m_ino(other.m_ino), m_content(std::move(other.m_content)),
      m_stored(other.m_stored), m_dirty(other.m_dirty), m_open(std::exchange(other.m_open, false)),
      m_max_size(other.m_max_size) {}

StagedFile& StagedFile::operator=(StagedFile&& other) noexcept {
    if (this != &other) {
        if (m_open) (void)abandon();
        m_store = other.m_store;
        m_ino = other.m_ino;
        m_content = std::move(other.m_content);
        m_stored = other.m_stored;
        m_dirty = other.m_dirty;
        m_open = std::exchange(other.m_open, false);
        m_max_size = other.m_max_size;
    }
    return *this;
}

StagedFile::~StagedFile() {
    // Best effort: a lease left behind by a failure here is ignored once this
    // process is gone, and `kcache gc` drops it.
    if (m_open) (void)abandon();
}

Result<StagedFile> StagedFile::begin(WriteTxn& txn, Ino file, bool truncate) {
    auto attr = txn.getattr(file);
    if (!attr) return tl::unexpected(attr.error());
    if (attr->is_dir()) return fail(EISDIR, fmt::format("inode {} is a directory", file));
    if (!attr->is_regular()) return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    std::string content;
    if (!truncate) {
        auto current = txn.read(file);
        if (!current) return tl::unexpected(current.error());
        content.assign(current->bytes());
    }
    if (auto s = txn.begin_write(file); !s) return tl::unexpected(s.error());
    StagedFile staged(&txn.store(), file, std::move(content));
    staged.m_stored = attr->digest;
    staged.m_dirty = truncate && attr->size > 0;
    return staged;
}

Result<StagedFile> StagedFile::begin(Store& store, Ino file, bool truncate) {
    auto txn = store.write();
    if (!txn) return tl::unexpected(txn.error());
    auto staged = begin(*txn, file, truncate);
    if (!staged) return staged;
    if (auto s = txn->commit(); !s) {
        staged->forget();
        return tl::unexpected(s.error());
    }
    return staged;
}

Status StagedFile::write(std::uint64_t offset, std::string_view data) {
    const std::uint64_t end = offset + data.size();
    const std::uint64_t limit = m_max_size ? std::min(m_max_size, kMaxFileSize) : kMaxFileSize;
    if (end < offset || end > limit) {
        return fail(EFBIG, fmt::format("file would grow to {} bytes, over the limit of {}", end, limit));
    }
    try {
        if (end > m_content.size()) m_content.resize(end, '\0');
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("no memory to stage {} bytes", end));
    }
    std::memcpy(m_content.data() + offset, data.data(), data.size());
    m_dirty = true;
    return {};
}

Status StagedFile::truncate(std::uint64_t size) {
    if (size == m_content.size()) return {};
    if (size > kMaxFileSize || (m_max_size && size > m_max_size)) {
        return fail(EFBIG, fmt::format("cannot extend a file to {} bytes", size));
    }
    try {
        m_content.resize(size, '\0');
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("no memory to stage {} bytes", size));
    }
    m_dirty = true;
    return {};
}

Status StagedFile::publish(WriteTxn& txn, const Origin& origin) {
    if (!m_open) return fail(EINVAL, "staged file already published or abandoned");
    auto w = txn.write(m_ino, m_content, origin);
    if (!w) return tl::unexpected(w.error());
    if (auto s = txn.end_write(m_ino); !s) return s;
    m_stored = w->digest;
    m_open = false;
    m_dirty = false;
    return {};
}

Status StagedFile::publish(const Origin& origin) {
    auto txn = m_store->write();
    if (!txn) return tl::unexpected(txn.error());
    if (auto s = publish(*txn, origin); !s) {
        m_open = true;  // still ours: the transaction is discarded
        return s;
    }
    if (auto s = txn->commit(); !s) {
        m_open = true;
        return s;
    }
    return {};
}

Status StagedFile::commit(const Origin& origin) {
    if (!m_open) return fail(EINVAL, "staged file already published or abandoned");
    if (!m_dirty) return {};
    Digest stored;
    auto s = m_store->update([&](WriteTxn& txn) -> Status {
        auto w = txn.write(m_ino, m_content, origin);
        if (!w) return tl::unexpected(w.error());
        stored = w->digest;
        return {};
    });
    if (s) {
        m_dirty = false;
        m_stored = stored;
    }
    return s;
}

Status StagedFile::abandon() {
    if (!m_open) return {};
    m_open = false;
    return m_store->update([&](WriteTxn& txn) { return txn.end_write(m_ino); });
}

}  // namespace kcache::core
