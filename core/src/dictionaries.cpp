// File kinds and trained zstd dictionaries (dictionaries.hpp): classifying blobs, the
// kinds' accounting, storing and loading dictionaries. Training and gc's recompression,
// which read and rewrite content: training.cpp.
#include "kcache/core/dictionaries.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>
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

void add(std::uint64_t& value, std::uint64_t delta, int sign) {
    value = sign > 0 ? value + delta : (value > delta ? value - delta : 0);
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

std::shared_ptr<LoadedDictionary> make_loaded(std::uint32_t id, std::string_view bytes) {
    auto d = std::make_shared<LoadedDictionary>();
    d->id = id;
    d->compress = ZSTD_createCDict(bytes.data(), bytes.size(), kLevel);
    d->decompress = ZSTD_createDDict(bytes.data(), bytes.size());
    if (!d->compress || !d->decompress) return nullptr;
    return d;
}

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
        MutexLock lock(cache.mutex);
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
    MutexLock lock(cache.mutex);
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
    auto kinds = KCACHE_TRY(ops::all_kinds(tx));
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

}  // namespace kcache::core
