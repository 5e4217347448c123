#include "hits.hpp"

#include <fmt/format.h>

#include "process.hpp"

namespace kcache::fsd {

void HitCounter::count_open(pid_t opener, const core::ReadTxn& txn, const core::Attr& attr) {
    m_background.count(core::Counter::opens);
    if (!attr.entry || attr.bookkeeping) return;  // locks and temp files are no kernel
    auto entry = txn.entry(attr.entry);
    if (!entry || !entry->populated) return;
    // Most opens come from a thread that opened this entry before: known without /proc.
    const auto tid = static_cast<std::uint32_t>(opener);
    const std::string by_thread = fmt::format("{}:t{}", attr.entry, tid);
    {
        MutexLock lock(m_mutex);
        if (m_seen.count(by_thread)) return;
    }
    const std::uint32_t pid = process_of(static_cast<pid_t>(tid));
    const std::string by_process = fmt::format("{}:{}", attr.entry, pid);
    const bool own = same_compile(pid, entry->populated_by_pid);  // /proc: not under the lock
    {
        MutexLock lock(m_mutex);
        if (m_seen.size() >= kMaxSeenPairs) m_seen.clear();  // bounded: may recount after this
        m_seen.insert(by_thread);
        if (own) return;  // its own kernel (or its compile's), not a cache hit
        if (!m_seen.insert(by_process).second) return;
    }
    m_background.hit(attr.entry);
}

}  // namespace kcache::fsd
