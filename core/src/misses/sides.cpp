// An entry's files as the comparison of misses sees them (misses_impl.hpp): paths with
// the entry's key normalized, each file's kind, its content.
#include <nlohmann/json.hpp>

#include "kcache/core/roles.hpp"

#include "misses/misses_impl.hpp"

namespace kcache::core::misses {
namespace {

// The part of an entry's name its compiler's key gave it: a node entry's directory
// name, a stem entry's stem. File names holding it are compared with "{key}" in its place.
std::string entry_key(const EntryInfo& e) {
    if (e.kind == EntryKind::stem) return e.stem;
    const auto slash = e.name.rfind('/');
    return slash == std::string::npos ? e.name : e.name.substr(slash + 1);
}

std::string normalized(std::string_view path, const std::string& key) {
    std::string out(path);
    if (key.size() < 8) return out;  // a short name says nothing about a key
    for (auto at = out.find(key); at != std::string::npos; at = out.find(key, at + 5)) {
        out.replace(at, key.size(), "{key}");
    }
    return out;
}

Kind kind_of(const EntryFile& f) {
    const std::string_view name = base_name(f.path);
    // Triton's group file holds the entry's absolute paths; JAX's -atime its last use.
    if (name.starts_with("__grp__") || name.ends_with("-atime")) return Kind::skip;
    if (f.role == Role::signature) return Kind::metadata;
    if (f.role == Role::ir) return Kind::text;
    if (name.ends_with(".py") || name.ends_with(".cpp") || name.ends_with(".h") ||
        name.ends_with(".txt")) {
        return Kind::text;
    }
    return Kind::binary;  // binaries and what no role describes: compared by content
}

}  // namespace

std::string_view base_name(std::string_view path) {
    const auto slash = path.rfind('/');
    return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

Result<Side> files_of(const Txn& txn, const EntryInfo& entry) {
    Side out;
    out.txn = &txn;
    const std::string key = entry_key(entry);
    KCACHE_TRY(txn.for_each_entry_file(entry, [&](const EntryFile& f) {
        if (!f.attr.is_regular() || f.attr.bookkeeping) return true;
        out.files[normalized(f.path, key)] = File{f, kind_of(f), std::nullopt, true};
        return true;
    }));
    return out;
}

bool has_text(const File& f) {
    if (f.held) return !f.held->empty() || (f.whole && f.info.attr.size == 0);
    return f.info.attr.size <= kMaxTextBytes;
}

Result<std::string> content_of(const Side& side, const File& f) {
    if (f.held) return *f.held;
    if (!side.txn || f.info.attr.size > kMaxTextBytes) return std::string();
    auto c = KCACHE_TRY(side.txn->read(f.info.attr.ino));
    return std::string(c.bytes());
}

std::optional<std::map<std::string, std::string>> json_fields(std::string_view bytes) {
    auto doc = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) return std::nullopt;
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : doc.items()) {
        out[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
    return out;
}

}  // namespace kcache::core::misses
