// File kinds and trained zstd dictionaries (schema 4).
//
// Kernels of one compiler are very alike: the same PTX preamble, the same metadata keys,
// the same ELF sections. Each file is compressed on its own, so zstd relearns that every
// time; a dictionary trained on earlier files of the same kind gives it that context
// (bench/README.md, "Trained dictionaries": on real Triton output stored/raw goes from
// 0.18 to under 0.10).
//
// A blob is classified when it is stored as one *kind*: the producer of its entry and
// the file kind of its name (roles.hpp), cubins per SM architecture, e.g.
// "triton/cubin-sm_90", "triton/ptx", "triton/json", "triton/group". Each kind keeps
// its accounting (blobs, raw and stored bytes) and at most one *current* dictionary,
// which every new blob of the kind is compressed with; its zstd frame then names the
// dictionary (the frame's dictID is the dictionary's id), and so does its blob
// reference. A dictionary is kept, by id, for as long as any blob uses it, and dropped
// with its last user once a newer one replaced it; ids are never reused.
//
// Training never runs on a request path: train_dictionaries() reads samples in a
// snapshot, trains with no transaction open, and stores the result in one short write
// transaction. The daemon runs it on a thread of its own when dictionaries_due() says
// so (fsd/src/daemon/upkeep.cpp); `kcache gc` runs it too, and then rewrites blobs stored
// before their kind's current dictionary existed (recompress_blobs).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

// "<producer>/<file kind>", with "-sm_NN" for a cubin whose ELF header names its
// architecture: the kind a file of this name and content is stored as.
std::string kind_name(std::string_view file_name, Producer producer, std::string_view content);

// When a kind gets a dictionary. Training is tried once the kind holds `min_blobs`
// blobs and `min_raw_bytes`, and again each time its raw bytes grew `growth` times
// since the last try (a newer dictionary replaces the older for new blobs). A trained
// dictionary is kept only when it saves at least an eighth of the samples' stored
// bytes, itself included.
struct DictionaryPolicy {
    std::uint64_t min_blobs = 16;
    std::uint64_t min_raw_bytes = 32 * 1024;
    std::uint64_t growth = 4;
    std::uint64_t max_dictionary_bytes = 64 * 1024;
    std::uint64_t sample_share = 20;  // a dictionary is at most 1/share of its samples
    std::uint64_t max_sample_bytes = 8 * 1024 * 1024;  // per kind, read from the db
    std::uint64_t max_sample = 128 * 1024;             // of one blob, its first bytes
};

struct KindStats {
    std::uint32_t id = 0;
    std::string name;
    std::uint64_t blobs = 0;
    std::uint64_t raw_bytes = 0;
    std::uint64_t stored_bytes = 0;  // footprints (records.hpp), as Counter::stored_bytes
    std::uint32_t dictionary = 0;    // current one (0: none)
    std::uint64_t dictionary_bytes = 0;
    // Every dictionary of the kind still held (current and older in use): how many,
    // and their footprint, which no blob's counts.
    std::uint64_t dictionaries = 0;
    std::uint64_t dictionaries_footprint = 0;
};
// Every kind, by id. Blobs of no kind (segments, and blobs stored before schema 4 that
// `kcache gc` has not classified yet) are the difference to the global counters.
Result<std::vector<KindStats>> kind_stats(const Txn& txn);

// Whether some kind is due for training (cheap: reads the kinds, not the blobs).
Result<bool> dictionaries_due(const Store& store, const DictionaryPolicy& policy = {});

struct TrainedDictionary {
    std::string kind;
    std::uint32_t id = 0;  // 0: not kept (training failed or did not pay)
    std::uint64_t bytes = 0;
    std::uint64_t samples = 0;
    std::uint64_t sample_bytes = 0;
    std::uint64_t stored_without = 0;  // the samples' footprints compressed without it
    std::uint64_t stored_with = 0;     // with it (its own footprint not included)
};
// Trains a dictionary for every kind that is due (see above). Safe beside writers:
// a kind whose dictionary changed meanwhile (another process trained it) is skipped.
Result<std::vector<TrainedDictionary>> train_dictionaries(Store& store,
                                                          const DictionaryPolicy& policy = {});

struct RecompressReport {
    std::uint64_t classified = 0;  // blobs of no kind given their file's kind
    std::uint64_t rewritten = 0;   // blobs recompressed with their kind's dictionary
    std::uint64_t stored_before = 0;
    std::uint64_t stored_after = 0;  // footprints of the rewritten blobs
    std::vector<TrainedDictionary> trained;
};
// `kcache gc`'s part: classifies blobs of no kind by a file that holds them, trains
// what is due, then rewrites each blob whose kind has a dictionary it was not stored
// with, where that makes it smaller. Works in write transactions of a bounded number of
// blobs; entries' stored bytes follow. A blob some segment list also holds is left.
Result<RecompressReport> recompress_blobs(Store& store, const DictionaryPolicy& policy = {});

}  // namespace kcache::core
