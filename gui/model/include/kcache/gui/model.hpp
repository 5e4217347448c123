// The inspector's model: what the panels show, taken from a kcache db. No ImGui here.
//
// Snapshots: every load and refresh reads the db in one MVCC read transaction, so the
// model never blocks the daemon or a writer, and always shows one consistent state.
//
// Refresh: refresh() is cheap and may be called every frame. It looks at the db at
// most every poll interval (250 ms, longer when reloading is costly), and only when
// the LMDB transaction id moved does it do work: it follows the events log from the
// last sequence it saw and re-reads the entries those events name (and the entries
// populated lately, which may still be growing). If the gauges then disagree with the
// rows, or the log was trimmed past what it saw, it reloads every entry. Nothing per
// frame is proportional to the number of entries.
//
// Memory: one EntryRow (64 bytes) per entry, its key in one shared arena, and one
// 4-byte index (the view's order); memory_bytes() counts it.
//
// Threads: a Model and everything it returns belong to one thread (the UI thread).
// Failures: open() fails with a message naming the path and the cause; refresh()
// and the actions return core errors (the model stays usable and unchanged).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"
#include "kcache/gui/duplicates.hpp"

namespace kcache::gui {

using core::Result;
using core::Status;

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

// One entry as the table shows it. A plain 64-byte record; the key lives in the
// model's arena (Model::key()).
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
    std::uint8_t flags = 0;  // kRowPinned | kRowSelected | kRowGone

    bool pinned() const { return flags & kRowPinned; }
    bool selected() const { return flags & kRowSelected; }
    bool gone() const { return flags & kRowGone; }

    static constexpr std::uint8_t kRowPinned = 1;
    static constexpr std::uint8_t kRowSelected = 2;
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

// What an action did, for the status line.
struct ActionReport {
    std::uint64_t entries = 0;  // entries evicted, pinned or unpinned
    std::uint64_t bytes = 0;    // logical bytes evicted
    std::uint64_t skipped = 0;  // pinned or with a write in flight: kept
    std::string message;        // one line a person reads: "evicted 3 entries (1.2 MiB)"
};

class Model {
  public:
    struct Options {
        std::string db_path;
        // Open for reading only: the actions then fail with EROFS. A db that cannot be
        // opened for writing (a read-only filesystem, no permission) is opened for
        // reading anyway, and read_only() says so.
        bool read_only = false;
        std::int64_t poll_interval_ns = 250'000'000;
        core::Clock clock;  // empty: the system clock (tests inject a fake one)
    };

    // Opens an existing db and loads every entry. Fails with ENOENT "no db at PATH"
    // when there is none (it never creates one), else with core's error.
    static Result<std::unique_ptr<Model>> open(const Options& options);

    // Brings the model up to date with the db if it changed (see the file comment).
    // `force` looks now instead of waiting for the poll interval. Returns true when
    // anything shown changed.
    Result<bool> refresh(bool force = false);
    // Reloads every entry now.
    Status reload();

    // --- the view: live entries that pass the filter, in sort order -------------
    std::size_t visible_count() const { return m_view.size(); }
    const EntryRow& visible(std::size_t i) const { return m_rows[m_view[i]]; }
    std::string_view key(const EntryRow& row) const {
        return std::string_view(m_keys).substr(row.key_offset, row.key_length);
    }
    std::size_t entry_count() const { return m_live; }  // live entries, filtered or not

    void set_sort(SortSpec spec);
    SortSpec sort() const { return m_sort; }
    // Case-insensitive substring of the key or the producer's name; "" shows all.
    void set_filter(std::string_view text);
    const std::string& filter() const { return m_filter; }
    // Position of an entry in the view, if visible.
    std::optional<std::size_t> visible_index(core::Ino ino) const;

    // --- selection (of entries, kept across sorting, filtering and refreshes) -----
    void select_only(std::size_t visible_index);
    void toggle_selected(std::size_t visible_index);
    // Selects visible rows [min(a,b), max(a,b)] in addition to the selection.
    void select_range(std::size_t a, std::size_t b);
    void select_all_visible();
    void clear_selection();
    std::size_t selected_count() const { return m_selected; }
    std::uint64_t selected_bytes() const;
    std::vector<core::Ino> selected_inos() const;
    // The entry the detail panel shows: the last one clicked, while it exists.
    std::optional<core::Ino> focused() const { return m_focused; }
    void set_focused(std::optional<core::Ino> ino) { m_focused = ino; }
    const EntryRow* row(core::Ino ino) const;

