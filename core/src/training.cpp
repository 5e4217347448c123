// Training zstd dictionaries for the file kinds, and gc's recompression: the work above
// the content (content.cpp: compression, reads, rewrites in place) and the kinds and
// dictionaries (dictionaries.cpp: records, loading, accounting).
//
// Where training runs, and why there: never on a request path (a training of a few MiB
// of samples takes a good part of a second). The daemon asks dictionaries_due() now and
// then on its background thread (a scan of a few kind records) and runs
// train_dictionaries() on a thread of its own (fsd/src/daemon/upkeep.cpp); `kcache gc`
// trains too, then rewrites older blobs. Training reads its samples in a snapshot and
// writes the dictionary in one short transaction, so writers wait for no training.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <zdict.h>

#include "kcache/core/dictionaries.hpp"
#include "kcache/core/roles.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::Codec;

namespace {

constexpr std::uint32_t kDictionaryMagic = 0xEC30A437;

bool due(const records::Kind& k, const DictionaryPolicy& policy) {
    return k.blobs >= policy.min_blobs && k.raw_bytes >= policy.min_raw_bytes &&
           k.raw_bytes >= policy.growth * k.trained_at;
}

// The footprint `samples` take compressed each on its own, with `dictionary` or not.
std::uint64_t stored_footprint(const std::vector<std::string>& samples,
                               const LoadedDictionary* dictionary) {
    std::uint64_t total = 0;
    for (const std::string& sample : samples) {
        const std::string compressed = ops::compressed_form(sample, dictionary);
        total += records::footprint(compressed.empty() ? sample.size() : compressed.size());
    }
    return total;
}

// A kind due for training: its record as read, its samples, and what training made.
struct Due {
    records::Kind kind;  // as read
    std::vector<std::string> samples;
    std::uint64_t bytes = 0;
    TrainedDictionary result;
    std::string dictionary;  // trained bytes, kept when non-empty
};
using DueKinds = std::map<std::uint32_t, Due>;

// 1. In a snapshot: the kinds due and samples of each (blobs in digest order, which is
//    no order of their content: a fair sample).
Result<DueKinds> sample_due_kinds(const Store& store, const DictionaryPolicy& policy) {
    DueKinds due_kinds;
    auto txn = KCACHE_TRY(store.read());
    Tx tx = TxnAccess::tx(txn);
    auto kinds = KCACHE_TRY(ops::all_kinds(tx));
    for (auto& [id, k] : kinds) {
        if (due(k, policy)) due_kinds[id].kind = std::move(k);
    }
    if (due_kinds.empty()) return due_kinds;
    KCACHE_TRY(tx.scan_checked(
        tx.db.blob_refs, {}, {}, [&](std::string_view key, std::string_view value) -> Result<bool> {
            auto ref = KCACHE_TRY(records::decode_blob_ref(value));
            if (ref.codec == Codec::segments || ref.raw_size < 16) return true;
            auto it = due_kinds.find(ref.kind);
            if (it == due_kinds.end() || it->second.bytes >= policy.max_sample_bytes) return true;
            auto content =
                KCACHE_TRY(ops::read_blob(tx, records::digest_from_key(key), ref.raw_size));
            std::string sample(content.bytes().substr(0, policy.max_sample));
            it->second.bytes += sample.size();
            it->second.samples.push_back(std::move(sample));
            return true;
        }));
    return due_kinds;
}

// 2. Trains `d`'s dictionary, no transaction open; keeps it (d.dictionary) when it pays.
void train(Due& d, const DictionaryPolicy& policy) {
    d.result.kind = d.kind.name;
    d.result.samples = d.samples.size();
    d.result.sample_bytes = d.bytes;
    if (d.samples.size() < policy.min_blobs) return;
    std::string joined;
    std::vector<std::size_t> sizes;
    joined.reserve(d.bytes);
    for (const std::string& s : d.samples) {
        joined += s;
        sizes.push_back(s.size());
    }
    // About a tenth of the samples (zstd's advice is a hundredth of a large
    // corpus; a cache's kinds are small, and their files share most of their text).
    const std::size_t capacity = static_cast<std::size_t>(
        std::clamp<std::uint64_t>(d.bytes / std::max<std::uint64_t>(policy.sample_share, 1), 1024,
                                  policy.max_dictionary_bytes));
    std::string dictionary(capacity, '\0');
    const std::size_t n = ZDICT_trainFromBuffer(dictionary.data(), dictionary.size(), joined.data(),
                                                sizes.data(), static_cast<unsigned>(sizes.size()));
    if (ZDICT_isError(n) || n < 8) return;
    dictionary.resize(n);
    std::uint32_t magic = 0;
    std::memcpy(&magic, dictionary.data(), 4);
    if (magic != kDictionaryMagic) return;  // raw content: no entropy tables, no id
    auto trial = ops::make_loaded(0, dictionary);
    if (!trial) return;
    d.result.stored_without = stored_footprint(d.samples, nullptr);
    d.result.stored_with = stored_footprint(d.samples, trial.get());
    const std::uint64_t with = d.result.stored_with + records::footprint(dictionary.size());
    if (with > d.result.stored_without - d.result.stored_without / 8) return;
    d.result.bytes = dictionary.size();
    d.dictionary = std::move(dictionary);
}

// 3. Stores what paid, and notes the try for every kind.
Status store_trained(Store& store, DueKinds& due_kinds) {
    return store.update([&](WriteTxn& txn) -> Status {
        Tx tx = TxnAccess::tx(txn);
        for (auto& [id, d] : due_kinds) {
            auto now = KCACHE_TRY(ops::find_kind(tx, id));
            if (!now || now->dictionary != d.kind.dictionary) continue;  // trained meanwhile
            now->trained_at = std::max<std::uint64_t>(d.kind.raw_bytes, 1);
            if (!d.dictionary.empty()) {
                const std::uint32_t new_id = KCACHE_TRY(
                    ops::store_dictionary(tx, id, d.dictionary, d.samples.size(), d.bytes));
                // The one it replaces stays while blobs use it.
                if (const std::uint32_t old = now->dictionary) {
                    auto old_record = KCACHE_TRY(ops::find_dictionary(tx, old));
                    if (old_record && old_record->users == 0)
                        KCACHE_TRY(ops::drop_dictionary(tx, old, *old_record));
                }
                now->dictionary = new_id;
                d.result.id = new_id;
            }
            KCACHE_TRY(tx.put(tx.db.dicts, records::kind_key(id), records::encode(*now)));
        }
        return {};
    });
}

// What a blob of no kind is classified by: one file that holds it.
struct Owner {
    std::string name;
    Producer producer = Producer::unknown;
};
using Unclassified = std::vector<std::pair<Digest, Owner>>;
constexpr std::size_t kBatch = 1024;

// gc's step 1, in a snapshot: the blobs of no kind, each with a file that holds it.
Result<Unclassified> unclassified_blobs(const Store& store) {
    Unclassified unclassified;
    auto txn = KCACHE_TRY(store.read());
    Tx tx = TxnAccess::tx(txn);
    std::unordered_map<Ino, Producer> producers;
    std::unordered_set<Digest, DigestHash> seen;
    KCACHE_TRY(tx.scan_checked(
        tx.db.inodes, {}, {}, [&](std::string_view key, std::string_view value) -> Result<bool> {
            auto node = KCACHE_TRY(records::decode_inode(records::u64_from_key(key), value));
            if (!is_regular(node.mode) || node.digest.empty()) return true;
            if (!seen.insert(node.digest).second) return true;
            auto ref = KCACHE_TRY(tx.blob_ref(node.digest));
            if (!ref || ref->kind != 0 || ref->codec == Codec::segments) return true;
            Producer producer = producer_of(node.name);
            if (node.entry) {
                auto it = producers.find(node.entry);
                if (it == producers.end()) {
                    auto entry = KCACHE_TRY(tx.find_entry_record(node.entry));
                    it = producers.emplace(node.entry, entry ? entry->producer : Producer::unknown)
                             .first;
                }
                if (it->second != Producer::unknown) producer = it->second;
            }
            unclassified.emplace_back(node.digest, Owner{node.name, producer});
            return true;
        }));
    return unclassified;
}

// Classifies the blob `digest` by `owner` (unless classified meanwhile): whether it was.
Result<bool> classify_blob(Tx& tx, const Digest& digest, const Owner& owner) {
    auto ref = KCACHE_TRY(tx.blob_ref(digest));
    if (!ref || ref->kind != 0 || ref->dictionary != 0 || ref->codec == Codec::segments)
        return false;
    std::string content;  // only a cubin's kind depends on its content
    if (file_kind(owner.name) == "cubin") {
        auto c = KCACHE_TRY(ops::read_blob(tx, digest, ref->raw_size));
        content.assign(c.bytes());
    }
    ref->kind = KCACHE_TRY(ops::kind_for(tx, ops::BlobOwner{owner.name, owner.producer}, content));
    KCACHE_TRY(tx.put(tx.db.blob_refs, records::digest_key(digest), records::encode(*ref)));
    // A blob of no kind was stored with no dictionary (acquire_flat): its kind counts it
    // now, and no dictionary gains a user.
    KCACHE_TRY(ops::account_blob(tx, *ref, +1));
    return true;
}

// gc's step 1, in batches of short transactions.
Status classify_blobs(Store& store, const Unclassified& unclassified, RecompressReport& report) {
    for (std::size_t begin = 0; begin < unclassified.size(); begin += kBatch) {
        const std::size_t end = std::min(unclassified.size(), begin + kBatch);
        KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
            Tx tx = TxnAccess::tx(txn);
            for (std::size_t i = begin; i < end; ++i) {
                const auto& [digest, owner] = unclassified[i];
                if (KCACHE_TRY(classify_blob(tx, digest, owner))) ++report.classified;
            }
            return {};
        }));
    }
    return {};
}

