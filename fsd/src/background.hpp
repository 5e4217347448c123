// The daemon's background thread: it does what request handlers must not.
//
// - Tells the kernel what changed behind the mount: entries evicted, removed,
//   renamed, imported or populated by anyone (it follows the db's events log, so
//   `kcache evict` in another process shows in the mount at once) and files whose
//   content a writer published. Notifications never come from a request handler:
//   the kernel may hold a directory lock while it waits for that handler's reply.
// - Flushes statistics that handlers count in memory (opens, hits, bytes read, ...)
//   in one transaction, at least every `flush period` and at stop().
// - Classifies misses (core/misses.hpp: classify_pending) on a thread of its own, a
//   batch every 200 ms: a batch compares from short read snapshots for 5 ms at most and
//   holds LMDB's writer lock, which stores need, only for its short write; this thread
//   never waits for it. Not niced (background.cpp says why).
// - Enforces the size bounds when a publish asked for it.
// - Syncs the db periodically under batched durability.
// Locks (lock_order.hpp): m_mutex, level 8, a leaf; the replies it runs after a
// notification (invalidate_attr's and grow_size's `then`) run with it let go.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "kcache/core/events.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

struct fuse_session;

namespace kcache::fsd {

class Background {
  public:
    Background(core::Store& store, double sync_interval_s);
    ~Background();
    Background(const Background&) = delete;
    Background& operator=(const Background&) = delete;

    // Starts following events from the newest one; `session` receives notifications.
    void start(fuse_session* session);
    // Stops the thread, then flushes statistics and, when it syncs on a timer
    // (batched durability), syncs. Call before the session is destroyed.
    void stop();

    // ---- for request handlers: thread-safe, never block on the kernel ----
    void invalidate_inode(core::Ino ino);
    // The kernel forgets the inode's attributes only (its pages stay), then `then`
    // runs on the background thread (a reply that must follow the invalidation).
    void invalidate_attr(core::Ino ino, std::function<void()> then = {});
    // The kernel's size of the inode becomes at least `size`, then `then` runs on the
    // background thread. The kernel applies every size it is told to the one inode
    // (a stat during a rewrite tells the stored version's), and silently drops a
    // GETATTR answer that crossed a notification, reading on with the size it had:
    // a reader whose version is longer would stop short. Growing it cannot be undone
    // by a crossing; a size too large is corrected by the first short READ.
    // `last_byte` is the version's byte at size - 1 (the notification stores it).
    void grow_size(core::Ino ino, std::uint64_t size, char last_byte, std::function<void()> then);
    void check_limits() { m_check_limits = true; }
    void count(core::Counter counter, std::uint64_t n = 1);
    void hit(core::Ino entry);

    // Writes the pending statistics now (also used by stop()).
    core::Status flush_stats();

    // Runs `fn` on the background thread at the start of every period (set before
    // start()): Contents::renew_pin, which must see every commit soon after it.
    void on_period(std::function<void()> fn) { m_on_period = std::move(fn); }

  private:
    void run();
    void follow_events();
    void notify(const std::vector<core::Ino>& inodes,
                const std::vector<std::pair<core::Ino, std::string>>& entries);
    void notify_attrs(std::vector<core::Ino> inodes);
    struct Growth {
        core::Ino ino;
        std::uint64_t size;
        char last_byte;
    };
    void notify_sizes(const std::vector<Growth>& growths);
    static void run_all(std::vector<std::function<void()>>& after);
    void train_if_due();
    void run_classifier();

    core::Store& m_store;
    fuse_session* m_session = nullptr;
    std::thread m_thread;
    Mutex m_mutex KCACHE_LEVEL(8);  // a leaf
    CondVar m_wake;
    std::thread m_classifier;   // run_classifier(); stop() joins it
    CondVar m_classifier_wake;  // stop
    bool m_stop GUARDED_BY(m_mutex) = false;
    std::vector<core::Ino> m_inodes_to_invalidate GUARDED_BY(m_mutex);
    std::vector<core::Ino> m_attrs_to_invalidate GUARDED_BY(m_mutex);
    std::vector<Growth> m_sizes_to_grow GUARDED_BY(m_mutex);
    std::vector<std::function<void()>> m_after_invalidation GUARDED_BY(m_mutex);
    std::vector<core::Ino> m_hits GUARDED_BY(m_mutex);
    std::atomic<bool> m_check_limits{false};
    std::function<void()> m_on_period;  // set before start(); only the thread calls it
    // Trained dictionaries (core/dictionaries.hpp): now and then this thread asks whether
    // a kind is due and starts the training on a thread of its own, since a training
    // takes a good part of a second, which notifications must not wait for. The trainer
    // holds no lock of the daemon's (only LMDB's writer lock, for one short commit);
    // stop() joins it. m_training: set here, cleared by the trainer when it is done.
    std::thread m_trainer;
    std::atomic<bool> m_training{false};
    std::chrono::steady_clock::time_point m_last_train_check = std::chrono::steady_clock::now();

  public:
    // The counters handlers count in memory, flushed together: the rows of the table
    // of statistics that the daemon counts (core::by_daemon).
    static constexpr int kSlots = static_cast<int>(core::statistics_counted_by(core::by_daemon));
    static constexpr std::array<core::Counter, kSlots> kCounted =
        core::statistics_counted_by_list<kSlots>(core::by_daemon);

  private:
    std::atomic<std::uint64_t> m_counts[kSlots] = {};
    core::EventCursor m_events;  // where follow_events() goes on from
    const double m_sync_interval_s;
    std::uint64_t m_synced_txn = 0;
    std::chrono::steady_clock::time_point m_last_sync = std::chrono::steady_clock::now();
};

}  // namespace kcache::fsd
