// File content: content-addressed blobs with reference counts, compression, segments
// of big files, zero-copy reads, atomic publication (StagedFile: staged.cpp).
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <zstd.h>

#include "kcache/core/integrity.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/staged.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::BlobRef;
using records::Codec;
using records::Inode;

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

// The compressed form of `content` if it saves space, else empty; with `dictionary`
// (whose id the frame then carries) when given.
std::string compress(std::string_view content, const LoadedDictionary* dictionary) {
    if (content.size() < kMinCompressSize) return {};
    std::string out(ZSTD_compressBound(content.size()), '\0');
    const std::size_t n =
        dictionary ? ZSTD_compress_usingCDict(zstd().compress, out.data(), out.size(),
                                              content.data(), content.size(), dictionary->compress)
                   : ZSTD_compressCCtx(zstd().compress, out.data(), out.size(), content.data(),
                                       content.size(), kZstdLevel);
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

std::string compressed_form(std::string_view content, const LoadedDictionary* dictionary) {
    return compress(content, dictionary);
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
            ? ZSTD_decompress_usingDDict(zstd().decompress, raw.data(), raw.size(), stored.data(),
                                         stored.size(), dictionary->decompress)
            : ZSTD_decompressDCtx(zstd().decompress, raw.data(), raw.size(), stored.data(),
                                  stored.size());
    if (ZSTD_isError(n) || n != raw.size()) {
        return fail(kDamagedContent,
                    fmt::format("db {}: blob {} does not decompress", tx.db.path, digest.hex()));
    }
    return {};
}

ContentDigests digests_of(std::string_view content) {
    ContentDigests d;
    if (content.size() < kSegmentedSize) {
        d.digest = flat_digest_of(content);
        return d;
    }
    d.segments.reserve(segment_count(content.size()));
    for (std::uint64_t at = 0; at < content.size(); at += kSegmentSize) {
        d.segments.push_back(flat_digest_of(content.substr(at, kSegmentSize)));
    }
    d.digest = digest_of_segments(d.segments);
    return d;
}

// The views of a blob's stored chunks (defined below).
static Result<std::vector<std::string_view>> chunk_views(const Tx& tx, const Digest& digest,
                                                         const BlobRef& ref);

namespace {

// `n` more references to an existing blob.
Status add_refs(Tx& tx, const Digest& digest, BlobRef ref, std::uint64_t n) {
    ref.refcount += n;
    return tx.put(tx.db.blob_refs, records::digest_key(digest), records::encode(ref));
}

// Deletes a blob's own bytes and reference (not a list's segments).
Status drop_blob(Tx& tx, const Digest& digest, const BlobRef& ref) {
    Status s = tx.del(tx.db.blob_refs, records::digest_key(digest));
    for (std::uint64_t i = 0; s && i < records::chunk_count(ref.stored_size); ++i) {
        s = tx.del(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i)));
    }
    if (s) s = tx.add(Counter::blobs, -1);
    if (s) s = tx.add(Counter::stored_bytes, -static_cast<std::int64_t>(records::footprint(ref)));
    if (s)
        s = tx.add(Counter::blob_raw_bytes, -static_cast<std::int64_t>(records::raw_counted(ref)));
    if (s) s = account_blob(tx, ref, -1);
    return s;
}

// A flat blob's bytes, for the compare below (defined further down).
Result<std::string> decompressed(const Tx& tx, const Digest& digest, const BlobRef& r);

// Whether the flat blob at `address` (`ref`) holds exactly `content`: its bytes are
// read (a zstd blob's decompressed) and compared. A blob that cannot be read as its
// reference describes it (damaged, its dictionary gone) holds other bytes, so content
// is never deduplicated onto it; a broken db or no memory is an error.
Result<bool> holds_flat(const Tx& tx, const Digest& address, const BlobRef& ref,
                        std::string_view content) {
    if (ref.codec == Codec::segments || ref.raw_size != content.size()) return false;
    auto fatal = [](const Error& e) { return e.code == kCorruptDb || e.code == ENOMEM; };
    if (ref.codec == Codec::zstd) {
        auto raw = decompressed(tx, address, ref);
        if (!raw) {
            if (fatal(raw.error())) return tl::unexpected(raw.error());
            return false;
        }
        return std::string_view(*raw) == content;
    }
    auto pieces = chunk_views(tx, address, ref);
    if (!pieces) {
        if (fatal(pieces.error())) return tl::unexpected(pieces.error());
        return false;
    }
    if (pieces->size() > 1) prefetch(*pieces);
    std::size_t at = 0;
    for (const std::string_view piece : *pieces) {
        if (content.compare(at, piece.size(), piece) != 0) return false;
        at += piece.size();
    }
    return at == content.size();
}

