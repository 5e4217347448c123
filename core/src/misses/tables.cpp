// The classifier's tables read back (misses.hpp): causes by name, the misses kept, the
// pending ones, the tables' sizes, and sizing from capacity misses.
#include <algorithm>

#include <fmt/format.h>

#include "misses/misses_impl.hpp"
#include "records.hpp"

namespace kcache::core {

// ---- names and causes ---------------------------------------------------------------

std::string_view miss_cause_name(MissCause cause) {
    switch (cause) {
        case MissCause::first:
            return "first";
        case MissCause::capacity:
            return "capacity";
        case MissCause::changed_key:
            return "changed_key";
        case MissCause::unstable_key:
            return "unstable_key";
    }
    return "unknown";
}

std::optional<MissCause> parse_miss_cause(std::string_view name) {
    for (MissCause c :
         {MissCause::first, MissCause::capacity, MissCause::changed_key, MissCause::unstable_key}) {
        if (name == miss_cause_name(c)) return c;
    }
    if (name == "changed") return MissCause::changed_key;
    if (name == "unstable") return MissCause::unstable_key;
    return std::nullopt;
}

Counter miss_cause_counter(MissCause cause) {
    switch (cause) {
        case MissCause::capacity:
            return Counter::misses_capacity;
        case MissCause::changed_key:
            return Counter::misses_changed_key;
        case MissCause::unstable_key:
            return Counter::misses_unstable_key;
        case MissCause::first:
            break;
    }
    return Counter::misses_first;
}

// ---- the tables ---------------------------------------------------------------------

Result<std::uint64_t> misses::records_in(const Tx& tx, MDB_dbi dbi, std::string_view table) {
    MDB_stat st{};
    if (const int rc = mdb_stat(tx.txn, dbi, &st); rc != 0) {
        return tl::unexpected(lmdb::error(rc, fmt::format("{}: stat", table)));
    }
    return st.ms_entries;
}

Status for_each_miss(const Txn& txn, std::int64_t since_ns,
                     const std::function<bool(const Miss&)>& fn) {
    const Tx tx = TxnAccess::tx(txn);
    if (!tx.db.has_misses) return {};
    lmdb::Cursor cursor;
    if (const int rc = cursor.open(tx.txn, tx.db.misses); rc != 0) {
        return tl::unexpected(lmdb::error(rc, "misses: cursor"));
    }
    MDB_val k{}, v{};
    int rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_LAST);
    while (rc == 0) {
        auto m =
            KCACHE_TRY(records::decode_miss(records::u64_from_key(lmdb::view(k)), lmdb::view(v)));
        if (m.time_ns < since_ns) break;
        if (!fn(m)) return {};
        rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_PREV);
    }
    if (rc != 0 && rc != MDB_NOTFOUND) return tl::unexpected(lmdb::error(rc, "misses: scan"));
    return {};
}

Result<std::optional<Miss>> find_miss(const Txn& txn, std::string_view name) {
    std::optional<Miss> found;
    KCACHE_TRY(for_each_miss(txn, 0, [&](const Miss& m) {
        if (m.name != name) return true;
        found = m;
        return false;
    }));
    return found;
}

namespace misses {

Result<std::uint64_t> classified_up_to(const Tx& tx) {
    auto at = KCACHE_TRY(tx.get(tx.db.meta, kMetaMissesSeq));
    return at ? KCACHE_TRY(records::decode_u64(*at, "misses_seq")) : 0;
}

}  // namespace misses

Result<std::uint64_t> pending_misses(const Txn& txn) {
    const Tx tx = TxnAccess::tx(txn);
    if (!tx.db.has_misses) return 0;
    const std::uint64_t pos = KCACHE_TRY(misses::classified_up_to(tx));
    std::uint64_t n = 0;
    KCACHE_TRY(txn.for_each_event(pos, [&](const Event& e) {
        n += e.kind == EventKind::populate ? 1 : 0;
        return true;
    }));
    return n;
}

Result<MissTables> miss_tables(const Txn& txn) {
    const Tx tx = TxnAccess::tx(txn);
    MissTables out;
    if (!tx.db.has_misses) return out;
    for (auto [dbi, field] : {std::pair{tx.db.misses, &MissTables::misses},
                              std::pair{tx.db.evictions, &MissTables::evictions},
                              std::pair{tx.db.families, &MissTables::families}}) {
        out.*field = KCACHE_TRY(misses::records_in(tx, dbi, "misses"));
    }
    return out;
}

// ---- sizing ---------------------------------------------------------------------------

Result<Sizing> capacity_sizing(const Txn& txn, std::int64_t since_ns) {
    Sizing out;
    out.bound = txn.config().max_bytes;
    std::vector<std::uint64_t> distances;
    KCACHE_TRY(for_each_miss(txn, since_ns, [&](const Miss& m) {
        ++out.misses;
        if (m.cause == MissCause::capacity) {
            ++out.capacity;
            if (m.stack_distance) distances.push_back(m.stack_distance);
        }
        return true;
    }));
    if (!distances.empty()) out.avoid_all = *std::max_element(distances.begin(), distances.end());
    std::vector<std::uint64_t> sizes;
    if (out.bound) {
        for (double f : {1.0, 1.5, 2.0, 4.0}) {
            sizes.push_back(static_cast<std::uint64_t>(static_cast<double>(out.bound) * f));
        }
    }
    if (out.avoid_all) {
        for (std::uint64_t div : {4, 2, 1}) sizes.push_back(out.avoid_all / div);
    }
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    const std::uint64_t unknown = out.capacity - distances.size();  // removed: no distance
    for (std::uint64_t size : sizes) {
        SizingPoint p{size, unknown};
        for (std::uint64_t d : distances) p.capacity_misses += d > size ? 1 : 0;
        out.curve.push_back(p);
    }
    return out;
}

}  // namespace kcache::core
