// File kinds and trained zstd dictionaries (dictionaries.hpp): classifying blobs, the
// kinds' accounting, loading dictionaries, training, and gc's recompression.
//
// Where training runs, and why there: never on a request path (a training of a few MiB
// of samples takes a good part of a second). The daemon asks dictionaries_due() now and
// then on its background thread (a scan of a few kind records) and runs
// train_dictionaries() on a thread of its own (fsd/src/background.cpp); `kcache gc`
// trains too, then rewrites older blobs. Training reads its samples in a snapshot and
// writes the dictionary in one short transaction, so writers wait for no training.
#include "kcache/core/dictionaries.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <zdict.h>
#include <zstd.h>

#include "kcache/core/byte_reader.hpp"
#include "kcache/core/roles.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::BlobRef;
using records::Codec;

LoadedDictionary::~LoadedDictionary() {
    ZSTD_freeCDict(compress);
    ZSTD_freeDDict(decompress);
}

namespace {

constexpr int kLevel = 3;  // content.cpp's level: a dictionary changes what, not how hard
constexpr std::uint32_t kDictionaryMagic = 0xEC30A437;

// The SM architecture in a 64-bit CUDA ELF's e_flags: bits 8..15 from ABI version 8
// on, bits 0..7 before (the rule of loader/src/cubin.cpp, which core cannot call);
// 0 when `content` is no such ELF.
unsigned cubin_sm(std::string_view content) {
    ByteReader r(content, "cubin");
    auto magic = r.slice(0, 4);
    auto elf_class = r.le_at<std::uint8_t>(4);
    auto abi = r.le_at<std::uint8_t>(8);
    auto flags = r.le_at<std::uint32_t>(48);
    if (!magic ||
        *magic !=
            "\x7f"
            "ELF" ||
        !elf_class || *elf_class != 2 || !abi || !flags) {
        return 0;
    }
    return *abi >= 8 ? (*flags >> 8) & 0xff : *flags & 0xff;
}

Result<std::optional<records::Kind>> find_kind(const Tx& tx, std::uint32_t id) {
    auto bytes = KCACHE_TRY(tx.get(tx.db.dicts, records::kind_key(id)));
    if (!bytes) return std::nullopt;
    auto kind = KCACHE_TRY(records::decode_kind(*bytes));
    return std::optional<records::Kind>(std::move(kind));
}

Result<std::optional<records::Dictionary>> find_dictionary(const Tx& tx, std::uint32_t id) {
    auto bytes = KCACHE_TRY(tx.get(tx.db.dicts, records::dictionary_key(id)));
    if (!bytes) return std::nullopt;
    auto d = KCACHE_TRY(records::decode_dictionary(*bytes));
    return std::optional<records::Dictionary>(d);
}

Status drop_dictionary(Tx& tx, std::uint32_t id, const records::Dictionary& d) {
    KCACHE_TRY(tx.del(tx.db.dicts, records::dictionary_key(id)));
    for (std::uint64_t i = 0; i < records::chunk_count(d.size); ++i) {
        KCACHE_TRY(
            tx.del(tx.db.dicts, records::dictionary_chunk_key(id, static_cast<std::uint32_t>(i))));
    }
    return {};
}

// A dictionary's bytes as stored.
Result<std::string> dictionary_bytes(const Tx& tx, std::uint32_t id, const records::Dictionary& d) {
    std::string bytes;
    bytes.reserve(d.size);
    for (std::uint64_t i = 0; i < records::chunk_count(d.size); ++i) {
        auto chunk = KCACHE_TRY(
            tx.get(tx.db.dicts, records::dictionary_chunk_key(id, static_cast<std::uint32_t>(i))));
        if (!chunk) {
            return fail(EIO,
                        fmt::format("db {}: dictionary {} is missing chunk {}", tx.db.path, id, i));
        }
        bytes.append(*chunk);
    }
    if (bytes.size() != d.size) {
        return fail(EIO, fmt::format("db {}: dictionary {} has {} bytes, its record says {}",
                                     tx.db.path, id, bytes.size(), d.size));
    }
    return bytes;
}

// Every kind record, by id.
Result<std::map<std::uint32_t, records::Kind>> all_kinds(const Tx& tx) {
    std::map<std::uint32_t, records::Kind> kinds;
    if (!tx.db.has_dicts) return kinds;
    KCACHE_TRY(tx.scan_checked(
        tx.db.dicts, "K", "K", [&](std::string_view key, std::string_view value) -> Result<bool> {
            auto id = ByteReader(key, "kind key").be_at<std::uint32_t>(1);
            auto kind = records::decode_kind(value);
            if (!id || !kind) {
                return fail(EIO, fmt::format("db {}: a damaged kind record", tx.db.path));
            }
            kinds.emplace(*id, std::move(*kind));
            return true;
        }));
    return kinds;
}

void add(std::uint64_t& value, std::uint64_t delta, int sign) {
    value = sign > 0 ? value + delta : (value > delta ? value - delta : 0);
}

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

std::shared_ptr<LoadedDictionary> make_loaded(std::uint32_t id, std::string_view bytes) {
    auto d = std::make_shared<LoadedDictionary>();
    d->id = id;
    d->compress = ZSTD_createCDict(bytes.data(), bytes.size(), kLevel);
    d->decompress = ZSTD_createDDict(bytes.data(), bytes.size());
    if (!d->compress || !d->decompress) return nullptr;
    return d;
}

}  // namespace

