// The catalog: what the inspector knows of a db at one LMDB snapshot (every entry's
// row and key, the counters, the timeline, the top entries), and the orders the
// entries table shows it in.
//
// Ownership: the worker (worker.hpp) builds a Catalog and publishes it through a
// std::shared_ptr<const Catalog>; from then on nobody changes it, so the UI thread
// reads it without a lock while the worker builds the next one. A View is one
// catalog plus the rows that pass a filter in one sort order, immutable in the same
// way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::gui {

// Columns of the entries table, in the order they are shown.
enum class Column : std::uint8_t {
    key,
    producer,
    files,
    bytes,
    stored_bytes,
    hits,
    created,
    last_access,
    pinned,
};
inline constexpr std::size_t kColumnCount = 9;
std::string_view column_name(Column c);  // "Key", "Producer", ... (table headers)

struct SortSpec {
    Column column = Column::last_access;
    bool descending = true;
    bool operator==(const SortSpec&) const = default;
};

// What the view asks for: a sort order and a filter (lower case; "" keeps all).
struct ViewSpec {
    SortSpec sort;
    std::string filter;
    bool operator==(const ViewSpec&) const = default;
};

// One entry as the table shows it. A plain 64-byte record; the key lives in the
// catalog's arena (Catalog::key()). The selection is the view's, not the row's.
struct EntryRow {
    core::Ino ino = 0;
    std::uint64_t bytes = 0;
    std::uint64_t stored_bytes = 0;
    std::uint64_t hits = 0;
    std::int64_t created_ns = 0;
    std::int64_t last_access_ns = 0;
    std::uint32_t key_offset = 0;  // into the key arena
    std::uint32_t files = 0;
    std::uint16_t key_length = 0;
    core::Producer producer = core::Producer::unknown;
    std::uint8_t flags = 0;  // kRowPinned | kRowGone

    bool pinned() const { return flags & kRowPinned; }
    bool gone() const { return flags & kRowGone; }

    static constexpr std::uint8_t kRowPinned = 1;
    static constexpr std::uint8_t kRowGone = 4;  // evicted; dropped at the next reload
};
static_assert(sizeof(EntryRow) == 64, "EntryRow is the per-entry memory cost: keep it small");

// Hits, entries populated (misses) and evictions per time bucket, from the events log.
struct Timeline {
    std::int64_t start_ns = 0;   // start of bucket 0
    std::int64_t bucket_ns = 0;  // width of each bucket; 0: no events
    std::vector<std::uint32_t> hits;
    std::vector<std::uint32_t> populates;  // entries stored (each one a miss)
    std::vector<std::uint32_t> evictions;
    // hits / (hits + populates) in bucket i, or -1 when the bucket has neither.
    float hit_rate(std::size_t i) const;
};

// Logical and stored bytes of the entries one producer wrote.
struct ProducerTotal {
    core::Producer producer = core::Producer::unknown;
    std::uint64_t entries = 0;
    std::uint64_t bytes = 0;
    std::uint64_t stored_bytes = 0;
};

struct Catalog {
    std::vector<EntryRow> rows;     // ino order, gone rows included
    std::string keys;               // every key, back to back
    std::size_t live = 0;           // rows not gone
    std::uint64_t total_bytes = 0;  // over live rows
    std::uint64_t total_stored = 0;

    core::Stats stats;
    Timeline timeline;
    static constexpr std::size_t kTopCount = 10;
    std::vector<std::uint32_t> top_hits;  // row indices
    std::vector<std::uint32_t> top_size;
    std::vector<ProducerTotal> by_producer;
    std::uint64_t data_file_bytes = 0;
    std::size_t event_count = 0;

    std::uint64_t txn_id = 0;  // the snapshot it shows
    double last_load_seconds = 0;
    std::uint64_t full_loads = 0;

    std::string_view key(const EntryRow& row) const {
        return std::string_view(keys).substr(row.key_offset, row.key_length);
    }
    const EntryRow* find(core::Ino ino) const;  // gone rows included
    std::size_t memory_bytes() const;           // rows, keys, derived
};

struct View {
    std::shared_ptr<const Catalog> catalog;
    ViewSpec spec;
    std::vector<std::uint32_t> order;  // row indices: live, passing spec.filter, sorted
};

// Order of the rows of `catalog` that pass `spec.filter`, sorted by `spec.sort` (ties
// by ino). O(n log n): at a million rows up to a fifth of a second, so the worker
// calls it, never the UI thread.
std::vector<std::uint32_t> order_rows(const Catalog& catalog, const ViewSpec& spec);
// `order` was right for the catalog before rows `changed` (row indices, sorted)
// changed: takes them out and puts back the ones that still pass where they belong.
void patch_order(std::vector<std::uint32_t>& order, const Catalog& catalog, const ViewSpec& spec,
                 const std::vector<std::uint32_t>& changed);
bool passes_filter(const Catalog& catalog, const EntryRow& row, std::string_view filter);

// "1.5 GiB" and "3d 4h ago" as the panels print them.
std::string format_bytes(std::uint64_t bytes);
std::string format_ago(std::int64_t now_ns, std::int64_t time_ns);  // "-" for 0

}  // namespace kcache::gui
