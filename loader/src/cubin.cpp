// Cubin introspection.
//
// What CUDA 13.0's ptxas writes (found with readelf on cubins for sm_75 ... sm_121, with
// and without -G, -rdc, big and __grid_constant__ parameters; docs/loader.md has the
// full notes):
//
//  ELF64, little-endian, e_machine 190 (EM_CUDA), e_ident[EI_OSABI] 0x41,
//  e_ident[EI_ABIVERSION] 8.
//
//  e_flags with ABI version >= 8: bits 8..15 are the SM number (0x4b sm_75, 0x5a sm_90,
//  0x64 sm_100, 0x78 sm_120), bit 27 is set by -G. The low byte (0x04 up to sm_90, 0x02
//  from sm_100) and bits 24..26 (6) are not interpreted. Older toolkits (ABI version
//  below 8) kept the SM number in bits 0..7 and the virtual arch in bits 16..23.
//  `.note.nv.cuinfo` repeats the SM number (descriptor: u16 version, u16 SM, u32 CUDA
//  version) and is used when e_flags gives none.
//
//  Arch variants: sm_XXa cubins have record 9 (EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET)
//  = 1 in `.nv.compat`; sm_XXf cubins differ from plain ones only in the ptxas command
//  line kept in `.note.nv.tkinfo` ("-arch sm_100f"), which is read for the suffix.
//
//  Kernels: STT_FUNC symbols with bit 0x10 (entry) in st_other, code in
//  `.text.<name>`. Device functions lack the bit.
//
//  `.nv.info.<kernel>` holds EIATTR records: u8 format, u8 attribute, then for format 4
//  (EIFMT_SVAL) a u16 size and that many bytes, for formats 1..3 (no value, byte, half)
//  a u16 value. The parameter records, one per parameter, highest index first:
//   EIATTR_KPARAM_INFO    (0x17, 12 bytes): u32 0, u16 index, u16 offset,
//                         u32 flags with the size in bits 18..31 (so at most 16383);
//                         bits 8..11 are 5 for pointers from sm_100 on.
//   EIATTR_KPARAM_INFO_V2 (0x45, 12 bytes): u32 0, u16 index, u16 offset, u32 with the
//                         size in bits 0..23 (top byte 5 for pointers from sm_100 on).
//                         ptxas writes these instead of 0x17 for every parameter of a
//                         kernel whose parameters exceed 4 KiB (CUDA 12.1's 32 KiB
//                         parameter space).
//   EIATTR_CBANK_PARAM_SIZE (0x19, half): the parameter buffer's size.
//  Offsets are the driver's layout, which may differ from the PTX declaration order's
//  natural alignment (a __grid_constant__ CUtensorMap on sm_90 sits at offset 0x70).

#include <cerrno>
#include <unordered_map>

#include <fmt/format.h>

#include "kcache/core/byte_reader.hpp"
#include "parsers.hpp"

