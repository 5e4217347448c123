// Moving entries between dbs: export, import.

#include <algorithm>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/bundle.hpp"
#include "kcache/core/units.hpp"

namespace kcache::cli {
namespace {

struct ExportOptions {
    std::vector<std::string> names;
    std::string output;
};

int run_export(const Cli& cli, const ExportOptions& opts) {
    auto store = open_store(cli, Access::read);
    std::vector<std::string> names;  // full names: prefixes resolved, duplicates dropped
    {
        auto txn = check(store->read());
        for (const auto& name : opts.names) {
            std::string full = find_entry(txn, name).name;
            if (std::find(names.begin(), names.end(), full) == names.end()) {
                names.push_back(std::move(full));
            }
        }
    }
    core::ExportReport report;
    {
        Progress progress("exporting");
        report = check(core::export_bundle(*store, names, opts.output, progress.fn()));
    }
    fmt::print("exported {} ({}, {}) to {} ({})\n", count(report.entries, "entry", "entries"),
               count(report.files, "file", "files"), core::format_size(report.bytes), opts.output,
               core::format_size(report.bundle_bytes));
    return kExitOk;
}

struct ImportOptions {
    std::string input;
    bool replace = false;
};

int run_import(const Cli& cli, const ImportOptions& opts) {
    auto store = open_store(cli, Access::write);
    core::ImportReport report;
    {
        Progress progress("importing");
        report = check(core::import_bundle(*store, opts.input, opts.replace, progress.fn()));
    }
    fmt::print("imported {} ({}, {}) from {}\n",
               count(report.entries_added + report.entries_replaced, "entry", "entries"),
               count(report.files, "file", "files"), core::format_size(report.bytes), opts.input);
    if (report.entries_replaced > 0) {
        fmt::print("replaced {} already present\n",
                   count(report.entries_replaced, "entry", "entries"));
    }
    if (report.entries_skipped > 0) {
        fmt::print("skipped {} already present (--replace overwrites them)\n",
                   count(report.entries_skipped, "entry", "entries"));
    }
    return kExitOk;
}

}  // namespace

void add_bundle_commands(CLI::App& app, Cli& cli) {
    {
        auto opts = std::make_shared<ExportOptions>();
        auto* sub = app.add_subcommand("export", "write entries (all by default) to a bundle file");
        sub->add_option("HASH", opts->names, "entry names (or unique prefixes); none: all");
        sub->add_option("-o,--output", opts->output, "bundle file to write")
            ->type_name("FILE")
            ->required();
        on_run(sub, cli, opts, &run_export);
    }
    {
        auto opts = std::make_shared<ImportOptions>();
        auto* sub =
            app.add_subcommand("import", "add the entries of a bundle file (all or nothing)");
        sub->add_option("FILE", opts->input, "bundle file written by `kcache export`")->required();
        sub->add_flag("--replace", opts->replace, "replace entries already present");
        on_run(sub, cli, opts, &run_import);
    }
}

}  // namespace kcache::cli
