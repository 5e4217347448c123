// Kernel signatures: what a launch needs beyond the binary (docs/signature.md).
//
// Two formats are read:
//  - kcache's own JSON schema ({"kcache_signature": 1, "kernel": ..., "params": [...],
//    "block": [...], "dynamic_shared_memory": ...}), for compilers without a cache
//    format of their own and for hand-made entries;
//  - Triton's metadata JSON (`<kernel>.json` in a Triton cache entry): name,
//    num_warps (the block is num_warps * warp_size threads), shared (dynamic shared
//    memory), num_ctas / cluster_dims, and the argument signature where it has one.
//
// parse_signature() is a pure function over untrusted bytes: any input gives a
// Signature or an Error, never a crash. Errors: ENOEXEC for input that is not JSON or
// is neither format (a Triton group file, Wave's metadata), EIO for a file that claims
// a format but breaks it (a field missing, of the wrong type or out of range; the
// message names the field), ENOTSUP for a kcache schema version newer than this library.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/loader/introspect.hpp"

namespace kcache::loader {

enum class SignatureFormat { kcache, triton };
KCACHE_LOADER_API std::string_view signature_format_name(SignatureFormat f);  // "kcache"

struct SignatureParam {
    std::string name;        // may be empty (Triton signatures keyed by index)
    std::string type;        // "i32", "f16", "ptr", "bytes", ... (docs/signature.md)
    std::uint32_t size = 0;  // bytes the argument takes in the parameter buffer
};

struct Signature {
    SignatureFormat format = SignatureFormat::kcache;
    std::string kernel;  // the kernel's symbol (mangled for C++)
    std::string binary;  // kcache: the entry's file holding it; "" chooses by device
    // The kernel's parameters in order; nullopt when the file does not say (Triton
    // metadata without a signature).
    std::optional<std::vector<SignatureParam>> params;
    std::array<std::uint32_t, 3> block{1, 1, 1};    // threads per block
    std::array<std::uint32_t, 3> cluster{1, 1, 1};  // blocks per cluster
    std::uint32_t shared_memory = 0;                // dynamic shared memory, bytes
};

// The largest signature file read (a signature is a few hundred bytes).
inline constexpr std::size_t kMaxSignatureBytes = 1u << 20;

KCACHE_LOADER_API Result<Signature> parse_signature(std::string_view json);

// Bytes of a scalar type of either format ("i32" 4, "fp16" 2, "ptr" or "*fp32" 8), or
// nullopt for a type without a fixed size ("bytes") or an unknown one.
KCACHE_LOADER_API std::optional<std::uint32_t> signature_type_size(std::string_view type);

}  // namespace kcache::loader