namespace kcache::loader::detail {
namespace {

using core::ByteReader;
using core::fail;

constexpr std::uint8_t kStoCudaEntry = 0x10;
constexpr std::uint8_t kFmtSval = 4;
constexpr std::uint8_t kAttrKparamInfo = 0x17;
constexpr std::uint8_t kAttrKparamInfoV2 = 0x45;
constexpr std::uint8_t kCompatAcceleratorTarget = 9;
constexpr std::size_t kKparamRecordSize = 12;
// A kernel's parameter buffer is at most 32764 bytes (CUDA 12.1); offsets are 16-bit.
constexpr std::uint32_t kMaxParamBytes = 1u << 16;

struct Record {
    std::uint64_t at = 0;  // offset in the section, for messages
    std::uint8_t format = 0;
    std::uint8_t attribute = 0;
    std::uint16_t value = 0;   // formats 1..3
    std::string_view payload;  // format 4
};

// Calls `fn(record)` for each record of an EIATTR-style section; EIO when a record is
// malformed or runs past the section.
template <class Fn>
Status for_each_record(std::string_view data, std::string_view what, Fn&& fn) {
    ByteReader in(data, what);
    while (!in.at_end()) {
        Record r;
        r.at = in.position();
        if (in.remaining() < 4) {
            return fail(EIO, fmt::format("{}: {} stray bytes at the end", what, in.remaining()));
        }
        if (auto s = in.read(r.format, r.attribute, r.value); !s) return s;
        if (r.format == kFmtSval) {
            const auto payload = in.bytes(r.value);
            if (!payload) {
                return fail(EIO, fmt::format("{}: record 0x{:02x} at {} ({} bytes) runs past the "
                                             "end ({} bytes)",
                                             what, r.attribute, r.at, r.value, data.size()));
            }
            r.payload = *payload;
        } else if (r.format < 1 || r.format > 3) {
            return fail(
                EIO, fmt::format("{}: record at {} has unknown format {}", what, r.at, r.format));
        }
        if (auto status = fn(r); !status) return status;
    }
    return {};
}

Status parse_kernel_info(std::string_view data, const std::string& what, KernelInfo& kernel) {
    return for_each_record(data, what, [&](const Record& r) -> Status {
        if (r.attribute != kAttrKparamInfo && r.attribute != kAttrKparamInfoV2) return {};
        if (r.format != kFmtSval || r.payload.size() < kKparamRecordSize) {
            return fail(EIO, fmt::format("{}: parameter record at {} is {} bytes (expected {})",
                                         what, r.at, r.payload.size(), kKparamRecordSize));
        }
        ByteReader c(r.payload, what, r.at + 4);
        ParamInfo p;
        std::uint32_t zero = 0, bits = 0;
        std::uint16_t index = 0, offset = 0;
        if (auto s = c.read(zero, index, offset, bits); !s) return s;
        p.index = index;
        p.offset = offset;
        p.size = r.attribute == kAttrKparamInfo ? bits >> 18 : bits & 0xffffffu;
        if (p.offset + std::uint64_t{p.size} > kMaxParamBytes) {
            return fail(EIO, fmt::format("{}: parameter {} at offset {} of {} bytes ends past the "
                                         "parameter space",
                                         what, p.index, p.offset, p.size));
        }
        kernel.params.push_back(p);
        return {};
    });
}

// Best effort: the arch named on the ptxas command line kept in .note.nv.tkinfo
// ("-arch sm_100f", "--gpu-name=sm_90a"), or empty.
std::string_view tkinfo_arch(const ElfFile& elf) {
    const ElfSection* note = elf.find(".note.nv.tkinfo");
    if (!note) return {};
    const ByteReader in(note->data, ".note.nv.tkinfo");
    const auto namesz = in.le_at<std::uint32_t>(0);
    const auto descsz = in.le_at<std::uint32_t>(4);
    if (!namesz || !descsz) return {};
    const std::uint64_t desc_at = 12 + ((std::uint64_t{*namesz} + 3) & ~std::uint64_t{3});
    const auto d = in.sub(desc_at, *descsz);
    if (!d) return {};
    // Descriptor: six u32 (format, then string offsets: object, tool, version, branch,
    // options) followed by the strings.
    const auto options_at = d->le_at<std::uint32_t>(20);
    if (!options_at) return {};
    const auto options = d->c_str(24 + std::uint64_t{*options_at});
    if (!options) return {};
    std::string_view args = *options;
    bool arch_follows = false;  // the previous word was "-arch" or "--gpu-name"
    while (!args.empty()) {
        const std::size_t space = args.find(' ');
        std::string_view word = args.substr(0, space);
        args = space == std::string_view::npos ? std::string_view{} : args.substr(space + 1);
        if (word.empty()) continue;
        std::string_view value;
        if (arch_follows) {
            value = word;
        } else {
            for (std::string_view flag : {"-arch=", "--gpu-name="}) {
                if (word.starts_with(flag)) value = word.substr(flag.size());
            }
        }
        if (value.starts_with("sm_")) return value;
        arch_follows = word == "-arch" || word == "--gpu-name";
    }
    return {};
}

Result<std::string> cubin_arch(const ElfFile& elf) {
    unsigned sm = elf.abi_version >= 8 ? (elf.flags >> 8) & 0xff : elf.flags & 0xff;
    if (sm == 0) {
        if (const ElfSection* note = elf.find(".note.nv.cuinfo")) {
            // namesz, descsz, type, "NVIDIA Corp\0" (12 bytes), then u16 version, u16 SM.
            // Too short to hold it: no SM from the note (the error below).
            if (auto v = ByteReader(note->data).le_at<std::uint16_t>(26)) sm = *v;
        }
    }
    if (sm == 0) return fail(EIO, "cubin: no SM architecture in e_flags or .note.nv.cuinfo");
    std::string arch = fmt::format("sm_{}", sm);

    bool accelerated = false;
    if (const ElfSection* compat = elf.find(".nv.compat")) {
        KCACHE_TRY(for_each_record(compat->data, "cubin: .nv.compat", [&](const Record& r) {
            if (r.attribute == kCompatAcceleratorTarget && r.format != kFmtSval && r.value == 1) {
                accelerated = true;
            }
            return Status{};
        }));
    }
    const std::string_view named = tkinfo_arch(elf);
    if (accelerated) {
        arch += 'a';
    } else if (named.size() == arch.size() + 1 && named.starts_with(arch) &&
               (named.back() == 'a' || named.back() == 'f')) {
        arch += named.back();
    }
    return arch;
}

}  // namespace

Result<BinaryInfo> parse_cubin(std::string_view bytes) {
    auto elf = KCACHE_TRY(parse_elf(bytes, "cubin"));
    return parse_cubin(elf);
}

Result<BinaryInfo> parse_cubin(const ElfFile& elf) {
    if (elf.machine != kEmCuda) {
        return fail(ENOEXEC, fmt::format("cubin: e_machine {} is not EM_CUDA", elf.machine));
    }
    BinaryInfo info;
    info.format = Format::cubin;
    info.arch = KCACHE_TRY(cubin_arch(elf));

    std::unordered_map<std::string_view, const ElfSection*> kernel_info;
    constexpr std::string_view kInfoPrefix = ".nv.info.";
    for (const auto& section : elf.sections) {
        if (section.name.starts_with(kInfoPrefix)) {
            kernel_info.emplace(section.name.substr(kInfoPrefix.size()), &section);
        }
    }

    auto symbols = KCACHE_TRY(parse_symbols(elf, "cubin"));
    for (const ElfSymbol& symbol : symbols) {
        if (symbol.type() != kSttFunc || !(symbol.other & kStoCudaEntry) || symbol.shndx == 0) {
            continue;
        }
        KernelInfo kernel;
        kernel.name = std::string(symbol.name);
        const std::string what = fmt::format("cubin: .nv.info.{}", kernel.name);
        if (auto it = kernel_info.find(symbol.name); it != kernel_info.end()) {
            KCACHE_TRY(parse_kernel_info(it->second->data, what, kernel));
        }
        KCACHE_TRY(finish_kernel(kernel, what));
        info.kernels.push_back(std::move(kernel));
    }
    return info;
}

}  // namespace kcache::loader::detail
