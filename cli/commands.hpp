// What the `kcache` commands share: the parsed global options, how a command opens
// the store, how it fails, and small output helpers (tables, JSON, progress).
//
// Error contract: core reports failures as Result/Status. A command turns a failed
// result into a Failure with check(); main() prints "kcache: <message>" to stderr and
// exits 1 (kExitError). A UsageError (bad combination of arguments that CLI11 cannot
// express) exits 2 like CLI11's own parse errors. Exceptions never leave main().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // the command failed, or `verify` found damage
inline constexpr int kExitUsage = 2;  // the command line was wrong

// A command that could not do its work; main() prints the message and exits 1.
class Failure : public std::runtime_error {
  public:
    explicit Failure(const std::string& message) : std::runtime_error(message) {}
};

// A command line that parses but makes no sense; main() exits 2.
class UsageError : public std::runtime_error {
  public:
    explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

// Unwraps a core result, throwing Failure with the error's message (prefixed by
// `context` when given) if it failed.
[[noreturn]] void fail(const core::Error& error, std::string_view context = {});
inline void check(const core::Status& status, std::string_view context = {}) {
    if (!status) fail(status.error(), context);
}
template <class T>
T check(core::Result<T> result, std::string_view context = {}) {
    if (!result) fail(result.error(), context);
    return std::move(*result);
}

// State shared by every command: the global options and the command to run once
// CLI11 has parsed the whole command line.
struct Cli {
    std::string db_option;        // --db; empty: core::default_db_path()
    std::function<int()> action;  // set by the chosen subcommand's callback

    std::string db_path() const;
};

// Registers `run` as what `sub` does when it is chosen. `opts` holds its options and
// lives as long as the callbacks do.
template <class Options>
void on_run(CLI::App* sub, Cli& cli, std::shared_ptr<Options> opts,
            int (*run)(const Cli&, const Options&)) {
    sub->callback(
        [&cli, opts, run] { cli.action = [&cli, opts, run] { return run(cli, *opts); }; });
}

// CLI11 transforms: turn "5G" / "7d" into a plain integer at parse time, so a bad
// value is a usage error (exit 2) and the option binds to an integer.
CLI::Validator size_transform();      // core::parse_size; "none" means 0
CLI::Validator duration_transform();  // core::parse_duration, into nanoseconds

// How a command uses the db. Only `create` (kcache init) may create it; the others
// fail with "no db at PATH (run `kcache init`)" and leave the file system untouched.
enum class Access { read, write, create };
// True when `path` certainly holds no db (no data.mdb). False when it does, or when
// that cannot be told (EACCES, ...): then Store::open names the cause.
bool db_missing(const std::string& path);
std::unique_ptr<core::Store> open_store(const Cli& cli, Access access,
                                        std::uint32_t entry_depth = 1);

// The entry called `name`, or the only entry whose name starts with `name`.
core::EntryInfo find_entry(const core::Txn& txn, std::string_view name);

// A progress line on stderr, shown only when stderr is a terminal and cleared when
// the Progress is destroyed. fn() is empty (no callback at all) otherwise.
class Progress {
  public:
    explicit Progress(std::string label);
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;
    core::ProgressFn fn();

  private:
    void update(std::uint64_t done, std::uint64_t total);
    std::string m_label;
    bool m_enabled = false;
    bool m_shown = false;
    std::int64_t m_last_ns = 0;
};

// Columns aligned with spaces. A header of empty strings is not printed.
class Table {
  public:
    explicit Table(std::vector<std::string> header, std::vector<bool> right_aligned = {});
    void add(std::vector<std::string> row);
    void print() const;  // to stdout
    bool empty() const { return m_rows.empty(); }

  private:
    std::vector<std::string> m_header;
    std::vector<bool> m_right;
    std::vector<std::vector<std::string>> m_rows;
};

void print_json(const nlohmann::json& value);  // pretty, newline-terminated, stdout

// "1 entry", "3 entries": `n` and the noun that goes with it.
std::string count(std::uint64_t n, std::string_view one, std::string_view many);
// "3d 4h ago" from a timestamp, "-" for 0 (never).
std::string age_since(const core::Store& store, std::int64_t time_ns);
// "1.5 GiB", or "none" for an unset bound.
std::string size_or_none(std::uint64_t bytes);
nlohmann::json config_json(const core::Config& config);
nlohmann::json entry_json(const core::Store& store, const core::EntryInfo& entry);

// Command groups; each adds its subcommands to `app`.
void add_db_commands(CLI::App& app, Cli& cli);           // init, config, stats
void add_entry_commands(CLI::App& app, Cli& cli);        // ls, show, cat
void add_evict_commands(CLI::App& app, Cli& cli);        // evict, clear, pin, unpin
void add_maintenance_commands(CLI::App& app, Cli& cli);  // verify, gc
void add_bundle_commands(CLI::App& app, Cli& cli);       // export, import
void add_inspect_commands(CLI::App& app, Cli& cli);      // inspect-binary
void add_remote_commands(CLI::App& app, Cli& cli);       // remote push, pull, stats
void add_misses_commands(CLI::App& app, Cli& cli);       // why, misses
void add_env_commands(CLI::App& app, Cli& cli);          // env, run
void add_keys_commands(CLI::App& app, Cli& cli);         // keys generate, list, trust, revoke

// Sizing from capacity misses (core/misses.hpp), for `kcache stats`.
nlohmann::json sizing_json(const core::Store& store, const core::Txn& txn);
void print_sizing(const core::Store& store, const core::Txn& txn);

}  // namespace kcache::cli
