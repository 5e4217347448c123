// Builders of synthetic cubins, fatbins and host ELF files for the loader tests: exact
// control over every record, so the parsers can be tested without nvcc and fed
// crafted headers. The layouts follow docs/loader.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kcache::test {

// Little-endian appends.
inline void put(std::string& out, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
inline void put_at(std::string& out, std::size_t at, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) {
        out[at + static_cast<std::size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
    }
}
inline std::uint64_t get_at(std::string_view in, std::size_t at, int bytes) {
    std::uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; --i) {
        value = (value << 8) | static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)]);
    }
    return value;
}

// ---- EIATTR records ---------------------------------------------------------------
inline std::string eiattr_value(std::uint8_t format, std::uint8_t attribute, std::uint16_t value) {
    std::string r;
    put(r, format, 1);
    put(r, attribute, 1);
    put(r, value, 2);
    return r;
}
inline std::string eiattr_bytes(std::uint8_t attribute, std::string_view payload) {
    std::string r;
    put(r, 4, 1);
    put(r, attribute, 1);
    put(r, payload.size(), 2);
    r.append(payload);
    return r;
}
// EIATTR_KPARAM_INFO (0x17): size in bits 18..31 of the last word; 0x1f000 as ptxas.
inline std::string kparam_info(std::uint16_t index, std::uint16_t offset, std::uint32_t size) {
    std::string p;
    put(p, 0, 4);
    put(p, index, 2);
    put(p, offset, 2);
    put(p, (std::uint64_t{size} << 18) | 0x1f000u, 4);
    return eiattr_bytes(0x17, p);
}
// EIATTR_KPARAM_INFO_V2 (0x45): size in bits 0..23 of the last word.
inline std::string kparam_info_v2(std::uint16_t index, std::uint16_t offset, std::uint32_t size,
                                  std::uint8_t top = 0) {
    std::string p;
    put(p, 0, 4);
    put(p, index, 2);
    put(p, offset, 2);
    put(p, size | (std::uint32_t{top} << 24), 4);
    return eiattr_bytes(0x45, p);
}

// ---- ELF ----------------------------------------------------------------------------
struct SectionSpec {
    std::string name;
    std::uint32_t type = 1;  // SHT_PROGBITS
    std::string data;
    std::uint32_t info = 0;
};
struct SymbolSpec {
    std::string name;
    std::uint8_t info = 0x12;   // STB_GLOBAL, STT_FUNC
    std::uint8_t other = 0x10;  // CUDA entry
    std::uint16_t shndx = 1;
};
struct ElfSpec {
    std::uint16_t machine = 190;  // EM_CUDA
    std::uint8_t abi_version = 8;
    std::uint32_t flags = 0x6005a04;  // sm_90 as CUDA 13 writes it
    std::vector<SectionSpec> sections;
    std::vector<SymbolSpec> symbols;  // a .symtab/.strtab pair is added when not empty
};

// Layout: header, section contents, .shstrtab, .strtab, .symtab, section headers.
inline std::string build_elf(const ElfSpec& spec) {
    struct Laid {
        std::uint32_t name = 0;
        std::uint32_t type = 0;
        std::uint64_t offset = 0;
        std::uint64_t size = 0;
        std::uint32_t link = 0;
        std::uint32_t info = 0;
        std::uint64_t entsize = 0;
    };
    std::string out(64, '\0');
    std::string shstrtab(1, '\0');
    std::vector<Laid> laid(1);  // the null section
    auto add = [&](const std::string& name, std::uint32_t type, const std::string& data,
                   std::uint32_t link, std::uint32_t info, std::uint64_t entsize) {
        while (out.size() % 8) out.push_back('\0');
        Laid s;
        s.name = static_cast<std::uint32_t>(shstrtab.size());
        shstrtab += name + '\0';
        s.type = type;
        s.offset = out.size();
        s.size = data.size();
        s.link = link;
        s.info = info;
        s.entsize = entsize;
        out += data;
        laid.push_back(s);
        return static_cast<std::uint32_t>(laid.size() - 1);
    };
    for (const auto& s : spec.sections) add(s.name, s.type, s.data, 0, s.info, 0);
    if (!spec.symbols.empty()) {
        std::string strtab(1, '\0');
        std::string symtab(24, '\0');  // the null symbol
        for (const auto& sym : spec.symbols) {
            put(symtab, strtab.size(), 4);
            strtab += sym.name + '\0';
            put(symtab, sym.info, 1);
            put(symtab, sym.other, 1);
            put(symtab, sym.shndx, 2);
            put(symtab, 0, 8);
            put(symtab, 0, 8);
        }
        const std::uint32_t str_index = add(".strtab", 3, strtab, 0, 0, 0);
        add(".symtab", 2, symtab, str_index, 1, 24);
    }
    // .shstrtab last: its own name must be in it before it is written.
    const std::uint32_t shstr_name = static_cast<std::uint32_t>(shstrtab.size());
    shstrtab += std::string(".shstrtab") + '\0';
    while (out.size() % 8) out.push_back('\0');
    Laid names;
    names.name = shstr_name;
    names.type = 3;
    names.offset = out.size();
    names.size = shstrtab.size();
    out += shstrtab;
    laid.push_back(names);
    const auto shstrndx = laid.size() - 1;

    while (out.size() % 8) out.push_back('\0');
    const std::uint64_t shoff = out.size();
    for (const auto& s : laid) {
        put(out, s.name, 4);
        put(out, s.type, 4);
        put(out, 0, 8);  // flags
        put(out, 0, 8);  // addr
        put(out, s.offset, 8);
        put(out, s.size, 8);
        put(out, s.link, 4);
        put(out, s.info, 4);
        put(out, 8, 8);  // addralign
        put(out, s.entsize, 8);
    }
    out[0] = 0x7f;
    out[1] = 'E';
    out[2] = 'L';
    out[3] = 'F';
    out[4] = 2;  // ELFCLASS64
    out[5] = 1;  // little-endian
    out[6] = 1;  // EV_CURRENT
    out[7] = 0x41;
    out[8] = static_cast<char>(spec.abi_version);
    put_at(out, 16, 2, 2);  // ET_EXEC
    put_at(out, 18, spec.machine, 2);
    put_at(out, 20, 1, 4);
    put_at(out, 40, shoff, 8);
    put_at(out, 48, spec.flags, 4);
    put_at(out, 52, 64, 2);  // e_ehsize
    put_at(out, 54, 56, 2);  // e_phentsize
    put_at(out, 58, 64, 2);  // e_shentsize
    put_at(out, 60, laid.size(), 2);
    put_at(out, 62, shstrndx, 2);
    return out;
}

