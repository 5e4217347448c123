// Frames and dictionaries as they travel between dbs (frames.hpp).
#include "kcache/core/frames.hpp"

#include <algorithm>
#include <cstring>
#include <list>
#include <memory>

#include <fmt/format.h>
#include <zstd.h>

#include "kcache/core/byte_reader.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::BlobRef;
using records::Codec;

namespace {

constexpr std::uint32_t kFrameMagic = 0xFD2FB528;
constexpr std::uint32_t kDictionaryMagic = 0xEC30A437;
constexpr std::size_t kCachedDictionaries = 16;  // per thread

tl::unexpected<Error> bad(std::string_view what) {
    return fail(EBADMSG, fmt::format("corrupt frame: {}", what));
}

std::uint32_t le32(std::string_view bytes, std::size_t at) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < 4; ++i)
        v |= std::uint32_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
    return v;
}

// Where a frame header's Dictionary_ID is: its offset and width (RFC 8878, 3.1.1.1).
struct DictionaryField {
    std::size_t at = 0;
    std::size_t width = 0;
};
Result<DictionaryField> dictionary_field(std::string_view frame) {
    if (frame.size() < 5 || le32(frame, 0) != kFrameMagic) return bad("no zstd frame magic");
    const auto descriptor = static_cast<unsigned char>(frame[4]);
    if (descriptor & 0x08) return bad("reserved bit set in the frame header");
    const bool single_segment = descriptor & 0x20;
    static constexpr std::size_t kWidths[4] = {0, 1, 2, 4};
    static constexpr std::size_t kContentSizeWidths[4] = {0, 2, 4, 8};
    DictionaryField field;
    field.at = 5 + (single_segment ? 0 : 1);  // the window descriptor
    field.width = kWidths[descriptor & 3];
    std::size_t content_size = kContentSizeWidths[descriptor >> 6];
    if (content_size == 0 && single_segment) content_size = 1;
    // A header cut anywhere, the Dictionary_ID included, is refused before it is read.
    if (frame.size() < field.at + field.width + content_size) return bad("header cut short");
    return field;
}

// Per thread: a decompression context and the last dictionaries used, by the digest of
// their bytes as given (the id included, so an entry is right whatever db they came
// from or will go to).
struct DecompressionCache {
    struct Loaded {
        Digest digest;
        ZSTD_DDict* ddict = nullptr;
    };
    ZSTD_DCtx* context = ZSTD_createDCtx();
    std::list<Loaded> recent;  // most recent first, at most kCachedDictionaries
    ~DecompressionCache() {
        for (Loaded& l : recent) ZSTD_freeDDict(l.ddict);
        ZSTD_freeDCtx(context);
    }
    ZSTD_DDict* dictionary(std::string_view bytes) {
        const Digest digest = digest_of(bytes);
        for (auto it = recent.begin(); it != recent.end(); ++it) {
            if (it->digest == digest) {
                recent.splice(recent.begin(), recent, it);
                return it->ddict;
            }
        }
        ZSTD_DDict* ddict = ZSTD_createDDict(bytes.data(), bytes.size());
        if (!ddict) return nullptr;
        recent.push_front({digest, ddict});
        if (recent.size() > kCachedDictionaries) {
            ZSTD_freeDDict(recent.back().ddict);
            recent.pop_back();
        }
        return ddict;
    }
};
DecompressionCache& decompression() {
    thread_local DecompressionCache cache;
    return cache;
}

}  // namespace

Result<std::optional<StoredFrame>> read_frame(const Txn& txn, const Digest& digest) {
    const Tx tx = TxnAccess::tx(txn);
    auto ref = KCACHE_TRY(tx.blob_ref(digest));
    if (!ref || ref->codec != Codec::zstd) return std::nullopt;
    auto stored = KCACHE_TRY(ops::stored_form(tx, digest, *ref));
    StoredFrame out;
    out.frame.assign(stored.bytes());
    out.raw_size = ref->raw_size;
    out.dictionary = ref->dictionary;
    auto named = frame_dictionary(out.frame);
    if (!named || *named != ref->dictionary) {
        return fail(EIO, fmt::format("db {}: blob {}'s frame names another dictionary than its "
                                     "reference ({})",
                                     tx.db.path, digest.hex(), ref->dictionary));
    }
    return std::optional<StoredFrame>(std::move(out));
}

Result<std::string> read_dictionary(const Txn& txn, std::uint32_t id) {
    const Tx tx = TxnAccess::tx(txn);
    auto bytes = KCACHE_TRY(ops::stored_dictionary(tx, id));
    if (!bytes) return fail(ENOENT, fmt::format("db {}: no dictionary {}", tx.db.path, id));
    return std::move(*bytes);
}

Digest dictionary_digest(std::string_view dictionary) {
    if (dictionary.size() < 8) return digest_of(dictionary);
    std::string zeroed(dictionary);
    std::memset(zeroed.data() + 4, 0, 4);
    return digest_of(zeroed);
}

Result<std::uint32_t> frame_dictionary(std::string_view frame) {
    const auto field = KCACHE_TRY(dictionary_field(frame));
    std::uint32_t id = 0;
    for (std::size_t i = 0; i < field.width; ++i)
        id |= std::uint32_t{static_cast<unsigned char>(frame[field.at + i])} << (8 * i);
    return id;
}

Result<std::string> with_frame_dictionary(std::string_view frame, std::uint32_t id) {
    const auto field = KCACHE_TRY(dictionary_field(frame));
    const std::size_t width = id == 0 ? 0 : id < 0x100 ? 1 : id < 0x10000 ? 2 : 4;
    const unsigned flag = width == 4 ? 3 : static_cast<unsigned>(width);
    std::string out;
    out.reserve(frame.size() + 4);
    out.append(frame.substr(0, field.at));
    out[4] = static_cast<char>((static_cast<unsigned char>(out[4]) & ~3u) | flag);
    for (std::size_t i = 0; i < width; ++i)
        out.push_back(static_cast<char>((id >> (8 * i)) & 0xff));
    out.append(frame.substr(field.at + field.width));
    return out;
}