// gc's step 3, in a snapshot: the blobs stored without their kind's current dictionary.
Result<std::vector<Digest>> rewrite_candidates(const Store& store) {
    std::vector<Digest> candidates;
    auto txn = KCACHE_TRY(store.read());
    Tx tx = TxnAccess::tx(txn);
    auto kinds = KCACHE_TRY(ops::all_kinds(tx));
    KCACHE_TRY(tx.scan_checked(tx.db.blob_refs, {}, {},
                               [&](std::string_view key, std::string_view value) -> Result<bool> {
                                   auto ref = KCACHE_TRY(records::decode_blob_ref(value));
                                   if (ref.codec == Codec::segments || ref.kind == 0) return true;
                                   auto it = kinds.find(ref.kind);
                                   if (it == kinds.end() || it->second.dictionary == 0 ||
                                       it->second.dictionary == ref.dictionary)
                                       return true;
                                   candidates.push_back(records::digest_from_key(key));
                                   return true;
                               }));
    return candidates;
}

// The entries (0: none) of the files that hold each of `digests`: one scan of the inodes.
using Holders = std::unordered_map<Digest, std::vector<Ino>, DigestHash>;
Result<Holders> holders_of(const Tx& tx, const Digest* digests, std::size_t n) {
    Holders holders;
    for (std::size_t i = 0; i < n; ++i) holders[digests[i]];
    KCACHE_TRY(tx.scan_checked(
        tx.db.inodes, {}, {}, [&](std::string_view key, std::string_view value) -> Result<bool> {
            auto node = KCACHE_TRY(records::decode_inode(records::u64_from_key(key), value));
            if (!is_regular(node.mode) || node.digest.empty()) return true;
            auto it = holders.find(node.digest);
            if (it != holders.end()) it->second.push_back(node.entry);
            return true;
        }));
    return holders;
}

