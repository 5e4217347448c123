// StagedFile: a file's new content built in memory under a write lease, published in
// one transaction; segmented content keeps its segment digests so that a publish
// hashes and stores only what changed (staged.hpp).
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include <fmt/format.h>

#include "kcache/core/staged.hpp"
#include "store_impl.hpp"

namespace kcache::core {

// ---- StagedFile ---------------------------------------------------------------------

StagedFile::StagedFile(Store* store, Ino ino) : m_store(store), m_ino(ino), m_open(true) {}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : m_store(other.m_store),
      m_ino(other.m_ino),
      m_content(std::move(other.m_content)),
      m_loaded(other.m_loaded),
      m_unloaded_size(other.m_unloaded_size),
      m_segments(std::move(other.m_segments)),
      m_stored(other.m_stored),
      m_dirty(other.m_dirty),
      m_open(std::exchange(other.m_open, false)),
      m_max_size(other.m_max_size),
      m_mirror(std::move(other.m_mirror)),
      m_mirrored(other.m_mirrored) {}

StagedFile& StagedFile::operator=(StagedFile&& other) noexcept {
    if (this != &other) {
        if (m_open) (void)abandon();
        m_store = other.m_store;
        m_ino = other.m_ino;
        m_content = std::move(other.m_content);
        m_loaded = other.m_loaded;
        m_unloaded_size = other.m_unloaded_size;
        m_segments = std::move(other.m_segments);
        m_stored = other.m_stored;
        m_dirty = other.m_dirty;
        m_open = std::exchange(other.m_open, false);
        m_max_size = other.m_max_size;
        m_mirror = std::move(other.m_mirror);
        m_mirrored = other.m_mirrored;
    }
    return *this;
}

StagedFile::~StagedFile() {
    // Best effort: a lease left behind by a failure here is ignored once this
    // process is gone, and `kcache gc` drops it.
    if (m_open) (void)abandon();
}

Result<StagedFile> StagedFile::begin(WriteTxn& txn, Ino file, bool truncate) {
    auto attr = KCACHE_TRY(txn.getattr(file));
    if (attr.is_dir()) return fail(EISDIR, fmt::format("inode {} is a directory", file));
    if (!attr.is_regular())
        return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    KCACHE_TRY(txn.begin_write(file));
    StagedFile staged(&txn.store(), file);
    staged.m_stored = attr.digest;
    staged.m_dirty = truncate && attr.size > 0;
    if (!truncate && attr.size > 0) {
        // Read at first use (load()): half of a writer's open went to reading a file
        // that most opens for writing change a few pages of, or none (fsstress).
        staged.m_loaded = false;
        staged.m_unloaded_size = attr.size;
    }
    return staged;
}

Result<StagedFile> StagedFile::begin(Store& store, Ino file, bool truncate) {
    auto txn = KCACHE_TRY(store.write());
    auto staged = begin(txn, file, truncate);
    if (!staged) return staged;
    if (auto s = txn.commit(); !s) {
        staged->forget();
        return tl::unexpected(s.error());
    }
    return staged;
}

Status StagedFile::load(std::uint64_t overwritten) {
    if (m_loaded) return {};
    auto txn = KCACHE_TRY(m_store->read());
    Tx tx = TxnAccess::tx(txn);
    // Published by another writer since begin: that version is the file now. A file
    // removed since has no node, and its content is there while something holds it
    // (kcache-fsd's orphans, core/holds.hpp).
    if (auto node = tx.inode(m_ino); node && is_regular(node->mode) && node->digest != m_stored) {
        m_stored = node->digest;
        m_unloaded_size = node->size;
    }
    const Digest digest = m_stored;
    const std::uint64_t size = m_unloaded_size;
    if (size <= overwritten) {  // the change about to be made keeps none of it
        m_content.clear();
        m_segments.clear();
        m_loaded = true;
        return {};
    }
    std::string content;
    try {
        content.reserve(size);
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("no memory to stage {} bytes", size));
    }
    // Straight into the staged copy: read() would assemble decompressed content first,
    // and copying that again cost a tenth of a writer's open (fsstress).
    KCACHE_TRY(ops::for_each_piece(tx, digest, size,
                                   [&](std::string_view piece) { content.append(piece); }));
    // Segmented content: its segment digests are known, so a publish re-hashes only the
    // segments written since.
    auto list = KCACHE_TRY(ops::segment_list(tx, digest));
    m_segments = list ? std::move(*list) : std::vector<Digest>{};
    m_content = std::move(content);
    m_segments.resize(segment_count(m_content.size()));
    m_loaded = true;
    return {};
}

Result<std::string_view> StagedFile::content() {
    KCACHE_TRY(load());
    return std::string_view(m_content);
}