    // --- statistics ------------------------------------------------------------
    const core::Stats& stats() const { return m_stats; }
    const Timeline& timeline() const { return m_timeline; }
    std::size_t event_count() const { return m_events.size(); }
    static constexpr std::size_t kTopCount = 10;
    const std::vector<std::uint32_t>& top_by_hits() const { return m_top_hits; }  // row indices
    const std::vector<std::uint32_t>& top_by_size() const { return m_top_size; }
    const EntryRow& row_at(std::uint32_t index) const { return m_rows[index]; }
    const std::vector<ProducerTotal>& by_producer() const { return m_by_producer; }
    std::uint64_t data_file_bytes() const { return m_data_file_bytes; }

    // --- actions: each is one or a few short write transactions -------------------
    // Evicts the selected entries, keeping pinned ones and those with a write in
    // flight (counted as skipped). One transaction: all or nothing on an error.
    Result<ActionReport> evict_selected();
    // Evicts unpinned entries idle (not accessed) for longer than `age_ns`.
    Result<ActionReport> evict_older_than(std::int64_t age_ns);
    Result<ActionReport> set_selected_pinned(bool pinned);
    // Evicts every unpinned entry.
    Result<ActionReport> clear();

    // --- duplicates: started on request, advanced a time slice per frame ---------
    // Starts a scan of every live entry on a fresh snapshot.
    Status start_duplicate_scan();
    DuplicateScan& duplicates() { return m_duplicates; }

    // --- about the snapshot -------------------------------------------------------
    core::Store& store() const { return *m_store; }
    const std::string& db_path() const { return m_store->path(); }
    bool read_only() const { return m_store->read_only(); }
    std::int64_t now_ns() const { return m_store->now_ns(); }
    std::uint64_t txn_id() const { return m_txn_id; }
    double last_load_seconds() const { return m_last_load_seconds; }
    std::uint64_t full_loads() const { return m_full_loads; }
    // Bytes the model holds for its entries: rows, keys, indices, events.
    std::size_t memory_bytes() const;

  private:
    Model() = default;
    Status load_all(const core::Txn& txn);
    // Applies events after m_event_seq; false when a full reload is needed instead.
    Result<bool> apply_changes(const core::Txn& txn);
    void upsert(const core::EntryInfo& info);
    void mark_gone(core::Ino ino);
    EntryRow* find_row(core::Ino ino);  // gone rows included
    void append_event(const core::Event& event);
    bool passes_filter(const EntryRow& row) const;
    void rebuild_view();
    void sort_view();
    void update_view(const std::vector<core::Ino>& touched);
    std::uint64_t sort_value(const EntryRow& row) const;
    bool view_less(std::uint32_t a, std::uint32_t b) const;  // the view's order
    void rebuild_derived();
    Status read_stats(const core::Txn& txn);
    Result<ActionReport> run_evict(const std::vector<core::Ino>& inos);

    std::unique_ptr<core::Store> m_store;
    std::int64_t m_poll_interval_ns = 0;
    std::int64_t m_next_poll_ns = 0;  // steady clock

    std::vector<EntryRow> m_rows;       // ino order (inos only grow: new rows append)
    bool m_rows_shifted = false;        // a row was inserted before others: view indices moved
    std::string m_keys;                 // every key, back to back
    std::vector<std::uint32_t> m_view;  // row indices: live, filtered, sorted
    std::size_t m_live = 0;
    std::uint64_t m_total_bytes = 0;  // over live rows
    std::uint64_t m_total_stored = 0;
    std::size_t m_selected = 0;
    std::optional<core::Ino> m_focused;
    SortSpec m_sort;
    std::string m_filter;  // lower case

    struct EventPoint {
        std::int64_t time_ns;
        core::EventKind kind;
    };
    std::vector<EventPoint> m_events;  // hit, populate, evict events, oldest first
    std::uint64_t m_event_seq = 0;     // last event seen
    // Entries populated lately, re-read at every refresh: files keep arriving after
    // the populate event, and publishing them logs nothing. (ino, when it was seen).
    std::vector<std::pair<core::Ino, std::int64_t>> m_recent;

    core::Stats m_stats;
    // Gauges minus the rows' totals at the last full load: files outside entries.
    std::array<std::int64_t, 3> m_gauge_offset{};
    Timeline m_timeline;
    std::vector<std::uint32_t> m_top_hits;
    std::vector<std::uint32_t> m_top_size;
    std::vector<ProducerTotal> m_by_producer;
    std::uint64_t m_data_file_bytes = 0;

    std::uint64_t m_txn_id = 0;
    double m_last_load_seconds = 0;
    std::uint64_t m_full_loads = 0;
    DuplicateScan m_duplicates;
};

// "1.5 GiB" and "3d 4h ago" as the panels print them.
std::string format_bytes(std::uint64_t bytes);
std::string format_ago(std::int64_t now_ns, std::int64_t time_ns);  // "-" for 0

}  // namespace kcache::gui