// Offsets of the header fields the hostile tests patch.
inline constexpr std::size_t kElfShoff = 40;
inline constexpr std::size_t kElfShentsize = 58;
inline constexpr std::size_t kElfShnum = 60;
inline constexpr std::size_t kElfShstrndx = 62;

// A kernel of a synthetic cubin: a .text.<name> section, an entry symbol and a
// .nv.info.<name> section holding `info` (EIATTR records).
struct KernelSpec {
    std::string name;
    std::string info;
    bool entry = true;  // false: a device function (no 0x10 in st_other)
};

inline std::string build_cubin(const std::vector<KernelSpec>& kernels,
                               std::uint32_t flags = 0x6005a04, std::vector<SectionSpec> extra = {},
                               std::uint8_t abi_version = 8) {
    ElfSpec spec;
    spec.flags = flags;
    spec.abi_version = abi_version;
    spec.sections = std::move(extra);
    for (const auto& k : kernels) {
        spec.sections.push_back({".text." + k.name, 1, std::string(128, '\0'), 0});
        const auto text_index = static_cast<std::uint16_t>(spec.sections.size());  // 1-based
        spec.sections.push_back({".nv.info." + k.name, 0x70000000, k.info, text_index});
        spec.symbols.push_back(
            {k.name, 0x12, static_cast<std::uint8_t>(k.entry ? 0x10 : 0), text_index});
    }
    return build_elf(spec);
}

// ---- fatbin -------------------------------------------------------------------------
struct EntrySpec {
    std::uint16_t kind = 2;  // 1 PTX, 2 cubin, 8 LTO-IR
    std::uint32_t sm = 90;
    std::uint64_t flags = 0x11;  // 64-bit, Linux
    std::string payload;         // as stored (compressed or not)
    std::uint64_t uncompressed_size = 0;
    std::uint16_t major = 0;
    std::uint16_t minor = 0;
};

inline std::string build_entry(const EntrySpec& e) {
    std::string payload = e.payload;
    while (payload.size() % 8) payload.push_back('\0');
    std::string h;
    put(h, e.kind, 2);
    put(h, 0x0101, 2);
    put(h, 0x40, 4);
    put(h, payload.size(), 8);
    put(h, (e.flags & 0xa000) ? e.payload.size() : 0, 4);  // exact compressed size
    put(h, 0, 4);
    put(h, e.minor, 2);
    put(h, e.major, 2);
    put(h, e.sm, 4);
    put(h, 0, 8);
    put(h, e.flags, 8);
    put(h, 0, 8);
    put(h, e.uncompressed_size, 8);
    return h + payload;
}

inline std::string build_container(const std::vector<EntrySpec>& entries) {
    std::string body;
    for (const auto& e : entries) body += build_entry(e);
    std::string out;
    put(out, 0xBA55ED50, 4);
    put(out, 1, 2);
    put(out, 16, 2);
    put(out, body.size(), 8);
    return out + body;
}

// A raw LZ4 block of `text`: literals only, except that a run of one repeated character
// at the end of the text is encoded as a match (so overlap copies are exercised).
inline std::string lz4_block(std::string_view text) {
    std::size_t run = 0;
    while (run < text.size() && text[text.size() - 1 - run] == text.back()) ++run;
    std::string out;
    auto put_length = [&](std::size_t length) {
        length -= 15;
        while (length >= 255) {
            out.push_back(static_cast<char>(255));
            length -= 255;
        }
        out.push_back(static_cast<char>(length));
    };
    // Sequence 1: literals up to and including the first char of the run, then a match
    // of run - 1 - 5 bytes at offset 1; sequence 2: the last 5 bytes as literals.
    if (run >= 12) {
        const std::size_t literals = text.size() - run + 1;
        const std::size_t match = run - 1 - 5;
        const unsigned lit_nib = literals >= 15 ? 15 : static_cast<unsigned>(literals);
        const unsigned match_nib = match - 4 >= 15 ? 15 : static_cast<unsigned>(match - 4);
        out.push_back(static_cast<char>(lit_nib << 4 | match_nib));
        if (lit_nib == 15) put_length(literals);
        out.append(text.substr(0, literals));
        out.push_back(1);
        out.push_back(0);
        if (match_nib == 15) put_length(match - 4);
        text = text.substr(text.size() - 5);
    }
    const unsigned lit_nib = text.size() >= 15 ? 15 : static_cast<unsigned>(text.size());
    out.push_back(static_cast<char>(lit_nib << 4));
    if (lit_nib == 15) put_length(text.size());
    out.append(text);
    return out;
}

}  // namespace kcache::test
