// Families (misses.hpp): which entries are "the same kernel" across keys, decided per
// layout from the files the compiler stores; and the keys of the families table.
#include "kcache/core/layout.hpp"
#include "misses/misses_impl.hpp"
#include "records.hpp"

namespace kcache::core {
namespace misses {
namespace {

// JAX names an entry <prefix>-<hash>: jit_<function>, pmap_<function>, ...
std::string jax_family(const EntryInfo& e) {
    const auto dash = e.stem.rfind('-');
    if (dash == std::string::npos || dash == 0) return {};
    if (!looks_like_hash(std::string_view(e.stem).substr(dash + 1))) return {};
    return "jax:" + e.stem.substr(0, dash);
}

Result<std::string> family_from_files(const Side& side) {
    for (const auto& [path, f] : side.files) {
        if (f.kind != Kind::metadata || !path.ends_with(".json")) continue;
        const std::string_view name = base_name(path);
        auto bytes = KCACHE_TRY(content_of(side, f));
        auto fields = json_fields(bytes);
        if (!fields) continue;
        auto field = [&](const char* k) -> std::string {
            auto it = fields->find(k);
            return it == fields->end() ? std::string() : it->second;
        };
        // Triton (and Inductor's Triton kernels): <name>.json, the compile's metadata.
        if (!field("name").empty() &&
            (fields->count("triton_version") || fields->count("num_warps"))) {
            return "triton:" + field("name");
        }
        // Wave: <hash>.kernel_info.json.
        if (name.ends_with(".kernel_info.json") && !field("func_name").empty()) {
            return "wave:" + field("func_name");
        }
        // kcache's own layout: kernel.json, the signature (docs/signature.md).
        if (name == "kernel.json" && !field("kernel").empty()) return "kcache:" + field("kernel");
    }
    return std::string();
}

constexpr std::size_t kMaxKeyText = 400;

}  // namespace

std::string text_key(std::string_view text) {
    if (text.size() <= kMaxKeyText && !text.starts_with('#') &&
        text.find('\0') == std::string_view::npos) {
        return std::string(text);
    }
    return "#" + digest_of(text).hex();
}

std::string family_prefix(std::string_view family) {
    std::string key = text_key(family);
    key.push_back('\0');
    return key;
}

std::string family_key(std::string_view family, Ino entry) {
    return family_prefix(family) + records::u64_key(entry);
}

}  // namespace misses

Result<std::string> family_of(const Txn& txn, const EntryInfo& entry) {
    if (entry.kind == EntryKind::stem) {
        if (entry.producer == Producer::jax || entry.stem.starts_with("jit_") ||
            entry.stem.starts_with("pmap_")) {
            return misses::jax_family(entry);
        }
        return std::string();  // Inductor's modules, ccache, CuTe DSL, Helion: opaque
    }
    return misses::family_from_files(KCACHE_TRY(misses::files_of(txn, entry)));
}

}  // namespace kcache::core
