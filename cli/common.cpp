#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/units.hpp"
#include "kcache/remote/trust.hpp"

namespace kcache::cli {

void fail(const core::Error& error, std::string_view context) {
    if (context.empty()) throw Failure(error.message);
    throw Failure(core::with_context(error, std::string(context)).message);
}

std::string Cli::db_path() const {
    return db_option.empty() ? core::default_db_path() : db_option;
}

CLI::Validator size_transform() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            if (text == "none") {
                text = "0";
                return {};
            }
            auto bytes = core::parse_size(text);
            if (!bytes) return bytes.error().message;
            text = std::to_string(*bytes);
            return {};
        },
        "", "size");
}

CLI::Validator duration_transform() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            auto ns = core::parse_duration(text);
            if (!ns) return ns.error().message;
            text = std::to_string(*ns);
            return {};
        },
        "", "duration");
}

bool db_missing(const std::string& path) {
    std::error_code ec;
    return !std::filesystem::exists(std::filesystem::path(path) / "data.mdb", ec) && !ec;
}

std::unique_ptr<core::Store> open_store(const Cli& cli, Access access, std::uint32_t entry_depth) {
    const std::string path = cli.db_path();
    if (access != Access::create && db_missing(path)) {
        throw Failure(fmt::format("no db at {} (run `kcache init`)", path));
    }
    core::OpenOptions options;
    options.path = path;
    options.create = access == Access::create;
    options.read_only = access == Access::read;
    options.entry_depth = entry_depth;
    return check(core::Store::open(options));
}

core::EntryInfo find_entry(const core::Txn& txn, std::string_view name) {
    if (name.empty()) throw UsageError("an entry name must not be empty");
    auto exact = txn.find_entry(name);
    if (exact) return std::move(*exact);
    if (exact.error().code != ENOENT) fail(exact.error());

    // Not a full name: accept a unique prefix, as git does for commit hashes.
    constexpr std::size_t kShown = 5;
    std::vector<core::EntryInfo> matches;
    check(txn.for_each_entry([&](const core::EntryInfo& entry) {
        if (entry.name.starts_with(name)) matches.push_back(entry);
        return matches.size() <= kShown;
    }));
    if (matches.size() == 1) return std::move(matches.front());
    if (matches.empty()) throw Failure(fmt::format("no entry {}", name));
    std::string names;
    for (std::size_t i = 0; i < std::min(matches.size(), kShown); ++i) {
        names += (i ? ", " : "") + matches[i].name;
    }
    throw Failure(fmt::format("{} is ambiguous: it starts {}{}", name, names,
                              matches.size() > kShown ? ", ..." : ""));
}

Progress::Progress(std::string label)
    : m_label(std::move(label)), m_enabled(isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() {
    if (m_shown) {
        std::fputs("\r\033[K", stderr);
        std::fflush(stderr);
    }
}

core::ProgressFn Progress::fn() {
    if (!m_enabled) return {};
    return [this](std::uint64_t done, std::uint64_t total) { update(done, total); };
}

void Progress::update(std::uint64_t done, std::uint64_t total) {
    constexpr std::int64_t kIntervalNs = 100'000'000;  // at most ten redraws a second
    const std::int64_t now = core::steady_ns();
    if (m_shown && done < total && now - m_last_ns < kIntervalNs) return;
    m_last_ns = now;
    m_shown = true;
    if (total > 0) {
        fmt::print(stderr, "\r{}: {}/{} ({}%)\033[K", m_label, done, total,
                   std::min<std::uint64_t>(done, total) * 100 / total);
    } else {
        fmt::print(stderr, "\r{}: {}\033[K", m_label, done);
    }
    std::fflush(stderr);
}

Table::Table(std::vector<std::string> header, std::vector<bool> right_aligned)
    : m_header(std::move(header)), m_right(std::move(right_aligned)) {
    m_right.resize(m_header.size(), false);
}

void Table::add(std::vector<std::string> row) {
    row.resize(m_header.size());
    m_rows.push_back(std::move(row));
}

void Table::print() const {
    std::vector<std::size_t> width(m_header.size());
    auto measure = [&](const std::vector<std::string>& row) {
        for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    };
    measure(m_header);
    for (const auto& row : m_rows) measure(row);

    auto print_row = [&](const std::vector<std::string>& row) {
        std::string line;
        for (std::size_t i = 0; i < row.size(); ++i) {
            const bool last = i + 1 == row.size();
            const std::string pad(width[i] - row[i].size(), ' ');
            if (i) line += "  ";
            if (m_right[i]) {
                line += pad + row[i];
            } else {
                line += row[i];
                if (!last) line += pad;
            }
        }
        line.erase(line.find_last_not_of(' ') + 1);
        fmt::print("{}\n", line);
    };
    const bool has_header = std::any_of(m_header.begin(), m_header.end(),
                                        [](const std::string& h) { return !h.empty(); });
    if (has_header) print_row(m_header);
    for (const auto& row : m_rows) print_row(row);
}

void print_json(const nlohmann::json& value) {
    fmt::print("{}\n", value.dump(2));
}

std::string count(std::uint64_t n, std::string_view one, std::string_view many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
}

std::string age_since(const core::Store& store, std::int64_t time_ns) {
    if (time_ns == 0) return "-";
    return core::format_age(std::max<std::int64_t>(0, store.now_ns() - time_ns)) + " ago";
}

std::string size_or_none(std::uint64_t bytes) {
    return bytes == 0 ? "none" : core::format_size(bytes);
}

nlohmann::json config_json(const core::Config& config) {
    return {
        {"entry_depth", config.entry_depth}, {"max_bytes", config.max_bytes},
        {"max_entries", config.max_entries}, {"low_mark_percent", config.low_mark_percent},
        {"max_events", config.max_events},   {"layout_rules", config.layout_rules},
    };
}

nlohmann::json entry_json(const core::Store& store, const core::EntryInfo& entry) {
    const std::int64_t now = store.now_ns();
    const std::string signer = remote::signer_of(entry);
    return {
        {"name", entry.name},
        {"ino", entry.ino},
        {"kind", entry.kind == core::EntryKind::stem ? "stem" : "directory"},
        {"layout", entry.by_rule ? "rule" : "fallback"},
        {"producer", core::producer_name(entry.producer)},
        {"files", entry.files},
        {"bytes", entry.bytes},
        {"stored_bytes", entry.stored_bytes},
        {"hits", entry.hits},
        {"created_ns", entry.created_ns},
        {"last_access_ns", entry.last_access_ns},
        {"last_access_age_ns", entry.last_access_ns ? now - entry.last_access_ns : 0},
        {"last_hit_ns", entry.last_hit_ns},
        {"pinned", entry.pinned},
        {"populated", entry.populated},
        {"populated_by", {{"pid", entry.populated_by_pid}, {"name", entry.populated_by_name}}},
        // the key id that signed an entry the shared tier supplied; null: unsigned or local
        {"signer", signer.empty() ? nlohmann::json(nullptr) : nlohmann::json(signer)},
    };
}

}  // namespace kcache::cli
