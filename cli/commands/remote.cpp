// kcache remote push / pull / stats: the shared tier on Redis (remote/).
//
// Every command records what the remote did (remote_* counters of `kcache stats`) in
// the db before it returns, also when it fails. A remote failure fails the entry, not
// the command: the others are still tried (fast, once a server's circuit is open), and
// the command exits 1 if any entry could not be moved.
#include <cerrno>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/units.hpp"
#include "kcache/remote/remote.hpp"
#include "kcache/remote/settings.hpp"

namespace kcache::cli {

namespace {

using RemoteCommon = remote::Settings;  // the options every program shares (remote/settings.hpp)

struct PushOptions {
    std::shared_ptr<RemoteCommon> common;
    std::string job_tag;
    std::vector<std::string> entries;
};

struct PullOptions {
    std::shared_ptr<RemoteCommon> common;
    std::string job_tag;
    std::vector<std::string> entries;
};

struct RemoteStatsOptions {
    std::shared_ptr<RemoteCommon> common;
    bool json = false;
};

std::unique_ptr<remote::Remote> make_remote(const RemoteCommon& c) {
    // Combinations of arguments are usage errors (exit 2); resolve() says the same
    // but cannot tell them from a bad URL or password source (exit 1).
    if (remote::configured_urls(c).empty())
        throw UsageError("no remote server: give --remote URL or set KCACHE_REMOTE");
    if (!c.password_env.empty() && !c.password_file.empty()) {
        throw UsageError("--remote-password-env and --remote-password-file exclude each other");
    }
    return check(remote::Remote::create(check(remote::resolve(c))));
}

// Records the remote's counts in the db when the command ends, however it ends.
class CountsRecorder {
  public:
    CountsRecorder(core::Store& store, const remote::Remote& r) : m_store(store), m_remote(r) {}
    ~CountsRecorder() {
        if (auto s = remote::record_counts(m_store, m_remote.counts()); !s) {
            fmt::print(stderr, "kcache: recording remote statistics: {}\n", s.error().message);
        }
    }
    CountsRecorder(const CountsRecorder&) = delete;
    CountsRecorder& operator=(const CountsRecorder&) = delete;

