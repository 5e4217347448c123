#define FUSE_USE_VERSION 312
#include "background.hpp"

#include <fuse_lowlevel.h>

#include <algorithm>

#include "kcache/core/dictionaries.hpp"
#include "kcache/core/misses.hpp"
#include "log.hpp"

namespace kcache::fsd {
namespace {

constexpr auto kPeriod = std::chrono::milliseconds(50);  // how soon the mount reflects a change
constexpr int kFlushEvery = 4;                           // statistics: every 4 periods
constexpr auto kTrainEvery = std::chrono::seconds(10);   // is a dictionary due? (reads the kinds)
constexpr auto kClassifyEvery = std::chrono::milliseconds(200);  // a batch of misses at most

constexpr int find_slot(core::Counter c) {
    for (int i = 0; i < Background::kSlots; ++i) {
        if (Background::kCounted[static_cast<std::size_t>(i)] == c) return i;
    }
    return -1;
}
constexpr int kOtherSlot = find_slot(core::Counter::errors_other);
static_assert(kOtherSlot >= 0, "the daemon counts errors_other (core/statistics.hpp)");

// A counter the table does not give the daemon counts as errors_other.
int slot_of(core::Counter c) {
    const int slot = find_slot(c);
    return slot >= 0 ? slot : kOtherSlot;
}

}  // namespace

Background::Background(core::Store& store, double sync_interval_s)
    : m_store(store), m_sync_interval_s(sync_interval_s) {}

Background::~Background() {
    stop();
}

void Background::start(fuse_session* session) {
    m_session = session;
    if (auto txn = m_store.read()) {  // follow from now on: the kernel knows nothing older
        if (auto end = core::EventCursor::at_end(*txn)) m_events = *end;
    }
    m_thread = std::thread([this] { run(); });
    m_classifier = std::thread([this] { run_classifier(); });
}

void Background::stop() {
    {
        MutexLock lock(m_mutex);
        if (m_stop && !m_thread.joinable()) return;
        m_stop = true;
    }
    m_wake.notify_all();
    m_classifier_wake.notify_all();
    if (m_thread.joinable()) m_thread.join();
    if (m_classifier.joinable()) m_classifier.join();
    if (m_trainer.joinable()) m_trainer.join();
    m_session = nullptr;
    std::vector<std::function<void()>>
        after;  // replies still owed (their notification no longer matters)
    {
        MutexLock lock(m_mutex);
        after.swap(m_after_invalidation);
    }
    run_all(after);
    if (auto s = flush_stats(); !s) log::error("statistics lost at stop: {}", s.error().message);
    if (m_sync_interval_s > 0) (void)m_store.sync();
}

void Background::invalidate_inode(core::Ino ino) {
    {
        MutexLock lock(m_mutex);
        m_inodes_to_invalidate.push_back(ino);
    }
    m_wake.notify_all();
}

void Background::invalidate_attr(core::Ino ino, std::function<void()> then) {
    {
        MutexLock lock(m_mutex);
        m_attrs_to_invalidate.push_back(ino);
        if (then) m_after_invalidation.push_back(std::move(then));
    }
    m_wake.notify_all();
}

void Background::grow_size(core::Ino ino, std::uint64_t size, char last_byte,
                           std::function<void()> then) {
    {
        MutexLock lock(m_mutex);
        m_sizes_to_grow.push_back({ino, size, last_byte});
        m_after_invalidation.push_back(std::move(then));
    }
    m_wake.notify_all();
}

void Background::run_all(std::vector<std::function<void()>>& after) {
    for (auto& f : after) f();
    after.clear();
}

void Background::count(core::Counter counter, std::uint64_t n) {
    m_counts[slot_of(counter)].fetch_add(n, std::memory_order_relaxed);
}

void Background::hit(core::Ino entry) {
    MutexLock lock(m_mutex);
    m_hits.push_back(entry);
}

core::Status Background::flush_stats() {
    std::uint64_t counts[kSlots];
    for (int i = 0; i < kSlots; ++i) counts[i] = m_counts[i].exchange(0);
    std::vector<core::Ino> hits;
    {
        MutexLock lock(m_mutex);
        hits.swap(m_hits);
    }
    bool any = !hits.empty();
    for (auto c : counts) any = any || c;
    if (!any || m_store.read_only()) return {};  // read-only service keeps no statistics
    auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
        for (int i = 0; i < kSlots; ++i) {
            if (auto a = txn.add(kCounted[static_cast<std::size_t>(i)], counts[i]); !a) return a;
        }
        for (core::Ino entry : hits) {
            auto h = txn.record_hit(entry);
            if (h) continue;
            if (h.error().code != ENOENT) return h;
            // Evicted since: the process did load it from the cache; only the entry's
            // own record is gone.
            if (auto a = txn.add(core::Counter::hits, 1); !a) return a;
        }
        return {};
    });
    if (!s) {  // keep them for the next try
        for (int i = 0; i < kSlots; ++i) m_counts[i].fetch_add(counts[i]);
        MutexLock lock(m_mutex);
        m_hits.insert(m_hits.end(), hits.begin(), hits.end());
    }
    return s;
}