// Whether the blob at `address` (`ref`) is the list of `segments` for `size` bytes.
Result<bool> holds_list(const Tx& tx, const Digest& address, const BlobRef& ref,
                        const std::vector<Digest>& segments, std::uint64_t size) {
    if (ref.codec != Codec::segments || ref.raw_size != size) return false;
    auto list = segment_list(tx, address);
    if (!list) {
        if (list.error().code == kCorruptDb) return tl::unexpected(list.error());
        return false;
    }
    return *list && **list == segments;
}

// Where content is stored, or is to be: its address (store_impl.hpp) and the blob
// there, which holds the same bytes (none: the address is free).
struct Placement {
    Digest address;
    std::optional<BlobRef> existing;
};

using Addresses = std::unordered_set<Digest, DigestHash>;

Error too_many_collisions(const Tx& tx, const Digest& digest) {
    return Error{EIO, fmt::format("db {}: content of digest {} not stored: its digest and its {} "
                                  "alternative addresses all hold other bytes (constructed "
                                  "XXH3 collisions)",
                                  tx.db.path, digest.hex(), kMaxProbes)};
}

// Places flat `content` (its flat digest `digest`): the first of its addresses that
// holds the same bytes or is free. `taken`: addresses this operation gives other
// content, not stored yet.
Result<Placement> place_flat(const Tx& tx, const Digest& digest, std::string_view content,
                             const Addresses* taken = nullptr) {
    for (std::uint32_t probe = 0; probe <= kMaxProbes; ++probe) {
        const Digest address = probe == 0 ? digest : alternative_address(content, probe);
        auto ref = KCACHE_TRY(tx.blob_ref(address));
        if (!ref) {
            if (taken && taken->count(address)) continue;
            return Placement{address, std::nullopt};
        }
        if (KCACHE_TRY(holds_flat(tx, address, *ref, content))) return Placement{address, ref};
    }
    return tl::unexpected(too_many_collisions(tx, digest));
}

// `n` more references to flat `content` at `place`: to the blob there, else to a new
// one stored there, as a blob of `owner`'s kind, compressed with the kind's dictionary
// when it has one. A segment (`owner` null) has no kind: a big file's segments are not
// alike. The blob's reference as it was (before these references) or as stored.
Result<BlobRef> take_flat(Tx& tx, const Placement& place, std::string_view content, std::uint64_t n,
                          const BlobOwner* owner) {
    if (place.existing) {
        // Read again: this operation may have taken references to it since it was
        // placed (two distinct segments of one file placed at one address: `own`).
        auto now = KCACHE_TRY(tx.blob_ref(place.address));
        if (!now)
            return fail(EIO, fmt::format("db {}: blob {} went while it was being referenced",
                                         tx.db.path, place.address.hex()));
        KCACHE_TRY(add_refs(tx, place.address, *now, n));
        return *now;
    }
    std::uint32_t kind = 0;
    std::shared_ptr<const LoadedDictionary> dictionary;
    if (owner) kind = KCACHE_TRY(kind_for(tx, *owner, content));
    if (kind && content.size() >= kMinCompressSize) {
        auto current = KCACHE_TRY(current_dictionary(tx, kind));
        dictionary = std::move(current);
    }
    std::string compressed = compress(content, dictionary.get());
    std::uint32_t used = dictionary && !compressed.empty() ? dictionary->id : 0;
    if (dictionary && compressed.empty()) {
        // Content the dictionary does not help (or hurts) may still compress alone.
        compressed = compress(content, nullptr);
    }
    const std::string_view stored = compressed.empty() ? content : std::string_view(compressed);
    BlobRef ref{n, content.size(), stored.size(), compressed.empty() ? Codec::raw : Codec::zstd};
    ref.kind = kind;
    ref.dictionary = used;
    KCACHE_TRY(put_blob(tx, place.address, stored, ref));
    return ref;
}

// One more reference, a file's, to the blob at `place`, which holds its content.
// Counts a dedup hit, unless no file held the blob yet (an offered frame: stored, not
// deduplicated).
Result<BlobRef> take_existing(Tx& tx, const Placement& place) {
    KCACHE_TRY(add_refs(tx, place.address, *place.existing, 1));
    if (place.existing->refcount > 0) KCACHE_TRY(tx.add(Counter::dedup_hits, 1));
    BlobRef ref = *place.existing;
    ++ref.refcount;
    return ref;
}

// References `n` fewer to `digest` (n at most its refcount); frees it at zero.
// `footprint_out`, when given, receives the blob's footprint.
Status release_refs(Tx& tx, const Digest& digest, std::uint64_t n,
                    std::uint64_t* footprint_out = nullptr);