  private:
    core::Store& m_store;
    const remote::Remote& m_remote;
};

std::string describe(const remote::EntryResult& r) {
    return fmt::format("{}, {}{}", count(r.files, "file", "files"), core::format_size(r.bytes),
                       r.signer.empty() ? "" : ", signed by " + r.signer);
}

// What a pull trusts, in a line (docs/operations.md, "Trust model").
std::string trust_line(const remote::Remote& r) {
    if (r.verifying()) {
        return fmt::format("verified: only entries signed by a key trusted in {}",
                           r.options().trusted_keys);
    }
    return "unverified: entries are accepted from any writer (no trust file; "
           "--remote-trusted-keys FILE)";
}

int run_push(const Cli& cli, const PushOptions& opts) {
    if (!opts.job_tag.empty()) check(remote::validate_job_tag(opts.job_tag));
    auto store = open_store(cli, Access::write);
    auto r = make_remote(*opts.common);
    CountsRecorder recorder(*store, *r);
    std::vector<std::string> names;
    {
        auto txn = check(store->read());
        if (opts.entries.empty()) {
            check(txn.for_each_entry([&](const core::EntryInfo& e) {
                if (e.files > 0) names.push_back(e.name);
                return true;
            }));
        } else {
            for (const std::string& name : opts.entries)
                names.push_back(find_entry(txn, name).name);
        }
    }
    std::uint64_t uploaded = 0, already = 0, failed = 0;
    for (const std::string& name : names) {
        auto result = r->push(*store, name, opts.job_tag);
        if (!result) {
            ++failed;
            fmt::print(stderr, "kcache: push {}: {}\n", name, result.error().message);
            continue;
        }
        (result->outcome == remote::Outcome::uploaded ? uploaded : already) += 1;
        fmt::print("{:<15} {} ({})\n", remote::outcome_name(result->outcome), name,
                   describe(*result));
    }
    fmt::print("pushed {}, already remote {}, failed {}\n", uploaded, already, failed);
    return failed ? kExitError : kExitOk;
}

int run_pull(const Cli& cli, const PullOptions& opts) {
    if (!opts.job_tag.empty() && !opts.entries.empty())
        throw UsageError("give --job-tag or entries, not both");
    if (opts.job_tag.empty() && opts.entries.empty())
        throw UsageError("give --job-tag TAG or the entries to pull");
    // A fresh node prefetches into a db that does not exist yet.
    auto store = open_store(cli, Access::create);
    auto r = make_remote(*opts.common);
    CountsRecorder recorder(*store, *r);
    if (!r->verifying())
        fmt::print(stderr, "kcache: note: the shared tier is {}\n", trust_line(*r));
    // The loop kcache-fsd --prefetch-job-tag runs too (Remote::pull_entries).
    auto report = [](const std::string& name, const core::Result<remote::EntryResult>& result) {
        if (!result) {
            fmt::print(stderr, "kcache: pull {}: {}\n", name, result.error().message);
        } else if (result->detail.empty()) {
            fmt::print("{:<15} {} ({})\n", remote::outcome_name(result->outcome), name,
                       describe(*result));
        } else {
            fmt::print("{:<15} {}: {}\n", remote::outcome_name(result->outcome), name,
                       result->detail);
        }
        return true;
    };
    const remote::PullSummary done =
        opts.job_tag.empty()
            ? r->pull_entries(*store, opts.entries, report)
            : check(r->pull_job(*store, opts.job_tag, report), "job " + opts.job_tag);
    fmt::print("pulled {}, already local {}, not available {}, failed {}\n", done.pulled,
               done.already_local, done.missing, done.failed);
    return done.failed || done.missing ? kExitError : kExitOk;
}

// The remote tier's statistics, in id order.
constexpr auto kRemoteCounters =
    core::statistics_counted_by_list<core::statistics_counted_by(core::by_remote)>(core::by_remote);

int run_remote_stats(const Cli& cli, const RemoteStatsOptions& opts) {
    auto store = open_store(cli, Access::read);
    const core::Stats stats = check(check(store->read()).stats());
    // Servers only when one is configured: the counters need no network.
    std::unique_ptr<remote::Remote> r;
    if (!remote::configured_urls(*opts.common).empty()) r = make_remote(*opts.common);
    std::vector<std::string> pings = r ? r->ping() : std::vector<std::string>{};
    std::vector<remote::ServerState> servers =
        r ? r->servers() : std::vector<remote::ServerState>{};
    // A cluster's masters may change between the two calls (a failover): report those pinged.
    if (servers.size() > pings.size()) servers.resize(pings.size());
    pings.resize(servers.size());
    if (opts.json) {
        nlohmann::json out;
        for (core::Counter c : kRemoteCounters)
            out[std::string(core::counter_name(c))] = stats.get(c);
        // null when no server is configured (the counters need none)
        out["trust"] = r ? nlohmann::json(r->verifying() ? "verified" : "unverified")
                         : nlohmann::json(nullptr);
        out["servers"] = nlohmann::json::array();
        for (std::size_t i = 0; i < servers.size(); ++i) {
            out["servers"].push_back({{"id", servers[i].id},
                                      {"reachable", pings[i].empty()},
                                      {"error", pings[i]},
                                      {"breaker", servers[i].breaker},
                                      {"uploads_paused", servers[i].uploads_paused}});
        }
        print_json(out);
    } else {
        Table counters({"", ""}, {false, true});
        for (core::Counter c : kRemoteCounters) {
            counters.add({core::counter_label(c), core::counts_bytes(c)
                                                      ? core::format_size(stats.get(c))
                                                      : std::to_string(stats.get(c))});
        }
        counters.print();
        if (r) fmt::print("\ntrust: {}\n", trust_line(*r));
        for (std::size_t i = 0; i < servers.size(); ++i) {
            fmt::print("\nserver {}: {}\n", servers[i].id,
                       pings[i].empty() ? "reachable" : pings[i]);
        }
    }
    for (const std::string& p : pings) {
        if (!p.empty()) return kExitError;
    }
    return kExitOk;
}

}  // namespace

void add_remote_commands(CLI::App& app, Cli& cli) {
    auto common = std::make_shared<RemoteCommon>();
    auto* group =
        app.add_subcommand("remote", "push entries to and pull them from the shared tier (Redis)");
    group->require_subcommand(1);
    remote::add_options(*group, *common);

    {
        auto opts = std::make_shared<PushOptions>();
        opts->common = common;
        auto* sub =
            group->add_subcommand("push", "upload entries (default: all) to the shared tier");
        sub->add_option("--job-tag", opts->job_tag, "also add them to this job's set")
            ->type_name("TAG");
        sub->add_option("entries", opts->entries, "entry names (a unique prefix will do)")
            ->type_name("ENTRY");
        on_run(sub, cli, opts, &run_push);
    }
    {
        auto opts = std::make_shared<PullOptions>();
        opts->common = common;
        auto* sub = group->add_subcommand(
            "pull", "fetch entries (or a job's entries) into the db, verified");
        sub->add_option("--job-tag", opts->job_tag, "every entry of this job's set")
            ->type_name("TAG");
        sub->add_option("entries", opts->entries, "exact entry names")->type_name("ENTRY");
        on_run(sub, cli, opts, &run_pull);
    }
    {
        auto opts = std::make_shared<RemoteStatsOptions>();
        opts->common = common;
        auto* sub = group->add_subcommand("stats",
                                          "the remote counters of the db, and each server's state");
        sub->add_flag("--json", opts->json, "print JSON");
        on_run(sub, cli, opts, &run_remote_stats);
    }
}

}  // namespace kcache::cli
