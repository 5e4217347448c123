#include "options.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "kcache/core/units.hpp"

namespace kcache::fsd {
namespace {

// Sets both halves of a durability mode, so that --durability and -o durability= (and
// a later one overriding an earlier one) cannot disagree about the sync timer.
core::Status set_durability(const std::string& text, Options& o) {
    if (text == "full") {
        o.durability = core::Durability::full;
        o.sync_interval_s = 0;  // every commit is synced: nothing is left for a timer
    } else if (text == "batched") {
        o.durability = core::Durability::none;
        o.sync_interval_s = kBatchedSyncIntervalS;
    } else if (text == "none") {
        o.durability = core::Durability::none;
        o.sync_interval_s = 0;
    } else {
        return core::fail(EINVAL,
                          fmt::format("invalid durability '{}' (full, batched, none)", text));
    }
    return {};
}

// Applies one of kcache's own options, named as in -o (key=value) and reached by the
// long options too, so both forms take one path; false if the key is not ours.
// Counts parse like sizes ("1K" is 1024), with the one parser the sizes use.
core::Result<bool> apply_option(const std::string& key, const std::string& value, Options& o) {
    auto number = [&](std::uint64_t& out) -> core::Result<bool> {
        auto v = core::parse_size(value);
        if (!v) return tl::unexpected(core::with_context(v.error(), key));
        out = *v;
        return true;
    };
    if (key == "db") {
        o.db = value;
        return true;
    }
    if (key == "max_size") return number(o.max_bytes);
    if (key == "max_file_size") return number(o.max_file_size);
    if (key == "max_entries") return number(o.max_entries);
    if (key == "single_flight_ms") {
        std::uint64_t ms = 0;
        if (auto ok = number(ms); !ok) return ok;
        if (ms > 3'600'000) {
            return core::fail(ERANGE, fmt::format("single_flight_ms: '{}' is over an hour", value));
        }
        o.single_flight_ms = ms;
        return true;
    }
    if (key == "entry_depth") {
        std::uint64_t depth = 0;
        if (auto ok = number(depth); !ok) return ok;
        // Only the narrowing is checked here: the db's own check (set_config) says
        // which depths are valid.
        if (depth > std::numeric_limits<std::uint32_t>::max()) {
            return core::fail(ERANGE, fmt::format("entry_depth: '{}' is too large", value));
        }
        o.entry_depth = static_cast<std::uint32_t>(depth);
        return true;
    }
    if (key == "job_tag" || key == "prefetch_job_tag") {
        // Checked here, so that a bad tag stops start-up with the option's name.
        if (auto s = remote::validate_job_tag(value); !s)
            return tl::unexpected(core::with_context(s.error(), key));
        (key == "job_tag" ? o.job_tag : o.prefetch_job_tag) = value;
        return true;
    }
    if (key == "io_uring") {
        if (!value.empty()) return core::fail(EINVAL, "io_uring takes no value");
        o.io_uring = true;
        return true;
    }
    if (key == "durability") {
        KCACHE_TRY(set_durability(value, o));
        return true;
    }
    return false;
}

// The command line's values before they are checked: what apply_option and the checks
// after the parse read.
struct RawOptions {
    std::vector<std::string> positionals, dash_o;
    // The long options' values by their -o key: both forms go through apply_option.
    std::map<std::string, std::string> long_options;
    std::string layout_rules_file;
    remote::Settings remote_settings;
    std::string lease_ms = "auto";
};

// Declares kcache-fsd's options on `app`: flags straight into `o`, the rest into `raw`.
void declare_options(CLI::App& app, Options& o, RawOptions& raw) {
    auto& long_options = raw.long_options;
    app.add_option("--db", o.db,
                   "cache db directory (default: $KCACHE_DB, else ~/.cache/kcache/db)");
    app.add_option("--max-size", long_options["max_size"],
                   "evict least-recently-used entries above this size (e.g. 10G)");
    app.add_option("--max-entries", long_options["max_entries"],
                   "evict least-recently-used entries above this count (e.g. 100K)");
    app.add_option("--entry-depth", long_options["entry_depth"],
                   "the layout's depth fallback: no entry above it, an unknown directory at it is "
                   "one (new db: 1)");
    app.add_option("--layout-rules", raw.layout_rules_file,
                   "a layout rules file for compilers kcache does not know (docs/core.md); "
                   "it becomes the db's");
    app.add_option("--max-file-size", long_options["max_file_size"],
                   "largest file a writer may store (default 2G; EFBIG past it)");
    app.add_option("--durability", long_options["durability"],
                   "full: sync every commit; batched (default): sync every second; none");
    app.add_option("--single-flight-ms", long_options["single_flight_ms"],
                   "at most this long, a path walk through an entry directory another compile "
                   "is filling waits for it (default 2000; 0: never)");
    app.add_flag("-f,--foreground", o.foreground, "stay in the foreground");
    app.add_flag("-d,--debug", o.debug, "log every FUSE request (implies -f)");
    app.add_flag("--no-keeper", o.no_keeper,
                 "serve without the keeper process that restarts a daemon that dies (a crash "
                 "then ends the mount)");
    app.add_flag("--no-xattrs", o.no_xattrs,
                 "answer no extended-attribute request (EOPNOTSUPP; saves the kernel's "
                 "security.capability probe before each write)");
    app.add_flag("--read-only", o.read_only,
                 "serve the db read-only (also -o ro): for a db on a read-only filesystem or a "
                 "shared image");
    app.add_flag("--io-uring", o.io_uring,
                 "serve requests over FUSE io_uring rings where the kernel offers them (also "
                 "-o io_uring; fuse module parameter enable_uring; else /dev/fuse, logged)");
    remote::add_options(app, raw.remote_settings);
    app.add_option("--remote-lease-ms", raw.lease_ms,
                   "with --remote: a node that misses an entry everywhere leases compiling it; "
                   "other nodes wait for it. auto (default): a short lease renewed while it "
                   "compiles, bounded by measured compile times; N: a fixed lease of N ms; "
                   "0: no leases")
        ->type_name("auto|MS");
    app.add_option(
           "--prefetch-job-tag", long_options["prefetch_job_tag"],
           "with --remote: pull every entry of this job into the db in the background at mount "
           "(also -o prefetch_job_tag=TAG)")
        ->type_name("TAG");
    app.add_option("--job-tag", long_options["job_tag"],
                   "with --remote: add every entry this daemon uploads, finds in the shared tier "
                   "or pulls from it to this job's set, for the next job's --prefetch-job-tag "
                   "(also -o job_tag=TAG)")
        ->type_name("TAG");
    app.add_option("-o", raw.dash_o,
                   "mount options: FUSE's, or kcache's db=, max_size=, max_entries=, entry_depth=, "
                   "max_file_size=, durability=, single_flight_ms=, job_tag=, prefetch_job_tag=, "
                   "io_uring")
        ->allow_extra_args(false);
    app.add_option("args", raw.positionals, "[DB] MOUNTPOINT")->required();
}

// -o's comma-separated items: kcache's own applied, the rest kept for FUSE.
core::Status apply_dash_o(const std::vector<std::string>& dash_o, Options& o) {
    for (const std::string& group : dash_o) {
        std::stringstream items(group);
        for (std::string item; std::getline(items, item, ',');) {
            if (item.empty()) continue;
            const auto eq = item.find('=');
            const std::string key = item.substr(0, eq);
            const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
            auto ours = KCACHE_TRY(apply_option(key, value, o));
            if (!ours) o.fuse_options.push_back(item);
            if (item == "ro") o.read_only = true;  // kept for the kernel, which then refuses writes
        }
    }
    return {};
}

// The FUSE options the daemon's own imply, and what --read-only rules out.
core::Status check_fuse_options(Options& o) {
    auto has = [&](const char* option) {
        return std::find(o.fuse_options.begin(), o.fuse_options.end(), option) !=
               o.fuse_options.end();
    };
    // The daemon checks no permissions itself: serving other users is only safe with
    // the kernel checking modes and owners for it.
    if (has("allow_other") && !has("default_permissions"))
        o.fuse_options.push_back("default_permissions");
    if (o.read_only) {
        if (!has("ro")) o.fuse_options.push_back("ro");
        if (o.max_bytes || o.max_entries || o.entry_depth || o.layout_rules) {
            return core::fail(EINVAL,
                              "--max-size, --max-entries and --entry-depth change the db: "
                              "not with --read-only");
        }
    }
    return {};
}

// The shared tier and the options that need it: --remote-lease-ms, the job tags.
core::Status resolve_remote(const RawOptions& raw, Options& o) {
    const std::string& lease_ms = raw.lease_ms;
    // The shared tier is on when a server is named: same options and environment as
    // `kcache remote` (remote/settings.hpp), resolved here so a bad one stops start-up.
    if (!remote::configured_urls(raw.remote_settings).empty()) {
        if (o.read_only)
            return core::fail(EINVAL,
                              "--remote writes what it fetches into the db: not with --read-only");
        auto resolved = KCACHE_TRY(remote::resolve(raw.remote_settings));
        o.remote = std::move(resolved);
    }
    if (lease_ms != "auto") {
        std::uint64_t ms = 0;
        const auto [end, ec] =
            std::from_chars(lease_ms.data(), lease_ms.data() + lease_ms.size(), ms);
        if (ec != std::errc() || end != lease_ms.data() + lease_ms.size())
            return core::fail(EINVAL, "--remote-lease-ms: auto, or a number of ms (0: no leases)");
        if (ms && !o.remote)
            return core::fail(EINVAL, "--remote-lease-ms needs a shared tier: give --remote URL");
        if (ms > 3'600'000) return core::fail(ERANGE, "--remote-lease-ms: over an hour");
        if (o.remote) o.remote->lease_ms = static_cast<std::int64_t>(ms);
    } else if (o.remote && !o.remote->read_only) {
        o.remote->lease_ms = remote::Options::kLeaseRenewed;  // the default: renewed leases
    }
    if (!o.prefetch_job_tag.empty() && !o.remote)
        return core::fail(EINVAL, "--prefetch-job-tag needs a shared tier: give --remote URL");
    if (!o.job_tag.empty()) {
        if (!o.remote)
            return core::fail(EINVAL, "--job-tag needs a shared tier: give --remote URL");
        if (o.remote->read_only) {
            return core::fail(EINVAL,
                              "--job-tag adds entries to a job's set in the shared tier: not with "
                              "--remote-read-only");
        }
    }
    return {};
}

// The daemon changes its working directory to / when it detaches, and serves statfs
// (df, stat -f) from the db's path ever after: a relative path would then name another
// place. Made absolute here, against the directory the command was started in.
core::Status make_paths_absolute(Options& o) {
    for (std::string* path : {&o.db, &o.mountpoint}) {
        std::error_code ec;
        auto absolute = std::filesystem::absolute(*path, ec);
        if (ec) return core::fail(ec.value(), fmt::format("{}: {}", *path, ec.message()));
        auto normal = absolute.lexically_normal();
        if (!normal.has_filename() && normal.has_relative_path())  // "a/" -> "a"
            normal = normal.parent_path();
        *path = normal.string();
    }
    return {};
}

}  // namespace

core::Result<Options> parse_options(int argc, char** argv) {
    Options o;
    CLI::App app{"kcache-fsd: mount a kcache db as a directory for compilers", "kcache-fsd"};
    RawOptions raw;
    declare_options(app, o, raw);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
        Options help_only;
        help_only.help = app.help();
        return help_only;
    } catch (const CLI::ParseError& e) {
        return core::fail(EINVAL, e.what());
    }
    if (raw.positionals.size() > 2)
        return core::fail(EINVAL, "too many arguments: [DB] MOUNTPOINT");
    o.mountpoint = raw.positionals.back();
    if (raw.positionals.size() == 2) o.db = raw.positionals.front();
    for (const auto& [key, value] : raw.long_options) {
        if (value.empty()) continue;
        KCACHE_TRY(apply_option(key, value, o));
    }
    if (!raw.layout_rules_file.empty()) {
        std::ifstream in(raw.layout_rules_file, std::ios::binary);
        if (!in) return core::fail(ENOENT, "cannot read layout rules " + raw.layout_rules_file);
        std::ostringstream text;
        text << in.rdbuf();
        o.layout_rules = text.str();
    }
    KCACHE_TRY(apply_dash_o(raw.dash_o, o));
    KCACHE_TRY(check_fuse_options(o));
    KCACHE_TRY(resolve_remote(raw, o));
    if (o.debug) o.foreground = true;
    if (o.db.empty()) o.db = core::default_db_path();
    KCACHE_TRY(make_paths_absolute(o));
    return o;
}

}  // namespace kcache::fsd