std::string_view segment_of(std::string_view content, std::size_t i) {
    return content.substr(i * kSegmentSize, kSegmentSize);
}

// How often each segment digest occurs (a sparse file repeats its zero segment).
std::unordered_map<Digest, std::uint64_t, DigestHash> occurrences(
    const std::vector<Digest>& segments) {
    std::unordered_map<Digest, std::uint64_t, DigestHash> counts;
    for (const Digest& d : segments) ++counts[d];
    return counts;
}

// Segmented content, placed: each distinct segment (by its bytes) at its address, the
// list of those addresses in order, and the list's own place.
struct PlacedSegments {
    struct Segment {
        std::size_t first = 0;    // its first occurrence
        std::uint64_t count = 0;  // its occurrences
        Placement place;
    };
    std::vector<Segment> distinct;  // in order of first occurrence
    std::vector<Digest> list;
    Placement place;
};

// Places segmented content (`d`: its digests): each segment as place_flat does (a
// segment that repeats is compared with its first occurrence), then its list at the
// first of the list's addresses that is free or holds the same list. A list holding
// the same addresses holds the same bytes: each was compared.
//
// `own`: the list of the version of the file this content replaces, if segmented. A
// segment whose digest is the address `own` has at the same index is taken without a
// compare: a rewrite of a few pages of a big file must not read back all the others
// (StagedFile carries their addresses over from that version). The bytes it could let
// stand in are those of that version of the same file, which only someone who may write
// the file wrote, and who can write it again anyway.
Result<PlacedSegments> place_segmented(const Tx& tx, const ContentDigests& d,
                                       std::string_view content,
                                       const std::vector<Digest>* own = nullptr) {
    PlacedSegments p;
    p.list.reserve(d.segments.size());
    std::unordered_map<Digest, std::vector<std::size_t>, DigestHash> by_digest;  // -> distinct
    Addresses taken;
    for (std::size_t i = 0; i < d.segments.size(); ++i) {
        const std::string_view seg = segment_of(content, i);
        std::vector<std::size_t>& same_digest = by_digest[d.segments[i]];
        const auto same = std::find_if(same_digest.begin(), same_digest.end(), [&](std::size_t k) {
            return segment_of(content, p.distinct[k].first) == seg;
        });
        if (same != same_digest.end()) {
            ++p.distinct[*same].count;
            p.list.push_back(p.distinct[*same].place.address);
            continue;
        }
        std::optional<Placement> kept;
        if (own && i < own->size() && (*own)[i] == d.segments[i]) {
            auto ref = KCACHE_TRY(tx.blob_ref(d.segments[i]));
            if (ref && ref->codec != Codec::segments && ref->raw_size == seg.size())
                kept = Placement{d.segments[i], ref};
        }
        if (!kept) {
            auto placed = KCACHE_TRY(place_flat(tx, d.segments[i], seg, &taken));
            kept = std::move(placed);
        }
        Placement& place = *kept;
        if (!place.existing) taken.insert(place.address);
        same_digest.push_back(p.distinct.size());
        p.list.push_back(place.address);
        p.distinct.push_back({i, 1, std::move(place)});
    }
    for (std::uint32_t probe = 0; probe <= kMaxProbes; ++probe) {
        const Digest address =
            probe == 0 ? digest_of_segments(p.list) : alternative_list_address(p.list, probe);
        auto ref = KCACHE_TRY(tx.blob_ref(address));
        if (!ref || KCACHE_TRY(holds_list(tx, address, *ref, p.list, content.size()))) {
            p.place = Placement{address, ref};
            return p;
        }
    }
    return tl::unexpected(too_many_collisions(tx, d.digest));
}

// Stores the list blob of placed segmented content; `segment_footprint` is the sum of
// its segments' footprints, one per occurrence.
Result<BlobRef> put_list(Tx& tx, const PlacedSegments& p, std::uint64_t raw_size,
                         std::uint64_t segment_footprint) {
    std::string list;
    list.reserve(p.list.size() * 16);
    for (const Digest& seg : p.list) list += records::digest_key(seg);
    const BlobRef ref{1, raw_size, list.size(), Codec::segments, segment_footprint};
    KCACHE_TRY(put_blob(tx, p.place.address, list, ref));
    return ref;
}

