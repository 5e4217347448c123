#include "redis_fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "skip.hpp"

#ifndef KCACHE_CLI_PATH
#error "KCACHE_CLI_PATH must name the kcache binary"
#endif

namespace kcache::test {

namespace {

std::string find_redis_server() {
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path ? path : "/usr/bin:/usr/sbin");
    for (std::string dir; std::getline(dirs, dir, ':');) {
        const std::string candidate = dir + "/redis-server";
        if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return {};
}

template <class T>
T ok(core::Result<T> r) {
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    return std::move(*r);
}
void ok(const core::Status& s) {
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s.has_value());
}

}  // namespace

RedisServer::RedisServer(std::vector<std::string> extra_args) {
    const std::string server = find_redis_server();
    if (server.empty()) skip("redis-server is not installed (scripts/setup.sh installs it)");
    m_socket = (m_dir / "redis.sock").string();
    std::vector<std::string> args = {server,         "--port",    "0",
                                     "--unixsocket", m_socket,    "--unixsocketperm",
                                     "700",          "--save",    "",
                                     "--appendonly", "no",        "--dir",
                                     m_dir.str(),    "--logfile", (m_dir / "redis.log").string(),
                                     "--daemonize",  "no"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    m_pid = fork();
    REQUIRE(m_pid >= 0);
    if (m_pid == 0) {
        const int null = open("/dev/null", O_RDWR);
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        execv(argv[0], argv.data());
        _exit(127);
    }
    // Ready once it answers PING on its socket.
    remote::Endpoint e = endpoint();
    for (int i = 0; i < 500 && !m_conn; ++i) {
        auto conn = remote::Connection::open(e, {}, remote::steady_ns() + 1'000'000'000);
        if (conn) {
            auto pong = (*conn)->exec({{"PING"}}, remote::steady_ns() + 1'000'000'000);
            if (pong && pong->front().str == "PONG") m_conn = std::move(*conn);
        }
        if (!m_conn) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    INFO("redis-server did not start; its log: " << read_file(m_dir / "redis.log"));
    REQUIRE(m_conn);
}

RedisServer::~RedisServer() {
    if (m_pid > 0) {
        kill(m_pid, SIGCONT);
        kill(m_pid, SIGKILL);
        waitpid(m_pid, nullptr, 0);
    }
}

remote::Endpoint RedisServer::endpoint(const std::string& user) const {
    remote::Endpoint e;
    e.unix_socket = true;
    e.path = m_socket;
    e.user = user;
    return e;
}

void RedisServer::signal(int sig) {
    REQUIRE(m_pid > 0);
    REQUIRE(kill(m_pid, sig) == 0);
    if (sig == SIGKILL) {
        waitpid(m_pid, nullptr, 0);
        m_pid = -1;
    }
    if (sig != SIGCONT) m_conn.reset();
}

remote::Reply RedisServer::command(const remote::Command& args) {
    if (!m_conn)
        m_conn = ok(remote::Connection::open(endpoint(), {}, remote::steady_ns() + 5'000'000'000));
    auto r = m_conn->exec({args}, remote::steady_ns() + 5'000'000'000);
    if (!r) m_conn.reset();
    return ok(std::move(r)).front();
}

std::uint64_t RedisServer::calls(const std::string& command) {
    const std::string info = this->command({"INFO", "commandstats"}).str;
    const std::string key = "cmdstat_" + command + ":calls=";
    const auto at = info.find(key);
    if (at == std::string::npos) return 0;
    return std::stoull(info.substr(at + key.size()));
}

TestDb::TestDb(core::Clock clock) : m_clock(std::move(clock)) {}

core::Store& TestDb::store() {
    if (!m_store) {
        core::OpenOptions options;
        options.path = path();
        options.clock = m_clock;
        m_store = ok(core::Store::open(options));
    }
    return *m_store;
}

namespace {

core::Ino make_parents(core::WriteTxn& txn, const std::string& path, std::string& leaf) {
    core::Ino dir = core::kRootIno;
    std::string rest = path;
    for (auto slash = rest.find('/'); slash != std::string::npos; slash = rest.find('/')) {
        const std::string part = rest.substr(0, slash);
        auto existing = txn.lookup(dir, part);
        dir = existing ? existing->ino : ok(txn.mkdir(dir, part, 0755)).ino;
        rest = rest.substr(slash + 1);
    }
    leaf = rest;
    return dir;
}

}  // namespace

void TestDb::put(const std::string& path, const std::string& content, std::uint32_t mode) {
    auto txn = ok(store().write());
    std::string leaf;
    const core::Ino dir = make_parents(txn, path, leaf);
    const core::Attr file = ok(txn.create(dir, leaf, mode));
    ok(txn.write(file.ino, content, core::Origin{4242, "remote-test"}));
    ok(txn.commit());
}

void TestDb::symlink(const std::string& path, const std::string& target) {
    auto txn = ok(store().write());
    std::string leaf;
    const core::Ino dir = make_parents(txn, path, leaf);
    ok(txn.symlink(dir, leaf, target));
    ok(txn.commit());
}

std::map<std::string, std::string> TestDb::snapshot(const std::string& entry) {
    auto txn = ok(store().read());
    const core::EntryInfo info = ok(txn.find_entry(entry));
    std::map<std::string, std::string> out;
    ok(txn.for_each_entry_file(info, [&](const core::EntryFile& f) {
        std::string v = std::to_string(static_cast<int>(f.attr.type())) + " " +
                        std::to_string(f.attr.mode) + " ";
        if (f.attr.is_regular()) v += std::string(ok(txn.read(f.attr.ino)).bytes());
        if (f.attr.is_symlink()) v += f.link_target;
        out[f.path] = v;
        return true;
    }));
    return out;
}

bool TestDb::has_entry(const std::string& entry) {
    auto txn = ok(store().read());
    auto e = txn.find_entry(entry);
    return e.has_value() && e->files > 0;
}

std::uint64_t TestDb::counter(core::Counter c) {
    return ok(ok(store().read()).counter(c));
}

std::uint64_t TestDb::entries() {
    return counter(core::Counter::entries);
}

RunResult run_cli(const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& env, int limit_s) {
    std::vector<std::string> argv{KCACHE_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(argv, env, {"KCACHE_DB", "KCACHE_REMOTE", "KCACHE_REMOTE_PASSWORD"},
                       limit_s);
}

std::string random_bytes(std::size_t n, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(gen() & 0xff);
    return bytes;
}

remote::Options fast_failing_options(const RedisServer& redis) {
    remote::Options o;
    o.servers.push_back(redis.endpoint());
    o.ns = "t";
    o.op_timeout_ns = 300'000'000;
    o.connect_timeout_ns = 300'000'000;
    o.breaker_threshold = 1;
    o.breaker_cooldown_ns = 100'000'000;
    return o;
}

}  // namespace kcache::test
