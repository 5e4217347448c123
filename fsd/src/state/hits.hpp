// Hit counting in kcache-fsd (docs/stats.md): an open for reading of an entry's file
// by a process other than the one that populated it (and not of its compile) counts
// one hit per (entry, process).
//
// The pairs counted are remembered twice: in this daemon's memory (m_seen, with the
// (entry, thread) pairs that spare most opens a read of /proc; bounded: after
// kMaxSeenPairs it is cleared) and in the state memfd (HitPairs, state.hpp), which the
// keeper passes to the next daemon, so that a takeover after a crash or an upgrade
// does not count every reader's hit again. A pair the memfd's set has no room for
// counts once per daemon, as before. A hit recorded in the set but not yet flushed
// when its daemon is killed is lost (hits stay at most the pairs that read).
//
// Contract: count_open never fails and never blocks on the kernel; it reads /proc
// (process.hpp) outside its lock. Locks (lock_order.hpp): m_mutex, a leaf (level 8);
// HitPairs takes none.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_set>

#include "counters.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

// A set of (entry, process) pairs in `count` shared 64-bit slots (0: free), lock-free:
// open addressing, a pair claimed with one compare-and-swap, so the daemons of one
// mount (an upgrade's old one finishing beside its successor) may insert at once.
// A key is entry << 22 | pid (a pid is below 2^22, Linux's PID_MAX_LIMIT); an entry
// of 2^42 or more is not kept (insert() answers full).
class HitPairs {
  public:
    enum class Insert { added, known, full };
    HitPairs(std::atomic<std::uint64_t>* slots, std::size_t count)
        : m_slots(slots), m_count(count) {}
    Insert insert(core::Ino entry, std::uint32_t pid);

  private:
    static constexpr std::size_t kMaxProbes = 128;
    std::atomic<std::uint64_t>* m_slots;
    std::size_t m_count;  // a power of two
};

class HitCounter {
  public:
    explicit HitCounter(Counters& counters) : m_counters(counters) {}

    // The set of pairs counted by this mount's daemons (state.hpp); set before serving.
    void remember_in(HitPairs pairs) { m_pairs = pairs; }

    // An open by thread `tid` of the file `attr` (read in `txn`): counts the open,
    // and the hit if it is one.
    void count_open(pid_t tid, const core::ReadTxn& txn, const core::Attr& attr);

  private:
    static constexpr std::size_t kMaxSeenPairs = 1 << 20;
    Counters& m_counters;
    HitPairs m_pairs{nullptr, 0};
    Mutex m_mutex KCACHE_LEVEL(8);  // a leaf
    // (entry, thread) and (entry, process) pairs that counted.
    std::unordered_set<std::string> m_seen GUARDED_BY(m_mutex);
};

}  // namespace kcache::fsd
