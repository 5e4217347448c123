#include "options.hpp"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kcache/core/units.hpp"

namespace kcache::fsd {
namespace {

core::Status parse_durability(const std::string& text, core::Durability& out) {
    if (text == "full") out = core::Durability::full;
    else if (text == "batched") out = core::Durability::none;  // synced by the daemon's timer
    else if (text == "none") out = core::Durability::none;
    else return core::fail(EINVAL, fmt::format("invalid durability '{}' (full, batched, none)", text));
    return {};
}

// Applies one of kcache's own key=value options; false if the key is not ours.
core::Result<bool> apply_option(const std::string& key, const std::string& value, Options& o) {
    auto size = [&](std::uint64_t& out) -> core::Result<bool> {
        auto v = core::parse_size(value);
        if (!v) return tl::unexpected(v.error());
        out = *v;
        return true;
    };
    if (key == "db") {
        o.db = value;
        return true;
    }
    if (key == "max_size") return size(o.max_bytes);
    if (key == "max_file_size") return size(o.max_file_size);
    if (key == "max_entries" || key == "entry_depth") {
        char* end = nullptr;
        const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
        if (value.empty() || *end) return core::fail(EINVAL, fmt::format("invalid {} '{}'", key, value));
        if (key == "max_entries") o.max_entries = v;
        else o.entry_depth = static_cast<std::uint32_t>(v);
        return true;
    }
    if (key == "durability") {
        if (auto s = parse_durability(value, o.durability); !s) return tl::unexpected(s.error());
        if (value == "none") o.sync_interval_s = 0;
        return true;
    }
    return false;
}

}  // namespace

core::Result<Options> parse_options(int argc, char** argv) {
    Options o;
    CLI::App app{"kcache-fsd: mount a kcache db as a directory for compilers", "kcache-fsd"};
    std::vector<std::string> positionals, dash_o;
    std::string max_size, max_file_size, durability = "batched";
    app.add_option("--db", o.db, "cache db directory (default: $KCACHE_DB, else ~/.cache/kcache/db)");
    app.add_option("--max-size", max_size, "evict least-recently-used entries above this size (e.g. 10G)");
    app.add_option("--max-entries", o.max_entries, "evict least-recently-used entries above this count");
    app.add_option("--entry-depth", o.entry_depth,
                   "the layout's depth fallback: no entry above it, an unknown directory at it is one (new db: 1)");
    std::string layout_rules_file;
    app.add_option("--layout-rules", layout_rules_file,
                   "a layout rules file for compilers kcache does not know (docs/architecture.md); "
                   "it becomes the db's");
    app.add_option("--max-file-size", max_file_size, "largest file a writer may store (default 2G; EFBIG past it)");
    app.add_option("--durability", durability, "full: sync every commit; batched: sync every second; none");
    app.add_flag("-f,--foreground", o.foreground, "stay in the foreground");
    app.add_flag("-d,--debug", o.debug, "log every FUSE request (implies -f)");
    app.add_flag("--read-only", o.read_only,
                 "serve the db read-only (also -o ro): for a db on a read-only filesystem or a shared image");
    app.add_option("-o", dash_o, "mount options: FUSE's, or kcache's db=, max_size=, max_entries=, entry_depth=, max_file_size=, durability=")
        ->allow_extra_args(false);
    app.add_option("args", positionals, "[DB] MOUNTPOINT")->required();
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
        std::fputs(app.help().c_str(), stdout);
        std::exit(0);
    } catch (const CLI::ParseError& e) {
        return core::fail(EINVAL, e.what());
    }
    if (positionals.size() > 2) return core::fail(EINVAL, "too many arguments: [DB] MOUNTPOINT");
    o.mountpoint = positionals.back();
    if (positionals.size() == 2) o.db = positionals.front();
    if (!max_size.empty()) {
        auto v = core::parse_size(max_size);
        if (!v) return tl::unexpected(v.error());
        o.max_bytes = *v;
    }
    if (!max_file_size.empty()) {
        auto v = core::parse_size(max_file_size);
        if (!v) return tl::unexpected(v.error());
        o.max_file_size = *v;
    }
    if (!layout_rules_file.empty()) {
        std::ifstream in(layout_rules_file, std::ios::binary);
        if (!in) return core::fail(ENOENT, "cannot read layout rules " + layout_rules_file);
        std::ostringstream text;
        text << in.rdbuf();
        o.layout_rules = text.str();
    }
    if (auto s = parse_durability(durability, o.durability); !s) return tl::unexpected(s.error());
    if (durability == "none") o.sync_interval_s = 0;
    if (durability == "full") o.sync_interval_s = 0;
    for (const std::string& group : dash_o) {
        std::stringstream items(group);
        for (std::string item; std::getline(items, item, ',');) {
            if (item.empty()) continue;
            const auto eq = item.find('=');
            const std::string key = item.substr(0, eq);
            const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
            auto ours = apply_option(key, value, o);
            if (!ours) return tl::unexpected(ours.error());
            if (!*ours) o.fuse_options.push_back(item);
            if (item == "ro") o.read_only = true;  // kept for the kernel, which then refuses writes
        }
    }
    auto has = [&](const char* option) {
        return std::find(o.fuse_options.begin(), o.fuse_options.end(), option) != o.fuse_options.end();
    };
    // The daemon checks no permissions itself: serving other users is only safe with
    // the kernel checking modes and owners for it.
    if (has("allow_other") && !has("default_permissions")) o.fuse_options.push_back("default_permissions");
    if (o.read_only) {
        if (!has("ro")) o.fuse_options.push_back("ro");
        if (o.max_bytes || o.max_entries || o.entry_depth || o.layout_rules) {
            return core::fail(EINVAL, "--max-size, --max-entries and --entry-depth change the db: "
                                      "not with --read-only");
        }
    }
    if (o.debug) o.foreground = true;
    if (o.db.empty()) o.db = core::default_db_path();
    return o;
}

}  // namespace kcache::fsd
