// A minimal, defensive ELF64 little-endian reader: headers, sections, symbols.
//
// Enough for cubins (EM_CUDA) and for finding the fatbin sections of host objects,
// libraries and executables. Everything returned views the input bytes: the input
// must outlive the ElfFile. Every section's [offset, offset + size) is checked to lie
// inside the input (SHT_NOBITS sections have no bytes), every name offset inside its
// string table; a violation is an EIO error prefixed with `what` ("cubin: ...").
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"

namespace kcache::loader::detail {

using core::Result;

inline constexpr std::uint16_t kEmCuda = 190;  // e_machine of a cubin
inline constexpr std::uint32_t kShtNull = 0;
inline constexpr std::uint32_t kShtSymtab = 2;
inline constexpr std::uint32_t kShtStrtab = 3;
inline constexpr std::uint32_t kShtNote = 7;
inline constexpr std::uint32_t kShtNobits = 8;
inline constexpr std::uint8_t kSttFunc = 2;

struct ElfSection {
    std::uint32_t index = 0;
    std::string_view name;
    std::uint32_t type = 0;
    std::uint64_t flags = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    std::uint32_t link = 0;
    std::uint32_t info = 0;
    std::uint64_t entsize = 0;
    std::string_view data;  // the section's bytes; empty for SHT_NOBITS
};

struct ElfSymbol {
    std::string_view name;
    std::uint8_t info = 0;   // bind << 4 | type
    std::uint8_t other = 0;  // visibility, and CUDA's attributes (0x10: kernel entry)
    std::uint16_t shndx = 0;
    std::uint64_t value = 0;
    std::uint64_t size = 0;

    std::uint8_t type() const { return info & 0xf; }
};

struct ElfFile {
    std::uint8_t osabi = 0;
    std::uint8_t abi_version = 0;
    std::uint16_t type = 0;
    std::uint16_t machine = 0;
    std::uint32_t flags = 0;
    std::vector<ElfSection> sections;  // index 0 is the null section

    const ElfSection* find(std::string_view name) const;  // first with that name
};

// True when `bytes` start with the ELF magic (any class, any machine).
bool is_elf(std::string_view bytes);

// Parses the header and the section table. ENOEXEC for an ELF file the loader cannot
// read at all (32-bit, big-endian); EIO for a damaged one.
Result<ElfFile> parse_elf(std::string_view bytes, std::string_view what);

// The symbols of the (first) SHT_SYMTAB section; empty when there is none. Names are
// checked against the table's linked string section.
Result<std::vector<ElfSymbol>> parse_symbols(const ElfFile& elf, std::string_view what);

}  // namespace kcache::loader::detail
