#include "kcache/loader/signature.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kcache::loader {
namespace {

using core::fail;
using Json = nlohmann::ordered_json;  // keeps Triton's signature in argument order

constexpr int kSchemaVersion = 1;
constexpr std::size_t kMaxDepth = 32;
constexpr std::uint32_t kMaxThreadsPerBlock = 1024;  // every CUDA GPU so far
constexpr std::uint32_t kMaxParamBytes = 32764;      // CUDA 12.1+

// nlohmann's parser keeps its own stack, but values are still built per level: refuse
// deep nesting before parsing. Counts brackets outside strings.
bool too_deep(std::string_view text) {
    std::size_t depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > kMaxDepth) return true;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return false;
}

tl::unexpected<Error> bad(std::string_view format, std::string_view why) {
    return fail(EIO, fmt::format("{} signature: {}", format, why));
}

// An unsigned integer field in [min, max]; `fallback` when absent.
Result<std::uint32_t> uint_field(const Json& object, const char* key, std::uint32_t fallback,
                                 std::uint32_t min, std::uint32_t max, std::string_view format) {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_number_unsigned() || it->get<std::uint64_t>() < min ||
        it->get<std::uint64_t>() > max) {
        return bad(format,
                   fmt::format("{} is {}, not an integer in [{}, {}]", key, it->dump(), min, max));
    }
    return static_cast<std::uint32_t>(it->get<std::uint64_t>());
}

// A dimension list [x], [x, y] or [x, y, z] of positive integers.
Result<std::array<std::uint32_t, 3>> dims_field(const Json& object, const char* key,
                                                std::string_view format) {
    std::array<std::uint32_t, 3> dims{1, 1, 1};
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return dims;
    if (!it->is_array() || it->empty() || it->size() > 3) {
        return bad(format, fmt::format("{} is not a list of 1 to 3 integers", key));
    }
    for (std::size_t i = 0; i < it->size(); ++i) {
        const Json& d = (*it)[i];
        if (!d.is_number_unsigned() || d.get<std::uint64_t>() == 0 ||
            d.get<std::uint64_t>() > std::numeric_limits<std::int32_t>::max()) {
            return bad(format,
                       fmt::format("{}[{}] is {}, not a positive integer", key, i, d.dump()));
        }
        dims[i] = static_cast<std::uint32_t>(d.get<std::uint64_t>());
    }
    return dims;
}

Status check_block(const std::array<std::uint32_t, 3>& block, std::string_view format) {
    const std::uint64_t threads = std::uint64_t{block[0]} * block[1] * block[2];
    if (threads > kMaxThreadsPerBlock) {
        return bad(format, fmt::format("a block of {}x{}x{} = {} threads is more than {}", block[0],
                                       block[1], block[2], threads, kMaxThreadsPerBlock));
    }
    return {};
}

Result<std::string> string_field(const Json& object, const char* key, std::string_view format,
                                 bool required) {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) {
        if (required) return bad(format, fmt::format("no {}", key));
        return std::string();
    }
    if (!it->is_string()) return bad(format, fmt::format("{} is not a string", key));
    auto value = it->get<std::string>();
    if (required && value.empty()) return bad(format, fmt::format("{} is empty", key));
    return value;
}

Status check_param_bytes(const std::vector<SignatureParam>& params, std::string_view format) {
    std::uint64_t total = 0;
    for (const auto& p : params) total += p.size;
    if (total > kMaxParamBytes) {
        return bad(format, fmt::format("the parameters take {} bytes, more than CUDA's {}", total,
                                       kMaxParamBytes));
    }
    return {};
}

Result<Signature> parse_kcache(const Json& doc) {
    constexpr std::string_view F = "kcache";
    const Json& version = doc["kcache_signature"];
    if (!version.is_number_unsigned()) return bad(F, "kcache_signature is not a version number");
    if (version.get<std::uint64_t>() > kSchemaVersion) {
        return fail(ENOTSUP, fmt::format("kcache signature version {} is newer than this "
                                         "loader reads ({})",
                                         version.dump(), kSchemaVersion));
    }
    if (version.get<std::uint64_t>() == 0) return bad(F, "kcache_signature is 0");
    Signature sig;
    sig.format = SignatureFormat::kcache;
    auto kernel = KCACHE_TRY(string_field(doc, "kernel", F, true));
    sig.kernel = std::move(kernel);
    auto binary = KCACHE_TRY(string_field(doc, "binary", F, false));
    sig.binary = std::move(binary);

    const auto params = doc.find("params");
    if (params == doc.end() || !params->is_array()) return bad(F, "params is not a list");
    std::vector<SignatureParam> list;
    for (std::size_t i = 0; i < params->size(); ++i) {
        const Json& p = (*params)[i];
        const std::string where = fmt::format("params[{}]", i);
        if (!p.is_object()) return bad(F, where + " is not an object");
        auto name = KCACHE_TRY(string_field(p, "name", F, false));
        auto type = string_field(p, "type", F, true);
        if (!type) return bad(F, fmt::format("{}: {}", where, "no type"));
        SignatureParam param{std::move(name), std::move(*type), 0};
        const auto known = signature_type_size(param.type);
        auto size = uint_field(p, "size", known.value_or(0), 1, kMaxParamBytes, F);
        if (!size)
            return bad(F,
                       fmt::format("{}: size is not an integer in [1, {}]", where, kMaxParamBytes));
        if (param.type == "bytes") {
            if (*size == 0) return bad(F, where + ": type bytes needs a size");
        } else if (!known) {
            return bad(F, fmt::format("{}: unknown type \"{}\"", where, param.type));
        } else if (*size != *known) {
            return bad(F, fmt::format("{}: size {} does not match type {} ({} bytes)", where, *size,
                                      param.type, *known));
        }
        param.size = *size;
        list.push_back(std::move(param));
    }
    KCACHE_TRY(check_param_bytes(list, F));
    sig.params = std::move(list);

    auto block = KCACHE_TRY(dims_field(doc, "block", F));
    KCACHE_TRY(check_block(block, F));
    sig.block = block;
    auto cluster = KCACHE_TRY(dims_field(doc, "cluster", F));
    sig.cluster = cluster;
    sig.shared_memory = KCACHE_TRY(uint_field(doc, "dynamic_shared_memory", 0, 0,
                                              std::numeric_limits<std::int32_t>::max(), F));
    return sig;
}

