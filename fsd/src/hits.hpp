// Hit counting in kcache-fsd (docs/stats.md): an open for reading of an entry's file
// by a process other than the one that populated it (and not of its compile) counts
// one hit per (entry, process). The pairs counted are remembered, bounded (after
// kMaxSeenPairs a pair may count again).
//
// Contract: count_open never fails and never blocks on the kernel; it reads /proc
// (process.hpp) outside its lock. Locks (lock_order.hpp): m_mutex, a leaf (level 9).
#pragma once

#include <sys/types.h>

#include <string>
#include <unordered_set>

#include "background.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class HitCounter {
  public:
    explicit HitCounter(Background& background) : m_background(background) {}

    // An open by thread `tid` of the file `attr` (read in `txn`): counts the open,
    // and the hit if it is one.
    void count_open(pid_t tid, const core::ReadTxn& txn, const core::Attr& attr);

  private:
    static constexpr std::size_t kMaxSeenPairs = 1 << 20;
    Background& m_background;
    Mutex m_mutex KCACHE_LEVEL(9);  // a leaf
    // (entry, thread) and (entry, process) pairs that counted.
    std::unordered_set<std::string> m_seen GUARDED_BY(m_mutex);
};

}  // namespace kcache::fsd
