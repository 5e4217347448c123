// Checking and tidying the db: verify, gc.

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/maintenance.hpp"
#include "kcache/core/units.hpp"

namespace kcache::cli {
namespace {

struct VerifyOptions {};

// Problems go to stdout, one a line; exit 1 when there is any.
int run_verify(const Cli& cli, const VerifyOptions&) {
    auto store = open_store(cli, Access::read);
    core::VerifyReport report;
    {
        Progress progress("verifying");
        report = check(core::verify(*store, progress.fn()));
    }
    for (const auto& problem : report.problems) fmt::print("{}\n", problem);
    fmt::print("checked {}, {}, {}: ", count(report.entries, "entry", "entries"),
               count(report.inodes, "inode", "inodes"), count(report.blobs, "blob", "blobs"));
    if (report.ok()) {
        fmt::print("ok\n");
        return kExitOk;
    }
    const std::string problems = count(report.problems.size(), "problem", "problems");
    fmt::print("{}\n", problems);
    fmt::print(stderr, "kcache: db {} is damaged ({})\n", store->path(), problems);
    return kExitError;
}

struct GcOptions {
    bool compact = false;
};

int run_gc(const Cli& cli, const GcOptions& opts) {
    auto store = open_store(cli, Access::write);
    const core::GcReport report = check(core::collect_garbage(*store));
    fmt::print("cleared {} stale reader slots and {} stale write leases\n", report.stale_readers,
               report.stale_leases);
    for (const core::TrainedDictionary& t : report.dictionaries.trained) {
        if (t.id) {
            fmt::print("trained dictionary {} for {}: {} from {} samples ({}), samples {} -> {}\n",
                       t.id, t.kind, core::format_size(t.bytes), t.samples,
                       core::format_size(t.sample_bytes), core::format_size(t.stored_without),
                       core::format_size(t.stored_with));
        } else {
            fmt::print("no dictionary for {}: {} samples ({}) gave none that pays\n", t.kind,
                       t.samples, core::format_size(t.sample_bytes));
        }
    }
    const core::RecompressReport& r = report.dictionaries;
    if (r.classified || r.rewritten) {
        fmt::print("classified {} blobs by kind; recompressed {} with dictionaries: {} -> {}\n",
                   r.classified, r.rewritten, core::format_size(r.stored_before),
                   core::format_size(r.stored_after));
    }
    fmt::print("data.mdb: {}, {} free pages for reuse\n", core::format_size(report.file_bytes),
               report.free_pages);
    if (!opts.compact) return kExitOk;

    const std::string path = store->path();
    store.reset();  // compaction needs the db to itself, this process included
    const core::CompactReport compacted = check(core::compact(path));
    fmt::print("compacted data.mdb: {} -> {}\n", core::format_size(compacted.bytes_before),
               core::format_size(compacted.bytes_after));
    return kExitOk;
}

}  // namespace

void add_maintenance_commands(CLI::App& app, Cli& cli) {
    {
        auto opts = std::make_shared<VerifyOptions>();
        auto* sub = app.add_subcommand(
            "verify", "check every blob against its digest and all accounting; exit 1 if damaged");
        on_run(sub, cli, opts, &run_verify);
    }
    {
        auto opts = std::make_shared<GcOptions>();
        auto* sub =
            app.add_subcommand("gc", "clear stale reader slots and write leases of dead processes");
        sub->add_flag("--compact", opts->compact,
                      "then rewrite data.mdb without free pages (needs the db to itself: stop "
                      "the daemon and other users first)");
        on_run(sub, cli, opts, &run_gc);
    }
}

}  // namespace kcache::cli
