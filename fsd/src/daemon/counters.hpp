// The statistics request handlers count in memory (opens, hits, bytes read, negative
// lookups, errors, ...): counting is an atomic add or a push under a leaf lock, never a
// write transaction; flush() writes them all in one transaction.
//
// Contract:
//  - count() and hit(): any thread, never block on the kernel or the db, never fail. A
//    counter the table of statistics does not give the daemon (core::by_daemon) counts
//    as errors_other.
//  - flush(): writes what was counted since the last flush in one transaction; on
//    failure keeps it for the next one. Nothing under --read-only (no statistics). Called
//    by Upkeep on the background thread (every 4th period) and at stop.
// Threads: none of its own. Locks (lock_order.hpp): m_mutex, level 8, a leaf: it guards
// the hits not flushed yet; the counts are atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "kcache/core/statistics.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class Counters {
  public:
    explicit Counters(core::Store& store) : m_store(store) {}
    Counters(const Counters&) = delete;
    Counters& operator=(const Counters&) = delete;

    void count(core::Counter counter, std::uint64_t n = 1);
    // A hit of `entry` (HitCounter decided it is one): recorded in its entry at flush().
    void hit(core::Ino entry);

    // Writes the pending statistics now.
    core::Status flush();

    // The counters handlers count in memory, flushed together: the rows of the table
    // of statistics that the daemon counts (core::by_daemon).
    static constexpr int kSlots = static_cast<int>(core::statistics_counted_by(core::by_daemon));
    static constexpr std::array<core::Counter, kSlots> kCounted =
        core::statistics_counted_by_list<kSlots>(core::by_daemon);

  private:
    core::Store& m_store;
    Mutex m_mutex KCACHE_LEVEL(8);  // a leaf
    std::vector<core::Ino> m_hits GUARDED_BY(m_mutex);
    std::atomic<std::uint64_t> m_counts[kSlots] = {};
};

}  // namespace kcache::fsd
