// Fixtures of the shared-tier tests: a real redis-server of this test's own (Unix
// socket in a temp dir, no TCP, no persistence), dbs filled through core, and the
// `kcache` binary run with a time limit so that a hang fails instead of blocking.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client.hpp"
#include "kcache/core/store.hpp"
#include "kcache/remote/remote.hpp"
#include "run_program.hpp"
#include "temp_dir.hpp"

namespace kcache::test {

// Starts redis-server, or skips the test (exit 77) with a message when it is absent.
class RedisServer {
  public:
    explicit RedisServer(std::vector<std::string> extra_args = {});
    ~RedisServer();
    RedisServer(const RedisServer&) = delete;
    RedisServer& operator=(const RedisServer&) = delete;

    std::string url() const { return "unix:" + m_socket; }
    remote::Endpoint endpoint(const std::string& user = {}) const;
    pid_t pid() const { return m_pid; }
    void signal(int sig);  // SIGSTOP, SIGCONT, SIGKILL (then reaped)
    // One command as the default user; REQUIREs that it got a reply.
    remote::Reply command(const remote::Command& args);
    // "calls" of one command in INFO commandstats (0 when never called).
    std::uint64_t calls(const std::string& command);

  private:
    TempDir m_dir;
    std::string m_socket;
    pid_t m_pid = -1;
    std::unique_ptr<remote::Connection> m_conn;
};

// Options of a client of `redis` that fails fast: 300 ms per command and to connect,
// its breaker open after one failure for 100 ms; namespace "t".
remote::Options fast_failing_options(const RedisServer& redis);

// A db in a temp dir, opened through core (with `clock` when given: the misses tests
// let entries settle without sleeping).
class TestDb {
  public:
    explicit TestDb(core::Clock clock = {});
    std::string path() const { return (m_dir / "db").string(); }
    core::Store& store();
    void close() { m_store.reset(); }
    // Creates a regular file (and every directory above it) with `content`.
    void put(const std::string& path, const std::string& content, std::uint32_t mode = 0644);
    void symlink(const std::string& path, const std::string& target);
    // Every node of the entry: path -> "type mode" + content or link target.
    std::map<std::string, std::string> snapshot(const std::string& entry);
    bool has_entry(const std::string& entry);
    std::uint64_t counter(core::Counter c);
    std::uint64_t entries();

  private:
    TempDir m_dir;
    core::Clock m_clock;
    std::unique_ptr<core::Store> m_store;
};

using RunResult = ProgramResult;
// `kcache ARGS...`, killed after `limit_s` (a guard against hangs, not a timing check).
RunResult run_cli(const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& env = {}, int limit_s = 60);

std::string random_bytes(std::size_t n, std::uint32_t seed);

}  // namespace kcache::test
