// Looking at entries: ls, show, cat.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/entry_files.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/units.hpp"
#include "kcache/remote/trust.hpp"

namespace kcache::cli {
namespace {

struct LsOptions {
    std::string sort = "name";
    bool reverse = false;
    std::optional<std::size_t> limit;
    bool json = false;
};

// name: A to Z; size and hits: largest first; age: most recently used first (as
// `ls -t`). Ties go by name so the order is stable.
bool sorts_before(const std::string& key, const core::EntryInfo& a, const core::EntryInfo& b) {
    if (key == "size" && a.bytes != b.bytes) return a.bytes > b.bytes;
    if (key == "hits" && a.hits != b.hits) return a.hits > b.hits;
    if (key == "age" && a.last_access_ns != b.last_access_ns) {
        return a.last_access_ns > b.last_access_ns;
    }
    return a.name < b.name;
}

int run_ls(const Cli& cli, const LsOptions& opts) {
    auto store = open_store(cli, Access::read);
    auto txn = check(store->read());
    std::vector<core::EntryInfo> entries;
    check(txn.for_each_entry([&](const core::EntryInfo& entry) {
        entries.push_back(entry);
        return true;
    }));
    std::sort(entries.begin(), entries.end(),
              [&](const auto& a, const auto& b) { return sorts_before(opts.sort, a, b); });
    if (opts.reverse) std::reverse(entries.begin(), entries.end());
    if (opts.limit && entries.size() > *opts.limit) entries.resize(*opts.limit);

    if (opts.json) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& entry : entries) out.push_back(entry_json(*store, entry));
        print_json(out);
        return kExitOk;
    }
    if (entries.empty()) return kExitOk;
    Table table({"NAME", "PRODUCER", "FILES", "SIZE", "STORED", "HITS", "ACCESSED", "PINNED"},
                {false, false, true, true, true, true, true, false});
    for (const auto& entry : entries) {
        table.add({entry.name, std::string(core::producer_name(entry.producer)),
                   std::to_string(entry.files), core::format_size(entry.bytes),
                   core::format_size(entry.stored_bytes), std::to_string(entry.hits),
                   age_since(*store, entry.last_access_ns), entry.pinned ? "pinned" : ""});
    }
    table.print();
    return kExitOk;
}

struct ShowOptions {
    std::string name;
    bool json = false;
};

std::string kind_of(const core::EntryFile& file) {
    if (file.attr.is_symlink()) return "symlink";
    return std::string(core::role_name(file.role));
}

int run_show(const Cli& cli, const ShowOptions& opts) {
    auto store = open_store(cli, Access::read);
    auto txn = check(store->read());
    const core::EntryInfo entry = find_entry(txn, opts.name);
    const std::vector<core::EntryFile> files = check(core::entry_files(txn, entry));

    if (opts.json) {
        nlohmann::json list = nlohmann::json::array();
        for (const auto& file : files) {
            nlohmann::json item = {
                {"path", file.path},
                {"role", kind_of(file)},
                {"size", file.attr.size},
                {"mode", file.attr.mode & 07777},
                {"mtime_ns", file.attr.mtime_ns},
            };
            if (file.attr.is_symlink()) {
                item["target"] = file.link_target;
            } else {
                item["digest"] = file.attr.digest.hex();
            }
            list.push_back(std::move(item));
        }
        print_json({{"entry", entry_json(*store, entry)}, {"files", std::move(list)}});
        return kExitOk;
    }

    Table info({"", ""});
    info.add({"name", entry.name});
    info.add({"producer", std::string(core::producer_name(entry.producer))});
    info.add({"files", std::to_string(entry.files)});
    info.add({"size", fmt::format("{} ({} bytes), stored {}", core::format_size(entry.bytes),
                                  entry.bytes, core::format_size(entry.stored_bytes))});
    info.add({"hits", entry.hits ? fmt::format("{} (last {})", entry.hits,
                                               age_since(*store, entry.last_hit_ns))
                                 : std::string("0")});
    info.add({"created", age_since(*store, entry.created_ns)});
    info.add({"last access", age_since(*store, entry.last_access_ns)});
    info.add({"pinned", entry.pinned ? "yes" : "no"});
    if (entry.populated_by_pid || !entry.populated_by_name.empty()) {
        info.add({"populated by",
                  fmt::format("{} (pid {})", entry.populated_by_name, entry.populated_by_pid)});
    }
    if (core::is_fleet_entry(entry)) {
        const std::string signer = remote::signer_of(entry);
        info.add({"signer", signer.empty() ? "none (unsigned)" : signer});
    }
    info.print();
    if (files.empty()) return kExitOk;
    fmt::print("\n");
    Table table({"ROLE", "SIZE", "DIGEST", "PATH"}, {false, true, false, false});
    for (const auto& file : files) {
        const bool link = file.attr.is_symlink();
        table.add({kind_of(file), std::to_string(file.attr.size),
                   link ? std::string("-") : file.attr.digest.hex(),
                   link ? file.path + " -> " + file.link_target : file.path});
    }
    table.print();
    return kExitOk;
}

