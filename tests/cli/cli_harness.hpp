// Harness for the CLI tests: runs the built `kcache` binary as a subprocess against a
// db in a temporary directory that the test fills through the core API.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kcache/core/store.hpp"
#include "run_program.hpp"
#include "temp_dir.hpp"

namespace kcache::test {

using CliResult = ProgramResult;

// Runs `kcache ARGS...` with stdin from /dev/null and stdout/stderr captured. KCACHE_DB
// is removed from its environment, then `env` is set.
CliResult run_kcache(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env = {});

// Files of one entry: path relative to the entry ("sub/x.ll") -> content.
using Files = std::vector<std::pair<std::string, std::string>>;

// A clock the test moves by hand, for entries with known ages.
struct ManualClock {
    std::shared_ptr<std::int64_t> now = std::make_shared<std::int64_t>(core::system_clock_ns());
    core::Clock clock() const {
        return [t = now] { return *t; };
    }
    void set(std::int64_t ns) { *now = ns; }
};

inline constexpr std::int64_t kSecondNs = 1'000'000'000;
inline constexpr std::int64_t kDayNs = 86'400 * kSecondNs;

// A db in a private temporary directory. The test opens it through the core API only
// between CLI runs (store() / close()); run() closes it first.
class CliDb {
  public:
    CliDb();
    const TempDir& dir() const { return m_dir; }
    std::string path() const { return (m_dir / "db").string(); }

    // The db opened through core (created if missing), with `clock` when given.
    core::Store& store(core::Clock clock = {});
    void close() { m_store.reset(); }

    // Creates entry `name` (a directory) with `files`, or a flat-file entry when
    // `files` holds one file with an empty path.
    core::Ino add_entry(const std::string& name, const Files& files);
    void record_hits(const std::string& name, int hits);

    // `kcache --db PATH ARGS...`
    CliResult run(std::vector<std::string> args);
    // Runs, requires exit 0, parses stdout as JSON.
    nlohmann::json json(std::vector<std::string> args);
    std::vector<std::string> ls_names(std::vector<std::string> args = {});

  private:
    TempDir m_dir;
    std::unique_ptr<core::Store> m_store;
};

// Bytes no compressor can shrink, from a fixed seed: stored size == raw size.
std::string random_bytes(std::size_t n, std::uint32_t seed);

}  // namespace kcache::test
