// A Remote's view of one server (internal to kcache_remote).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "client.hpp"
#include "kcache/remote/remote.hpp"

namespace kcache::remote {

// One server. `endpoint` and `id` are set once, before the Remote is shared; `mutex`
// guards every other member: the connection is used by one operation at a time, and
// the breaker and the OOM pause change only under it.
struct Remote::Server {
    enum class Breaker : std::uint8_t { closed, open, half_open };
    Endpoint endpoint;
    std::string id;
    std::mutex mutex;
    std::unique_ptr<Connection> connection;  // null until needed, and after a failure
    Breaker breaker = Breaker::closed;
    std::uint64_t failures = 0;   // consecutive
    std::int64_t open_until = 0;  // steady_ns
    std::int64_t cooldown = 0;    // the next time it opens
    std::int64_t uploads_paused_until = 0;
};

// A Redis Cluster's slot map. `mutex` guards `slots` and the Remote's m_servers (which
// only grows); `refresh` is held by the one thread reading the map from the cluster
// (others route by the map they have meanwhile). No server's mutex is ever taken while
// `mutex` is held.
struct Remote::Cluster {
    std::shared_mutex mutex;
    std::vector<Server*> slots;  // kSlots entries; null: unknown
    std::mutex refresh;
    std::atomic<bool> wanted{true};                 // the map is stale (or was never read)
    std::atomic<std::int64_t> next_refresh_ns{0};   // steady_ns: no read before this
    static constexpr std::size_t kMaxNodes = 1024;  // addresses a reply may add, at most
};

}  // namespace kcache::remote
