#include "kcache/gui/worker.hpp"

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <system_error>

#include <fmt/core.h>

#include "catalog_builder.hpp"

namespace kcache::gui {
namespace {

constexpr std::int64_t kMaxPollIntervalNs = 5'000'000'000;
constexpr std::int64_t kScanSliceNs = 20'000'000;  // between two looks at the requests
constexpr std::size_t kMaxPatched = 256;           // more changed rows: sort again instead

using core::steady_ns;

ActionReport report_of(const core::EvictReport& evicted) {
    ActionReport report;
    report.entries = evicted.entries;
    report.bytes = evicted.bytes;
    report.skipped = evicted.skipped_in_flight;
    report.message =
        fmt::format("evicted {} {} ({}, {} stored freed)", evicted.entries,
                    evicted.entries == 1 ? "entry" : "entries", format_bytes(evicted.bytes),
                    format_bytes(evicted.stored_bytes_freed));
    if (evicted.skipped_in_flight) {
        report.message +=
            fmt::format("; {} with a write in flight kept", evicted.skipped_in_flight);
    }
    return report;
}

const std::vector<DuplicateGroup> kNoGroups;

}  // namespace

const std::vector<DuplicateGroup>& DuplicateReport::groups() const {
    return groups_ ? *groups_ : kNoGroups;
}

void ThreadOwnedStore::bind(std::unique_ptr<core::Store> store) {
    m_store = std::move(store);
    m_owner = std::this_thread::get_id();
}

core::Store& ThreadOwnedStore::get() {
    // Counted, not aborted: a test asserts the count stays 0 after driving the UI.
    if (std::this_thread::get_id() != m_owner) m_foreign.fetch_add(1);
    return *m_store;
}

core::Result<std::unique_ptr<Worker>> Worker::start(const Options& options) {
    // Never create a db: a wrong --db should say so, not show an empty cache.
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::path(options.db_path) / "data.mdb", ec) && !ec) {
        return core::fail(ENOENT, fmt::format("no db at {} (no data.mdb there; create one "
                                              "with `kcache init --db {}` or give --db DIR)",
                                              options.db_path, options.db_path));
    }
    std::unique_ptr<Worker> worker(new Worker());
    worker->m_poll_interval_ns = options.poll_interval_ns;
    std::promise<core::Status> started;
    auto ready = started.get_future();
    worker->m_thread = std::thread(&Worker::run, worker.get(), options, std::move(started));
    if (auto status = ready.get(); !status) {
        worker->m_thread.join();  // run() returned after failing
        return tl::unexpected(status.error());
    }
    return worker;
}

Worker::~Worker() {
    {
        MutexLock lock(m_mutex);
        m_stop = true;
    }
    m_wake.notify_all();
    if (m_thread.joinable()) m_thread.join();
}

void Worker::run(const Options& options, std::promise<core::Status> started) {
    core::OpenOptions open_options;
    open_options.path = options.db_path;
    open_options.create = false;
    open_options.read_only = options.read_only;
    open_options.clock = options.clock;
    auto store = core::Store::open(open_options);
    if (!store && !options.read_only &&
        (store.error().code == EROFS || store.error().code == EACCES)) {
        open_options.read_only = true;  // still worth looking at; actions will say why not
        store = core::Store::open(open_options);
    }
    if (!store) {
        started.set_value(tl::unexpected(store.error()));
        return;
    }
    m_db_path = (*store)->path();
    m_read_only = (*store)->read_only();
    m_store.bind(std::move(*store));
    m_builder = std::make_unique<CatalogBuilder>(m_store);
    auto first = m_builder->load();
    if (!first) {
        started.set_value(tl::unexpected(first.error()));
        return;
    }
    publish_ordered(first->catalog);
    m_next_poll_ns = steady_ns() + m_poll_interval_ns;
    started.set_value({});
    loop();
    m_scan = DuplicateScan{};  // its read transaction ends on this thread
}

void Worker::loop() {
    MutexLock lock(m_mutex);
    while (!m_stop) {
        if (m_pending_spec) {
            ViewSpec spec = std::move(*m_pending_spec);
            m_pending_spec.reset();
            m_busy = true;
            lock.unlock();
            apply_view(spec);
        } else if (!m_jobs.empty()) {
            auto job = std::move(m_jobs.front());
            m_jobs.pop_front();
            m_busy = true;
            lock.unlock();
            job();
        } else if (m_scanning) {
            m_busy = true;
            lock.unlock();
            auto stepped = m_scan.step(kScanSliceNs);
            if (!stepped) publish_error("duplicates: " + stepped.error().message);
            if (!stepped || *stepped) {
                lock.lock();
                m_scanning = false;
                lock.unlock();
            }
            publish_duplicates();
        } else if (steady_ns() >= m_next_poll_ns) {
            m_busy = true;
            lock.unlock();
            (void)look(false);
        } else {
            m_idle.notify_all();
            m_wake.wait_for(m_mutex, std::chrono::nanoseconds(m_next_poll_ns - steady_ns()));
            continue;
        }
        lock.lock();
        m_busy = false;
    }
    m_idle.notify_all();
}

