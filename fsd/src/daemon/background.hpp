// The daemon's background work, what request handlers must not do, in four parts with
// one concern each; this thin owner starts and stops them and runs the background
// thread, which sequences the first three every period:
// - KernelNotifier (kernel_notifier.hpp): tells the kernel what changed behind the
//   mount (the events log, invalidations, sizes) and runs the replies that wait for it;
// - Upkeep (upkeep.hpp): the pin's renewal, eviction, statistics, dictionary training
//   (its own trainer thread), the periodic sync;
// - Counters (counters.hpp): the statistics handlers count in memory;
// - MissClassifier (miss_classifier.hpp): misses explained, on a thread of its own.
// Request handlers reach only the part they use (Filesystem keeps a reference to each).
//
// Threads: the background thread (Background::run), start() to stop(): every kPeriod,
// or at once when a notification is queued: Upkeep::begin_period, then the kernel told
// what handlers queued, then the events log, eviction when asked (and the events log
// again), then Upkeep::end_period. Locks: none of its own (its parts' are leaves,
// level 8, lock_order.hpp); it holds none while it calls a part.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "counters.hpp"
#include "kcache/core/store.hpp"
#include "kernel_notifier.hpp"
#include "miss_classifier.hpp"
#include "upkeep.hpp"

struct fuse_session;

namespace kcache::fsd {

class Background {
  public:
    static constexpr auto kPeriod = std::chrono::milliseconds(50);  // how soon the mount
                                                                    // reflects a change
    Background(core::Store& store, double sync_interval_s);
    ~Background();
    Background(const Background&) = delete;
    Background& operator=(const Background&) = delete;

    // Starts following events from the newest one; `session` receives notifications.
    void start(fuse_session* session);
    // Stops the threads, then runs the replies still owed, flushes statistics and, when
    // it syncs on a timer (batched durability), syncs. Call before the session is
    // destroyed. Idempotent.
    void stop();

    KernelNotifier& notifier() { return m_notifier; }
    Counters& counters() { return m_counters; }
    Upkeep& upkeep() { return m_upkeep; }

  private:
    void run();

    Counters m_counters;  // before m_upkeep, which flushes it
    KernelNotifier m_notifier;
    Upkeep m_upkeep;
    MissClassifier m_classifier;
    std::thread m_thread;  // run(); stop() joins it
};

}  // namespace kcache::fsd
