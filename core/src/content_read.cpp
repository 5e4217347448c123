// Reading content: a blob's chunks (zero-copy views into the map, their overflow pages'
// headers checked), decompression, segment lists, the content check against the digest,
// and the Txn's reads. Storing content: content.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
#include <vector>

#include <fmt/format.h>
#include <zstd.h>

#include "kcache/core/integrity.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::BlobRef;
using records::Codec;

namespace {
std::atomic<bool> g_content_checks{true};
}  // namespace

void set_content_checks(bool on) {
    g_content_checks.store(on, std::memory_order_relaxed);
}

bool content_checks() {
    return g_content_checks.load(std::memory_order_relaxed);
}

namespace {

// This thread's zstd decompression context, made once.
ZSTD_DCtx* decompression_context() {
    struct Context {
        ZSTD_DCtx* dctx = ZSTD_createDCtx();
        ~Context() { ZSTD_freeDCtx(dctx); }
    };
    thread_local Context context;
    return context.dctx;
}

}  // namespace

namespace ops {

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

Status decompress(const Tx& tx, const Digest& digest, const BlobRef& ref, std::string_view stored,
                  std::string& raw) {
    std::shared_ptr<const LoadedDictionary> dictionary;
    if (ref.dictionary) {
        auto loaded = KCACHE_TRY(load_dictionary(tx, ref.dictionary));
        dictionary = std::move(loaded);
    }
    // The frame names the dictionary it needs (0: none): it must be the reference's.
    if (ZSTD_getDictID_fromFrame(stored.data(), stored.size()) != ref.dictionary) {
        return fail(kDamagedContent,
                    fmt::format("db {}: blob {} was compressed with another dictionary than "
                                "its reference names ({})",
                                tx.db.path, digest.hex(), ref.dictionary));
    }
    const std::size_t n =
        dictionary
            ? ZSTD_decompress_usingDDict(decompression_context(), raw.data(), raw.size(),
                                         stored.data(), stored.size(), dictionary->decompress)
            : ZSTD_decompressDCtx(decompression_context(), raw.data(), raw.size(), stored.data(),
                                  stored.size());
    if (ZSTD_isError(n) || n != raw.size()) {
        return fail(kDamagedContent,
                    fmt::format("db {}: blob {} does not decompress", tx.db.path, digest.hex()));
    }
    return {};
}

namespace {

// LMDB's page size: big values' overflow pages are checked against it.
std::size_t page_size(const Tx& tx) {
    MDB_stat st{};
    return mdb_env_stat(tx.db.env, &st) == 0 ? st.ms_psize : 0;
}

// A value bigger than half a page lives on overflow pages whose header LMDB trusts when
// it frees them (an eviction): a page overwritten whole (a torn write, bit rot) has lost
// it, and LMDB would then abort (an assertion), fail (ENOMEM for a huge page count) or
// free pages still in use. So a chunk's header is checked before its bytes are: pgno (8
// bytes), a pad (2), flags (2), the number of pages (4), then the value (lmdb.h does not
// declare the layout; mdb.c's MDB_page, stable in the 0.9 format). The flags must say
// overflow (and dirty, for a page this write transaction made) and the count be the
// value's; the pgno is not checked (LMDB does not tell where its map is). kCorruptDb
// otherwise. Values inside a leaf page (never at 16 bytes past a page boundary) are not
// checked here: the structure walk and LMDB cover those.
Status check_overflow_header(const Tx& tx, std::size_t page, const Digest& digest,
                             std::uint64_t chunk, std::string_view data) {
    constexpr std::size_t kHeader = 16;
    constexpr std::uint16_t kOverflow = 0x04, kDirty = 0x10;
    const auto at = reinterpret_cast<std::uintptr_t>(data.data());
    if (page == 0 || data.size() <= page / 2 || (at - kHeader) % page != 0) return {};
    const char* header = data.data() - kHeader;
    std::uint16_t flags = 0;
    std::uint32_t pages = 0;
    std::memcpy(&flags, header + 10, 2);
    std::memcpy(&pages, header + 12, 4);
    const std::uint64_t expected_pages = (kHeader + data.size() + page - 1) / page;
    if ((flags & ~kDirty) == kOverflow && pages == expected_pages) return {};
    return fail(kCorruptDb,
                fmt::format("db {}: blob {} chunk {}: its overflow page is damaged (LMDB's page "
                            "header reads flags {:#x}, {} pages where {} are)",
                            tx.db.path, digest.hex(), chunk, flags, pages, expected_pages));
}

}  // namespace

Status check_chunk_page(const Tx& tx, std::string_view key, std::string_view value) {
    const Digest digest = records::digest_from_key(key.substr(0, 16));
    return check_overflow_header(tx, page_size(tx), digest, 0, value);
}

// The views of a blob's stored chunks, in order, their pages not yet touched (but for
// the header of each overflow page: check_overflow_header).
Result<std::vector<std::string_view>> chunk_views(const Tx& tx, const Digest& digest,
                                                  const BlobRef& ref) {
    const std::uint64_t chunks = records::chunk_count(ref.stored_size);
    std::vector<std::string_view> pieces;
    pieces.reserve(chunks);
    const std::size_t page = page_size(tx);
    for (std::uint64_t i = 0; i < chunks; ++i) {
        auto data = KCACHE_TRY(
            tx.get(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i))));
        const std::uint64_t expected =
            std::min<std::uint64_t>(records::kChunkSize, ref.stored_size - i * records::kChunkSize);
        if (!data || data->size() != expected) {
            return fail(kDamagedContent,
                        fmt::format("db {}: blob {} is missing or has the wrong size (chunk {})",
                                    tx.db.path, digest.hex(), i));
        }
        KCACHE_TRY(check_overflow_header(tx, page, digest, i, *data));
        pieces.push_back(*data);
    }
    return pieces;
}

