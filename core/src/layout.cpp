#include "kcache/core/layout.hpp"

#include <fnmatch.h>
#include <algorithm>
#include <array>

#include <cctype>

#include <fmt/format.h>

namespace kcache::core {
namespace {

bool is_alnum(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0;
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

// Directories that hold the entries of one compiler, or a part of its tree.
constexpr std::array kContainerNames{
    std::string_view("triton"),      std::string_view("inductor"), std::string_view("fxgraph"),
    std::string_view("aotautograd"), std::string_view("jax"),      std::string_view("xla"),
    std::string_view("wave"),        std::string_view("ccache"),   std::string_view("cutlass"),
    std::string_view("cute"),        std::string_view("cutedsl"),  std::string_view("helion"),
    std::string_view("kernels"),     std::string_view("cache"),    std::string_view("kcache"),
};

// Shards (ccache's 0-f, Inductor's two letters) and device numbers sit inside a
// compiler's directory; at the top of the cache a short name is a plain entry. Short
// names are common in any tree, so they are containers only where an entry would
// otherwise not be found, never evidence that a tree is a compiler's (by_rule false).
bool is_shard_name(std::string_view name, std::size_t depth) {
    if (depth <= 1) return false;
    return name.size() <= 2 || std::all_of(name.begin(), name.end(), is_digit);
}

bool is_container_name(std::string_view name) {
    if (name.starts_with("torchinductor_")) return true;  // Inductor's default directory
    return std::find(kContainerNames.begin(), kContainerNames.end(), name) != kContainerNames.end();
}

// Triton names a kernel's directory by the base32 of a SHA-256: 52 of A-Z, 2-7.
bool is_triton_key(std::string_view name) {
    return name.size() == 52 && std::all_of(name.begin(), name.end(), [](char c) {
               return (c >= 'A' && c <= 'Z') || (c >= '2' && c <= '7');
           });
}

bool has_ancestor(const LayoutContext& context, std::string_view name) {
    return std::find(context.ancestors.begin(), context.ancestors.end(), name) !=
           context.ancestors.end();
}

// A file in a directory Inductor shards by two letters of its key.
bool in_shard(const LayoutContext& context) {
    return !context.ancestors.empty() && context.ancestors.back().size() == 2;
}

Producer directory_producer(const LayoutContext& context, std::string_view name) {
    if (has_ancestor(context, "fxgraph") || has_ancestor(context, "aotautograd"))
        return Producer::inductor;
    if (is_triton_key(name)) return Producer::triton;
    return Producer::unknown;  // Wave, kcache's own: decided by the first file's name
}

Producer stem_producer(const LayoutContext& context, std::string_view extension) {
    if (extension == ".best_config") return Producer::helion;
    if (extension == ".mlir") return Producer::cutedsl;
    if (in_shard(context)) return Producer::inductor;  // <xx>/<key>.py, .cpp, .so, ...
    return Producer::unknown;
}

// ccache keeps results (R) and manifests (M) two one-letter levels down.
bool is_ccache_file(const LayoutContext& context, std::string_view name) {
    const auto n = context.ancestors.size();
    return (name.ends_with("R") || name.ends_with("M")) && n >= 2 &&
           context.ancestors[n - 1].size() == 1 && context.ancestors[n - 2].size() == 1;
}

Classified entry(Placement placement, std::string stem, Producer producer, bool by_rule) {
    return Classified{placement, std::move(stem), producer, by_rule};
}

}  // namespace

bool looks_like_hash(std::string_view name) {
    std::size_t run = 0;
    bool digit = false, letter = false;
    for (std::size_t i = 0; i <= name.size(); ++i) {
        if (i < name.size() && is_alnum(name[i])) {
            ++run;
            (is_digit(name[i]) ? digit : letter) = true;
            continue;
        }
        if (run >= 16 && digit && letter) return true;
        run = 0;
        digit = letter = false;
    }
    return false;
}

bool is_bookkeeping_name(std::string_view name) {
    constexpr std::array kExact{
        std::string_view("locks"),       std::string_view("lock"),
        std::string_view("tmp"),         std::string_view("stats"),
        std::string_view("ccache.conf"), std::string_view("CACHEDIR.TAG"),
        std::string_view("__pycache__"),
    };
    if (std::find(kExact.begin(), kExact.end(), name) != kExact.end()) return true;
    if (name.starts_with("tmp")) return true;  // Python's tempfile, CuTe DSL's temp dirs
    if (name.starts_with("_temp_"))
        return true;  // JAX's GFileCache: _temp_<key> renamed into place
    // Inductor's cpp_builder: g++ runs in <stem>_CxxBuild, removed once the .so is built.
    if (name.ends_with("_CxxBuild")) return true;
    if (name.ends_with(".lock") || name.ends_with(".lck") || name.ends_with(".lockfile"))
        return true;
    // SQLite's rollback journal, write-ahead log and shared-memory index: made and
    // dropped per transaction beside a database that is itself one entry.
    if (name.ends_with("-journal") || name.ends_with("-wal") || name.ends_with("-shm")) return true;
    // Temp names: x.tmp, x.tmp.pid_1_2 (Triton), .1.2.tmp (Inductor), x.ABC.tmp (ccache).
    for (auto at = name.find(".tmp"); at != std::string_view::npos;
         at = name.find(".tmp", at + 1)) {
        const std::size_t after = at + 4;
        if (after == name.size()) return true;
        const char c = name[after];
        if (c == '.' || c == '_' || c == '-' || is_digit(c)) return true;
    }
    return false;
}

Result<std::vector<LayoutRule>> parse_layout_rules(std::string_view text) {
    std::vector<LayoutRule> rules;
    std::size_t line_no = 0;
    while (!text.empty()) {
        const auto end = text.find('\n');
        std::string_view line = text.substr(0, end);
        text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
        ++line_no;
        if (const auto hash = line.find('#'); hash != std::string_view::npos)
            line = line.substr(0, hash);
        auto word = [&]() {
            const auto from = line.find_first_not_of(" \t\r");
            if (from == std::string_view::npos) return std::string_view{};
            const auto to = line.find_first_of(" \t\r", from);
            const std::string_view w =
                line.substr(from, to == std::string_view::npos ? line.npos : to - from);
            line = to == std::string_view::npos ? std::string_view{} : line.substr(to);
            return w;
        };
        const std::string_view kind = word();
        if (kind.empty()) continue;
        const std::string_view glob = word();
        LayoutRule rule;
        if (kind == "entry")
            rule.placement = Placement::entry_dir;
        else if (kind == "container")
            rule.placement = Placement::container;
        else if (kind == "ignore")
            rule.placement = Placement::bookkeeping;
        else
            return fail(EINVAL,
                        fmt::format("layout rules, line {}: '{}' is not entry, container or ignore",
                                    line_no, kind));
        if (glob.empty() || !word().empty()) {
            return fail(EINVAL, fmt::format("layout rules, line {}: expected one glob after '{}'",
                                            line_no, kind));
        }
        rule.glob = glob;
        rules.push_back(std::move(rule));
    }
    return rules;
}

Classified classify(const LayoutContext& context, std::string_view name, FileType type) {
    const std::size_t depth = context.ancestors.size() + 1;
    if (context.rules && !context.rules->empty()) {
        std::string path;
        for (std::string_view a : context.ancestors) path.append(a).push_back('/');
        path.append(name);
        for (const LayoutRule& rule : *context.rules) {
            if (::fnmatch(rule.glob.c_str(), path.c_str(), FNM_PATHNAME) != 0) continue;
            if (rule.placement != Placement::entry_dir)
                return entry(rule.placement, {}, Producer::unknown, true);
            if (type == FileType::directory)
                return entry(Placement::entry_dir, {}, Producer::unknown, true);
            return entry(Placement::entry_stem, std::string(name), Producer::unknown, true);
        }
    }
    const bool above_entries = depth < context.entry_depth;
    if (is_bookkeeping_name(name))
        return entry(Placement::bookkeeping, {}, Producer::unknown, true);

    if (type == FileType::directory) {
        if (looks_like_hash(name)) {
            return entry(Placement::entry_dir, {}, directory_producer(context, name), true);
        }
        if (is_container_name(name))
            return entry(Placement::container, {}, Producer::unknown, true);
        if (is_shard_name(name, depth))
            return entry(Placement::container, {}, Producer::unknown, false);
        if (above_entries) return entry(Placement::container, {}, Producer::unknown, false);
        return entry(Placement::entry_dir, {}, Producer::unknown, false);  // the depth fallback
    }

    // Files: the entry of their stem. JAX's pair first: its keys may hold dots.
    for (std::string_view suffix : {std::string_view("-cache"), std::string_view("-atime")}) {
        if (name.ends_with(suffix) &&
            looks_like_hash(name.substr(0, name.size() - suffix.size()))) {
            return entry(Placement::entry_stem,
                         std::string(name.substr(0, name.size() - suffix.size())), Producer::jax,
                         true);
        }
    }
    if (const auto dot = name.find('.'); dot != std::string_view::npos && dot > 0) {
        const std::string_view stem = name.substr(0, dot);
        if (looks_like_hash(stem)) {
            return entry(Placement::entry_stem, std::string(stem),
                         stem_producer(context, name.substr(dot)), true);
        }
    } else if (looks_like_hash(name)) {
        return entry(Placement::entry_stem, std::string(name),
                     is_ccache_file(context, name) ? Producer::ccache : Producer::unknown, true);
    }
    if (above_entries)
        return entry(Placement::container, {}, Producer::unknown, false);  // no entry
    return entry(Placement::entry_stem, std::string(name), Producer::unknown,
                 false);  // a file of its own
}

}  // namespace kcache::core
