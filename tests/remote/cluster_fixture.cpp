#include "cluster_fixture.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "cluster.hpp"
#include "run_program.hpp"
#include "skip.hpp"
#include "tls.hpp"
#include "tls_fixture.hpp"

namespace kcache::test {

namespace {

std::string find_program(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path ? path : "/usr/bin:/usr/sbin");
    for (std::string dir; std::getline(dirs, dir, ':');) {
        const std::string candidate = dir + "/" + name;
        if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return {};
}

// Whether 127.0.0.1:port can be bound now (a hint: another program may take it later).
bool port_free(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

remote::Endpoint endpoint(std::uint16_t port, bool tls) {
    remote::Endpoint e;
    e.host = "127.0.0.1";
    e.port = port;
    e.tls = tls;
    return e;
}

}  // namespace

core::Result<remote::Reply> RedisCluster::try_command(std::uint16_t port,
                                                      const remote::Command& args) {
    const std::int64_t deadline = remote::steady_ns() + 2'000'000'000;
    auto conn = KCACHE_TRY(
        remote::Connection::open(endpoint(port, m_tls != nullptr), {}, deadline, m_tls.get()));
    auto replies = KCACHE_TRY(conn->exec({args}, deadline));
    return replies.front();
}

RedisCluster::RedisCluster(const TlsCerts* tls) {
    const std::string server = find_program("redis-server");
    const std::string cli = find_program("redis-cli");
    if (server.empty() || cli.empty())
        skip("redis-server or redis-cli is not installed (scripts/setup.sh installs them)");
    // Six ports whose cluster bus ports (+10000) are free too, from a random start so
    // that tests running side by side rarely collide.
    std::mt19937 gen(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(std::time(nullptr)));
    for (std::uint16_t p = static_cast<std::uint16_t>(20000 + gen() % 20000);
         m_ports.size() < 6 && p < 45000; ++p) {
        if (port_free(p) && port_free(static_cast<std::uint16_t>(p + 10000))) m_ports.push_back(p);
    }
    REQUIRE(m_ports.size() == 6);
    if (tls) {
        auto context = remote::TlsContext::create(tls->options(true));
        INFO((context ? std::string() : context.error().message));
        REQUIRE(context.has_value());
        m_tls = std::move(*context);
    }
    for (const std::uint16_t port : m_ports) {
        const std::filesystem::path dir = m_dir / std::to_string(port);
        std::filesystem::create_directories(dir);
        std::vector<std::string> args = {server,
                                         "--port",
                                         std::to_string(port),
                                         "--bind",
                                         "127.0.0.1",
                                         "--cluster-enabled",
                                         "yes",
                                         "--cluster-config-file",
                                         (dir / "nodes.conf").string(),
                                         "--cluster-node-timeout",
                                         "1000",
                                         "--save",
                                         "",
                                         "--appendonly",
                                         "no",
                                         "--dir",
                                         dir.string(),
                                         "--logfile",
                                         (dir / "redis.log").string(),
                                         "--daemonize",
                                         "no"};
        if (tls) {
            // TLS only: the port above moves to tls-port; the cluster bus (port + 10000)
            // and replication are TLS too, the nodes authenticated by their certificates.
            args[1] = "--tls-port";
            args.insert(args.end(), {"--port", "0", "--tls-cluster", "yes", "--tls-replication",
                                     "yes", "--tls-cert-file", tls->path("server.pem"),
                                     "--tls-key-file", tls->path("server.key"),
                                     "--tls-ca-cert-file", tls->ca(), "--tls-auth-clients", "no"});
        }
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        const pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            const int null = open("/dev/null", O_RDWR);
            dup2(null, STDIN_FILENO);
            dup2(null, STDOUT_FILENO);
            execv(argv[0], argv.data());
            _exit(127);
        }
        m_pids[port] = pid;
    }
    for (const std::uint16_t port : m_ports) {
        bool up = false;
        for (int i = 0; i < 250 && !up; ++i) {
            auto pong = try_command(port, {"PING"});
            up = pong && pong->str == "PONG";
            if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        INFO("a node did not start: " << logs());
        REQUIRE(up);
    }
    std::vector<std::string> create = {cli, "--cluster", "create"};
    for (const std::uint16_t port : m_ports) create.push_back("127.0.0.1:" + std::to_string(port));
    create.insert(create.end(), {"--cluster-replicas", "1", "--cluster-yes"});
    if (tls) create.insert(create.end(), {"--tls", "--cacert", tls->ca()});
    const ProgramResult made = run_program(create, {}, {}, 60);
    INFO(made.out << made.err << logs());
    REQUIRE(made.exit_code == 0);
    wait_stable();
}

RedisCluster::~RedisCluster() = default;

RedisCluster::Nodes::~Nodes() {
    for (const auto& [port, pid] : *this) ::kill(pid, SIGKILL);
    for (const auto& [port, pid] : *this) waitpid(pid, nullptr, 0);
}

std::string RedisCluster::url() const {
    return (m_tls ? "rediss-cluster://127.0.0.1:" : "redis-cluster://127.0.0.1:") +
           std::to_string(m_ports.front());
}

remote::Reply RedisCluster::command(std::uint16_t port, const remote::Command& args) {
    auto r = try_command(port, args);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    return *r;
}

std::vector<std::uint16_t> RedisCluster::masters() {
    for (const auto& [port, pid] : m_pids) {
        auto slots = try_command(port, {"CLUSTER", "SLOTS"});
        if (!slots) continue;
        auto ranges = remote::cluster::parse_slots(*slots, "127.0.0.1");
        if (!ranges) continue;
        std::set<std::uint16_t> out;
        for (const auto& r : *ranges) out.insert(r.port);
        return {out.begin(), out.end()};
    }
    FAIL("no node answers CLUSTER SLOTS");
    return {};
}

std::uint16_t RedisCluster::master_of(const std::string& key) {
    const std::uint16_t slot = remote::cluster::key_slot(key);
    for (const auto& [port, pid] : m_pids) {
        auto slots = try_command(port, {"CLUSTER", "SLOTS"});
        if (!slots) continue;
        auto ranges = remote::cluster::parse_slots(*slots, "127.0.0.1");
        if (!ranges) continue;
        for (const auto& r : *ranges) {
            if (r.first <= slot && slot <= r.last) return r.port;
        }
    }
    FAIL("no node knows the master of slot " << slot);
    return 0;
}

void RedisCluster::wait_replicated() {
    for (const std::uint16_t m : masters()) {
        bool acked = false;
        // A replica acknowledges once a second; WAIT's own bound stays under our deadline.
        for (int i = 0; i < 20 && !acked; ++i)
            acked = command(m, {"WAIT", "1", "1000"}).integer >= 1;
        INFO("master " << m << " has no replica that caught up: " << logs());
        REQUIRE(acked);
    }
}

void RedisCluster::kill(std::uint16_t port) {
    const auto it = m_pids.find(port);
    REQUIRE(it != m_pids.end());
    ::kill(it->second, SIGKILL);
    waitpid(it->second, nullptr, 0);
    m_pids.erase(it);
}

void RedisCluster::wait_stable(int limit_s) {
    const auto stable = [&] {
        for (const auto& [port, pid] : m_pids) {
            auto info = try_command(port, {"CLUSTER", "INFO"});
            if (!info || info->str.find("cluster_state:ok") == std::string::npos) return false;
            auto slots = try_command(port, {"CLUSTER", "SLOTS"});
            if (!slots) return false;
            auto ranges = remote::cluster::parse_slots(*slots, "127.0.0.1");
            if (!ranges) return false;
            std::uint32_t covered = 0;
            for (const auto& r : *ranges) {
                if (!m_pids.count(r.port)) return false;  // a dead master still named
                covered += r.last - r.first + 1u;
            }
            if (covered != remote::cluster::kSlots) return false;
        }
        return true;
    };
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
    bool ok = stable();
    while (!ok && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        ok = stable();
    }
    INFO("the cluster did not settle: " << logs());
    REQUIRE(ok);
}

std::string RedisCluster::logs() const {
    std::string out;
    for (const std::uint16_t port : m_ports) {
        out += "--- node " + std::to_string(port) + "\n";
        std::ifstream in(m_dir / std::to_string(port) / "redis.log");
        out += std::string(std::istreambuf_iterator<char>(in), {});
    }
    return out;
}

}  // namespace kcache::test