void Worker::post(std::function<void()> job) {
    {
        MutexLock lock(m_mutex);
        m_jobs.push_back(std::move(job));
    }
    m_wake.notify_all();
}

void Worker::wait_idle() {
    MutexLock lock(m_mutex);
    while (!(m_stop || (!m_busy && m_jobs.empty() && !m_pending_spec && !m_scanning)))
        m_idle.wait(m_mutex);
}

Worker::Published Worker::published() const {
    MutexLock lock(m_pub_mutex);
    return m_published;
}

void Worker::publish_view(std::shared_ptr<const View> view) {
    m_view = view;
    {
        MutexLock lock(m_pub_mutex);
        m_published.view = std::move(view);
        m_published.serial = m_serial.load() + 1;
    }
    m_serial.fetch_add(1, std::memory_order_release);
}

void Worker::publish_error(std::string message) {
    {
        MutexLock lock(m_pub_mutex);
        m_published.error = std::move(message);
        ++m_published.error_serial;
        m_published.serial = m_serial.load() + 1;
    }
    m_serial.fetch_add(1, std::memory_order_release);
}

void Worker::publish_duplicates() {
    DuplicateReport report;
    report.started_ = m_scan.started();
    report.running_ = m_scan.running();
    report.scanned_ = m_scan.scanned();
    report.total_ = m_scan.total();
    report.txn_id_ = m_scan.txn_id();
    if (m_scan.done()) {
        report.groups_ = std::make_shared<const std::vector<DuplicateGroup>>(m_scan.groups());
    }
    {
        MutexLock lock(m_pub_mutex);
        m_published.duplicates = std::move(report);
        m_published.serial = m_serial.load() + 1;
    }
    m_serial.fetch_add(1, std::memory_order_release);
}

void Worker::set_view(ViewSpec spec) {
    {
        MutexLock lock(m_mutex);
        m_pending_spec = std::move(spec);
    }
    m_wake.notify_all();
}

void Worker::apply_view(const ViewSpec& spec) {
    if (spec == m_spec) return;
    m_spec = spec;
    publish_ordered(m_view->catalog);
}

void Worker::publish_ordered(std::shared_ptr<const Catalog> catalog) {
    auto view = std::make_shared<View>();
    view->order = order_rows(*catalog, m_spec);
    view->catalog = std::move(catalog);
    view->spec = m_spec;
    publish_view(std::move(view));
}

core::Result<bool> Worker::look(bool force) {
    const std::int64_t t0 = steady_ns();
    (void)force;  // a look is a look; `force` only skips the wait for the poll time
    auto update = m_builder->follow();
    if (!update) {
        m_next_poll_ns = steady_ns() + m_poll_interval_ns;
        publish_error("refresh: " + update.error().message);
        return tl::unexpected(update.error());
    }
    if (!*update) {
        m_next_poll_ns = steady_ns() + m_poll_interval_ns;
        return false;
    }
    const CatalogBuilder::Update& u = **update;
    auto view = std::make_shared<View>();
    view->catalog = u.catalog;
    view->spec = m_spec;
    if (u.full || u.rows_moved || u.changed.size() > kMaxPatched) {
        view->order = order_rows(*u.catalog, m_spec);
    } else {
        view->order = m_view->order;
        if (!u.changed.empty()) patch_order(view->order, *u.catalog, m_spec, u.changed);
    }
    publish_view(std::move(view));
    // A slow look must not be repeated at once: look again after several times its cost.
    const std::int64_t cost = steady_ns() - t0;
    m_next_poll_ns =
        steady_ns() + std::clamp<std::int64_t>(4 * cost, m_poll_interval_ns, kMaxPollIntervalNs);
    return true;
}

std::future<core::Result<bool>> Worker::look_now() {
    auto promise = std::make_shared<std::promise<core::Result<bool>>>();
    auto future = promise->get_future();
    post([this, promise] { promise->set_value(look(true)); });
    return future;
}

std::future<core::Status> Worker::reload_now() {
    auto promise = std::make_shared<std::promise<core::Status>>();
    auto future = promise->get_future();
    post([this, promise] {
        auto loaded = m_builder->load();
        if (!loaded) {
            promise->set_value(tl::unexpected(loaded.error()));
            return;
        }
        publish_ordered(loaded->catalog);
        promise->set_value({});
    });
    return future;
}

