// Offline introspection of GPU binaries: what a cubin, fatbin or PTX file holds,
// without a GPU or the CUDA driver.
//
// inspect() is a pure function over a byte span: it never reads files, allocates at
// most what the input declares (decompression is bounded by InspectOptions), and
// treats every offset and size in the input as hostile. A damaged or crafted input
// is an Error, never undefined behaviour. Thread-safe: no shared state.
//
// Formats (docs/loader.md describes the layouts as found in CUDA 13 output):
//  - cubin: an ELF64 file for EM_CUDA; kernels from the symbol table, parameters from
//    the EIATTR records of `.nv.info.<kernel>`, the SM arch from e_flags.
//  - fatbin: a container (magic 0xBA55ED50) of cubin, PTX and LTO-IR entries, as a
//    plain file or embedded in a host ELF object, library or executable
//    (`.nv_fatbin`, `__nv_relfatbin` sections).
//  - ptx: text with `.version`, `.target sm_XX` and `.entry` kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"

#if defined(__GNUC__)
#define KCACHE_LOADER_API __attribute__((visibility("default")))
#else
#define KCACHE_LOADER_API
#endif

namespace kcache::loader {

using core::Error;
using core::Result;
using core::Status;

enum class Format { cubin, fatbin, ptx };
// What a fatbin entry holds. `unknown` keeps entries of kinds this version does not
// know listed (with their raw kind number) instead of failing the whole container.
enum class EntryKind { cubin, ptx, ltoir, unknown };
enum class Compression { none, lz4, zstd, unknown };

KCACHE_LOADER_API std::string_view format_name(Format format);       // "cubin", "fatbin", "ptx"
KCACHE_LOADER_API std::string_view kind_name(EntryKind kind);        // "cubin", "ptx", "ltoir", ...
KCACHE_LOADER_API std::string_view compression_name(Compression c);  // "none", "lz4", "zstd"

// One kernel parameter as the launch sees it: the argument at `index` is copied to
// `offset` in the parameter buffer and is `size` bytes long.
struct ParamInfo {
    std::uint32_t index = 0;
    std::uint32_t offset = 0;
    std::uint32_t size = 0;

    bool operator==(const ParamInfo&) const = default;
};

struct KernelInfo {
    std::string name;               // the symbol as linked (C++ names are mangled)
    std::vector<ParamInfo> params;  // sorted by index; indices are 0..n-1
    // Bytes of the parameter buffer: the end of the last parameter (0 without any).
    std::uint32_t param_bytes = 0;
};

struct FatbinEntry {
    std::uint32_t container = 0;  // which fatbin container (a host binary may hold many)
    EntryKind kind = EntryKind::unknown;
    std::uint16_t raw_kind = 0;           // the kind number in the entry header
    std::string arch;                     // "sm_90", "sm_90a", "sm_100f"
    std::uint64_t size = 0;               // payload bytes as stored in the container
    std::uint64_t uncompressed_size = 0;  // == size when not compressed
    bool compressed = false;
    Compression compression = Compression::none;
    bool debug = false;       // compiled with -G (or -g for PTX)
    std::uint64_t flags = 0;  // raw entry flags (docs/loader.md)
    std::string ptx_version;  // PTX entries: "9.0"
    // Kernels of a cubin or PTX payload, when its bytes could be read (uncompressed,
    // or decompressed within InspectOptions). Not set for LTO-IR or unknown entries.
    std::optional<std::vector<KernelInfo>> kernels;
};

struct BinaryInfo {
    Format format = Format::cubin;
    // cubin and PTX: "sm_90", "sm_90a", ...; fatbin: empty (each entry has its own).
    std::string arch;
    std::string ptx_version;           // PTX only: the `.version` directive, "9.0"
    std::vector<KernelInfo> kernels;   // cubin and PTX; empty for a fatbin
    std::vector<FatbinEntry> entries;  // fatbin only
    // A fatbin found inside a host ELF file: the section(s) it came from,
    // ".nv_fatbin" or "__nv_relfatbin". Empty for a plain .fatbin file.
    std::string host_section;

    // The kernel called `name` (cubin, PTX), or nullptr.
    KCACHE_LOADER_API const KernelInfo* find_kernel(std::string_view name) const;
};

struct InspectOptions {
    // Compressed fatbin entries (zstd, LZ4) are decompressed to list their kernels
    // when their declared size is at most this; larger ones are listed without.
    std::uint64_t max_decompressed_size = 256u << 20;
    bool decompress = true;
};

// Recognizes the format and describes the binary. Errors:
//  ENOEXEC  not a cubin, fatbin or PTX file (the message says what it looks like);
//  EIO      a cubin, fatbin or PTX file that is damaged or inconsistent (the message
//           names the part: "cubin: section 12 runs past the end of the file");
//  ENOMEM   the declared sizes could not be allocated.
KCACHE_LOADER_API Result<BinaryInfo> inspect(std::string_view bytes,
                                             const InspectOptions& options = {});

// Checks launch arguments against a kernel before anything reaches a GPU: one size
// per parameter, in order, each equal to the parameter's size. EINVAL with a message
// naming the kernel and the first mismatch ("axpy: argument 1 is 4 bytes, the kernel
// expects 8") otherwise.
KCACHE_LOADER_API Status check_arguments(const KernelInfo& kernel,
                                         const std::vector<std::size_t>& sizes);

}  // namespace kcache::loader
