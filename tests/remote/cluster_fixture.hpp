// A real Redis Cluster of the test's own on loopback: 3 masters and 3 replicas
// (redis-server in cluster mode on free ports, joined by `redis-cli --cluster create`),
// in a temp dir, no persistence, a node timeout of 1 s so that a killed master's replica
// is promoted within a few seconds. Skips the test (exit 77) with a message without
// redis-server or redis-cli. With TlsCerts (tls_fixture.hpp), every node serves TLS only
// (tls-port, tls-cluster, tls-replication): clients, the cluster bus and replication.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client.hpp"
#include "temp_dir.hpp"

namespace kcache::remote {
class TlsContext;
}

namespace kcache::test {

class TlsCerts;

class RedisCluster {
  public:
    // `tls`: TLS everywhere with these certificates (they must outlive the cluster).
    explicit RedisCluster(const TlsCerts* tls = nullptr);
    ~RedisCluster();
    RedisCluster(const RedisCluster&) = delete;
    RedisCluster& operator=(const RedisCluster&) = delete;

    // redis-cluster://127.0.0.1:<first node> (rediss-cluster:// with TLS): one seed;
    // kcache discovers the rest.
    std::string url() const;
    const std::vector<std::uint16_t>& ports() const { return m_ports; }
    // One command to one node; REQUIREs a reply within 5 s.
    remote::Reply command(std::uint16_t port, const remote::Command& args);
    // The master serving `key`'s slot now, as a live node's CLUSTER SLOTS says.
    std::uint16_t master_of(const std::string& key);
    // The masters serving slots now.
    std::vector<std::uint16_t> masters();
    // Until every master's writes so far reached its replica (WAIT; REQUIREd: a hang guard).
    void wait_replicated();
    void kill(std::uint16_t port);  // SIGKILL, reaped
    // The node's process (for a kill(2) from another thread; kill() reaps it after).
    pid_t pid(std::uint16_t port) const { return m_pids.at(port); }
    bool alive(std::uint16_t port) const { return m_pids.count(port) > 0; }
    // Until every live node reports cluster_state:ok and a slot map covering all slots
    // with live masters only (REQUIREd within `limit_s`: a hang guard).
    void wait_stable(int limit_s = 30);
    std::string logs() const;  // every node's log, for failures

  private:
    // Kills and reaps the nodes left, also when the constructor failed half way (then
    // ~RedisCluster does not run), before m_dir is removed.
    struct Nodes : std::map<std::uint16_t, pid_t> {
        Nodes() = default;
        Nodes(const Nodes&) = delete;
        Nodes& operator=(const Nodes&) = delete;
        ~Nodes();
    };
    // One command, or the error (a dead node, a node still starting).
    core::Result<remote::Reply> try_command(std::uint16_t port, const remote::Command& args);
    TempDir m_dir;
    std::shared_ptr<const remote::TlsContext> m_tls;  // null: plaintext
    std::vector<std::uint16_t> m_ports;
    Nodes m_pids;
};

}  // namespace kcache::test
