#include "miss_classifier.hpp"

#include "kcache/core/misses.hpp"
#include "log.hpp"

namespace kcache::fsd {

void MissClassifier::start() {
    m_thread = std::thread([this] { run(); });
}

void MissClassifier::stop() {
    {
        MutexLock lock(m_mutex);
        m_stop = true;
    }
    m_wake.notify_all();
    if (m_thread.joinable()) m_thread.join();
}

void MissClassifier::run() {
    // Misses explained (core/misses.hpp), off every request path and off this daemon's
    // notifications. Not at a lower priority: on a busy machine a niced thread is
    // descheduled for tens of ms inside its snapshot (LMDB then cannot reuse the pages
    // stores free: the db grew 30-200% in bench/misses at 20,000 entries) and inside its
    // write, with LMDB's writer lock that stores wait for (a batch of 3.7 ms of CPU took
    // 37 ms). Its share of the CPU is bounded by the batch budget instead: about 5 ms
    // of comparing every kEvery.
    if (m_store.read_only()) return;
    MutexLock lock(m_mutex);
    while (!m_stop) {
        const auto due = std::chrono::steady_clock::now() + kEvery;
        while (!m_stop && m_wake.wait_until(m_mutex, due)) {
        }
        if (m_stop) break;
        lock.unlock();
        if (auto c = core::classify_pending(m_store); !c) {
            log::warning("misses not classified yet: {}", c.error().message);
        }
        lock.lock();
    }
}

}  // namespace kcache::fsd
