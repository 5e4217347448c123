// The shared tier's Backend on Redis (internal to kcache_remote): plain servers
// sharded by rendezvous hashing, or one Redis Cluster's masters by its slot map; a
// connection, a deadline and a circuit breaker per server (remote.hpp's contract).
// redis_pool.cpp: servers, sharding, the breaker; routing.cpp: a cluster's slot map
// and the MOVED / ASK redirections followed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "client.hpp"
#include "kcache/core/thread_annotations.hpp"
#include "kcache/remote/remote.hpp"

namespace kcache::remote {

class RedisPool final : public Backend {
  public:
    // The servers of `options` (a cluster's seeds), with its password, deadlines, breaker
    // and TLS settings; failures, timeouts and bytes are counted in `counts` (which must
    // outlive the pool). EINVAL for a server given twice; a TLS file that cannot be read.
    static Result<std::unique_ptr<RedisPool>> create(const Options& options, AtomicCounts& counts);
    ~RedisPool() override;
    RedisPool(const RedisPool&) = delete;
    RedisPool& operator=(const RedisPool&) = delete;

    // Plain servers: the highest rendezvous score of (server id, the key's hash tag). A
    // cluster: the master of the key's slot (the first seed while the slot is unknown;
    // its MOVED reply corrects that).
    Shard& shard(std::string_view key) override;
    // One pipeline on the server of its keys; in a cluster, MOVED and ASK replies are
    // followed to the node they name and their replies put in place. A failure of any
    // node it reached fails the whole pipeline.
    Result<std::vector<Reply>> exec(Shard& shard, const std::vector<Command>& commands) override;
    bool uploads_paused(Shard& shard) override;
    // Plain: all servers; a cluster: the masters of the slot map (read first if it never
    // was), or the first seed while none is known.
    std::vector<Shard*> serving() override;
    std::vector<ServerState> states() override;
    std::size_t probe() override;

    struct Server;  // a connection, its breaker and its mutex
    // A Redis Cluster's slot map (defined here, not below with Server: m_servers's
    // GUARDED_BY names its mutex). `mutex` guards `slots` and the pool's m_servers
    // (which only grows); `refresh` is held by the one thread reading the map from the
    // cluster (others route by the map they have meanwhile). No server's mutex is ever
    // taken while `mutex` is held.
    struct Cluster {
        explicit Cluster(std::size_t slot_count) : slots(slot_count, nullptr) {}
        SharedMutex mutex;
        std::vector<Server*> slots GUARDED_BY(mutex);   // kSlots entries; null: unknown
        Mutex refresh;                                  // guards no field: it is who reads the map
        std::atomic<bool> wanted{true};                 // the map is stale (or was never read)
        std::atomic<std::int64_t> next_refresh_ns{0};   // steady_ns: no read before this
        static constexpr std::size_t kMaxNodes = 1024;  // addresses a reply may add, at most
    };

  private:
    RedisPool(const Options& options, AtomicCounts& counts);
    // One pipeline on one server under the breaker and the deadline; counts failures,
    // timeouts and bytes, pauses uploads on an OOM reply.
    Result<std::vector<Reply>> exec_once(Server& server, const std::vector<Command>& commands);
    // Cluster (routing.cpp): the master of a slot; reads the slot map when it is
    // wanted and Remote::kRefreshNs has passed since the last read; the server of an
    // address (added on first sight); follows the redirections among `replies`.
    Server& route(std::string_view key);
    void refresh_slots();
    Server* node(const std::string& host, std::uint16_t port);
    Result<std::vector<Reply>> follow_redirects(Server& server,
                                                const std::vector<Command>& commands,
                                                std::vector<Reply> replies);
    // Every server known now (plain: the configured ones; cluster: seeds and nodes seen).
    std::vector<Server*> all_servers() const;
    std::vector<Server*> serving_servers();
    // m_servers without m_cluster's mutex, where nothing can change it: plain servers
    // (fixed once create() returns), and create() before the pool is shared. The
    // analysis cannot tell a plain pool from a cluster's; a cluster's reads lock.
    std::vector<std::unique_ptr<Server>>& unshared_servers() NO_THREAD_SAFETY_ANALYSIS {
        return m_servers;
    }
    const std::vector<std::unique_ptr<Server>>& unshared_servers() const NO_THREAD_SAFETY_ANALYSIS {
        return m_servers;
    }

    const Options& m_options;  // the Remote's, which outlives the pool
    AtomicCounts& m_counts;
    // Plain servers: fixed once create() returns (unshared_servers()). A cluster appends
    // the nodes it discovers under m_cluster's mutex (never removes one: a Server& stays
    // valid).
    std::vector<std::unique_ptr<Server>> m_servers GUARDED_BY(m_cluster->mutex);
    std::unique_ptr<Cluster> m_cluster;  // null for plain servers
    // Set once by create() when a server is rediss:// (null otherwise); read-only after,
    // shared by every connection (OpenSSL's SSL_CTX is safe to share once set up).
    std::shared_ptr<const TlsContext> m_tls;
};

// One server. `endpoint` and `id` are set once, before the pool is shared; `mutex`
// guards every other member: the connection is used by one operation at a time, and
// the breaker and the OOM pause change only under it.
struct RedisPool::Server : Shard {
    enum class Breaker : std::uint8_t { closed, open, half_open };
    Endpoint endpoint;
    Mutex mutex;
    // null until needed, and after a failure
    std::unique_ptr<Connection> connection GUARDED_BY(mutex);
    Breaker breaker GUARDED_BY(mutex) = Breaker::closed;
    std::uint64_t failures GUARDED_BY(mutex) = 0;   // consecutive
    std::int64_t open_until GUARDED_BY(mutex) = 0;  // steady_ns
    std::int64_t cooldown GUARDED_BY(mutex) = 0;    // the next time it opens
    std::int64_t uploads_paused_until GUARDED_BY(mutex) = 0;
};

}  // namespace kcache::remote