std::future<core::Result<ActionReport>> Worker::act(ActionRequest request) {
    auto promise = std::make_shared<std::promise<core::Result<ActionReport>>>();
    auto future = promise->get_future();
    post(
        [this, promise, request = std::move(request)] { promise->set_value(run_action(request)); });
    return future;
}

std::future<core::Result<EntryDetail>> Worker::load_detail(core::Ino entry) {
    auto promise = std::make_shared<std::promise<core::Result<EntryDetail>>>();
    auto future = promise->get_future();
    post([this, promise, entry] { promise->set_value(EntryDetail::load(m_store.get(), entry)); });
    return future;
}

std::future<core::Result<FileView>> Worker::load_file(EntryFile file) {
    auto promise = std::make_shared<std::promise<core::Result<FileView>>>();
    auto future = promise->get_future();
    post([this, promise, file = std::move(file)] {
        promise->set_value(load_file_view(m_store.get(), file));
    });
    return future;
}

std::future<core::Result<MissesReport>> Worker::load_misses(std::int64_t span_ns) {
    auto promise = std::make_shared<std::promise<core::Result<MissesReport>>>();
    auto future = promise->get_future();
    post([this, promise, span_ns] {
        core::Store& store = m_store.get();
        promise->set_value(MissesReport::load(store, store.now_ns(), span_ns));
    });
    return future;
}

void Worker::scan_duplicates() {
    post([this] {
        const Catalog& c = *m_view->catalog;
        std::vector<core::Ino> inos;
        inos.reserve(c.live);
        for (const EntryRow& row : c.rows) {
            if (!row.gone()) inos.push_back(row.ino);
        }
        if (auto status = m_scan.start(m_store.get(), std::move(inos)); !status) {
            publish_error("duplicates: " + status.error().message);
        } else {
            MutexLock lock(m_mutex);
            m_scanning = true;
        }
        publish_duplicates();
    });
}

core::Result<ActionReport> Worker::run_action(const ActionRequest& request) {
    core::Result<ActionReport> report = core::fail(EINVAL, "nothing to do");
    switch (request.action) {
        case Action::evict:
            report = run_evict(request.inos);
            break;
        case Action::pin:
        case Action::unpin:
            report = run_pin(request.inos, request.action == Action::pin);
            break;
        case Action::evict_older:
        case Action::clear: {
            core::EvictRequest evict;
            if (request.action == Action::clear) {
                evict.max_entries = 0;
            } else {
                evict.older_than_ns = request.age_ns;
            }
            auto evicted = KCACHE_TRY(m_store.get().evict(evict));
            report = report_of(evicted);
            break;
        }
    }
    if (!report) return report;
    KCACHE_TRY(look(true));
    if (request.action == Action::clear && m_view->catalog->live > 0) {
        report->message += fmt::format("; {} pinned kept", m_view->catalog->live);
    }
    return report;
}

core::Result<ActionReport> Worker::run_evict(const std::vector<core::Ino>& inos) {
    const Catalog& c = *m_view->catalog;
    auto txn = KCACHE_TRY(m_store.get().write());
    ActionReport report;
    for (core::Ino ino : inos) {
        const EntryRow* r = c.find(ino);
        core::Status status = txn.evict_entry(ino);
        if (!status) {
            const int code = status.error().code;
            if (code == EPERM || code == EBUSY) {  // pinned, or a write in flight
                ++report.skipped;
                continue;
            }
            if (code == ENOENT) continue;  // evicted by someone else meanwhile
            return tl::unexpected(status.error());
        }
        ++report.entries;
        if (r && !r->gone()) report.bytes += r->bytes;
    }
    KCACHE_TRY(txn.commit());
    report.message =
        fmt::format("evicted {} {} ({})", report.entries, report.entries == 1 ? "entry" : "entries",
                    format_bytes(report.bytes));
    if (report.skipped) {
        report.message += fmt::format("; kept {} pinned or with a write in flight", report.skipped);
    }
    return report;
}

core::Result<ActionReport> Worker::run_pin(const std::vector<core::Ino>& inos, bool pinned) {
    const Catalog& c = *m_view->catalog;
    auto txn = KCACHE_TRY(m_store.get().write());
    ActionReport report;
    for (core::Ino ino : inos) {
        const EntryRow* r = c.find(ino);
        if (r && !r->gone() && r->pinned() == pinned) continue;
        core::Status status = txn.set_pinned(ino, pinned);
        if (!status && status.error().code == ENOENT) continue;
        KCACHE_TRY(status);
        ++report.entries;
    }
    KCACHE_TRY(txn.commit());
    report.message = fmt::format("{} {} {}", pinned ? "pinned" : "unpinned", report.entries,
                                 report.entries == 1 ? "entry" : "entries");
    return report;
}

}  // namespace kcache::gui