Result<std::string> decompress_frame(std::string_view frame, std::string_view dictionary,
                                     std::uint64_t raw_size) {
    if (raw_size >= kSegmentedSize) return bad("a frame holds less than kSegmentedSize bytes");
    const std::uint32_t named = KCACHE_TRY(frame_dictionary(frame));
    if (dictionary.empty() != (named == 0)) {
        return bad(named ? "the frame needs a dictionary" : "the frame names no dictionary");
    }
    if (!dictionary.empty() && (dictionary.size() < 8 || le32(dictionary, 0) != kDictionaryMagic ||
                                le32(dictionary, 4) != named)) {
        return bad("the dictionary is not the one the frame names");
    }
    if (ZSTD_findFrameCompressedSize(frame.data(), frame.size()) != frame.size())
        return bad("not exactly one frame");
    DecompressionCache& cache = decompression();
    std::string raw(raw_size, '\0');
    std::size_t n = 0;
    if (dictionary.empty()) {
        n = ZSTD_decompressDCtx(cache.context, raw.data(), raw.size(), frame.data(), frame.size());
    } else {
        ZSTD_DDict* ddict = cache.dictionary(dictionary);
        if (!ddict) return bad("the dictionary does not load");
        n = ZSTD_decompress_usingDDict(cache.context, raw.data(), raw.size(), frame.data(),
                                       frame.size(), ddict);
    }
    if (ZSTD_isError(n)) {
        return bad(fmt::format("does not decompress ({})", ZSTD_getErrorName(n)));
    }
    if (n != raw_size) return bad("decompresses to another size");
    return raw;
}

Result<DictionaryIds> dictionary_ids(const Txn& txn) {
    const Tx tx = TxnAccess::tx(txn);
    DictionaryIds ids;
    if (!tx.db.has_dicts) return ids;
    std::vector<std::uint32_t> found;
    KCACHE_TRY(tx.scan(tx.db.dicts, "D", "D", [&](std::string_view key, std::string_view) {
        if (key.size() == 5)
            found.push_back(ByteReader(key, "dictionary key").be_at<std::uint32_t>(1).value_or(0));
        return true;
    }));
    for (const std::uint32_t id : found) {
        auto bytes = KCACHE_TRY(ops::stored_dictionary(tx, id));
        if (bytes) ids.emplace_back(dictionary_digest(*bytes), id);
    }
    return ids;
}

Result<bool> offer_frame(WriteTxn& txn, const PulledFrame& pulled, DictionaryIds& ids) {
    Tx tx = TxnAccess::tx(txn);
    if (!tx.db.has_dicts) return false;
    if (KCACHE_TRY(tx.blob_ref(pulled.digest))) return false;

    // This db's id of the dictionary, known or to be stored (the bytes then carry it).
    std::uint32_t local = 0;
    std::string dictionary(pulled.dictionary);
    bool new_dictionary = false;
    if (!dictionary.empty()) {
        if (dictionary.size() < 8 || le32(dictionary, 0) != kDictionaryMagic)
            return bad("not a zstd dictionary");
        const Digest digest = dictionary_digest(dictionary);
        auto known =
            std::find_if(ids.begin(), ids.end(), [&](const auto& p) { return p.first == digest; });
        if (known != ids.end()) {
            local = known->second;
            auto stored = KCACHE_TRY(ops::stored_dictionary(tx, local));
            if (!stored)
                return fail(EIO, fmt::format("db {}: dictionary {} is gone", tx.db.path, local));
            dictionary = std::move(*stored);
        } else {
            new_dictionary = true;
        }
    }
    // Checked before anything is stored: the frame with this db's id, decompressed with
    // the dictionary as this db will hold it (a new one with the id it is about to get),
    // must give the content of the digest.
    std::uint32_t id = local;
    if (new_dictionary) {
        // The next id, as store_dictionary will give it (same transaction: no other writer).
        auto next = KCACHE_TRY(tx.get(tx.db.meta, kMetaNextDictionary));
        id = next ? static_cast<std::uint32_t>(
                        KCACHE_TRY(records::decode_u64(*next, "next dictionary")))
                  : kFirstDictionaryId;
        for (int i = 0; i < 4; ++i)
            dictionary[static_cast<std::size_t>(4 + i)] = static_cast<char>((id >> (8 * i)) & 0xff);
    }
    const std::string frame = KCACHE_TRY(with_frame_dictionary(pulled.frame, id));
    const std::string raw = KCACHE_TRY(decompress_frame(frame, dictionary, pulled.raw_size));
    if (!(digest_of(raw) == pulled.digest)) return bad("content does not match its digest");

    const std::uint32_t kind =
        KCACHE_TRY(ops::kind_for(tx, ops::BlobOwner{pulled.name, pulled.producer}, raw));
    if (new_dictionary) {
        const std::uint32_t stored = KCACHE_TRY(ops::store_dictionary(tx, kind, dictionary, 0, 0));
        if (stored != id) return fail(EIO, "dictionary id changed while it was stored");
        ids.emplace_back(dictionary_digest(dictionary), id);
        if (kind) KCACHE_TRY(ops::adopt_dictionary(tx, kind, id));
    }
    BlobRef ref{0, pulled.raw_size, frame.size(), Codec::zstd};
    ref.kind = kind;
    ref.dictionary = id;
    KCACHE_TRY(ops::put_blob(tx, pulled.digest, frame, ref));
    return true;
}

}  // namespace kcache::core
