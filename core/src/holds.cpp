#include "kcache/core/holds.hpp"

#include <cerrno>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
namespace {

// A hold lives in the meta table (no schema change): "hold/" + digest key -> count.
// An older binary ignores the record and sees one reference more than files: its
// verify reports it, and the next fresh mount clears it.
std::string hold_key(const Digest& digest) {
    return std::string(kMetaHoldPrefix) + records::digest_key(digest);
}

Result<std::uint64_t> hold_count(const Tx& tx, const Digest& digest) {
    auto value = KCACHE_TRY(tx.get(tx.db.meta, hold_key(digest)));
    if (!value) return std::uint64_t{0};
    return records::decode_u64(*value, "meta hold");
}

}  // namespace

Status hold_blob(WriteTxn& txn, const Digest& digest) {
    if (digest.empty()) return {};
    Tx tx = TxnAccess::tx(txn);
    auto ref = KCACHE_TRY(tx.blob_ref(digest));
    if (!ref)
        return fail(ENOENT, fmt::format("blob {}: not in the db, cannot hold it", digest.hex()));
    const std::uint64_t held = KCACHE_TRY(hold_count(tx, digest));
    records::BlobRef more = *ref;
    ++more.refcount;
    KCACHE_TRY(tx.put(tx.db.blob_refs, records::digest_key(digest), records::encode(more)));
    return tx.put(tx.db.meta, hold_key(digest), records::encode_u64(held + 1));
}

Status release_hold(WriteTxn& txn, const Digest& digest) {
    if (digest.empty()) return {};
    Tx tx = TxnAccess::tx(txn);
    const std::uint64_t held = KCACHE_TRY(hold_count(tx, digest));
    if (held == 0) return fail(ENOENT, fmt::format("blob {}: no hold to release", digest.hex()));
    if (held == 1) {
        KCACHE_TRY(tx.del(tx.db.meta, hold_key(digest)));
    } else {
        KCACHE_TRY(tx.put(tx.db.meta, hold_key(digest), records::encode_u64(held - 1)));
    }
    return ops::release_blob(tx, digest);
}

Result<std::uint64_t> clear_holds(WriteTxn& txn) {
    Tx tx = TxnAccess::tx(txn);
    std::vector<std::pair<Digest, std::uint64_t>> holds;
    KCACHE_TRY(for_each_hold(txn, [&](const Digest& digest, std::uint64_t count) {
        holds.emplace_back(digest, count);
        return true;
    }));
    std::uint64_t dropped = 0;
    for (const auto& [digest, count] : holds) {
        KCACHE_TRY(tx.del(tx.db.meta, hold_key(digest)));
        // A hold on a blob already gone (damage verify reports) is dropped alone.
        auto ref = KCACHE_TRY(tx.blob_ref(digest));
        if (ref) {
            for (std::uint64_t i = 0; i < count && i < ref->refcount; ++i) {
                KCACHE_TRY(ops::release_blob(tx, digest));
            }
        }
        dropped += count;
    }
    return dropped;
}

Status for_each_hold(const Txn& txn, const std::function<bool(const Digest&, std::uint64_t)>& fn) {
    Tx tx = TxnAccess::tx(txn);
    return tx.scan_checked(tx.db.meta, kMetaHoldPrefix, kMetaHoldPrefix,
                           [&](std::string_view key, std::string_view value) -> Result<bool> {
                               key.remove_prefix(kMetaHoldPrefix.size());
                               if (key.size() != 16) {
                                   return fail(EIO, "meta: a hold record with a bad key");
                               }
                               const auto count =
                                   KCACHE_TRY(records::decode_u64(value, "meta hold"));
                               return fn(records::digest_from_key(key), count);
                           });
}

}  // namespace kcache::core