Result<Signature> parse_triton(const Json& doc) {
    constexpr std::string_view F = "Triton";
    Signature sig;
    sig.format = SignatureFormat::triton;
    auto name = KCACHE_TRY(string_field(doc, "name", F, true));
    sig.kernel = std::move(name);

    std::uint32_t warp_size = 32;
    if (const auto target = doc.find("target"); target != doc.end() && target->is_object()) {
        auto w = KCACHE_TRY(uint_field(*target, "warp_size", 32, 1, 64, F));
        warp_size = w;
    }
    auto warps = KCACHE_TRY(uint_field(doc, "num_warps", 4, 1, kMaxThreadsPerBlock, F));
    sig.block = {warps * warp_size, 1, 1};
    KCACHE_TRY(check_block(sig.block, F));
    auto shared =
        KCACHE_TRY(uint_field(doc, "shared", 0, 0, std::numeric_limits<std::int32_t>::max(), F));
    sig.shared_memory = shared;
    auto cluster = KCACHE_TRY(dims_field(doc, "cluster_dims", F));
    sig.cluster = cluster;

    // Older Triton releases keep {"0": "*fp32", ...} by index; newer ones (in the
    // compiled kernel's source) {"x_ptr": "*fp32", ..., "BLOCK": "constexpr"}.
    const auto signature = doc.find("signature");
    if (signature != doc.end() && !signature->is_null()) {
        if (!signature->is_object()) return bad(F, "signature is not an object");
        std::vector<std::pair<std::string, std::string>> items;
        bool by_index = !signature->empty();
        for (const auto& [key, value] : signature->items()) {
            if (!value.is_string())
                return bad(F, fmt::format("signature[{}] is not a string", key));
            items.emplace_back(key, value.get<std::string>());
            by_index = by_index && !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
                           return c >= '0' && c <= '9';
                       });
        }
        if (by_index) {
            auto index = [](const std::string& k) {
                unsigned long v = 0;
                std::from_chars(k.data(), k.data() + k.size(), v);
                return v;
            };
            std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
                return index(a.first) < index(b.first);
            });
        }
        std::vector<SignatureParam> list;
        for (auto& [key, type] : items) {
            if (type == "constexpr") continue;  // folded into the kernel, not passed
            const auto size = signature_type_size(type);
            if (!size) return bad(F, fmt::format("signature[{}]: unknown type \"{}\"", key, type));
            list.push_back(SignatureParam{by_index ? std::string() : key, type, *size});
        }
        KCACHE_TRY(check_param_bytes(list, F));
        sig.params = std::move(list);
    }
    return sig;
}

}  // namespace

std::string_view signature_format_name(SignatureFormat f) {
    return f == SignatureFormat::kcache ? "kcache" : "triton";
}

std::optional<std::uint32_t> signature_type_size(std::string_view type) {
    if (type == "ptr" || (type.size() > 1 && type.front() == '*')) return 8;
    struct Named {
        std::string_view name;
        std::uint32_t size;
    };
    // kcache names, then Triton's (i1 and u1 are passed as 32-bit integers).
    static constexpr Named kTypes[] = {
        {"i8", 1},  {"u8", 1},  {"i16", 2},  {"u16", 2},  {"f16", 2},  {"bf16", 2},
        {"i32", 4}, {"u32", 4}, {"f32", 4},  {"i64", 8},  {"u64", 8},  {"f64", 8},
        {"i1", 4},  {"u1", 4},  {"fp16", 2}, {"fp32", 4}, {"fp64", 8}, {"nvTmaDesc", 128},
    };
    for (const auto& t : kTypes) {
        if (t.name == type) return t.size;
    }
    return std::nullopt;
}

Result<Signature> parse_signature(std::string_view json) {
    if (json.size() > kMaxSignatureBytes) {
        return fail(ENOEXEC, fmt::format("a {}-byte JSON file is too large for a signature "
                                         "(at most {})",
                                         json.size(), kMaxSignatureBytes));
    }
    if (too_deep(json)) {
        return fail(ENOEXEC,
                    fmt::format("JSON nested deeper than {} levels is not a signature", kMaxDepth));
    }
    Json doc;
    try {
        doc = Json::parse(json.begin(), json.end());
    } catch (const Json::exception& e) {
        return fail(ENOEXEC, fmt::format("not JSON ({})", e.what()));
    }
    if (!doc.is_object()) return fail(ENOEXEC, "JSON that is not an object is not a signature");
    try {
        if (doc.contains("kcache_signature")) return parse_kcache(doc);
        const auto name = doc.find("name");
        if (name != doc.end() && name->is_string() && doc.contains("num_warps")) {
            return parse_triton(doc);
        }
    } catch (const Json::exception& e) {  // defensive: every access above is type-checked
        return fail(EIO, fmt::format("signature: {}", e.what()));
    }
    return fail(ENOEXEC,
                "JSON that is neither a kcache signature (no \"kcache_signature\") nor "
                "Triton metadata (no \"name\" and \"num_warps\")");
}

}  // namespace kcache::loader
