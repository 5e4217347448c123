// kcache: command-line tool over kcache's core (see docs/cli.md).
//
// main() wires CLI11: the global options, one subcommand per command (registered by
// the command groups in commands/), and the mapping of failures to exit codes.

#include <cstdio>
#include <exception>

#include <fmt/core.h>

#include "commands.hpp"

#ifndef KCACHE_VERSION
#define KCACHE_VERSION "unknown"
#endif

int main(int argc, char** argv) {
    using namespace kcache::cli;

    Cli cli;
    CLI::App app{"kcache: inspect and manage a kcache GPU-kernel cache db", "kcache"};
    app.set_version_flag("--version", KCACHE_VERSION);
    app.add_option("--db", cli.db_option,
                   "cache db directory (default: $KCACHE_DB, else ~/.cache/kcache/db)")
        ->type_name("DIR");
    app.require_subcommand(1);
    app.fallthrough();  // subcommands inherit it: `kcache ls --db DIR` works too
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return fmt::format("kcache: {}\nRun with --help for more information.\n", e.what());
    });

    add_db_commands(app, cli);
    add_entry_commands(app, cli);
    add_evict_commands(app, cli);
    add_maintenance_commands(app, cli);
    add_bundle_commands(app, cli);
    add_inspect_commands(app, cli);
    add_remote_commands(app, cli);
    add_misses_commands(app, cli);
    add_env_commands(app, cli);
    add_keys_commands(app, cli);

    if (argc <= 1) {
        std::fputs(app.help().c_str(), stderr);
        return kExitUsage;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // --help and --version exit 0; every real parse error is a usage error.
        return app.exit(e) == 0 ? kExitOk : kExitUsage;
    }

    if (!cli.action) return kExitUsage;  // unreachable: a subcommand is required
    try {
        return cli.action();
    } catch (const UsageError& e) {
        fmt::print(stderr, "kcache: {}\n", e.what());
        return kExitUsage;
    } catch (const std::exception& e) {  // Failure, and anything unexpected
        fmt::print(stderr, "kcache: {}\n", e.what());
        return kExitError;
    }
}
