// The daemon's periodic upkeep, on the background thread (background.hpp), each period
// after the kernel was told what changed:
// - the period's hook, first (on_period: Contents::renew_pin, which must see every
//   commit soon after it);
// - the size bounds enforced when a publish asked for it (check_limits);
// - the statistics handlers count in memory (Counters) written every kFlushEvery-th
//   period, and at stop;
// - trained dictionaries (core/dictionaries.hpp): every kTrainEvery it asks whether a
//   kind is due and starts the training on a thread of its own, since a training takes
//   a good part of a second, which notifications must not wait for;
// - the db synced every `sync_interval_s` under batched durability (after a change
//   only), and at stop.
//
// Contract: check_limits() from any thread (a flag); on_period() before the background
// thread starts; begin_period, evict_if_asked and end_period on the background thread
// only; stop_training() and stop() once that thread ended.
// Threads: the dictionary trainer, 0 or 1 at a time (m_trainer; stop() joins it). It
// holds no lock of the daemon's (only LMDB's writer lock, for one short commit). Locks:
// none of its own: its state is the background thread's, or atomic.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "counters.hpp"
#include "kcache/core/store.hpp"

namespace kcache::fsd {

class Upkeep {
  public:
    static constexpr int kFlushEvery = 4;                          // statistics: every 4 periods
    static constexpr auto kTrainEvery = std::chrono::seconds(10);  // is a dictionary due?

    Upkeep(core::Store& store, Counters& counters, double sync_interval_s)
        : m_store(store), m_counters(counters), m_sync_interval_s(sync_interval_s) {}
    ~Upkeep() { stop(); }
    Upkeep(const Upkeep&) = delete;
    Upkeep& operator=(const Upkeep&) = delete;

    // ---- for request handlers ----
    // A publish took the cache over a bound: evict in the next period.
    void check_limits() { m_check_limits = true; }

    // Runs `fn` on the background thread at the start of every period (set before
    // start()): Contents::renew_pin, which must see every commit soon after it.
    void on_period(std::function<void()> fn) { m_on_period = std::move(fn); }

    // ---- for the background thread ----
    void begin_period() {
        if (m_on_period) m_on_period();
    }
    // Enforces the size bounds if check_limits() asked since the last call; true when
    // it ran (the caller then follows the events log: what eviction removed leaves the
    // kernel's caches at once).
    bool evict_if_asked();
    // Statistics every kFlushEvery-th `tick`, training when due, the periodic sync.
    void end_period(int tick);

    // Once the background thread ended: joins the trainer.
    void stop_training() {
        if (m_trainer.joinable()) m_trainer.join();
    }
    // Then: joins the trainer, writes the statistics and, when it syncs on a timer
    // (batched durability), syncs. Idempotent.
    void stop();

  private:
    void train_if_due();

    core::Store& m_store;
    Counters& m_counters;
    std::atomic<bool> m_check_limits{false};
    std::function<void()> m_on_period;  // set before start(); only the thread calls it
    bool m_stopped = false;             // the thread that stops only
    // The trainer. m_training: set here, cleared by the trainer when it is done.
    std::thread m_trainer;
    std::atomic<bool> m_training{false};
    std::chrono::steady_clock::time_point m_last_train_check = std::chrono::steady_clock::now();
    const double m_sync_interval_s;
    std::uint64_t m_synced_txn = 0;
    std::chrono::steady_clock::time_point m_last_sync = std::chrono::steady_clock::now();
};

}  // namespace kcache::fsd
