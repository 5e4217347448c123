// The db as a whole: init, config, stats.

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/dictionaries.hpp"
#include "kcache/core/units.hpp"

namespace kcache::cli {
namespace {

// --max-size / --max-entries, shared by init and config.
struct Limits {
    std::optional<std::uint64_t> max_size;
    std::optional<std::uint64_t> max_entries;

    void add_to(CLI::App* sub) {
        sub->add_option("--max-size", max_size,
                        "bound on stored bytes, e.g. 10G; 0 or none: no bound")
            ->type_name("SIZE")
            ->transform(size_transform());
        sub->add_option("--max-entries", max_entries, "bound on entries; 0: no bound")
            ->type_name("N");
    }
    bool any() const { return max_size || max_entries; }
    void apply(core::Config& config) const {
        if (max_size) config.max_bytes = *max_size;
        if (max_entries) config.max_entries = *max_entries;
    }
};

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Failure(fmt::format("cannot read {}", path));
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

void print_config(const std::string& path, const core::Config& config) {
    Table table({"", ""});
    table.add({"db", path});
    table.add({"entry depth", std::to_string(config.entry_depth)});
    table.add({"max size", size_or_none(config.max_bytes)});
    table.add({"max entries",
               config.max_entries ? std::to_string(config.max_entries) : std::string("none")});
    table.add({"low mark", fmt::format("{}%", config.low_mark_percent)});
    table.add({"max events", std::to_string(config.max_events)});
    std::size_t rules = 0;
    for (char c : config.layout_rules) rules += c == '\n';
    table.add({"layout rules", config.layout_rules.empty()
                                   ? std::string("built-in only")
                                   : fmt::format("{} line(s), then built-in", rules)});
    table.print();
}

// Sets the limits in one transaction, then evicts down to them if they are exceeded
// now (a daemon would do so at its next store anyway).
core::Config set_limits(core::Store& store, const Limits& limits) {
    auto txn = check(store.write());
    core::Config config = txn.config();
    limits.apply(config);
    check(txn.set_config(config));
    check(txn.commit());
    const core::EvictReport report = check(store.enforce_limits());
    if (report.entries > 0) {
        fmt::print("evicted {} ({}) to meet the new limits\n",
                   count(report.entries, "entry", "entries"), core::format_size(report.bytes));
    }
    return config;
}

struct InitOptions {
    std::optional<std::uint32_t> entry_depth;
    Limits limits;
};

int run_init(const Cli& cli, const InitOptions& opts) {
    const std::string path = cli.db_path();
    const bool existed = !db_missing(path);
    auto store = open_store(cli, Access::create, opts.entry_depth.value_or(1));
    core::Config config = check(store->read()).config();
    if (opts.entry_depth && *opts.entry_depth != config.entry_depth) {
        throw Failure(fmt::format(
            "db at {} has entry depth {}: the entry depth of an existing db cannot change", path,
            config.entry_depth));
    }
    if (opts.limits.any()) config = set_limits(*store, opts.limits);
    fmt::print("{} db at {}\n", existed ? "existing" : "created", path);
    print_config(path, config);
    return kExitOk;
}

struct ConfigOptions {
    Limits limits;
    std::optional<std::string> layout_rules;  // a rules file (layout.hpp); empty file: none
    bool json = false;
};

int run_config(const Cli& cli, const ConfigOptions& opts) {
    const bool changes = opts.limits.any() || opts.layout_rules;
    auto store = open_store(cli, changes ? Access::write : Access::read);
    if (opts.layout_rules) {
        auto txn = check(store->write());
        core::Config config = txn.config();
        config.layout_rules = read_text_file(*opts.layout_rules);
        check(txn.set_config(config));  // EINVAL naming the line of a bad rule
        check(txn.commit());
    }
    const core::Config config =
        opts.limits.any() ? set_limits(*store, opts.limits) : check(store->read()).config();
    if (opts.json) {
        print_json(config_json(config));
    } else {
        print_config(store->path(), config);
    }
    return kExitOk;
}

struct StatsOptions {
    bool json = false;
    bool reset = false;
};

// hits / (hits + misses); nullopt before any lookup.
std::optional<double> hit_rate(const core::Stats& stats) {
    const std::uint64_t hits = stats.get(core::Counter::hits);
    const std::uint64_t lookups = hits + stats.get(core::Counter::misses);
    if (lookups == 0) return std::nullopt;
    return static_cast<double>(hits) / static_cast<double>(lookups);
}

// The shared tier's servers as the running kcache-fsd --remote sees them: the file
// it rewrites when a breaker changes state (fsd/src/tier/remote_tier.hpp, docs/stats.md),
// with "live": false when the daemon that wrote it is gone. null when there is none.
nlohmann::json remote_server_states(const core::Store& store) {
    std::ifstream in(store.path() + "/remote-servers.json", std::ios::binary);
    if (!in) return nullptr;
    nlohmann::json state = nlohmann::json::parse(in, nullptr, false);
    if (state.is_discarded() || !state.is_object() || !state.contains("servers")) return nullptr;
    const auto pid = state.value("pid", std::int64_t{0});
    state["live"] = pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
    return state;
}

// The shared tier's statistics (remote_*): kStatistics' by_remote rows.
bool of_shared_tier(core::Counter c) {
    const core::StatisticField* f = core::statistic_field(c);
    return f && (f->counted_by & core::by_remote);
}

// Whether the db has used a shared tier: one of its statistics is not zero (a counter
// since the last reset, or a gauge of a running kcache-fsd --remote), or a daemon left
// its servers' states (`servers`, remote_server_states()).
bool used_shared_tier(const core::Stats& stats, const nlohmann::json& servers) {
    if (!servers.is_null()) return true;
    for (const auto& [counter, value] : stats.values) {
        if (value != 0 && of_shared_tier(counter)) return true;
    }
    return false;
}

nlohmann::json stats_json(const core::Store& store, const core::Stats& stats,
                          const core::Config& config,
                          const std::vector<core::KindStats>& kind_list) {
    nlohmann::json out;
    out["db"] = store.path();
    for (const auto& [counter, value] : stats.values)
        out[std::string(core::counter_name(counter))] = value;
    out["evictions"] = stats.get(core::Counter::evicted_entries);
    const auto rate = hit_rate(stats);
    out["hit_rate"] = rate ? nlohmann::json(*rate) : nlohmann::json(nullptr);
    out["reset_ns"] = stats.reset_ns;
    out["data_file_bytes"] = store.data_file_bytes();
    out["config"] = config_json(config);
    out["remote_server_states"] = remote_server_states(store);
    nlohmann::json kinds = nlohmann::json::array();
    for (const core::KindStats& k : kind_list) {
        kinds.push_back({{"kind", k.name},
                         {"blobs", k.blobs},
                         {"raw_bytes", k.raw_bytes},
                         {"stored_bytes", k.stored_bytes},
                         {"dictionary", k.dictionary},
                         {"dictionary_bytes", k.dictionary_bytes},
                         {"dictionaries_footprint", k.dictionaries_footprint}});
    }
    out["kinds"] = std::move(kinds);
    return out;
}

// Stored/raw by file kind (dictionaries.hpp): what compression and the trained
// dictionaries save where.
void print_kinds(const std::vector<core::KindStats>& kinds) {
    if (kinds.empty()) return;
    fmt::print("\nstored by kind\n");
    Table table({"  kind", "blobs", "raw", "stored", "stored/raw", "dictionary"},
                {false, true, true, true, true, true});
    for (const core::KindStats& k : kinds) {
        const std::string ratio = k.raw_bytes
                                      ? fmt::format("{:.3f}", static_cast<double>(k.stored_bytes) /
                                                                  static_cast<double>(k.raw_bytes))
                                      : "-";
        std::string dictionary = k.dictionary ? core::format_size(k.dictionary_bytes) : "-";
        if (const std::uint64_t older = k.dictionaries - (k.dictionary ? 1 : 0)) {
            dictionary += fmt::format(" (+{} older in use)", older);
        }
        table.add({"  " + k.name, std::to_string(k.blobs), core::format_size(k.raw_bytes),
                   core::format_size(k.stored_bytes), ratio, dictionary});
    }
    table.print();
}

// A counter's value as printed: a size or a count.
std::string value_of(const core::Stats& stats, core::Counter c) {
    const std::uint64_t v = stats.get(c);
    return core::counts_bytes(c) ? core::format_size(v) : std::to_string(v);
}

void print_summary(const core::Store& store, const core::Stats& stats, const core::Config& config) {
    const std::uint64_t stored = stats.get(core::Counter::stored_bytes);
    std::string limit = "no size bound";
    if (config.max_bytes) {
        limit = fmt::format(
            "{} of {} max ({:.0f}%)", core::format_size(stored),
            core::format_size(config.max_bytes),
            100.0 * static_cast<double>(stored) / static_cast<double>(config.max_bytes));
    }

    Table summary({"", ""});
    summary.add({"db", store.path()});
    summary.add({"data file", core::format_size(store.data_file_bytes())});
    summary.add({"stored", limit});
    if (config.max_entries) summary.add({"max entries", std::to_string(config.max_entries)});
    summary.print();
}

// The shared tier's gauges and its servers' states (`servers`: what the daemon
// published, null when none did).
void print_remote_servers(const core::Stats& stats, const nlohmann::json& servers) {
    if (!servers.is_null() || stats.get(core::Counter::remote_servers) != 0) {
        fmt::print("\nremote servers");
        if (!servers.is_null()) {
            fmt::print(" (kcache-fsd pid {}{})", servers.value("pid", std::int64_t{0}),
                       servers["live"].get<bool>() ? "" : "; stale: that daemon is gone");
        }
        fmt::print("\n");
        Table remote_gauges({"", ""}, {false, true});
        for (const auto& [counter, value] : stats.values) {
            if (core::is_gauge(counter) && of_shared_tier(counter)) {
                remote_gauges.add({"  " + core::counter_label(counter), value_of(stats, counter)});
            }
        }
        remote_gauges.print();
    }
    if (!servers.is_null()) {
        Table table({"", "", ""}, {false, false, false});
        for (const auto& s : servers["servers"]) {
            if (!s.is_object()) continue;
            std::string state = s.value("breaker", std::string("?"));
            if (const auto failures = s.value("failures", std::uint64_t{0})) {
                state += fmt::format(" ({} failures in a row)", failures);
            }
            table.add({"  " + s.value("id", std::string("?")), state,
                       s.value("uploads_paused", false) ? "uploads paused" : ""});
        }
        table.print();
    }
}

// The shared tier's counters, under the headings of their groups (as the inspector's
// "Shared tier" section).
void print_shared_tier_counters(const core::Stats& stats, const std::string& since) {
    fmt::print("\nshared tier since {}\n", since);
    Table remote({"", ""}, {false, true});
    std::vector<std::string_view> groups;
    for (const core::StatisticField& f : core::kStatistics) {
        if (!(f.counted_by & core::by_remote) || core::is_gauge(f.id)) continue;
        if (std::find(groups.begin(), groups.end(), f.group) == groups.end())
            groups.push_back(f.group);
    }
    for (std::string_view group : groups) {
        remote.add({"  " + std::string(group), ""});
        for (const core::StatisticField& f : core::kStatistics) {
            if (!(f.counted_by & core::by_remote) || core::is_gauge(f.id) || f.group != group)
                continue;
            remote.add({"    " + core::counter_label(f.id), value_of(stats, f.id)});
        }
    }
    remote.print();
}

void print_stats(const core::Store& store, const core::Stats& stats, const core::Config& config,
                 const std::vector<core::KindStats>& kinds) {
    print_summary(store, stats, config);

    fmt::print("\ncache now\n");
    Table gauges({"", ""}, {false, true});
    // The shared tier's gauges describe the running daemon, not the contents: apart.
    for (const auto& [counter, value] : stats.values) {
        if (core::is_gauge(counter) && !of_shared_tier(counter)) {
            gauges.add({"  " + core::counter_label(counter), value_of(stats, counter)});
        }
    }
    gauges.print();

    const nlohmann::json servers = remote_server_states(store);
    print_remote_servers(stats, servers);

    print_kinds(kinds);

    const std::string since = stats.reset_ns ? "reset " + age_since(store, stats.reset_ns)
                                             : std::string("the db was created");
    fmt::print("\nsince {}\n", since);
    Table counters({"", ""}, {false, true});
    for (const auto& [counter, value] : stats.values) {
        if (core::is_gauge(counter) || of_shared_tier(counter)) continue;
        counters.add({"  " + core::counter_label(counter), value_of(stats, counter)});
        if (counter == core::Counter::misses) {
            const auto rate = hit_rate(stats);
            counters.add({"  hit rate", rate ? fmt::format("{:.1f}%", *rate * 100) : "-"});
        }
    }
    counters.print();

    // The shared tier's counters only for a db that has used one: most never do, and a
    // screenful of zeros would bury the rest. --json has them all, always.
    if (used_shared_tier(stats, servers)) print_shared_tier_counters(stats, since);
}

// Reads the statistics records, the meta record and the classified misses (bounded by
// Config::max_events): O(1) in the entries.
int run_stats(const Cli& cli, const StatsOptions& opts) {
    auto store = open_store(cli, opts.reset ? Access::write : Access::read);
    if (opts.reset) check(store->update([](core::WriteTxn& txn) { return txn.reset_stats(); }));
    auto txn = check(store->read());
    const core::Stats stats = check(txn.stats());
    const std::vector<core::KindStats> kinds = check(core::kind_stats(txn));
    if (opts.json) {
        auto out = stats_json(*store, stats, txn.config(), kinds);
        out["sizing"] = sizing_json(*store, txn);
        print_json(out);
    } else {
        print_stats(*store, stats, txn.config(), kinds);
        print_sizing(*store, txn);
    }
    return kExitOk;
}

}  // namespace

void add_db_commands(CLI::App& app, Cli& cli) {
    {
        auto opts = std::make_shared<InitOptions>();
        auto* sub = app.add_subcommand("init", "create the db if missing and set its limits");
        sub->add_option("--entry-depth", opts->entry_depth,
                        "depth below the root at which entries live (new db only; default 1)")
            ->type_name("N")
            ->check(CLI::Range(1, 64));
        opts->limits.add_to(sub);
        on_run(sub, cli, opts, &run_init);
    }
    {
        auto opts = std::make_shared<ConfigOptions>();
        auto* sub = app.add_subcommand("config", "print the db's settings, or set its limits");
        opts->limits.add_to(sub);
        sub->add_option("--layout-rules", opts->layout_rules,
                        "layout rules for compilers kcache does not know (docs/core.md); "
                        "an empty file removes them")
            ->type_name("FILE");
        sub->add_flag("--json", opts->json, "print as JSON");
        on_run(sub, cli, opts, &run_config);
    }
    {
        auto opts = std::make_shared<StatsOptions>();
        auto* sub = app.add_subcommand("stats", "print statistics counters and gauges");
        sub->add_flag("--json", opts->json, "print as JSON");
        sub->add_flag("--reset", opts->reset, "zero the counters first (gauges stay)");
        on_run(sub, cli, opts, &run_stats);
    }
}

}  // namespace kcache::cli