Result<Content> stored_form(const Tx& tx, const Digest& digest, const BlobRef& ref) {
    auto pieces = KCACHE_TRY(chunk_views(tx, digest, ref));
    if (pieces.size() == 1) return Content::view(pieces.front());  // zero-copy from the map
    prefetch(pieces);
    std::string assembled;
    assembled.reserve(ref.stored_size);
    for (const std::string_view piece : pieces) assembled.append(piece);
    return Content::owned(std::move(assembled));
}

Result<std::optional<std::vector<Digest>>> segment_list(const Tx& tx, const Digest& digest) {
    auto ref = KCACHE_TRY(tx.blob_ref(digest));
    if (!ref || ref->codec != Codec::segments) return std::nullopt;
    const BlobRef& r = *ref;
    if (r.stored_size != segment_count(r.raw_size) * 16 || r.raw_size < kSegmentedSize) {
        return fail(kDamagedContent,
                    fmt::format("db {}: blob {} has a segment list of the wrong size", tx.db.path,
                                digest.hex()));
    }
    auto stored = KCACHE_TRY(stored_form(tx, digest, r));
    const std::string_view list = stored.bytes();
    std::vector<Digest> segments;
    segments.reserve(list.size() / 16);
    for (std::size_t at = 0; at < list.size(); at += 16)
        segments.push_back(records::digest_from_key(list.substr(at, 16)));
    return std::optional<std::vector<Digest>>(std::move(segments));
}

// The raw content of a zstd blob.
Result<std::string> decompressed(const Tx& tx, const Digest& digest, const BlobRef& r) {
    auto stored = KCACHE_TRY(stored_form(tx, digest, r));
    std::string raw;
    try {
        raw.assign(r.raw_size, '\0');
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("no memory to read {} bytes", r.raw_size));
    }
    KCACHE_TRY(decompress(tx, digest, r, stored.bytes(), raw));
    return raw;
}

namespace {

// The reference of a blob holding `size` bytes, or EIO.
Result<BlobRef> sized_ref(const Tx& tx, const Digest& digest, std::uint64_t size) {
    auto ref = KCACHE_TRY(tx.blob_ref(digest));
    if (!ref)
        return fail(kDamagedContent,
                    fmt::format("db {}: blob {} is missing", tx.db.path, digest.hex()));
    if (ref->raw_size != size) {
        // EIO, as Txn::read_blob promises: the size asked for may be the caller's error.
        return fail(EIO,
                    fmt::format("db {}: blob {} has the wrong size", tx.db.path, digest.hex()));
    }
    return *ref;
}

// The content check (integrity.hpp): a blob that is no list is keyed by the flat digest
// of its bytes (a file below kSegmentedSize, a segment, or a big file stored before
// schema 3) or, after a collision, by an alternative address of them (store_impl.hpp),
// given here in the pieces it is read in. kDamagedContent when it is neither.
Status check_content(const Tx& tx, const Digest& digest,
                     const std::vector<std::string_view>& pieces) {
    if (!content_checks() || is_flat_address(digest, pieces)) return {};
    return fail(kDamagedContent,
                fmt::format("db {}: blob {} has damaged content: it does not match its digest",
                            tx.db.path, digest.hex()));
}

Status check_content(const Tx& tx, const Digest& digest, std::string_view content) {
    if (!content_checks() || flat_digest_of(content) == digest) return {};
    return check_content(tx, digest, std::vector<std::string_view>{content});  // alternatives
}

}  // namespace

