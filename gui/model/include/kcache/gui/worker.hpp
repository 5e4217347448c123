// The inspector's worker, as Tracy splits its worker from its view: one thread that
// owns the db (core::Store) and is the only one to read or write it. It loads the
// db, follows it (polling every poll interval, at most once per 4x the last change's
// cost) into immutable catalogs, orders them for the view's current ViewSpec, runs
// the actions, loads an entry's detail and files, and runs the duplicates scan, in
// slices between requests. What it produces it publishes by swapping a pointer under
// m_pub_mutex; the UI thread copies that pointer once per frame and reads the
// catalog without a lock.
//
// Threads: every public member may be called from any thread (in practice the UI
// thread); each returns at once, except start(), wait_idle() and a future's get().
// Lock order: m_mutex (requests) and m_pub_mutex (what is published) are never held
// together; neither is held while the db is read.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/thread_annotations.hpp"
#include "kcache/gui/catalog.hpp"
#include "kcache/gui/detail.hpp"
#include "kcache/gui/duplicates.hpp"
#include "kcache/gui/misses.hpp"

namespace kcache::gui {

class CatalogBuilder;

// What an action did, for the status line.
struct ActionReport {
    std::uint64_t entries = 0;  // entries evicted, pinned or unpinned
    std::uint64_t bytes = 0;    // logical bytes evicted
    std::uint64_t skipped = 0;  // pinned or with a write in flight: kept
    std::string message;        // one line a person reads: "evicted 3 entries (1.2 MiB)"
};

enum class Action : std::uint8_t { evict, pin, unpin, evict_older, clear };
struct ActionRequest {
    Action action = Action::evict;
    std::vector<core::Ino> inos;  // evict, pin, unpin
    std::int64_t age_ns = 0;      // evict_older
};

// The duplicates scan as the view sees it: a copy of the worker's progress.
struct DuplicateReport {
    bool started_ = false;
    bool running_ = false;
    std::size_t scanned_ = 0;
    std::size_t total_ = 0;
    std::uint64_t txn_id_ = 0;
    std::shared_ptr<const std::vector<DuplicateGroup>> groups_;

    bool started() const { return started_; }
    bool running() const { return running_; }
    bool done() const { return started_ && !running_; }
    std::size_t scanned() const { return scanned_; }
    std::size_t total() const { return total_; }
    std::uint64_t txn_id() const { return txn_id_; }    // the snapshot scanned
    const std::vector<DuplicateGroup>& groups() const;  // complete once done()
};

// The store, usable only on the thread that bound it. A use from any other thread is
// counted (and asserts in debug builds): the UI thread must never touch the db.
class ThreadOwnedStore {
  public:
    void bind(std::unique_ptr<core::Store> store);  // on the owning thread
    core::Store& get();
    bool has() const { return m_store != nullptr; }
    std::uint64_t foreign_uses() const { return m_foreign.load(); }

  private:
    std::unique_ptr<core::Store> m_store;
    std::thread::id m_owner;
    std::atomic<std::uint64_t> m_foreign{0};
};

class Worker {
  public:
    struct Options {
        std::string db_path;
        bool read_only = false;
        std::int64_t poll_interval_ns = 250'000'000;
        core::Clock clock;
    };
    // What the worker publishes. `serial` grows with every publication.
    struct Published {
        std::shared_ptr<const View> view;
        DuplicateReport duplicates;
        std::string error;  // the last error ("refresh: ...", "duplicates: ..."), once
        std::uint64_t error_serial = 0;
        std::uint64_t serial = 0;
    };

    // Opens the db on the worker thread (read-only when it cannot be written) and
    // loads it; returns once the first catalog is published, or with the error.
    static core::Result<std::unique_ptr<Worker>> start(const Options& options);
    ~Worker();  // stops the thread; a job in progress finishes first
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;

    std::uint64_t serial() const { return m_serial.load(std::memory_order_acquire); }
    Published published() const;

    // Requests. A later set_view replaces one not yet applied (typing a filter).
    void set_view(ViewSpec spec);
    std::future<core::Result<bool>> look_now();  // true: a new catalog was published
    std::future<core::Status> reload_now();      // loads every entry anew
    std::future<core::Result<ActionReport>> act(ActionRequest request);
    std::future<core::Result<EntryDetail>> load_detail(core::Ino entry);
    std::future<core::Result<FileView>> load_file(EntryFile file);
    std::future<core::Result<MissesReport>> load_misses(std::int64_t span_ns = 0);
    void scan_duplicates();  // every live entry of the current catalog

    // Waits until no request is queued or running and no scan is running (tests,
    // tools; never the frame loop).
    void wait_idle();

    const std::string& db_path() const { return m_db_path; }
    bool read_only() const { return m_read_only; }
    std::uint64_t foreign_store_uses() const { return m_store.foreign_uses(); }
    // Tests: the store as the UI thread would reach it (counts a foreign use).
    core::Store& store_for_test() { return m_store.get(); }

  private:
    Worker() = default;
    void run(const Options& options, std::promise<core::Status> started);
    void loop();
    void post(std::function<void()> job);
    core::Result<bool> look(bool force);
    void apply_view(const ViewSpec& spec);
    void publish_view(std::shared_ptr<const View> view);
    void publish_ordered(
        std::shared_ptr<const Catalog> catalog);  // in m_spec's order, sorted whole
    void publish_error(std::string message);
    void publish_duplicates();
    core::Result<ActionReport> run_action(const ActionRequest& request);
    core::Result<ActionReport> run_evict(const std::vector<core::Ino>& inos);
    core::Result<ActionReport> run_pin(const std::vector<core::Ino>& inos, bool pinned);

    std::string m_db_path;
    bool m_read_only = false;
    std::int64_t m_poll_interval_ns = 0;
    std::thread m_thread;

    // Worker thread only.
    ThreadOwnedStore m_store;
    std::unique_ptr<CatalogBuilder> m_builder;
    std::shared_ptr<const View> m_view;  // last published
    ViewSpec m_spec;                     // the spec m_view is ordered by
    DuplicateScan m_scan;
    std::int64_t m_next_poll_ns = 0;  // steady clock

    // Requests, under m_mutex.
    mutable Mutex m_mutex;
    CondVar m_wake;  // a request, or stop
    CondVar m_idle;  // became idle
    std::deque<std::function<void()>> m_jobs GUARDED_BY(m_mutex);
    std::optional<ViewSpec> m_pending_spec GUARDED_BY(m_mutex);
    bool m_busy GUARDED_BY(m_mutex) = false;
    bool m_scanning GUARDED_BY(m_mutex) = false;
    bool m_stop GUARDED_BY(m_mutex) = false;

    // Published, under m_pub_mutex.
    mutable Mutex m_pub_mutex;
    Published m_published GUARDED_BY(m_pub_mutex);
    std::atomic<std::uint64_t> m_serial{0};
};

}  // namespace kcache::gui