void Background::run() {
    for (int tick = 1;; ++tick) {
        std::vector<core::Ino> inodes, attrs;
        std::vector<Growth> growths;
        std::vector<std::function<void()>> after;
        {
            MutexLock lock(m_mutex);
            const auto deadline = std::chrono::steady_clock::now() + kPeriod;
            while (!m_stop && m_inodes_to_invalidate.empty() && m_attrs_to_invalidate.empty() &&
                   m_sizes_to_grow.empty()) {
                if (!m_wake.wait_until(m_mutex, deadline)) break;
            }
            if (m_stop) return;
            inodes.swap(m_inodes_to_invalidate);
            attrs.swap(m_attrs_to_invalidate);
            growths.swap(m_sizes_to_grow);
            after.swap(m_after_invalidation);
        }
        if (m_on_period) m_on_period();
        // Attributes and sizes first, and the replies that wait for them. Neither
        // waits on a request handler: an attribute notification takes no lock a
        // request holds, and a stored byte at most waits for a READ filling its page,
        // which a request thread answers without this thread.
        notify_attrs(std::move(attrs));
        notify_sizes(growths);
        run_all(after);
        notify(inodes, {});
        follow_events();
        if (m_check_limits.exchange(false)) {
            if (auto r = m_store.enforce_limits(); !r) {
                log::error("eviction failed: {}", r.error().message);
            }
            follow_events();  // what eviction removed leaves the kernel's caches at once
        }
        if (tick % kFlushEvery == 0) {
            if (auto s = flush_stats(); !s) {
                log::warning("statistics not saved yet: {}", s.error().message);
            }
        }
        const auto now = std::chrono::steady_clock::now();
        if (now - m_last_train_check >= kTrainEvery) {
            m_last_train_check = now;
            train_if_due();
        }
        if (m_sync_interval_s > 0 &&
            now - m_last_sync >= std::chrono::duration<double>(m_sync_interval_s)) {
            m_last_sync = now;
            std::uint64_t id = 0;
            if (auto txn = m_store.read()) id = txn->id();  // only sync after a change
            if (id != m_synced_txn) {
                if (auto s = m_store.sync(); s) m_synced_txn = id;
            }
        }
    }
}

void Background::run_classifier() {
    // Misses explained (core/misses.hpp), off every request path and off this daemon's
    // notifications. Not at a lower priority: on a busy machine a niced thread is
    // descheduled for tens of ms inside its snapshot (LMDB then cannot reuse the pages
    // stores free: the db grew 30-200% in bench/misses at 20,000 entries) and inside its
    // write, with LMDB's writer lock that stores wait for (a batch of 3.7 ms of CPU took
    // 37 ms). Its share of the CPU is bounded by the batch budget instead: about 5 ms
    // of comparing every kClassifyEvery.
    if (m_store.read_only()) return;
    MutexLock lock(m_mutex);
    while (!m_stop) {
        const auto due = std::chrono::steady_clock::now() + kClassifyEvery;
        while (!m_stop && m_classifier_wake.wait_until(m_mutex, due)) {
        }
        if (m_stop) break;
        lock.unlock();
        if (auto c = core::classify_pending(m_store); !c) {
            log::warning("misses not classified yet: {}", c.error().message);
        }
        lock.lock();
    }
}

