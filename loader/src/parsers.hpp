// The format parsers behind inspect(). Each is a pure function over bytes it does not
// own (the results copy what they keep); errors follow introspect.hpp (EIO for a
// damaged input, ENOEXEC for one that is not of the format at all).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "elf.hpp"
#include "kcache/loader/introspect.hpp"

namespace kcache::loader::detail {

// A cubin: an ELF64 file with e_machine EM_CUDA.
Result<BinaryInfo> parse_cubin(std::string_view bytes);
Result<BinaryInfo> parse_cubin(const ElfFile& elf);

// One or more fatbin containers back to back (8-byte aligned, zero padding between
// them allowed), as in a .fatbin file or a host binary's fatbin section. Appends the
// entries to `out.entries`, numbering containers from `first_container`; returns the
// number of containers read.
Result<std::uint32_t> parse_fatbin_containers(std::string_view bytes, std::uint32_t first_container,
                                              const InspectOptions& options, BinaryInfo& out);

// A host ELF file (object, shared library, executable): the fatbins of its
// `.nv_fatbin` and `__nv_relfatbin` sections. ENOEXEC when it has neither.
Result<BinaryInfo> parse_host_elf(const ElfFile& elf, const InspectOptions& options);

// PTX text: true when, after white space and comments, it starts with `.version`.
bool looks_like_ptx(std::string_view text);
Result<BinaryInfo> parse_ptx(std::string_view text);

// Decompression of fatbin payloads into exactly `size` bytes (the size the entry
// header declares). EIO when the payload is damaged, could not hold `size` bytes, or
// does not decompress to that size; ENOMEM when `size` bytes cannot be allocated.
Result<std::string> decompress_lz4(std::string_view payload, std::uint64_t size);
Result<std::string> decompress_zstd(std::string_view payload, std::uint64_t size);

// Sets param_bytes and checks that parameter indices are 0..n-1 after sorting (EIO
// naming `what` otherwise).
Status finish_kernel(KernelInfo& kernel, std::string_view what);

}  // namespace kcache::loader::detail