// Rewrites blob `digest` with its kind's current dictionary when that saves space, and
// fixes the stored bytes of the entries of `files` (the files holding it).
Status recompress_blob(Tx& tx, const Digest& digest, const std::vector<Ino>& files,
                       RecompressReport& report) {
    auto ref = KCACHE_TRY(tx.blob_ref(digest));
    if (!ref || ref->codec == Codec::segments || ref->kind == 0) return {};
    // A blob a segment list holds too counts in that list's footprint: left.
    if (files.size() != ref->refcount) return {};
    auto dictionary = KCACHE_TRY(ops::current_dictionary(tx, ref->kind));
    if (!dictionary || dictionary->id == ref->dictionary) return {};
    auto content = KCACHE_TRY(ops::read_blob(tx, digest, ref->raw_size));
    const std::string stored = ops::compressed_form(content.bytes(), dictionary.get());
    const std::uint64_t before = records::footprint(*ref);
    if (stored.empty() || records::footprint(stored.size()) >= before) return {};
    auto now = KCACHE_TRY(ops::rewrite_blob(tx, digest, *ref, stored, dictionary->id));
    const std::uint64_t after = records::footprint(now);
    for (const Ino entry : files) {
        if (!entry) continue;
        auto e = KCACHE_TRY(tx.entry(entry));
        e.stored_bytes = e.stored_bytes + after - std::min(e.stored_bytes, before);
        KCACHE_TRY(tx.put_entry(e));
    }
    ++report.rewritten;
    report.stored_before += before;
    report.stored_after += after;
    return {};
}

