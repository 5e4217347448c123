// The inspector's view of misses explained (core/misses.hpp): the recent misses with
// their causes and evidence, and misses by cause over time. Loaded by the worker on
// request (Worker::load_misses) from one snapshot; the view reads the copy.
//
// Thread: load() runs on the worker thread (it reads the db); a MissesReport is a
// value the UI thread owns once its future is ready. Failures: core's read errors.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kcache/core/misses.hpp"
#include "kcache/core/store.hpp"

namespace kcache::gui {

inline constexpr std::size_t kCauseCount = 4;  // MissCause 1..4, index cause - 1

struct MissesReport {
    std::vector<core::Miss> recent;  // newest first, at most kMaxRecent
    // Misses by cause in equal spans of time, oldest first, the last ending now.
    struct Bucket {
        std::int64_t start_ns = 0;
        std::array<std::uint32_t, kCauseCount> by_cause{};
    };
    std::vector<Bucket> buckets;
    std::int64_t bucket_ns = 0;
    std::array<std::uint64_t, kCauseCount> totals{};  // every kept miss, by cause
    std::uint64_t pending = 0;                        // not classified yet
    std::uint64_t txn_id = 0;                         // the snapshot read

    static constexpr std::size_t kMaxRecent = 500;
    // The last `span_ns` (0: since the oldest kept miss) in `buckets` spans.
    static core::Result<MissesReport> load(const core::Store& store, std::int64_t now_ns,
                                           std::int64_t span_ns = 0, std::size_t buckets = 24);
};

inline std::size_t cause_index(core::MissCause c) {
    return static_cast<std::size_t>(c) - 1;
}

}  // namespace kcache::gui
