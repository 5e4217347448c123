// Storing file content: content-addressed blobs with reference counts, compression,
// segments of big files. Reading it: content_read.cpp; atomic publication (StagedFile):
// staged.cpp.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// Below this size compression cannot pay for its frame. Above it, zstd is kept only
// when it saves at least an eighth of the blob's footprint in data.mdb: content that
// would take the same pages compressed is stored raw, and read zero-copy.
constexpr std::size_t kMinCompressSize = 128;
constexpr int kZstdLevel = 3;

// This thread's zstd compression context, made once.
ZSTD_CCtx* compression_context() {
    struct Context {
        ZSTD_CCtx* cctx = ZSTD_createCCtx();
        ~Context() { ZSTD_freeCCtx(cctx); }
    };
    thread_local Context context;
    return context.cctx;
}

// The compressed form of `content` if it saves space, else empty; with `dictionary`
// (whose id the frame then carries) when given.
std::string compress(std::string_view content, const LoadedDictionary* dictionary) {
    if (content.size() < kMinCompressSize) return {};
    std::string out(ZSTD_compressBound(content.size()), '\0');
    const std::size_t n =
        dictionary ? ZSTD_compress_usingCDict(compression_context(), out.data(), out.size(),
                                              content.data(), content.size(), dictionary->compress)
                   : ZSTD_compressCCtx(compression_context(), out.data(), out.size(),
                                       content.data(), content.size(), kZstdLevel);
    const std::uint64_t raw = records::footprint(content.size());
    if (ZSTD_isError(n) || records::footprint(n) > raw - raw / 8) return {};
    out.resize(n);
    return out;
}

}  // namespace

namespace ops {

std::string compressed_form(std::string_view content, const LoadedDictionary* dictionary) {
    return compress(content, dictionary);
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

}  // namespace kcache::core
