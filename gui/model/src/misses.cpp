#include "kcache/gui/misses.hpp"

#include <algorithm>

namespace kcache::gui {

core::Result<MissesReport> MissesReport::load(const core::Store& store, std::int64_t now_ns,
                                              std::int64_t span_ns, std::size_t buckets) {
    MissesReport out;
    auto txn = KCACHE_TRY(store.read());
    out.txn_id = txn.id();
    std::vector<std::pair<std::int64_t, core::MissCause>> all;
    KCACHE_TRY(core::for_each_miss(txn, span_ns ? now_ns - span_ns : 0, [&](const core::Miss& m) {
        if (out.recent.size() < kMaxRecent) out.recent.push_back(m);
        all.emplace_back(m.time_ns, m.cause);
        ++out.totals[cause_index(m.cause)];
        return true;
    }));
    out.pending = KCACHE_TRY(core::pending_misses(txn));
    if (buckets == 0) return out;
    std::int64_t from = span_ns ? now_ns - span_ns : now_ns;
    for (const auto& [t, c] : all) from = std::min(from, t);
    const std::int64_t span = std::max<std::int64_t>(now_ns - from, 1);
    out.bucket_ns =
        (span + static_cast<std::int64_t>(buckets) - 1) / static_cast<std::int64_t>(buckets);
    const std::int64_t start = now_ns - out.bucket_ns * static_cast<std::int64_t>(buckets);
    out.buckets.resize(buckets);
    for (std::size_t i = 0; i < buckets; ++i) {
        out.buckets[i].start_ns = start + out.bucket_ns * static_cast<std::int64_t>(i);
    }
    for (const auto& [t, c] : all) {
        auto i = static_cast<std::size_t>(std::max<std::int64_t>(t - start, 0) / out.bucket_ns);
        ++out.buckets[std::min(i, buckets - 1)].by_cause[cause_index(c)];
    }
    return out;
}

}  // namespace kcache::gui
