// EventCursor (events.hpp): following the events log with gap detection.
#include "kcache/core/events.hpp"

#include "store_impl.hpp"

namespace kcache::core {

Result<EventCursor> EventCursor::at_end(const Txn& txn) {
    const Tx tx = TxnAccess::tx(txn);
    auto next = KCACHE_TRY(tx.get(tx.db.meta, kMetaNextEvent));
    if (!next) return EventCursor(0);  // nothing was ever logged
    const auto seq = KCACHE_TRY(records::decode_u64(*next, "meta next_event"));
    return EventCursor(seq == 0 ? 0 : seq - 1);
}

Result<std::uint64_t> EventCursor::read(const Txn& txn,
                                        const std::function<bool(const Event&)>& fn) {
    std::uint64_t lost = 0;
    bool first = true;
    KCACHE_TRY(txn.for_each_event(m_seq, [&](const Event& event) {
        if (first && m_seq != 0 && event.seq > m_seq + 1) lost = event.seq - m_seq - 1;
        first = false;
        if (!fn(event)) return false;
        m_seq = event.seq;
        return true;
    }));
    return lost;
}

}  // namespace kcache::core
