// The Redis pool: its servers, sharding and the circuit breaker of each server. A Redis
// Cluster's routing is in routing.cpp.
#include "redis_pool.hpp"

#include <algorithm>
#include <cerrno>

#include <fmt/core.h>

#include "cluster.hpp"
#include "tls.hpp"

namespace kcache::remote {

namespace {

constexpr std::int64_t kMaxCooldownNs = 60'000'000'000;

}  // namespace

RedisPool::RedisPool(const Options& options, AtomicCounts& counts)
    : m_options(options), m_counts(counts) {}
RedisPool::~RedisPool() = default;

Result<std::unique_ptr<RedisPool>> RedisPool::create(const Options& options, AtomicCounts& counts) {
    std::unique_ptr<RedisPool> pool(new RedisPool(options, counts));
    for (const Endpoint& e : options.servers) {
        auto server = std::make_unique<Server>();
        server->endpoint = e;
        server->id = e.id();
        {
            MutexLock lock(server->mutex);
            server->cooldown = options.breaker_cooldown_ns;
        }
        for (const auto& other : pool->unshared_servers()) {
            if (other->id == server->id)
                return core::fail(EINVAL, fmt::format("remote {} is given twice", server->id));
        }
        pool->unshared_servers().push_back(std::move(server));
    }
    // One TLS context for every rediss:// connection: its files are read now, so that a
    // bad one stops start-up instead of failing every connect.
    const auto& servers = options.servers;
    if (std::any_of(servers.begin(), servers.end(), [](const Endpoint& e) { return e.tls; }))
        pool->m_tls = KCACHE_TRY(TlsContext::create(options.tls));
    if (options.cluster) {
        pool->m_cluster = std::make_unique<Cluster>(cluster::kSlots);
    }
    return pool;
}

Shard& RedisPool::shard(std::string_view key) {
    if (m_cluster) return route(key);
    const auto& servers = unshared_servers();  // plain: fixed since create()
    Server* best = servers.front().get();
    if (servers.size() == 1) return *best;
    std::uint64_t best_score = 0;
    const std::string_view tag = cluster::hash_tag(key);
    for (const auto& s : servers) {
        std::string probe = s->id;
        probe.push_back('\n');
        probe.append(tag);
        const std::uint64_t score = core::digest_of(probe).low;
        if (score >= best_score) {
            best_score = score;
            best = s.get();
        }
    }
    return *best;
}

Result<std::vector<Reply>> RedisPool::exec(Shard& shard, const std::vector<Command>& commands) {
    auto& server = static_cast<Server&>(shard);  // every shard of this pool is a Server
    auto replies = KCACHE_TRY(exec_once(server, commands));
    if (!m_cluster) return replies;
    return follow_redirects(server, commands, std::move(replies));
}

Result<std::vector<Reply>> RedisPool::exec_once(Server& server,
                                                const std::vector<Command>& commands) {
    MutexLock lock(server.mutex);
    std::int64_t now = steady_ns();
    if (server.breaker == Server::Breaker::open) {
        if (now < server.open_until) {
            m_counts.errors.fetch_add(1);
            return core::fail(
                EAGAIN,
                fmt::format("redis {}: circuit open after {} failures (retry in {} ms)", server.id,
                            server.failures, (server.open_until - now + 999'999) / 1'000'000));
        }
        server.breaker = Server::Breaker::half_open;  // this operation is the trial
    }
    auto failed = [&](core::Error e) -> tl::unexpected<core::Error> {
        server.mutex.assert_held();                    // the lambda runs under `lock`
        server.connection.reset();                     // replies may be pending: never reuse it
        if (m_cluster) m_cluster->wanted.store(true);  // a failover may have begun
        (e.code == ETIMEDOUT ? m_counts.timeouts : m_counts.errors).fetch_add(1);
        ++server.failures;
        if (server.breaker == Server::Breaker::half_open ||
            server.failures >= m_options.breaker_threshold) {
            server.breaker = Server::Breaker::open;
            server.open_until = steady_ns() + server.cooldown;
            e.message += fmt::format(" (circuit opened for {} ms)", server.cooldown / 1'000'000);
            server.cooldown = std::min(server.cooldown * 2, kMaxCooldownNs);
        }
        return tl::unexpected(std::move(e));
    };
    if (!server.connection) {
        auto conn = Connection::open(server.endpoint, m_options.password,
                                     now + m_options.connect_timeout_ns, m_tls.get());
        if (!conn) return failed(std::move(conn.error()));
        server.connection = std::move(*conn);
        now = steady_ns();
    }
    std::uint64_t sent = 0;
    std::uint64_t received = 0;
    auto replies =
        server.connection->exec(commands, now + m_options.op_timeout_ns, &sent, &received);
    if (!replies) return failed(std::move(replies.error()));
    m_counts.bytes_up.fetch_add(sent);
    m_counts.bytes_down.fetch_add(received);
    server.failures = 0;
    server.breaker = Server::Breaker::closed;
    server.cooldown = m_options.breaker_cooldown_ns;
    for (const Reply& r : *replies) {
        if (r.is_error() && r.str.starts_with("OOM"))
            server.uploads_paused_until = steady_ns() + m_options.oom_pause_ns;
    }
    return replies;
}

bool RedisPool::uploads_paused(Shard& shard) {
    auto& server = static_cast<Server&>(shard);
    MutexLock lock(server.mutex);
    return steady_ns() < server.uploads_paused_until;
}

std::vector<Shard*> RedisPool::serving() {
    std::vector<Shard*> out;
    for (Server* s : serving_servers()) out.push_back(s);
    return out;
}

std::size_t RedisPool::probe() {
    std::size_t tried = 0;
    for (Server* s : all_servers()) {
        {
            MutexLock lock(s->mutex);
            if (s->breaker != Server::Breaker::open || steady_ns() < s->open_until) continue;
        }
        ++tried;
        (void)exec(*s, {{"PING"}});  // the trial: closes the circuit or opens it again
    }
    return tried;
}

std::vector<ServerState> RedisPool::states() {
    std::vector<ServerState> out;
    const std::int64_t now = steady_ns();
    for (Server* s : serving_servers()) {
        MutexLock lock(s->mutex);
        ServerState st;
        st.id = s->id;
        st.breaker = s->breaker == Server::Breaker::closed      ? "closed"
                     : s->breaker == Server::Breaker::half_open ? "half-open"
                     : now < s->open_until                      ? "open"
                                                                : "half-open";
        st.uploads_paused = now < s->uploads_paused_until;
        st.failures = s->failures;
        out.push_back(std::move(st));
    }
    return out;
}

}  // namespace kcache::remote