// One more reference, a file's, to placed segmented content: to the list there, or to
// a new list holding a reference per occurrence to each segment (stored if new).
Result<BlobRef> take_segmented(Tx& tx, const PlacedSegments& p, std::string_view content) {
    if (p.place.existing) return take_existing(tx, p.place);
    std::uint64_t sum = 0;
    for (const PlacedSegments::Segment& s : p.distinct) {
        auto ref =
            KCACHE_TRY(take_flat(tx, s.place, segment_of(content, s.first), s.count, nullptr));
        sum += s.count * records::footprint(ref);
    }
    return put_list(tx, p, content.size(), sum);
}

Status release_refs(Tx& tx, const Digest& digest, std::uint64_t n, std::uint64_t* footprint_out) {
    if (digest.empty() || n == 0) return {};
    auto existing = KCACHE_TRY(tx.blob_ref(digest));
    if (!existing) {
        // A reference to a blob that is gone: the db was damaged before. Dropping the
        // reference is the repair; `kcache verify` reports such damage.
        return tx.add(Counter::errors_io, 1);
    }
    BlobRef ref = *existing;
    if (footprint_out) *footprint_out = records::footprint(ref);
    if (ref.refcount > n) {
        ref.refcount -= n;
        return tx.put(tx.db.blob_refs, records::digest_key(digest), records::encode(ref));
    }
    if (ref.codec == Codec::segments) {
        auto list = KCACHE_TRY(segment_list(tx, digest));
        if (list) {
            for (const auto& [seg, count] : occurrences(*list)) {
                if (auto s = release_refs(tx, seg, count); !s) return s;
            }
        }
    }
    return drop_blob(tx, digest, ref);
}

// Replaces the last reference to the segmented blob `old` by new placed segmented
// content whose list is not stored yet: the new list takes over the old one's segment
// references, so only segments that differ are stored or released (a change of a few
// pages in a big file costs a few segments, not the file). Nullopt when that does not
// apply.
Result<std::optional<BlobRef>> replace_segmented(Tx& tx, const Digest& old, const PlacedSegments& p,
                                                 std::string_view content) {
    if (old.empty() || old == p.place.address || p.place.existing) return std::nullopt;
    auto old_ref = KCACHE_TRY(tx.blob_ref(old));
    if (!old_ref || old_ref->codec != Codec::segments || old_ref->refcount != 1)
        return std::nullopt;
    auto old_list = KCACHE_TRY(segment_list(tx, old));
    if (!old_list) return std::nullopt;

    std::unordered_map<Digest, std::int64_t, DigestHash> delta;  // by address
    for (const Digest& seg : p.list) ++delta[seg];
    for (const Digest& seg : *old_list) --delta[seg];
    std::int64_t sum = static_cast<std::int64_t>(old_ref->segment_footprint);
    for (const PlacedSegments::Segment& s : p.distinct) {  // new segments, once per address
        std::int64_t& n = delta[s.place.address];
        if (n <= 0) continue;
        auto ref = KCACHE_TRY(take_flat(tx, s.place, segment_of(content, s.first),
                                        static_cast<std::uint64_t>(n), nullptr));
        sum += n * static_cast<std::int64_t>(records::footprint(ref));
        n = 0;  // taken (another segment placed at the same address has nothing to add)
    }
    for (const auto& [seg, n] : delta) {  // segments gone
        if (n >= 0) continue;
        std::uint64_t fp = 0;
        KCACHE_TRY(release_refs(tx, seg, static_cast<std::uint64_t>(-n), &fp));
        sum += n * static_cast<std::int64_t>(fp);
    }
    KCACHE_TRY(drop_blob(tx, old, *old_ref));
    auto ref = KCACHE_TRY(put_list(tx, p, content.size(),
                                   static_cast<std::uint64_t>(std::max<std::int64_t>(sum, 0))));
    return std::optional<BlobRef>(ref);
}

}  // namespace

Status put_blob(Tx& tx, const Digest& digest, std::string_view stored, const BlobRef& ref) {
    for (std::uint64_t i = 0; i < records::chunk_count(stored.size()); ++i) {
        const std::string_view chunk = stored.substr(i * records::kChunkSize, records::kChunkSize);
        auto place = KCACHE_TRY(
            tx.reserve(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i)),
                       chunk.size()));
        std::memcpy(place, chunk.data(), chunk.size());
    }
    if (auto s = tx.put(tx.db.blob_refs, records::digest_key(digest), records::encode(ref)); !s)
        return s;
    Status s = tx.add(Counter::blobs, 1);
    if (s) s = tx.add(Counter::stored_bytes, static_cast<std::int64_t>(records::footprint(ref)));
    if (s)
        s = tx.add(Counter::blob_raw_bytes, static_cast<std::int64_t>(records::raw_counted(ref)));
    if (s) s = account_blob(tx, ref, +1);
    return s;
}

