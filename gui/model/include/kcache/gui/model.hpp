// The inspector's view: what the panels show, over the worker's current catalog. No
// ImGui here, and no db: the Worker (worker.hpp) owns the db and its thread; the
// Model owns the view's state (sort, filter, selection, focus) and the catalog it
// shows now.
//
// Frames: refresh() is called once per frame. It copies the worker's newest
// publication if there is one (a pointer swap: a new catalog, or the order asked for
// by set_sort / set_filter) and carries the selection over to it; it never waits and
// never reads the db. Between two refresh() calls everything returned here stays
// valid and unchanged. set_sort and set_filter return at once: the worker orders the
// rows (a fifth of a second at a million) while the table still shows the old order.
// The actions and the detail loads return futures the panels poll.
//
// Memory: the catalog's 64-byte row and key per entry, the order (4 bytes a row),
// the selection (1 byte a row); memory_bytes() counts them.
//
// Threads: a Model belongs to one thread (the UI thread). Failures: open() fails with
// a message naming the path and the cause; refresh() returns the worker's last error
// once; actions resolve to core errors (the view stays usable and unchanged).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/types.hpp"
#include "kcache/gui/catalog.hpp"
#include "kcache/gui/worker.hpp"

namespace kcache::gui {

using core::Result;
using core::Status;

class Model {
  public:
    using Options = Worker::Options;

    // Starts the worker on an existing db and waits for its first catalog. Fails with
    // ENOENT "no db at PATH" when there is none (it never creates one), else with
    // core's error.
    static Result<std::unique_ptr<Model>> open(const Options& options);

    // Takes the worker's newest publication, if any (never waits). Returns true when
    // anything shown changed, or the worker's newest error. `force` first asks the
    // worker to look at the db now and waits for it (tests and tools, not frames).
    Result<bool> refresh(bool force = false);
    // Waits until the worker has nothing to do, then takes what it published (tests,
    // benchmarks, --screenshot; never the frame loop).
    void wait_idle();
    // True while the worker has not yet published the order set_sort/set_filter asked.
    bool ordering() const { return m_view->spec != m_spec; }

    // --- the view: live entries that pass the filter, in sort order -------------
    std::size_t visible_count() const { return m_view->order.size(); }
    const EntryRow& visible(std::size_t i) const { return catalog().rows[m_view->order[i]]; }
    std::string_view key(const EntryRow& row) const { return catalog().key(row); }
    std::size_t entry_count() const { return catalog().live; }  // filtered or not

    void set_sort(SortSpec spec);
    SortSpec sort() const { return m_spec.sort; }
    // Case-insensitive substring of the key or the producer's name; "" shows all.
    void set_filter(std::string_view text);
    const std::string& filter() const { return m_spec.filter; }
    // Position of an entry in the view, if visible.
    std::optional<std::size_t> visible_index(core::Ino ino) const;

    // --- selection (of entries, kept across sorting, filtering and new catalogs) ----
    void select_only(std::size_t visible_index);
    void toggle_selected(std::size_t visible_index);
    // Selects visible rows [min(a,b), max(a,b)] in addition to the selection.
    void select_range(std::size_t a, std::size_t b);
    void select_all_visible();
    void clear_selection();
    bool is_selected(std::size_t visible_index) const {
        return m_selected_rows[m_view->order[visible_index]] != 0;
    }
    std::size_t selected_count() const { return m_selected; }
    std::uint64_t selected_bytes() const;
    std::vector<core::Ino> selected_inos() const;
    // The entry the detail panel shows: the last one clicked, while it exists.
    std::optional<core::Ino> focused() const { return m_focused; }
    void set_focused(std::optional<core::Ino> ino) { m_focused = ino; }
    const EntryRow* row(core::Ino ino) const;  // live rows only

    // --- statistics ------------------------------------------------------------
    const core::Stats& stats() const { return catalog().stats; }
    const Timeline& timeline() const { return catalog().timeline; }
    std::size_t event_count() const { return catalog().event_count; }
    static constexpr std::size_t kTopCount = Catalog::kTopCount;
    const std::vector<std::uint32_t>& top_by_hits() const { return catalog().top_hits; }
    const std::vector<std::uint32_t>& top_by_size() const { return catalog().top_size; }
    const EntryRow& row_at(std::uint32_t index) const { return catalog().rows[index]; }
    const std::vector<ProducerTotal>& by_producer() const { return catalog().by_producer; }
    std::uint64_t data_file_bytes() const { return catalog().data_file_bytes; }

    // --- actions, run by the worker: one or a few short write transactions ---------
    // Each resolves after the worker has committed and looked at the db again; the
    // refresh() after that shows the result.
    std::future<Result<ActionReport>> request(Action action, std::int64_t age_ns = 0);
    // The same, waiting for the result and taking the new catalog (tests, tools).
    Result<ActionReport> evict_selected();  // pinned and busy entries are kept, counted
    Result<ActionReport> evict_older_than(std::int64_t age_ns);  // idle for longer
    Result<ActionReport> set_selected_pinned(bool pinned);
    Result<ActionReport> clear();  // every unpinned entry

    // --- entry detail, loaded by the worker ------------------------------------------
    std::future<Result<EntryDetail>> load_detail(core::Ino entry) {
        return m_worker->load_detail(entry);
    }
    std::future<Result<FileView>> load_file(EntryFile file) {
        return m_worker->load_file(std::move(file));
    }
    // Misses explained (misses.hpp), over the last `span_ns` (0: all kept).
    std::future<Result<MissesReport>> load_misses(std::int64_t span_ns = 0) {
        return m_worker->load_misses(span_ns);
    }

    // --- duplicates: scanned by the worker, on request ----------------------------
    Status start_duplicate_scan();
    const DuplicateReport& duplicates() const { return m_duplicates; }

    // --- about the catalog ---------------------------------------------------------
    const std::string& db_path() const { return m_worker->db_path(); }
    bool read_only() const { return m_worker->read_only(); }
    std::int64_t now_ns() const;
    std::uint64_t txn_id() const { return catalog().txn_id; }
    double last_load_seconds() const { return catalog().last_load_seconds; }
    std::uint64_t full_loads() const { return catalog().full_loads; }
    // Bytes held for the entries: catalog, order, selection.
    std::size_t memory_bytes() const;
    Worker& worker() { return *m_worker; }

  private:
    Model() = default;
    const Catalog& catalog() const { return *m_view->catalog; }
    bool adopt(Worker::Published published);
    Result<ActionReport> finish(std::future<Result<ActionReport>> future);

    std::unique_ptr<Worker> m_worker;
    core::Clock m_clock;
    std::uint64_t m_serial = 0;        // of the publication adopted
    std::uint64_t m_error_serial = 0;  // of the last error returned
    std::shared_ptr<const View> m_view;
    ViewSpec m_spec;  // what the view asked for (m_view->spec once the worker did it)
    std::vector<std::uint8_t> m_selected_rows;  // per row of the catalog: 1 selected
    std::size_t m_selected = 0;
    std::optional<core::Ino> m_focused;
    DuplicateReport m_duplicates;
};

}  // namespace kcache::gui
