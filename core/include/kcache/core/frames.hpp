// A blob's zstd frame and the trained dictionary it needs, as they travel between dbs
// (the shared tier: remote/src/transfer.cpp sends them, pull.cpp stores them).
//
// Why frames travel as stored: a blob compressed with its kind's dictionary is about
// half the bytes of the same content compressed alone (dictionaries.hpp), and sending
// the stored frame costs the sender no compression and the receiver none either. The
// frame names its dictionary by the sender's local id, which means nothing elsewhere:
// a dictionary travels by its portable digest (dictionary_digest: the trained bytes,
// the id they carry zeroed), and the receiver rewrites the frame's Dictionary_ID to
// its own id for those bytes (with_frame_dictionary), storing the dictionary under a
// new id if it has no such one yet.
//
// Every input here may come from the network: a frame or dictionary that does not
// parse, does not decompress to exactly the size given, or whose content is not the
// digest given is EBADMSG, never a crash or an unbounded allocation (frames hold less
// than kSegmentedSize raw bytes: bigger content is a segment list, which travels as
// content).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

struct StoredFrame {
    std::string frame;             // one zstd frame; its Dictionary_ID is `dictionary`
    std::uint64_t raw_size = 0;    // what it decompresses to
    std::uint32_t dictionary = 0;  // this db's id of its dictionary (0: none)
};
// Blob `digest` as stored, when that is one zstd frame: nullopt when the db lacks it or
// stores it raw or as a segment list (those travel as content). EIO when the frame
// names another dictionary than the blob's reference.
Result<std::optional<StoredFrame>> read_frame(const Txn& txn, const Digest& digest);
// Dictionary `id`'s bytes as stored (a zstd dictionary carrying `id`). ENOENT when the
// db has no such dictionary.
Result<std::string> read_dictionary(const Txn& txn, std::uint32_t id);

// The digest a dictionary travels by: digest_of its bytes with their id (bytes 4..8 of
// a zstd dictionary) zeroed, so that the same trained bytes have one digest on every
// node whatever id each gave them.
Digest dictionary_digest(std::string_view dictionary);
// The Dictionary_ID in `frame`'s header (0: none). EBADMSG when it is no zstd frame
// header (bad magic, reserved bit set, cut short).
Result<std::uint32_t> frame_dictionary(std::string_view frame);
// `frame` with its Dictionary_ID replaced by `id` (0: no field). The field takes 0, 1, 2
// or 4 bytes by value, as zstd writes it, so the header may change length; the rest of
// the frame is copied as it is. EBADMSG as frame_dictionary.
Result<std::string> with_frame_dictionary(std::string_view frame, std::uint32_t id);
// The content of `frame`, exactly one zstd frame decompressing to `raw_size` bytes
// (less than kSegmentedSize) with `dictionary` (empty: none; otherwise the one whose id
// the frame names). EBADMSG otherwise. Each thread keeps its decompression context and
// its last 16 dictionaries loaded, so a pull of many frames digests each dictionary once.
Result<std::string> decompress_frame(std::string_view frame, std::string_view dictionary,
                                     std::uint64_t raw_size);

// This db's dictionaries by dictionary_digest (few: one or two per kind), which a caller
// offering frames keeps for its write transaction: offer_frame adds what it stores.
using DictionaryIds = std::vector<std::pair<Digest, std::uint32_t>>;
Result<DictionaryIds> dictionary_ids(const Txn& txn);

struct PulledFrame {
    Digest digest;  // of the content (digest_of)
    std::uint64_t raw_size = 0;
    std::string_view frame;       // as it came: its Dictionary_ID is the sender's
    std::string_view dictionary;  // the dictionary it needs, as it came (empty: none)
    std::string_view name;        // the file it is for, and its entry's producer: its kind
    Producer producer = Producer::unknown;
};
// Stores the blob of `pulled` from its frame as it is, its Dictionary_ID rewritten to
// this db's id for its dictionary. A dictionary the db lacks (by digest) is stored
// under a new id, counted in `ids`, refcounted by its blobs like a trained one; if the
// file's kind had no dictionary it becomes the kind's current one. Before anything is
// stored the rewritten frame is decompressed again and its content checked against
// the digest: EBADMSG (and nothing stored) for a bad frame or dictionary.
//
// The blob is stored with no reference: the caller writes a file of that content in
// the same transaction (its write takes the reference, as for any blob already
// stored), or drops the transaction. False, with nothing done, when the db has the
// blob already or cannot take it as a frame (a db without the dictionaries table):
// the file's write then stores the content as usual.
Result<bool> offer_frame(WriteTxn& txn, const PulledFrame& pulled, DictionaryIds& ids);

}  // namespace kcache::core
