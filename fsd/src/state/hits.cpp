#include "hits.hpp"

#include <fmt/format.h>

#include "process.hpp"

namespace kcache::fsd {

void HitCounter::count_open(pid_t opener, const core::ReadTxn& txn, const core::Attr& attr) {
    m_counters.count(core::Counter::opens);
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
    // Counted already by a daemon before this one (a takeover)?
    if (m_pairs.insert(attr.entry, pid) == HitPairs::Insert::known) return;
    m_counters.hit(attr.entry);
}

HitPairs::Insert HitPairs::insert(core::Ino entry, std::uint32_t pid) {
    constexpr unsigned kPidBits = 22;
    if (m_count == 0 || entry >> (64 - kPidBits) != 0 || pid >> kPidBits != 0) return Insert::full;
    const std::uint64_t key = (std::uint64_t{entry} << kPidBits) | pid;  // entry > 0: never 0
    // splitmix64's finalizer spreads consecutive entries over the table.
    std::uint64_t h = key;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    for (std::size_t probe = 0; probe < kMaxProbes && probe < m_count; ++probe) {
        std::atomic<std::uint64_t>& slot = m_slots[(h + probe) & (m_count - 1)];
        std::uint64_t seen = slot.load(std::memory_order_acquire);
        if (seen == 0 && slot.compare_exchange_strong(seen, key, std::memory_order_acq_rel))
            return Insert::added;
        if (seen == key) return Insert::known;  // (a lost race for the slot sees the winner)
    }
    return Insert::full;
}

}  // namespace kcache::fsd