Status for_each_piece(const Tx& tx, const Digest& digest, std::uint64_t size,
                      const std::function<void(std::string_view)>& fn, bool in_list) {
    if (digest.empty()) return {};
    auto r = KCACHE_TRY(sized_ref(tx, digest, size));
    switch (r.codec) {
        case Codec::segments: {
            if (in_list)
                return fail(kDamagedContent,
                            fmt::format("db {}: segment {} is a list", tx.db.path, digest.hex()));
            auto list = KCACHE_TRY(segment_list(tx, digest));
            if (content_checks() && !is_list_address(digest, *list)) {
                return fail(kDamagedContent,
                            fmt::format("db {}: blob {} has damaged content: its segment list "
                                        "does not match its digest",
                                        tx.db.path, digest.hex()));
            }
            for (std::size_t i = 0; i < list->size(); ++i) {
                const std::uint64_t seg_size =
                    std::min<std::uint64_t>(kSegmentSize, size - i * kSegmentSize);
                if (auto s = for_each_piece(tx, (*list)[i], seg_size, fn, true); !s) return s;
            }
            return {};
        }
        case Codec::zstd: {
            auto raw = KCACHE_TRY(decompressed(tx, digest, r));
            KCACHE_TRY(check_content(tx, digest, raw));
            fn(raw);
            return {};
        }
        case Codec::raw:
            break;
    }
    auto pieces = KCACHE_TRY(chunk_views(tx, digest, r));
    if (pieces.size() > 1) prefetch(pieces);
    KCACHE_TRY(check_content(tx, digest, pieces));
    for (const std::string_view piece : pieces) fn(piece);
    return {};
}

Result<Content> read_blob(const Tx& tx, const Digest& digest, std::uint64_t size) {
    if (digest.empty()) return Content::view({});
    auto r = KCACHE_TRY(sized_ref(tx, digest, size));
    if (r.codec == Codec::raw) {  // zero-copy when one chunk
        auto content = KCACHE_TRY(stored_form(tx, digest, r));
        KCACHE_TRY(check_content(tx, digest, content.bytes()));
        return content;
    }
    if (r.codec == Codec::zstd) {
        auto raw = KCACHE_TRY(decompressed(tx, digest, r));
        KCACHE_TRY(check_content(tx, digest, raw));
        return Content::owned(std::move(raw));
    }
    std::string assembled;
    try {
        assembled.reserve(size);
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("no memory to read {} bytes", size));
    }
    KCACHE_TRY(
        for_each_piece(tx, digest, size, [&](std::string_view piece) { assembled.append(piece); }));
    return Content::owned(std::move(assembled));
}

}  // namespace ops

Result<Content> Txn::read(Ino file) const {
    Tx tx = TxnAccess::tx(*this);
    auto node = KCACHE_TRY(tx.inode(file));
    if (is_dir(node.mode)) return fail(EISDIR, fmt::format("inode {} is a directory", file));
    if (!is_regular(node.mode))
        return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    return ops::read_blob(tx, node.digest, node.size);
}

Status Txn::read_pieces(Ino file, const std::function<void(std::string_view)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    auto node = KCACHE_TRY(tx.inode(file));
    if (!is_regular(node.mode))
        return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    return ops::for_each_piece(tx, node.digest, node.size, fn);
}

Result<bool> Txn::has_blob(const Digest& digest) const {
    if (digest.empty()) return true;
    Tx tx = TxnAccess::tx(*this);
    auto ref = KCACHE_TRY(tx.blob_ref(digest));
    return ref.has_value();
}

Result<Content> Txn::read_blob(const Digest& digest, std::uint64_t size) const {
    auto present = KCACHE_TRY(has_blob(digest));
    if (!present) return fail(ENOENT, fmt::format("no blob {}", digest.hex()));
    return ops::read_blob(TxnAccess::tx(*this), digest, size);
}

}  // namespace kcache::core
