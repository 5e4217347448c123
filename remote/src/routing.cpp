// A Redis Cluster's routing: the slot map (CLUSTER SLOTS), the nodes it names, and the
// MOVED / ASK redirections followed. Plain servers never come here (RedisPool::shard and
// RedisPool::exec check). The parsers are in cluster.cpp.
#include <algorithm>
#include <map>

#include "client.hpp"
#include "cluster.hpp"
#include "kcache/remote/remote.hpp"
#include "redis_pool.hpp"

namespace kcache::remote {

namespace {

constexpr int kMaxRedirects = 5;  // hops of one command, then its last error reply stands

}  // namespace

std::vector<RedisPool::Server*> RedisPool::all_servers() const {
    std::vector<Server*> out;
    if (!m_cluster) {
        const auto& servers = unshared_servers();  // fixed since create()
        out.reserve(servers.size());
        for (const auto& s : servers) out.push_back(s.get());
        return out;
    }
    ReaderLock lock(m_cluster->mutex);
    out.reserve(m_servers.size());
    for (const auto& s : m_servers) out.push_back(s.get());
    return out;
}

std::vector<RedisPool::Server*> RedisPool::serving_servers() {
    if (!m_cluster) return all_servers();
    refresh_slots();  // read now if it never was
    std::vector<Server*> masters;
    {
        ReaderLock lock(m_cluster->mutex);
        for (Server* s : m_cluster->slots) {
            if (s && std::find(masters.begin(), masters.end(), s) == masters.end())
                masters.push_back(s);
        }
    }
    std::sort(masters.begin(), masters.end(),
              [](const Server* a, const Server* b) { return a->id < b->id; });
    if (!masters.empty()) return masters;
    ReaderLock lock(m_cluster->mutex);  // node() may be adding a node meanwhile
    return {m_servers.front().get()};
}

RedisPool::Server* RedisPool::node(const std::string& host, std::uint16_t port) {
    Endpoint e;
    e.host = host;
    e.port = port;
    e.user = m_options.servers.front().user;
    e.tls = m_options.servers.front().tls;  // rediss-cluster://: every node over TLS
    const std::string id = e.id();
    {
        ReaderLock lock(m_cluster->mutex);
        for (const auto& s : m_servers) {
            if (s->id == id) return s.get();
        }
    }
    WriterLock lock(m_cluster->mutex);
    for (const auto& s : m_servers) {
        if (s->id == id) return s.get();
    }
    if (m_servers.size() >= Cluster::kMaxNodes) return nullptr;
    auto server = std::make_unique<Server>();
    server->endpoint = std::move(e);
    server->id = id;
    {
        MutexLock init(server->mutex);
        server->cooldown = m_options.breaker_cooldown_ns;
    }
    m_servers.push_back(std::move(server));
    return m_servers.back().get();
}

void RedisPool::refresh_slots() {
    Cluster& c = *m_cluster;
    if (!c.wanted.load() || steady_ns() < c.next_refresh_ns.load()) return;
    if (!c.refresh.try_lock()) return;  // another thread reads it; route by the map we have
    MutexLock guard(c.refresh, std::adopt_lock);
    if (!c.wanted.load() || steady_ns() < c.next_refresh_ns.load()) return;
    c.next_refresh_ns.store(steady_ns() + Remote::kRefreshNs);
    // Ask the nodes whose circuit is closed first (masters, seeds and replicas alike:
    // any node knows the whole map), then those whose cool-down has passed.
    std::vector<Server*> candidates = all_servers();
    const std::int64_t now = steady_ns();
    std::stable_partition(candidates.begin(), candidates.end(), [](Server* s) {
        MutexLock lock(s->mutex);
        return s->breaker == Server::Breaker::closed;
    });
    for (Server* s : candidates) {
        {
            MutexLock lock(s->mutex);
            if (s->breaker == Server::Breaker::open && now < s->open_until) continue;
        }
        auto replies = exec_once(*s, {{"CLUSTER", "SLOTS"}});
        if (!replies) continue;
        auto ranges = cluster::parse_slots(replies->front(), s->endpoint.host);
        // A reply of the wrong shape, or a node that knows no master yet: ask the next.
        if (!ranges || ranges->empty()) continue;
        std::vector<Server*> slots(cluster::kSlots, nullptr);
        for (const cluster::SlotRange& r : *ranges) {
            Server* master = node(r.host, r.port);
            if (master == nullptr) continue;
            std::fill(slots.begin() + r.first, slots.begin() + r.last + 1, master);
        }
        {
            WriterLock lock(c.mutex);
            c.slots = std::move(slots);
        }
        c.wanted.store(false);
        return;
    }
}

RedisPool::Server& RedisPool::route(std::string_view key) {
    refresh_slots();
    const std::uint16_t slot = cluster::key_slot(key);
    ReaderLock lock(m_cluster->mutex);
    Server* s = m_cluster->slots.empty() ? nullptr : m_cluster->slots[slot];
    return s ? *s : *m_servers.front();
}

Result<std::vector<Reply>> RedisPool::follow_redirects(Server& server,
                                                       const std::vector<Command>& commands,
                                                       std::vector<Reply> replies) {
    // Where each command was last sent: its replies that redirect go on from there.
    std::vector<Server*> at(commands.size(), &server);
    for (int hop = 0; hop < kMaxRedirects; ++hop) {
        struct Pending {
            std::vector<std::size_t> moved, asked;  // indexes into commands
        };
        std::map<Server*, Pending> by_node;
        for (std::size_t i = 0; i < replies.size(); ++i) {
            const Reply& r = replies[i];
            if (!r.is_error()) continue;
            if (r.str.starts_with("CLUSTERDOWN")) m_cluster->wanted.store(true);
            auto redirect = cluster::parse_redirect(r.str, at[i]->endpoint.host);
            if (!redirect) continue;
            Server* target = node(redirect->host, redirect->port);
            if (target == nullptr) continue;  // too many addresses: the error stands
            if (!redirect->ask) {
                // The slot moved for good: route it there now, and read the whole map
                // again soon (a failover or a resharding moves many slots at once).
                WriterLock lock(m_cluster->mutex);
                if (!m_cluster->slots.empty()) m_cluster->slots[redirect->slot] = target;
                m_cluster->wanted.store(true);
            }
            (redirect->ask ? by_node[target].asked : by_node[target].moved).push_back(i);
            at[i] = target;
        }
        if (by_node.empty()) break;
        for (auto& [target, pending] : by_node) {
            // One pipeline per node: the moved commands, then each asked one after its
            // ASKING (whose +OK reply is dropped).
            std::vector<Command> batch;
            for (std::size_t i : pending.moved) batch.push_back(commands[i]);
            for (std::size_t i : pending.asked) {
                batch.push_back({"ASKING"});
                batch.push_back(commands[i]);
            }
            auto more = KCACHE_TRY(exec_once(*target, batch));
            std::size_t k = 0;
            for (std::size_t i : pending.moved) replies[i] = std::move(more[k++]);
            for (std::size_t i : pending.asked) {
                ++k;  // ASKING's reply
                replies[i] = std::move(more[k++]);
            }
        }
    }
    return replies;
}

}  // namespace kcache::remote
