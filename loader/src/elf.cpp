#include "elf.hpp"

#include <cerrno>

#include <fmt/format.h>

#include "kcache/core/byte_reader.hpp"

namespace kcache::loader::detail {
namespace {

using core::ByteReader;
using core::fail;

constexpr std::size_t kEhdrSize = 64;
constexpr std::size_t kShdrSize = 64;
constexpr std::size_t kSymSize = 24;
constexpr std::size_t kPhdrSize = 56;
constexpr std::uint16_t kShnXindex = 0xffff;
constexpr std::uint16_t kPnXnum = 0xffff;

tl::unexpected<core::Error> damaged(std::string_view what, const std::string& why) {
    return fail(EIO, fmt::format("{}: {}", what, why));
}
// A read the ByteReader refused (its message already names `what`).
tl::unexpected<core::Error> damaged(const core::Error& error) {
    return fail(EIO, error.message);
}

struct SectionHeader {
    std::uint32_t name = 0, type = 0;
    std::uint64_t flags = 0, addr = 0, offset = 0, size = 0;
    std::uint32_t link = 0, info = 0;
    std::uint64_t addralign = 0, entsize = 0;
};

Result<SectionHeader> section_header(const ByteReader& in, std::uint64_t at) {
    auto sh = KCACHE_TRY(in.sub(at, kShdrSize));
    SectionHeader h;
    KCACHE_TRY(sh.read(h.name, h.type, h.flags, h.addr, h.offset, h.size, h.link, h.info,
                       h.addralign, h.entsize));
    return h;
}

// The program header table and every segment's file bytes lie inside the file: a
// cubin cut short in its segments is damaged even when its sections are whole.
core::Status check_segments(const ByteReader& in, std::uint64_t phoff, std::uint16_t phentsize,
                            std::uint64_t phnum, std::string_view what) {
    if (phnum == 0) return {};
    if (phentsize != kPhdrSize) {
        return damaged(what,
                       fmt::format("program header size {} (expected {})", phentsize, kPhdrSize));
    }
    if (phoff > in.size() || phnum > (in.size() - phoff) / kPhdrSize) {
        return damaged(what, fmt::format("{} program headers at {} run past the end of the file "
                                         "({} bytes)",
                                         phnum, phoff, in.size()));
    }
    for (std::uint64_t i = 0; i < phnum; ++i) {
        auto ph = in.sub(phoff + i * kPhdrSize, kPhdrSize);
        if (!ph) return damaged(ph.error());
        std::uint32_t type = 0, flags = 0;
        std::uint64_t offset = 0, vaddr = 0, paddr = 0, filesz = 0;
        if (auto s = ph->read(type, flags, offset, vaddr, paddr, filesz); !s)
            return damaged(s.error());
        if (!in.contains(offset, filesz)) {
            return damaged(what, fmt::format("segment {} [{}, +{}) runs past the end of the file "
                                             "({} bytes)",
                                             i, offset, filesz, in.size()));
        }
    }
    return {};
}

// The `shnum` section headers at `shoff`, each section's bytes checked to lie in the
// file; `name_offsets`: each one's name in the section name table, resolved by
// name_sections.
core::Status read_sections(const ByteReader& in, std::uint64_t shoff, std::uint64_t shnum,
                           std::string_view bytes, std::string_view what, ElfFile& elf,
                           std::vector<std::uint32_t>& name_offsets) {
    elf.sections.resize(static_cast<std::size_t>(shnum));
    name_offsets.resize(elf.sections.size());
    for (std::size_t i = 0; i < elf.sections.size(); ++i) {
        const auto sh = section_header(in, shoff + i * kShdrSize);
        if (!sh) return damaged(sh.error());
        ElfSection& s = elf.sections[i];
        s.index = static_cast<std::uint32_t>(i);
        name_offsets[i] = sh->name;  // resolved by name_sections
        s.type = sh->type;
        s.flags = sh->flags;
        s.offset = sh->offset;
        s.size = sh->size;
        s.link = sh->link;
        s.info = sh->info;
        s.entsize = sh->entsize;
        if (i == 0 || s.type == kShtNobits || s.type == kShtNull) continue;
        const auto section_bytes = in.slice(s.offset, s.size);
        if (!section_bytes) {
            return damaged(what, fmt::format("section {} [{}, +{}) runs past the end of the "
                                             "file ({} bytes)",
                                             i, s.offset, s.size, bytes.size()));
        }
        s.data = *section_bytes;
    }
    return {};
}

// Each section's name, from the section name table (section `shstrndx`).
core::Status name_sections(std::uint64_t shstrndx, const std::vector<std::uint32_t>& name_offsets,
                           std::string_view what, ElfFile& elf) {
    if (shstrndx == 0 || shstrndx >= elf.sections.size()) {
        return damaged(what, fmt::format("section name table index {} out of range", shstrndx));
    }
    const ElfSection& names = elf.sections[static_cast<std::size_t>(shstrndx)];
    if (names.type != kShtStrtab) {
        return damaged(what, fmt::format("section name table {} is not a string table", shstrndx));
    }
    const ByteReader name_bytes(names.data, what);
    for (std::size_t i = 1; i < elf.sections.size(); ++i) {
        const auto name = name_bytes.c_str(name_offsets[i]);
        if (!name) {
            return damaged(what, fmt::format("section {}: name offset {} outside the name "
                                             "table ({} bytes)",
                                             i, name_offsets[i], names.data.size()));
        }
        elf.sections[i].name = *name;
    }
    return {};
}

}  // namespace

const ElfSection* ElfFile::find(std::string_view name) const {
    for (const auto& section : sections) {
        if (section.name == name) return &section;
    }
    return nullptr;
}

bool is_elf(std::string_view bytes) {
    return bytes.substr(0, 4) == std::string_view(
                                     "\x7f"
                                     "ELF",
                                     4);
}

Result<ElfFile> parse_elf(std::string_view bytes, std::string_view what) {
    const ByteReader in(bytes, what);
    if (!is_elf(bytes)) return fail(ENOEXEC, fmt::format("{}: no ELF header", what));
    if (bytes.size() < kEhdrSize) {
        return damaged(
            what, fmt::format("ELF header truncated ({} of {} bytes)", bytes.size(), kEhdrSize));
    }
    auto header = in.sub(0, kEhdrSize);
    if (!header) return damaged(header.error());
    std::uint32_t magic = 0;
    std::uint8_t cls = 0, data = 0, ident_version = 0;
    ElfFile elf;
    if (auto s = header->read(magic, cls, data, ident_version, elf.osabi, elf.abi_version); !s) {
        return damaged(s.error());
    }
    if (cls != 2) return fail(ENOEXEC, fmt::format("{}: not a 64-bit ELF file", what));
    if (data != 1) return fail(ENOEXEC, fmt::format("{}: not a little-endian ELF file", what));

    std::uint32_t version = 0;
    std::uint64_t entry = 0, phoff = 0, shoff = 0;
    std::uint16_t ehsize = 0, phentsize = 0, phnum16 = 0, shentsize = 0, shnum16 = 0,
                  shstrndx16 = 0;
    if (auto s = header->seek(16); !s) return damaged(s.error());
    if (auto s = header->read(elf.type, elf.machine, version, entry, phoff, shoff, elf.flags,
                              ehsize, phentsize, phnum16, shentsize, shnum16, shstrndx16);
        !s) {
        return damaged(s.error());
    }
    std::uint64_t phnum = phnum16, shnum = shnum16, shstrndx = shstrndx16;

    if (shoff == 0) {
        if (shnum != 0) return damaged(what, "section headers declared at offset 0");
        KCACHE_TRY(check_segments(in, phoff, phentsize, phnum, what));
        return elf;  // no sections (a stripped image): nothing to describe
    }
    if (shentsize != kShdrSize) {
        return damaged(what,
                       fmt::format("section header size {} (expected {})", shentsize, kShdrSize));
    }
    // Section 0 holds the real count and string-table index when they do not fit the
    // 16-bit header fields (e_shnum == 0, e_shstrndx == SHN_XINDEX).
    const auto first = section_header(in, shoff);
    if (!first) {
        return damaged(what, fmt::format("section header table at {} is past the end of the "
                                         "file ({} bytes)",
                                         shoff, bytes.size()));
    }
    if (shnum == 0) shnum = first->size;
    if (phnum == kPnXnum) phnum = first->info;
    KCACHE_TRY(check_segments(in, phoff, phentsize, phnum, what));
    if (shstrndx == kShnXindex) shstrndx = first->link;
    if (shnum == 0) return damaged(what, "no sections");
    if (shnum > (bytes.size() - shoff) / kShdrSize) {
        return damaged(what, fmt::format("{} section headers at {} run past the end of the "
                                         "file ({} bytes)",
                                         shnum, shoff, bytes.size()));
    }

    std::vector<std::uint32_t> name_offsets;
    KCACHE_TRY(read_sections(in, shoff, shnum, bytes, what, elf, name_offsets));
    KCACHE_TRY(name_sections(shstrndx, name_offsets, what, elf));
    return elf;
}

Result<std::vector<ElfSymbol>> parse_symbols(const ElfFile& elf, std::string_view what) {
    std::vector<ElfSymbol> symbols;
    const ElfSection* table = nullptr;
    for (const auto& section : elf.sections) {
        if (section.type == kShtSymtab) {
            table = &section;
            break;
        }
    }
    if (!table) return symbols;
    if (table->entsize != kSymSize) {
        return damaged(what, fmt::format("symbol table entry size {} (expected {})", table->entsize,
                                         kSymSize));
    }
    if (table->link == 0 || table->link >= elf.sections.size() ||
        elf.sections[table->link].type != kShtStrtab) {
        return damaged(
            what, fmt::format("symbol table names section {}, not a string table", table->link));
    }
    const ByteReader strings(elf.sections[table->link].data, what);
    ByteReader entries(table->data, what);
    const std::size_t count = table->data.size() / kSymSize;
    symbols.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
        ElfSymbol s;
        std::uint32_t name_offset = 0;
        if (auto st = entries.read(name_offset, s.info, s.other, s.shndx, s.value, s.size); !st) {
            return damaged(st.error());
        }
        const auto name = strings.c_str(name_offset);
        if (!name) {
            return damaged(what, fmt::format("symbol {}: name offset {} outside the string "
                                             "table",
                                             i, name_offset));
        }
        s.name = *name;
        symbols.push_back(s);
    }
    return symbols;
}

}  // namespace kcache::loader::detail