std::string kind_name(std::string_view file_name, Producer producer, std::string_view content) {
    std::string kind(file_kind(file_name));
    if (kind == "cubin") {
        if (const unsigned sm = cubin_sm(content)) kind += fmt::format("-sm_{}", sm);
    }
    return fmt::format("{}/{}", producer_name(producer), kind);
}

namespace ops {

Result<std::uint32_t> kind_for(Tx& tx, const BlobOwner& owner, std::string_view content) {
    if (!tx.db.has_dicts) return 0;
    const std::string name = kind_name(owner.name, owner.producer, content);
    auto known = KCACHE_TRY(tx.get(tx.db.dicts, records::kind_name_key(name)));
    if (known) {
        auto id = KCACHE_TRY(records::decode_u32(*known, "kind name"));
        return id;
    }
    // A new kind: the next id (kinds are few, never removed; ids start at 1).
    std::uint32_t id = 1;
    KCACHE_TRY(tx.scan(tx.db.dicts, "K", "K", [&](std::string_view key, std::string_view) {
        id = std::max(id, ByteReader(key, "kind key").be_at<std::uint32_t>(1).value_or(0) + 1);
        return true;
    }));
    records::Kind kind;
    kind.name = name;
    std::string id_bytes;
    records::Writer(id_bytes).u32(id);
    KCACHE_TRY(tx.put(tx.db.dicts, records::kind_name_key(name), id_bytes));
    KCACHE_TRY(tx.put(tx.db.dicts, records::kind_key(id), records::encode(kind)));
    return id;
}

Result<std::shared_ptr<const LoadedDictionary>> load_dictionary(const Tx& tx, std::uint32_t id) {
    auto& cache = tx.db.dictionaries;
    {
        std::lock_guard lock(cache.mutex);
        if (auto it = cache.by_id.find(id); it != cache.by_id.end()) return it->second;
    }
    // Loaded outside the lock (a few LMDB reads, zstd digesting the dictionary). A
    // dictionary is loaded only after the transaction that stored it committed (none
    // compresses or reads with it before), so an id cached here names committed bytes.
    if (!tx.db.has_dicts) {
        return fail(
            EIO, fmt::format("db {}: dictionary {} is missing (no dicts table)", tx.db.path, id));
    }
    auto record = KCACHE_TRY(find_dictionary(tx, id));
    if (!record) return fail(EIO, fmt::format("db {}: dictionary {} is missing", tx.db.path, id));
    auto bytes = KCACHE_TRY(dictionary_bytes(tx, id, *record));
    std::shared_ptr<const LoadedDictionary> loaded = make_loaded(id, bytes);
    if (!loaded) {
        return fail(EIO,
                    fmt::format("db {}: dictionary {} is not a zstd dictionary", tx.db.path, id));
    }
    std::lock_guard lock(cache.mutex);
    return cache.by_id.emplace(id, loaded).first->second;
}

Result<std::shared_ptr<const LoadedDictionary>> current_dictionary(const Tx& tx,
                                                                   std::uint32_t kind) {
    if (kind == 0 || !tx.db.has_dicts) return nullptr;
    auto record = KCACHE_TRY(find_kind(tx, kind));
    if (!record || record->dictionary == 0) return nullptr;
    return load_dictionary(tx, record->dictionary);
}

Result<std::optional<std::string>> stored_dictionary(const Tx& tx, std::uint32_t id) {
    if (!tx.db.has_dicts) return std::nullopt;
    auto record = KCACHE_TRY(find_dictionary(tx, id));
    if (!record) return std::nullopt;
    auto bytes = KCACHE_TRY(dictionary_bytes(tx, id, *record));
    return std::optional<std::string>(std::move(bytes));
}

Result<std::uint32_t> store_dictionary(Tx& tx, std::uint32_t kind, std::string& bytes,
                                       std::uint64_t samples, std::uint64_t sample_bytes) {
    if (bytes.size() < 8) return fail(EINVAL, "a zstd dictionary has at least 8 bytes");
    auto next = KCACHE_TRY(tx.get(tx.db.meta, kMetaNextDictionary));
    std::uint64_t dict_id = kFirstDictionaryId;
    if (next) dict_id = KCACHE_TRY(records::decode_u64(*next, "next dictionary"));
    if (dict_id >= 0x80000000u) return fail(EOVERFLOW, "dictionary ids exhausted");
    KCACHE_TRY(tx.put(tx.db.meta, kMetaNextDictionary, records::encode_u64(dict_id + 1)));
    // The id zstd writes into every frame compressed with it.
    const auto new_id = static_cast<std::uint32_t>(dict_id);
    for (int i = 0; i < 4; ++i)
        bytes[static_cast<std::size_t>(4 + i)] = static_cast<char>((new_id >> (8 * i)) & 0xff);
    records::Dictionary record;
    record.kind = kind;
    record.size = bytes.size();
    record.samples = samples;
    record.sample_bytes = sample_bytes;
    record.created_ns = tx.now();
    KCACHE_TRY(tx.put(tx.db.dicts, records::dictionary_key(new_id), records::encode(record)));
    for (std::uint64_t i = 0; i < records::chunk_count(record.size); ++i) {
        KCACHE_TRY(tx.put(
            tx.db.dicts, records::dictionary_chunk_key(new_id, static_cast<std::uint32_t>(i)),
            std::string_view(bytes).substr(i * records::kChunkSize, records::kChunkSize)));
    }
    return new_id;
}

Status adopt_dictionary(Tx& tx, std::uint32_t kind, std::uint32_t id) {
    auto record = KCACHE_TRY(find_kind(tx, kind));
    if (!record || record->dictionary != 0) return {};
    record->dictionary = id;
    return tx.put(tx.db.dicts, records::kind_key(kind), records::encode(*record));
}

Status account_blob(Tx& tx, const BlobRef& ref, int sign) {
    if (!tx.db.has_dicts) return {};
    std::optional<records::Kind> kind;
    if (ref.kind) {
        auto found = KCACHE_TRY(find_kind(tx, ref.kind));
        // A blob of a kind that is gone: the db was damaged before; `kcache verify`
        // reports it. The blob itself is fine.
        if (!found) return tx.add(Counter::errors_io, 1);
        kind = std::move(found);
        add(kind->blobs, 1, sign);
        add(kind->raw_bytes, ref.raw_size, sign);
        add(kind->stored_bytes, records::footprint(ref), sign);
        KCACHE_TRY(tx.put(tx.db.dicts, records::kind_key(ref.kind), records::encode(*kind)));
    }
    if (!ref.dictionary) return {};
    auto d = KCACHE_TRY(find_dictionary(tx, ref.dictionary));
    if (!d) return tx.add(Counter::errors_io, 1);
    add(d->users, 1, sign);
    // The last user of a dictionary its kind no longer compresses with takes it along.
    if (d->users == 0 && !(kind && kind->dictionary == ref.dictionary)) {
        return drop_dictionary(tx, ref.dictionary, *d);
    }
    return tx.put(tx.db.dicts, records::dictionary_key(ref.dictionary), records::encode(*d));
}

}  // namespace ops

