#include "counters.hpp"

#include <cerrno>

namespace kcache::fsd {
namespace {

constexpr int find_slot(core::Counter c) {
    for (int i = 0; i < Counters::kSlots; ++i) {
        if (Counters::kCounted[static_cast<std::size_t>(i)] == c) return i;
    }
    return -1;
}
constexpr int kOtherSlot = find_slot(core::Counter::errors_other);
static_assert(kOtherSlot >= 0, "the daemon counts errors_other (core/statistics.hpp)");

// A counter the table does not give the daemon counts as errors_other.
int slot_of(core::Counter c) {
    const int slot = find_slot(c);
    return slot >= 0 ? slot : kOtherSlot;
}

}  // namespace

void Counters::count(core::Counter counter, std::uint64_t n) {
    m_counts[slot_of(counter)].fetch_add(n, std::memory_order_relaxed);
}

void Counters::hit(core::Ino entry) {
    MutexLock lock(m_mutex);
    m_hits.push_back(entry);
}

core::Status Counters::flush() {
    std::uint64_t counts[kSlots];
    for (int i = 0; i < kSlots; ++i) counts[i] = m_counts[i].exchange(0);
    std::vector<core::Ino> hits;
    {
        MutexLock lock(m_mutex);
        hits.swap(m_hits);
    }
    bool any = !hits.empty();
    for (auto c : counts) any = any || c;
    if (!any || m_store.read_only()) return {};  // read-only service keeps no statistics
    auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
        for (int i = 0; i < kSlots; ++i) {
            if (auto a = txn.add(kCounted[static_cast<std::size_t>(i)], counts[i]); !a) return a;
        }
        for (core::Ino entry : hits) {
            auto h = txn.record_hit(entry);
            if (h) continue;
            if (h.error().code != ENOENT) return h;
            // Evicted since: the process did load it from the cache; only the entry's
            // own record is gone.
            if (auto a = txn.add(core::Counter::hits, 1); !a) return a;
        }
        return {};
    });
    if (!s) {  // keep them for the next try
        for (int i = 0; i < kSlots; ++i) m_counts[i].fetch_add(counts[i]);
        MutexLock lock(m_mutex);
        m_hits.insert(m_hits.end(), hits.begin(), hits.end());
    }
    return s;
}

}  // namespace kcache::fsd
