// Statistics, the events log and the configuration, as transactions read and change them.
#include <cerrno>

#include <fmt/format.h>

#include "kcache/core/layout.hpp"
#include "store_impl.hpp"

namespace kcache::core {

// ---- statistics, events, configuration ------------------------------------------

Result<Stats> Txn::stats() const {
    Tx tx = TxnAccess::tx(*this);
    Stats stats;
    for (const StatisticField& f : kStatistics) stats.values[f.id] = 0;
    KCACHE_TRY(tx.scan(tx.db.stats, {}, {}, [&](std::string_view key, std::string_view value) {
        if (key.size() != 4 || value.size() != 8) return true;
        std::uint32_t id = 0;
        for (char c : key) id = (id << 8) | static_cast<unsigned char>(c);
        records::Reader r(value);
        stats.values[static_cast<Counter>(id)] = r.u64();
        return true;
    }));
    auto reset = KCACHE_TRY(tx.get(tx.db.meta, kMetaResetTime));
    if (reset) {
        auto v = KCACHE_TRY(records::decode_u64(*reset, "meta reset_ns"));
        stats.reset_ns = static_cast<std::int64_t>(v);
    }
    return stats;
}

Result<std::uint64_t> Txn::counter(Counter c) const {
    return TxnAccess::tx(*this).counter(c);
}

Status Txn::for_each_event(std::uint64_t after_seq,
                           const std::function<bool(const Event&)>& fn) const {
    Tx tx = TxnAccess::tx(*this);
    return tx.scan_checked(
        tx.db.events, {}, records::u64_key(after_seq + 1),
        [&](std::string_view key, std::string_view value) -> Result<bool> {
            return fn(KCACHE_TRY(records::decode_event(records::u64_from_key(key), value)));
        });
}

Status WriteTxn::add(Counter c, std::uint64_t delta) {
    Tx tx = TxnAccess::tx(*this);
    return tx.add(c, static_cast<std::int64_t>(delta));
}

Status WriteTxn::reset_stats() {
    Tx tx = TxnAccess::tx(*this);
    for (const StatisticField& f : kStatistics) {
        if (f.kind == StatisticKind::gauge) continue;
        if (auto s = tx.del(tx.db.stats, records::counter_key(f.id)); !s) return s;
    }
    const auto now = static_cast<std::uint64_t>(tx.now());
    if (auto s = tx.put(tx.db.meta, kMetaResetTime, records::encode_u64(now)); !s) return s;
    return tx.log(EventKind::reset, 0, 0, {});
}

Status WriteTxn::set_config(const Config& config) {
    Tx tx = TxnAccess::tx(*this);
    KCACHE_TRY(parse_layout_rules(config.layout_rules));
    if (config.entry_depth == 0 || config.entry_depth > 64) {
        return fail(EINVAL, "entry depth must be between 1 and 64");
    }
    if (config.low_mark_percent == 0 || config.low_mark_percent > 100) {
        return fail(EINVAL, "low mark must be between 1 and 100 percent");
    }
    if (config.entry_depth != m_config->entry_depth) {
        auto any = KCACHE_TRY(tx.has_children(kRootIno));
        if (any) return fail(EBUSY, "entry depth can only change while the cache is empty");
    }
    if (auto s = tx.put(tx.db.meta, kMetaConfig, records::encode(config)); !s) return s;
    m_config = std::make_shared<const Config>(config);
    return {};
}

}  // namespace kcache::core