struct CatOptions {
    std::string name;
    std::string file;
};

// FILE relative to the entry, without "." or empty components; ".." is refused so a
// path cannot leave the entry.
std::string clean_relative(const std::string& file) {
    std::string out;
    std::size_t start = 0;
    while (start <= file.size()) {
        std::size_t end = file.find('/', start);
        if (end == std::string::npos) end = file.size();
        const std::string part = file.substr(start, end - start);
        if (part == "..")
            throw UsageError(fmt::format("FILE must stay inside the entry: {}", file));
        if (!part.empty() && part != ".") out += (out.empty() ? "" : "/") + part;
        start = end + 1;
    }
    return out;
}

void write_stdout(std::string_view bytes) {
    while (!bytes.empty()) {
        const ssize_t n = ::write(STDOUT_FILENO, bytes.data(), bytes.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            throw Failure(fmt::format("writing to stdout: {}", std::strerror(errno)));
        }
        bytes.remove_prefix(static_cast<std::size_t>(n));
    }
}

int run_cat(const Cli& cli, const CatOptions& opts) {
    const std::string relative = clean_relative(opts.file);
    auto store = open_store(cli, Access::read);
    auto txn = check(store->read());
    const core::EntryInfo entry = find_entry(txn, opts.name);
    std::vector<core::EntryFile> nodes;  // directories too: naming one is an error of its own
    check(txn.for_each_entry_file(entry, [&](const core::EntryFile& file) {
        nodes.push_back(file);
        return true;
    }));
    const core::EntryFile* chosen = nullptr;
    if (relative.empty()) {
        std::size_t files = 0;
        for (const auto& node : nodes) {
            if (!node.attr.is_dir()) {
                chosen = &node;
                ++files;
            }
        }
        if (files != 1) {
            throw UsageError(
                fmt::format("entry {} has {} files: name a FILE in it (see `kcache show {}`)",
                            entry.name, files, entry.name));
        }
    } else {
        for (const auto& node : nodes) {
            if (node.path == relative) chosen = &node;
        }
        if (!chosen) throw Failure(fmt::format("entry {} has no file {}", entry.name, relative));
    }
    if (!chosen->attr.is_regular()) {
        throw Failure(fmt::format("{}/{} is not a regular file", entry.name, chosen->path));
    }
    const core::Ino ino = chosen->attr.ino;
    const core::Content content = check(txn.read(ino));
    write_stdout(content.bytes());
    return kExitOk;
}

}  // namespace

void add_entry_commands(CLI::App& app, Cli& cli) {
    {
        auto opts = std::make_shared<LsOptions>();
        auto* sub = app.add_subcommand("ls", "list entries");
        sub->add_option("--sort", opts->sort,
                        "name (A-Z), size (largest first), hits (most first) or age (most "
                        "recently used first)")
            ->type_name("KEY")
            ->check(CLI::IsMember({"name", "size", "hits", "age"}))
            ->capture_default_str();
        sub->add_flag("--reverse", opts->reverse, "reverse the order");
        sub->add_option("--limit", opts->limit, "print at most N entries")->type_name("N");
        sub->add_flag("--json", opts->json, "print as a JSON array");
        on_run(sub, cli, opts, &run_ls);
    }
    {
        auto opts = std::make_shared<ShowOptions>();
        auto* sub = app.add_subcommand("show", "print an entry and its files");
        sub->add_option("HASH", opts->name, "entry name (or a unique prefix)")->required();
        sub->add_flag("--json", opts->json, "print as JSON");
        on_run(sub, cli, opts, &run_show);
    }
    {
        auto opts = std::make_shared<CatOptions>();
        auto* sub = app.add_subcommand("cat", "write a file of an entry to stdout");
        sub->add_option("HASH", opts->name, "entry name (or a unique prefix)")->required();
        sub->add_option("FILE", opts->file,
                        "path relative to the entry (may be left out for a flat-file entry)");
        on_run(sub, cli, opts, &run_cat);
    }
}

}  // namespace kcache::cli
