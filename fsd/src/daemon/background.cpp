#include "background.hpp"

namespace kcache::fsd {

Background::Background(core::Store& store, double sync_interval_s)
    : m_counters(store),
      m_notifier(store),
      m_upkeep(store, m_counters, sync_interval_s),
      m_classifier(store) {}

Background::~Background() {
    stop();
}

void Background::start(fuse_session* session) {
    m_notifier.start(session);
    m_thread = std::thread([this] { run(); });
    m_classifier.start();
}

void Background::stop() {
    if (!m_notifier.close() && !m_thread.joinable()) return;  // stopped already
    m_classifier.stop();
    if (m_thread.joinable()) m_thread.join();
    m_upkeep.stop_training();
    m_notifier.finish();
    m_upkeep.stop();
}

void Background::run() {
    for (int tick = 1;; ++tick) {
        auto queued = m_notifier.take(kPeriod);
        if (!queued) return;
        m_upkeep.begin_period();
        m_notifier.tell(std::move(*queued));
        m_notifier.follow_events();
        // What eviction removed leaves the kernel's caches at once.
        if (m_upkeep.evict_if_asked()) m_notifier.follow_events();
        m_upkeep.end_period(tick);
    }
}

}  // namespace kcache::fsd