Result<std::vector<KindStats>> kind_stats(const Txn& txn) {
    Tx tx = TxnAccess::tx(txn);
    auto kinds = KCACHE_TRY(all_kinds(tx));
    std::map<std::uint32_t, KindStats> out;
    for (const auto& [id, k] : kinds) {
        KindStats& s = out[id];
        s.id = id;
        s.name = k.name;
        s.blobs = k.blobs;
        s.raw_bytes = k.raw_bytes;
        s.stored_bytes = k.stored_bytes;
        s.dictionary = k.dictionary;
    }
    if (tx.db.has_dicts) {
        KCACHE_TRY(tx.scan_checked(
            tx.db.dicts, "D", "D",
            [&](std::string_view key, std::string_view value) -> Result<bool> {
                auto id = ByteReader(key, "dictionary key").be_at<std::uint32_t>(1);
                auto d = records::decode_dictionary(value);
                if (!id || !d) {
                    return fail(EIO, fmt::format("db {}: a damaged dictionary record", tx.db.path));
                }
                auto it = out.find(d->kind);
                if (it == out.end()) return true;
                ++it->second.dictionaries;
                it->second.dictionaries_footprint += records::footprint(d->size);
                if (it->second.dictionary == *id) it->second.dictionary_bytes = d->size;
                return true;
            }));
    }
    std::vector<KindStats> list;
    for (auto& [id, s] : out) list.push_back(std::move(s));
    return list;
}

