#include "elf.hpp"

#include <cerrno>

#include <fmt/format.h>

#include "bytes.hpp"

namespace kcache::loader::detail {
namespace {

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

// The program header table and every segment's file bytes lie inside the file: a
// cubin cut short in its segments is damaged even when its sections are whole.
core::Status check_segments(const Bytes& in, std::uint64_t phoff, std::uint16_t phentsize,
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
        Cursor ph(*in.slice(phoff + i * kPhdrSize, kPhdrSize));
        ph.skip(4 + 4);  // p_type, p_flags
        const auto offset = ph.next<std::uint64_t>();
        ph.skip(8 + 8);  // p_vaddr, p_paddr
        const auto filesz = ph.next<std::uint64_t>();
        if (!in.contains(offset, filesz)) {
            return damaged(what, fmt::format("segment {} [{}, +{}) runs past the end of the file "
                                             "({} bytes)",
                                             i, offset, filesz, in.size()));
        }
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
    const Bytes in(bytes);
    if (!is_elf(bytes)) return fail(ENOEXEC, fmt::format("{}: no ELF header", what));
    if (bytes.size() < kEhdrSize) {
        return damaged(
            what, fmt::format("ELF header truncated ({} of {} bytes)", bytes.size(), kEhdrSize));
    }
    const auto cls = static_cast<unsigned char>(bytes[4]);
    const auto data = static_cast<unsigned char>(bytes[5]);
    if (cls != 2) return fail(ENOEXEC, fmt::format("{}: not a 64-bit ELF file", what));
    if (data != 1) return fail(ENOEXEC, fmt::format("{}: not a little-endian ELF file", what));

    ElfFile elf;
    elf.osabi = static_cast<std::uint8_t>(bytes[7]);
    elf.abi_version = static_cast<std::uint8_t>(bytes[8]);
    Cursor header(bytes.substr(16, kEhdrSize - 16));
    elf.type = header.next<std::uint16_t>();
    elf.machine = header.next<std::uint16_t>();
    header.skip(4 + 8);  // e_version, e_entry
    const auto phoff = header.next<std::uint64_t>();
    const auto shoff = header.next<std::uint64_t>();
    elf.flags = header.next<std::uint32_t>();
    header.skip(2);  // e_ehsize
    const auto phentsize = header.next<std::uint16_t>();
    std::uint64_t phnum = header.next<std::uint16_t>();
    const auto shentsize = header.next<std::uint16_t>();
    std::uint64_t shnum = header.next<std::uint16_t>();
    std::uint64_t shstrndx = header.next<std::uint16_t>();

    if (shoff == 0) {
        if (shnum != 0) return damaged(what, "section headers declared at offset 0");
        if (auto status = check_segments(in, phoff, phentsize, phnum, what); !status) {
            return tl::unexpected(status.error());
        }
        return elf;  // no sections (a stripped image): nothing to describe
    }
    if (shentsize != kShdrSize) {
        return damaged(what,
                       fmt::format("section header size {} (expected {})", shentsize, kShdrSize));
    }
    // Section 0 holds the real count and string-table index when they do not fit the
    // 16-bit header fields (e_shnum == 0, e_shstrndx == SHN_XINDEX).
    const auto first = in.slice(shoff, kShdrSize);
    if (!first) {
        return damaged(what, fmt::format("section header table at {} is past the end of the "
                                         "file ({} bytes)",
                                         shoff, bytes.size()));
    }
    if (shnum == 0) shnum = Bytes(*first).le<std::uint64_t>(32).value_or(0);
    if (phnum == kPnXnum) phnum = Bytes(*first).le<std::uint32_t>(44).value_or(0);
    if (auto status = check_segments(in, phoff, phentsize, phnum, what); !status) {
        return tl::unexpected(status.error());
    }
    if (shstrndx == kShnXindex) shstrndx = Bytes(*first).le<std::uint32_t>(40).value_or(0);
    if (shnum == 0) return damaged(what, "no sections");
    if (shnum > (bytes.size() - shoff) / kShdrSize) {
        return damaged(what, fmt::format("{} section headers at {} run past the end of the "
                                         "file ({} bytes)",
                                         shnum, shoff, bytes.size()));
    }

    elf.sections.resize(static_cast<std::size_t>(shnum));
    for (std::size_t i = 0; i < elf.sections.size(); ++i) {
        Cursor sh(*in.slice(shoff + i * kShdrSize, kShdrSize));
        ElfSection& s = elf.sections[i];
        s.index = static_cast<std::uint32_t>(i);
        sh.skip(4);  // sh_name, resolved below
        s.type = sh.next<std::uint32_t>();
        s.flags = sh.next<std::uint64_t>();
        sh.skip(8);  // sh_addr
        s.offset = sh.next<std::uint64_t>();
        s.size = sh.next<std::uint64_t>();
        s.link = sh.next<std::uint32_t>();
        s.info = sh.next<std::uint32_t>();
        sh.skip(8);  // sh_addralign
        s.entsize = sh.next<std::uint64_t>();
        if (i == 0 || s.type == kShtNobits || s.type == kShtNull) continue;
        const auto section_bytes = in.slice(s.offset, s.size);
        if (!section_bytes) {
            return damaged(what, fmt::format("section {} [{}, +{}) runs past the end of the "
                                             "file ({} bytes)",
                                             i, s.offset, s.size, bytes.size()));
        }
        s.data = *section_bytes;
    }

    if (shstrndx == 0 || shstrndx >= elf.sections.size()) {
        return damaged(what, fmt::format("section name table index {} out of range", shstrndx));
    }
    const ElfSection& names = elf.sections[static_cast<std::size_t>(shstrndx)];
    if (names.type != kShtStrtab) {
        return damaged(what, fmt::format("section name table {} is not a string table", shstrndx));
    }
    const Bytes name_bytes(names.data);
    for (std::size_t i = 1; i < elf.sections.size(); ++i) {
        const auto name_offset = in.le<std::uint32_t>(shoff + i * kShdrSize).value_or(0);
        const auto name = name_bytes.c_str(name_offset);
        if (!name) {
            return damaged(what, fmt::format("section {}: name offset {} outside the name "
                                             "table ({} bytes)",
                                             i, name_offset, names.data.size()));
        }
        elf.sections[i].name = *name;
    }
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
    const Bytes strings(elf.sections[table->link].data);
    const Bytes entries(table->data);
    const std::size_t count = table->data.size() / kSymSize;
    symbols.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
        Cursor sym(*entries.slice(i * kSymSize, kSymSize));
        ElfSymbol s;
        const auto name_offset = sym.next<std::uint32_t>();
        s.info = sym.next<std::uint8_t>();
        s.other = sym.next<std::uint8_t>();
        s.shndx = sym.next<std::uint16_t>();
        s.value = sym.next<std::uint64_t>();
        s.size = sym.next<std::uint64_t>();
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