// gc's step 3, in batches: each scans the inodes once in its transaction, to fix the
// stored bytes of the entries whose files hold a rewritten blob: about 16 scans in all.
Status rewrite_blobs(Store& store, const std::vector<Digest>& candidates,
                     RecompressReport& report) {
    const std::size_t batch = std::max<std::size_t>(kBatch, candidates.size() / 16 + 1);
    for (std::size_t begin = 0; begin < candidates.size(); begin += batch) {
        const std::size_t end = std::min(candidates.size(), begin + batch);
        KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
            Tx tx = TxnAccess::tx(txn);
            auto holders = KCACHE_TRY(holders_of(tx, candidates.data() + begin, end - begin));
            for (std::size_t i = begin; i < end; ++i) {
                KCACHE_TRY(recompress_blob(tx, candidates[i], holders[candidates[i]], report));
            }
            return {};
        }));
    }
    return {};
}

}  // namespace

Result<bool> dictionaries_due(const Store& store, const DictionaryPolicy& policy) {
    if (store.read_only()) return false;
    auto txn = KCACHE_TRY(store.read());
    auto kinds = KCACHE_TRY(ops::all_kinds(TxnAccess::tx(txn)));
    return std::any_of(kinds.begin(), kinds.end(),
                       [&](const auto& k) { return due(k.second, policy); });
}

Result<std::vector<TrainedDictionary>> train_dictionaries(Store& store,
                                                          const DictionaryPolicy& policy) {
    if (store.read_only()) return std::vector<TrainedDictionary>{};
    auto due_kinds = KCACHE_TRY(sample_due_kinds(store, policy));
    if (due_kinds.empty()) return std::vector<TrainedDictionary>{};
    for (auto& [id, d] : due_kinds) train(d, policy);
    KCACHE_TRY(store_trained(store, due_kinds));
    std::vector<TrainedDictionary> out;
    for (auto& [id, d] : due_kinds) out.push_back(std::move(d.result));
    return out;
}

Result<RecompressReport> recompress_blobs(Store& store, const DictionaryPolicy& policy) {
    RecompressReport report;
    if (store.read_only()) return report;
    {
        auto txn = KCACHE_TRY(store.read());
        if (!TxnAccess::tx(txn).db.has_dicts) return report;
    }
    // 1. Classify blobs of no kind by one file that holds each.
    const auto unclassified = KCACHE_TRY(unclassified_blobs(store));
    KCACHE_TRY(classify_blobs(store, unclassified, report));
    // 2. Train what is due now.
    auto trained = KCACHE_TRY(train_dictionaries(store, policy));
    report.trained = std::move(trained);
    // 3. Rewrite blobs stored without their kind's current dictionary.
    const auto candidates = KCACHE_TRY(rewrite_candidates(store));
    KCACHE_TRY(rewrite_blobs(store, candidates, report));
    return report;
}

}  // namespace kcache::core