Result<bool> dictionaries_due(const Store& store, const DictionaryPolicy& policy) {
    if (store.read_only()) return false;
    auto txn = KCACHE_TRY(store.read());
    auto kinds = KCACHE_TRY(all_kinds(TxnAccess::tx(txn)));
    return std::any_of(kinds.begin(), kinds.end(),
                       [&](const auto& k) { return due(k.second, policy); });
}

Result<std::vector<TrainedDictionary>> train_dictionaries(Store& store,
                                                          const DictionaryPolicy& policy) {
    struct Due {
        records::Kind kind;  // as read
        std::vector<std::string> samples;
        std::uint64_t bytes = 0;
        TrainedDictionary result;
        std::string dictionary;  // trained bytes, kept when non-empty
    };
    std::map<std::uint32_t, Due> due_kinds;
    if (store.read_only()) return std::vector<TrainedDictionary>{};
    {
        // 1. In a snapshot: the kinds due and samples of each (blobs in digest order,
        //    which is no order of their content: a fair sample).
        auto txn = KCACHE_TRY(store.read());
        Tx tx = TxnAccess::tx(txn);
        auto kinds = KCACHE_TRY(all_kinds(tx));
        for (auto& [id, k] : kinds) {
            if (due(k, policy)) due_kinds[id].kind = std::move(k);
        }
        if (due_kinds.empty()) return std::vector<TrainedDictionary>{};
        KCACHE_TRY(tx.scan_checked(
            tx.db.blob_refs, {}, {},
            [&](std::string_view key, std::string_view value) -> Result<bool> {
                auto ref = KCACHE_TRY(records::decode_blob_ref(value));
                if (ref.codec == Codec::segments || ref.raw_size < 16) return true;
                auto it = due_kinds.find(ref.kind);
                if (it == due_kinds.end() || it->second.bytes >= policy.max_sample_bytes)
                    return true;
                auto content =
                    KCACHE_TRY(ops::read_blob(tx, records::digest_from_key(key), ref.raw_size));
                std::string sample(content.bytes().substr(0, policy.max_sample));
                it->second.bytes += sample.size();
                it->second.samples.push_back(std::move(sample));
                return true;
            }));
    }

    // 2. Train, no transaction open.
    for (auto& [id, d] : due_kinds) {
        d.result.kind = d.kind.name;
        d.result.samples = d.samples.size();
        d.result.sample_bytes = d.bytes;
        if (d.samples.size() < policy.min_blobs) continue;
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
            std::clamp<std::uint64_t>(d.bytes / std::max<std::uint64_t>(policy.sample_share, 1),
                                      1024, policy.max_dictionary_bytes));
        std::string dictionary(capacity, '\0');
        const std::size_t n =
            ZDICT_trainFromBuffer(dictionary.data(), dictionary.size(), joined.data(), sizes.data(),
                                  static_cast<unsigned>(sizes.size()));
        if (ZDICT_isError(n) || n < 8) continue;
        dictionary.resize(n);
        std::uint32_t magic = 0;
        std::memcpy(&magic, dictionary.data(), 4);
        if (magic != kDictionaryMagic) continue;  // raw content: no entropy tables, no id
        auto trial = make_loaded(0, dictionary);
        if (!trial) continue;
        d.result.stored_without = stored_footprint(d.samples, nullptr);
        d.result.stored_with = stored_footprint(d.samples, trial.get());
        const std::uint64_t with = d.result.stored_with + records::footprint(dictionary.size());
        if (with > d.result.stored_without - d.result.stored_without / 8) continue;
        d.result.bytes = dictionary.size();
        d.dictionary = std::move(dictionary);
    }

    // 3. Store what paid, and note the try for every kind.
    KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
        Tx tx = TxnAccess::tx(txn);
        for (auto& [id, d] : due_kinds) {
            auto now = KCACHE_TRY(find_kind(tx, id));
            if (!now || now->dictionary != d.kind.dictionary) continue;  // trained meanwhile
            now->trained_at = std::max<std::uint64_t>(d.kind.raw_bytes, 1);
            if (!d.dictionary.empty()) {
                const std::uint32_t new_id = KCACHE_TRY(
                    ops::store_dictionary(tx, id, d.dictionary, d.samples.size(), d.bytes));
                // The one it replaces stays while blobs use it.
                if (const std::uint32_t old = now->dictionary) {
                    auto old_record = KCACHE_TRY(find_dictionary(tx, old));
                    if (old_record && old_record->users == 0)
                        KCACHE_TRY(drop_dictionary(tx, old, *old_record));
                }
                now->dictionary = new_id;
                d.result.id = new_id;
            }
            KCACHE_TRY(tx.put(tx.db.dicts, records::kind_key(id), records::encode(*now)));
        }
        return {};
    }));
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
    struct Owner {
        std::string name;
        Producer producer = Producer::unknown;
    };
    std::vector<std::pair<Digest, Owner>> unclassified;
    {
        auto txn = KCACHE_TRY(store.read());
        Tx tx = TxnAccess::tx(txn);
        std::unordered_map<Ino, Producer> producers;
        std::unordered_set<Digest, DigestHash> seen;
        KCACHE_TRY(tx.scan_checked(
            tx.db.inodes, {}, {},
            [&](std::string_view key, std::string_view value) -> Result<bool> {
                auto node = KCACHE_TRY(records::decode_inode(records::u64_from_key(key), value));
                if ((node.mode & S_IFMT) != S_IFREG || node.digest.empty()) return true;
                if (!seen.insert(node.digest).second) return true;
                auto ref = KCACHE_TRY(tx.blob_ref(node.digest));
                if (!ref || ref->kind != 0 || ref->codec == Codec::segments) return true;
                Producer producer = producer_of(node.name);
                if (node.entry) {
                    auto it = producers.find(node.entry);
                    if (it == producers.end()) {
                        auto entry = KCACHE_TRY(tx.find_entry_record(node.entry));
                        it = producers
                                 .emplace(node.entry, entry ? entry->producer : Producer::unknown)
                                 .first;
                    }
                    if (it->second != Producer::unknown) producer = it->second;
                }
                unclassified.emplace_back(node.digest, Owner{node.name, producer});
                return true;
            }));
    }
    constexpr std::size_t kBatch = 1024;
    for (std::size_t begin = 0; begin < unclassified.size(); begin += kBatch) {
        const std::size_t end = std::min(unclassified.size(), begin + kBatch);
        KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
            Tx tx = TxnAccess::tx(txn);
            for (std::size_t i = begin; i < end; ++i) {
                const auto& [digest, owner] = unclassified[i];
                auto ref = KCACHE_TRY(tx.blob_ref(digest));
                if (!ref || ref->kind != 0 || ref->dictionary != 0 || ref->codec == Codec::segments)
                    continue;
                std::string content;  // only a cubin's kind depends on its content
                if (file_kind(owner.name) == "cubin") {
                    auto c = KCACHE_TRY(ops::read_blob(tx, digest, ref->raw_size));
                    content.assign(c.bytes());
                }
                ref->kind = KCACHE_TRY(
                    ops::kind_for(tx, ops::BlobOwner{owner.name, owner.producer}, content));
                KCACHE_TRY(
                    tx.put(tx.db.blob_refs, records::digest_key(digest), records::encode(*ref)));
                // A blob of no kind was stored with no dictionary (acquire_flat): its
                // kind counts it now, and no dictionary gains a user.
                KCACHE_TRY(ops::account_blob(tx, *ref, +1));
                ++report.classified;
            }
            return {};
        }));
    }

    // 2. Train what is due now.
    auto trained = KCACHE_TRY(train_dictionaries(store, policy));
    report.trained = std::move(trained);

    // 3. Rewrite blobs stored without their kind's current dictionary.
    std::vector<Digest> candidates;
    {
        auto txn = KCACHE_TRY(store.read());
        Tx tx = TxnAccess::tx(txn);
        auto kinds = KCACHE_TRY(all_kinds(tx));
        KCACHE_TRY(
            tx.scan_checked(tx.db.blob_refs, {}, {},
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
    }
    // Each batch scans the inodes once in its transaction, to fix the stored bytes of
    // the entries whose files hold a rewritten blob: about 16 scans in all.
    const std::size_t batch = std::max<std::size_t>(kBatch, candidates.size() / 16 + 1);
    for (std::size_t begin = 0; begin < candidates.size(); begin += batch) {
        const std::size_t end = std::min(candidates.size(), begin + batch);
        KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
            Tx tx = TxnAccess::tx(txn);
            std::unordered_map<Digest, std::vector<Ino>, DigestHash> holders;  // entries, 0: none
            for (std::size_t i = begin; i < end; ++i) holders[candidates[i]];
            KCACHE_TRY(tx.scan_checked(
                tx.db.inodes, {}, {},
                [&](std::string_view key, std::string_view value) -> Result<bool> {
                    auto node =
                        KCACHE_TRY(records::decode_inode(records::u64_from_key(key), value));
                    if ((node.mode & S_IFMT) != S_IFREG || node.digest.empty()) return true;
                    auto it = holders.find(node.digest);
                    if (it != holders.end()) it->second.push_back(node.entry);
                    return true;
                }));
            for (std::size_t i = begin; i < end; ++i) {
                const Digest& digest = candidates[i];
                auto ref = KCACHE_TRY(tx.blob_ref(digest));
                if (!ref || ref->codec == Codec::segments || ref->kind == 0) continue;
                const std::vector<Ino>& files = holders[digest];
                // A blob a segment list holds too counts in that list's footprint: left.
                if (files.size() != ref->refcount) continue;
                auto dictionary = KCACHE_TRY(ops::current_dictionary(tx, ref->kind));
                if (!dictionary || dictionary->id == ref->dictionary) continue;
                auto content = KCACHE_TRY(ops::read_blob(tx, digest, ref->raw_size));
                const std::string stored = ops::compressed_form(content.bytes(), dictionary.get());
                const std::uint64_t before = records::footprint(*ref);
                if (stored.empty() || records::footprint(stored.size()) >= before) continue;
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
            }
            return {};
        }));
    }
    return report;
}

}  // namespace kcache::core
