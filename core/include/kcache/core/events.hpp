// Following the events log (types.hpp: Event) from one read to the next, and knowing
// when events were lost in between: the log keeps Config::max_events, so a follower
// that reads too seldom finds its position trimmed away.
//
// Sequence numbers are contiguous (an event takes the next one in the transaction that
// logs it), so a follower at sequence S whose next event is not S + 1 lost the events
// between. A cursor at 0 (nothing seen yet) cannot tell: it reads what the log holds.
//
// Thread-safety: an EventCursor is a value; one thread at a time uses it. Failures:
// core's read errors (EIO for a record that does not decode). A failed read leaves
// the cursor after the last event its callback accepted.
#pragma once

#include <cstdint>
#include <functional>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

class EventCursor {
  public:
    // After event `seq` (0: before the first; reads everything the log holds).
    explicit EventCursor(std::uint64_t seq = 0) : m_seq(seq) {}
    // After the newest event logged by the time of `txn` (also when the log is empty
    // or trimmed): only what is logged later will be read.
    static Result<EventCursor> at_end(const Txn& txn);

    // Visits the events of `txn` after the cursor, oldest first, and moves the cursor
    // past each one `fn` accepts; `fn` returns false to stop before that event (the
    // cursor stays in front of it). Returns how many events were lost: trimmed from
    // the log after the cursor's position before this read reached them (0: none, or
    // the cursor was at 0). The events after a loss are still visited.
    Result<std::uint64_t> read(const Txn& txn, const std::function<bool(const Event&)>& fn);

    std::uint64_t seq() const { return m_seq; }  // the last event passed; 0: none

  private:
    std::uint64_t m_seq = 0;
};

}  // namespace kcache::core
