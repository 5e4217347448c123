// Misses explained (core/misses.hpp: classify_pending) on a thread of its own, off every
// request path and off the daemon's notifications: a batch every kEvery (200 ms). A
// batch compares from short read snapshots for 5 ms at most and holds LMDB's writer
// lock, which stores need, only for its short write; this thread never waits for it.
// Not niced (miss_classifier.cpp says why). Nothing under --read-only.
//
// Contract: start() once; stop() (idempotent) ends the thread after the batch in
// progress.
// Threads: the classifier (MissClassifier::run), start() to stop(). Locks
// (lock_order.hpp): m_mutex, level 8, a leaf: it guards m_stop; a batch runs with it
// let go.
#pragma once

#include <chrono>
#include <thread>

#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class MissClassifier {
  public:
    static constexpr auto kEvery = std::chrono::milliseconds(200);  // a batch of misses at most

    explicit MissClassifier(core::Store& store) : m_store(store) {}
    ~MissClassifier() { stop(); }
    MissClassifier(const MissClassifier&) = delete;
    MissClassifier& operator=(const MissClassifier&) = delete;

    void start();
    void stop();

  private:
    void run();

    core::Store& m_store;
    Mutex m_mutex KCACHE_LEVEL(8);  // a leaf
    CondVar m_wake;                 // stop
    bool m_stop GUARDED_BY(m_mutex) = false;
    std::thread m_thread;  // run(); stop() joins it
};

}  // namespace kcache::fsd