Status release_blob(Tx& tx, const Digest& digest) {
    return release_refs(tx, digest, 1);
}

Result<BlobRef> rewrite_blob(Tx& tx, const Digest& digest, const BlobRef& ref,
                             std::string_view stored, std::uint32_t dictionary) {
    BlobRef now = ref;
    now.stored_size = stored.size();
    now.codec = Codec::zstd;
    now.dictionary = dictionary;
    const std::uint64_t old_chunks = records::chunk_count(ref.stored_size);
    const std::uint64_t new_chunks = records::chunk_count(now.stored_size);
    for (std::uint64_t i = 0; i < new_chunks; ++i) {
        const std::string_view chunk = stored.substr(i * records::kChunkSize, records::kChunkSize);
        auto place = KCACHE_TRY(
            tx.reserve(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i)),
                       chunk.size()));
        std::memcpy(place, chunk.data(), chunk.size());
    }
    for (std::uint64_t i = new_chunks; i < old_chunks; ++i) {
        KCACHE_TRY(
            tx.del(tx.db.blob_data, records::chunk_key(digest, static_cast<std::uint32_t>(i))));
    }
    KCACHE_TRY(tx.put(tx.db.blob_refs, records::digest_key(digest), records::encode(now)));
    KCACHE_TRY(
        tx.add(Counter::stored_bytes, static_cast<std::int64_t>(records::footprint(now)) -
                                          static_cast<std::int64_t>(records::footprint(ref))));
    KCACHE_TRY(account_blob(tx, ref, -1));
    KCACHE_TRY(account_blob(tx, now, +1));
    return now;
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
static Result<std::vector<std::string_view>> chunk_views(const Tx& tx, const Digest& digest,
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

namespace {

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

// Calls fn with the pieces of a blob's content in order: zero-copy views of raw
// chunks, decompressed blobs, a list's segments. Checks sizes and digests (a list's
// own and each segment's) before fn sees a piece of the blob or segment. A
// segment is never a list itself (`in_list`).
Status for_each_piece(const Tx& tx, const Digest& digest, std::uint64_t size,
                      const std::function<void(std::string_view)>& fn, bool in_list = false) {
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

}  // namespace

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

Result<StoredContent> store_content(Tx& tx, const Inode& node, std::string_view content,
                                    const ContentDigests& digests) {
    // Where the content goes (store_impl.hpp: its digest unless that holds other bytes).
    std::optional<PlacedSegments> segmented;
    std::optional<Placement> flat;
    if (!digests.segments.empty()) {
        // The version replaced (a damaged one is no help, and replaced all the same).
        auto own = segment_list(tx, node.digest);
        const std::vector<Digest>* own_list = own && *own ? &**own : nullptr;
        auto placed = KCACHE_TRY(place_segmented(tx, digests, content, own_list));
        segmented = std::move(placed);
    } else if (!digests.digest.empty()) {
        auto placed = KCACHE_TRY(place_flat(tx, digests.digest, content));
        flat = std::move(placed);
    }
    const Digest address = segmented ? segmented->place.address : flat ? flat->address : Digest{};
    std::optional<BlobRef> replaced;
    if (segmented) {
        auto r = KCACHE_TRY(replace_segmented(tx, node.digest, *segmented, content));
        replaced = std::move(r);
    }
    BlobRef ref;
    if (replaced) {
        ref = *replaced;
    } else {
        // Take the new reference before dropping the old one: rewriting the same
        // content must not free the blob in between.
        if (segmented) {
            auto taken = KCACHE_TRY(take_segmented(tx, *segmented, content));
            ref = taken;
        } else if (flat && flat->existing) {
            auto taken = KCACHE_TRY(take_existing(tx, *flat));
            ref = taken;
        } else if (flat) {
            BlobOwner owner{node.name, producer_of(node.name)};
            if (node.entry) {
                auto entry = KCACHE_TRY(tx.find_entry_record(node.entry));
                if (entry && entry->producer != Producer::unknown) owner.producer = entry->producer;
            }
            auto taken = KCACHE_TRY(take_flat(tx, *flat, content, 1, &owner));
            ref = taken;
        }
        KCACHE_TRY(release_blob(tx, node.digest));
    }
    return StoredContent{address, ref};
}

// The checks every write to an inode makes before its content changes.
Result<Inode> writable_file(const Tx& tx, Ino file) {
    auto node = KCACHE_TRY(tx.inode(file));
    if (is_dir(node.mode)) return fail(EISDIR, fmt::format("inode {} is a directory", file));
    if (!is_regular(node.mode))
        return fail(EINVAL, fmt::format("inode {} is not a regular file", file));
    return node;
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
