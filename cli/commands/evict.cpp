// Changing what the cache keeps: evict, clear, pin, unpin.

#include <cerrno>
#include <set>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/units.hpp"
#include "kcache/remote/trust.hpp"

namespace kcache::cli {
namespace {

void print_report(const core::EvictReport& report) {
    fmt::print("evicted {} ({}, {} stored freed)\n", count(report.entries, "entry", "entries"),
               core::format_size(report.bytes), core::format_size(report.stored_bytes_freed));
    if (report.skipped_in_flight > 0) {
        fmt::print("skipped {} with a write in flight\n",
                   count(report.skipped_in_flight, "entry", "entries"));
    }
}

struct EvictOptions {
    std::vector<std::string> names;
    std::optional<std::int64_t> older_than_ns;
    std::optional<std::uint64_t> to_size;
    std::optional<std::uint64_t> to_entries;
    std::string signer;  // --signer KEYID
};

// Every entry the shared tier supplied signed by `signer` (a key id: what `kcache keys
// revoke` names), pinned ones too: a revoked key's kernels must not run here. One
// transaction: all or none.
int evict_signer(core::Store& store, const std::string& signer) {
    auto txn = check(store.write());
    std::vector<core::EntryInfo> signed_by;
    check(txn.for_each_entry([&](const core::EntryInfo& e) {
        if (remote::signer_of(e) == signer) signed_by.push_back(e);
        return true;
    }));
    core::EvictReport report;
    for (const core::EntryInfo& entry : signed_by) {
        if (entry.pinned)
            check(txn.set_pinned(entry.ino, false), fmt::format("unpin {}", entry.name));
        const core::Status status = txn.evict_entry(entry.ino);
        if (!status && status.error().code == EBUSY) {
            throw Failure(
                fmt::format("entry {} has a write in flight; try again later", entry.name));
        }
        check(status, fmt::format("evict {}", entry.name));
        report.entries += 1;
        report.bytes += entry.bytes;
    }
    check(txn.commit());
    fmt::print("evicted {} signed by {} ({})\n", count(report.entries, "entry", "entries"), signer,
               core::format_size(report.bytes));
    return kExitOk;
}

// All named entries in one transaction: either all are evicted or none is.
int evict_names(core::Store& store, const std::vector<std::string>& names) {
    auto txn = check(store.write());
    std::set<core::Ino> evicted;
    core::EvictReport report;
    for (const auto& name : names) {
        const core::EntryInfo entry = find_entry(txn, name);
        if (!evicted.insert(entry.ino).second) continue;
        const core::Status status = txn.evict_entry(entry.ino);
        if (!status && status.error().code == EPERM) {
            throw Failure(fmt::format("entry {} is pinned (run `kcache unpin {}` first)",
                                      entry.name, entry.name));
        }
        if (!status && status.error().code == EBUSY) {
            throw Failure(
                fmt::format("entry {} has a write in flight; try again later", entry.name));
        }
        check(status, fmt::format("evict {}", entry.name));
        report.entries += 1;
        report.bytes += entry.bytes;
    }
    check(txn.commit());
    fmt::print("evicted {} ({})\n", count(report.entries, "entry", "entries"),
               core::format_size(report.bytes));
    return kExitOk;
}

int run_evict(const Cli& cli, const EvictOptions& opts) {
    const bool by_name = !opts.names.empty();
    const bool by_bound = opts.older_than_ns || opts.to_size || opts.to_entries;
    if (!opts.signer.empty()) {
        if (by_name || by_bound) throw UsageError("--signer takes no entry names or bounds");
        const bool id = opts.signer.size() == 16 &&
                        opts.signer.find_first_not_of("0123456789abcdef") == std::string::npos;
        if (!id) {
            throw UsageError(fmt::format(
                "--signer: '{}' is no key id (16 hex digits, as `kcache keys list` shows)",
                opts.signer));
        }
        auto store = open_store(cli, Access::write);
        return evict_signer(*store, opts.signer);
    }
    if (by_name && by_bound) {
        throw UsageError(
            "give entry names or bounds (--older-than, --to-size, --to-entries), "
            "not both");
    }
    if (!by_name && !by_bound) {
        throw UsageError(
            "nothing to evict: give entry names, --older-than, --to-size or "
            "--to-entries (or use `kcache clear --yes`)");
    }
    auto store = open_store(cli, Access::write);
    if (by_name) return evict_names(*store, opts.names);

    core::EvictRequest request;
    request.max_bytes = opts.to_size;
    request.max_entries = opts.to_entries;
    request.older_than_ns = opts.older_than_ns;
    core::EvictReport report;
    {
        Progress progress("evicting");
        report = check(store->evict(request, progress.fn()));
    }
    print_report(report);
    if (!report.satisfied) {
        fmt::print(stderr,
                   "kcache: note: the bound is not reached: the entries left are pinned or "
                   "have a write in flight\n");
    }
    return kExitOk;
}

struct ClearOptions {
    bool yes = false;
};

int run_clear(const Cli& cli, const ClearOptions& opts) {
    if (!opts.yes) throw UsageError("clear evicts every unpinned entry: pass --yes to do it");
    auto store = open_store(cli, Access::write);
    core::EvictRequest request;
    request.max_entries = 0;
    core::EvictReport report;
    {
        Progress progress("clearing");
        report = check(store->evict(request, progress.fn()));
    }
    print_report(report);
    const std::uint64_t left = check(check(store->read()).counter(core::Counter::entries));
    if (left > 0) {
        fmt::print("kept {} (pinned or with a write in flight)\n", count(left, "entry", "entries"));
    }
    return kExitOk;
}

struct PinOptions {
    std::vector<std::string> names;
};

int set_pinned(const Cli& cli, const PinOptions& opts, bool pinned) {
    auto store = open_store(cli, Access::write);
    auto txn = check(store->write());
    std::vector<std::string> done;
    for (const auto& name : opts.names) {
        const core::EntryInfo entry = find_entry(txn, name);
        check(txn.set_pinned(entry.ino, pinned),
              fmt::format("{} {}", pinned ? "pin" : "unpin", entry.name));
        done.push_back(entry.name);
    }
    check(txn.commit());
    for (const auto& name : done) fmt::print("{} {}\n", pinned ? "pinned" : "unpinned", name);
    return kExitOk;
}

int run_pin(const Cli& cli, const PinOptions& opts) {
    return set_pinned(cli, opts, true);
}
int run_unpin(const Cli& cli, const PinOptions& opts) {
    return set_pinned(cli, opts, false);
}

}  // namespace

void add_evict_commands(CLI::App& app, Cli& cli) {
    {
        auto opts = std::make_shared<EvictOptions>();
        auto* sub = app.add_subcommand(
            "evict", "evict named entries, or least-recently-used entries down to bounds");
        sub->add_option("HASH", opts->names, "entry names (or unique prefixes)");
        sub->add_option("--older-than", opts->older_than_ns,
                        "evict entries not used for this long, e.g. 7d")
            ->type_name("AGE")
            ->transform(duration_transform());
        sub->add_option("--to-size", opts->to_size, "evict until stored bytes <= SIZE, e.g. 5G")
            ->type_name("SIZE")
            ->transform(size_transform());
        sub->add_option("--to-entries", opts->to_entries, "evict until at most N entries are left")
            ->type_name("N");
        sub->add_option("--signer", opts->signer,
                        "evict every entry pulled signed by this key id (a revoked key's), "
                        "pinned ones too")
            ->type_name("KEYID");
        on_run(sub, cli, opts, &run_evict);
    }
    {
        auto opts = std::make_shared<ClearOptions>();
        auto* sub = app.add_subcommand("clear", "evict every unpinned entry");
        sub->add_flag("--yes", opts->yes, "confirm (required)");
        on_run(sub, cli, opts, &run_clear);
    }
    {
        auto opts = std::make_shared<PinOptions>();
        auto* sub = app.add_subcommand("pin", "protect entries from eviction");
        sub->add_option("HASH", opts->names, "entry names (or unique prefixes)")->required();
        on_run(sub, cli, opts, &run_pin);
    }
    {
        auto opts = std::make_shared<PinOptions>();
        auto* sub = app.add_subcommand("unpin", "let entries be evicted again");
        sub->add_option("HASH", opts->names, "entry names (or unique prefixes)")->required();
        on_run(sub, cli, opts, &run_unpin);
    }
}

}  // namespace kcache::cli