void Background::train_if_due() {
    if (m_training || m_store.read_only()) return;
    auto due = core::dictionaries_due(m_store);
    if (!due || !*due) return;
    if (m_trainer.joinable()) m_trainer.join();  // the last one is done (m_training)
    m_training = true;
    m_trainer = std::thread([this] {
        auto trained = core::train_dictionaries(m_store);
        if (!trained) {
            log::warning("training dictionaries: {}", trained.error().message);
        } else {
            for (const core::TrainedDictionary& t : *trained) {
                if (t.id)
                    log::info("trained dictionary {} for {} ({} bytes)", t.id, t.kind, t.bytes);
            }
        }
        m_training = false;
    });
}

void Background::follow_events() {
    std::vector<core::Ino> inodes;
    std::vector<std::pair<core::Ino, std::string>> entries;
    {
        auto txn = m_store.read();
        if (!txn) return;
        auto lost = m_events.read(*txn, [&](const core::Event& e) {
            switch (e.kind) {
                case core::EventKind::evict:
                case core::EventKind::remove:
                case core::EventKind::rename:
                case core::EventKind::import:
                case core::EventKind::populate:
                case core::EventKind::member:  // a file of a stem entry, by its own name
                    if (e.parent) entries.emplace_back(e.parent, e.name);
                    inodes.push_back(e.entry);
                    break;
                default:
                    break;  // hits, pins, resets change nothing the kernel caches
            }
            return true;
        });
        if (lost && *lost) {
            log::warning(
                "{} events were trimmed from the log before the daemon read them: "
                "the kernel may keep names of what they changed until they expire",
                *lost);
        }
    }  // the snapshot ends before the kernel is told anything
    notify(inodes, entries);
}

void Background::notify_attrs(std::vector<core::Ino> inodes) {
    if (!m_session) return;
    std::sort(inodes.begin(), inodes.end());
    inodes.erase(std::unique(inodes.begin(), inodes.end()), inodes.end());
    // A negative offset: attributes only, the page cache stays (ENOENT when the
    // kernel holds nothing of the inode: harmless).
    for (core::Ino ino : inodes) fuse_lowlevel_notify_inval_inode(m_session, ino, -1, 0);
}

void Background::notify_sizes(const std::vector<Growth>& growths) {
    if (!m_session) return;
    for (const Growth& g : growths) {
        // NOTIFY_STORE of the last byte: the kernel extends its size to the end of
        // what it stores (and never shrinks it), and invalidates the size it held.
        fuse_bufvec buf = FUSE_BUFVEC_INIT(1);
        char byte = g.last_byte;
        buf.buf[0].mem = &byte;
        const int err = fuse_lowlevel_notify_store(m_session, g.ino, static_cast<off_t>(g.size - 1),
                                                   &buf, fuse_buf_copy_flags{});
        if (err != 0 && err != -ENOENT)
            log::warning("telling the kernel the size of inode {}: {}", g.ino, strerror(-err));
    }
}

void Background::notify(const std::vector<core::Ino>& inodes,
                        const std::vector<std::pair<core::Ino, std::string>>& entries) {
    if (!m_session) return;
    // Errors are expected and harmless: ENOENT when the kernel has nothing cached.
    for (const auto& [parent, name] : entries) {
        fuse_lowlevel_notify_inval_entry(m_session, parent, name.c_str(), name.size());
    }
    for (core::Ino ino : inodes) fuse_lowlevel_notify_inval_inode(m_session, ino, 0, 0);
}

}  // namespace kcache::fsd
