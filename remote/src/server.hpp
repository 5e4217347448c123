// A Remote's view of one server (internal to kcache_remote).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

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

}  // namespace kcache::remote