void StagedFile::changed(std::uint64_t from, std::uint64_t to) {
    m_segments.resize(segment_count(m_content.size()));
    const std::uint64_t last = std::min<std::uint64_t>(segment_count(to), m_segments.size());
    for (std::uint64_t i = from / kSegmentSize; i < last; ++i) m_segments[i] = {};
    m_dirty = true;
}

Status StagedFile::write(std::uint64_t offset, std::string_view data) {
    const std::uint64_t end = offset + data.size();
    const std::uint64_t limit = m_max_size ? std::min(m_max_size, kMaxFileSize) : kMaxFileSize;
    if (end < offset || end > limit) {
        return fail(EFBIG,
                    fmt::format("file would grow to {} bytes, over the limit of {}", end, limit));
    }
    KCACHE_TRY(load(offset == 0 ? end : 0));
    const std::uint64_t old_size = m_content.size();
    try {
        if (end > m_content.size()) m_content.resize(end, '\0');
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("no memory to stage {} bytes", end));
    }
    std::memcpy(m_content.data() + offset, data.data(), data.size());
    changed(std::min(offset, old_size), end);  // a gap filled with zeros changed too
    mirror([&](StagedMirror& m) { return m.write(offset, data); });
    return {};
}

Status StagedFile::truncate(std::uint64_t size) {
    if (size > kMaxFileSize || (m_max_size && size > m_max_size)) {
        return fail(EFBIG, fmt::format("cannot extend a file to {} bytes", size));
    }
    const bool was_loaded = m_loaded;
    KCACHE_TRY(load(size == 0 ? std::numeric_limits<std::uint64_t>::max() : 0));
    // Emptied unread, the content had the size of the version it was begun from.
    const std::uint64_t old_size = was_loaded ? m_content.size() : m_unloaded_size;
    if (size == old_size) return {};
    try {
        m_content.resize(size, '\0');
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("no memory to stage {} bytes", size));
    }
    // The segment that now ends the file (cut or extended), and any added after it.
    const std::uint64_t from = std::min(old_size, size) / kSegmentSize * kSegmentSize;
    changed(from, std::max(old_size, size));
    mirror([&](StagedMirror& m) { return m.resize(size); });
    return {};
}

void StagedFile::mirror_to(std::shared_ptr<StagedMirror> mirror, bool holds_content) {
    m_mirror = std::move(mirror);
    m_mirrored = holds_content;
    if (m_dirty && !m_mirrored) this->mirror([](StagedMirror&) { return Status{}; });
}

void StagedFile::mirror(const std::function<Status(StagedMirror&)>& change) {
    if (!m_mirror) return;
    Status s = m_mirrored ? change(*m_mirror) : m_mirror->reset(m_content);
    if (s) {
        m_mirrored = true;
        return;
    }
    m_mirror->drop(s.error());
    m_mirror.reset();
    m_mirrored = false;
}

// The digests of the staged content: only segments changed since they were last
// known are hashed again.
ops::ContentDigests StagedFile::digests() {
    if (m_content.size() < kSegmentedSize) return ops::digests_of(m_content);
    m_segments.resize(segment_count(m_content.size()));
    const std::string_view content = m_content;
    for (std::size_t i = 0; i < m_segments.size(); ++i) {
        if (m_segments[i].empty())
            m_segments[i] = flat_digest_of(content.substr(i * kSegmentSize, kSegmentSize));
    }
    return {digest_of_segments(m_segments), m_segments};
}

Result<Attr> StagedFile::store_content(WriteTxn& txn, const Origin& origin) {
    Tx tx = TxnAccess::tx(txn);
    auto node = KCACHE_TRY(ops::writable_file(tx, m_ino));
    return ops::write_file(tx, node, m_content, digests(), origin);
}

Status StagedFile::publish(WriteTxn& txn, const Origin& origin) {
    if (!m_open) return fail(EINVAL, "staged file already published or abandoned");
    auto w = KCACHE_TRY(store_content(txn, origin));
    if (auto s = txn.end_write(m_ino); !s) return s;
    m_stored = w.digest;
    m_open = false;
    m_dirty = false;
    return {};
}

Status StagedFile::publish(const Origin& origin) {
    auto txn = KCACHE_TRY(m_store->write());
    if (auto s = publish(txn, origin); !s) {
        m_open = true;  // still ours: the transaction is discarded
        return s;
    }
    if (auto s = txn.commit(); !s) {
        m_open = true;
        return s;
    }
    return {};
}

Status StagedFile::commit(const Origin& origin, const std::function<Status(WriteTxn&)>& first) {
    if (!m_open) return fail(EINVAL, "staged file already published or abandoned");
    if (!m_dirty) return {};
    Digest stored;
    auto s = m_store->update([&](WriteTxn& txn) -> Status {
        if (first) KCACHE_TRY(first(txn));
        auto w = KCACHE_TRY(store_content(txn, origin));
        stored = w.digest;
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
