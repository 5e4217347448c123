#include "upkeep.hpp"

#include "kcache/core/dictionaries.hpp"
#include "log.hpp"

namespace kcache::fsd {

bool Upkeep::evict_if_asked() {
    if (!m_check_limits.exchange(false)) return false;
    if (auto r = m_store.enforce_limits(); !r) {
        log::error("eviction failed: {}", r.error().message);
    }
    return true;
}

void Upkeep::end_period(int tick) {
    if (tick % kFlushEvery == 0) {
        if (auto s = m_counters.flush(); !s) {
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

void Upkeep::stop() {
    if (m_stopped) return;
    m_stopped = true;
    if (m_trainer.joinable()) m_trainer.join();
    if (auto s = m_counters.flush(); !s)
        log::error("statistics lost at stop: {}", s.error().message);
    if (m_sync_interval_s > 0) (void)m_store.sync();
}

void Upkeep::train_if_due() {
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

}  // namespace kcache::fsd
