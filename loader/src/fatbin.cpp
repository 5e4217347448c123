// Fatbin containers, plain and embedded in host ELF files.
//
// Layout as CUDA 13.0's fatbinary writes it (all little-endian; docs/loader.md):
//
//  container header, 16 bytes:
//    0x00 u32 magic 0xBA55ED50   0x04 u16 version (1)   0x06 u16 header size (16)
//    0x08 u64 bytes of entries that follow the header
//  entry header, header-size bytes (0x40 or more), then the payload:
//    0x00 u16 kind: 1 PTX, 2 cubin (ELF), 8 LTO-IR
//    0x02 u16 (0x0101)           0x04 u32 header size       0x08 u64 payload size
//    0x10 u32 compressed size (unpadded; the payload is padded to 8 bytes)
//    0x14 u32 offset of an options descriptor in the header {u32 offset, u32 size}
//    0x18 u16 minor, 0x1a u16 major: the PTX ISA version for PTX entries
//    0x1c u32 SM number          0x20 u32 object name offset, 0x24 u32 its length
//    0x28 u64 flags: 0x1 64-bit, 0x2 debug (-G), 0x10 Linux, 0x2000 LZ4-compressed,
//             0x8000 zstd-compressed (CUDA 13's default), 0x100000 an sm_XXa arch,
//             0x200000 an sm_XXf arch
//    0x30 u64 (0, or a hash for LTO-IR)   0x38 u64 uncompressed size (when compressed)
//
// nvcc compresses PTX entries by default and cubins with -Xfatbin=-compress-all
// (zstd; -compress-mode=speed gives LZ4). Host binaries keep one container per
// translation unit in `.nv_fatbin` (`__nv_relfatbin` for -rdc objects), back to back.

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "kcache/core/byte_reader.hpp"
#include "parsers.hpp"

namespace kcache::loader::detail {
namespace {

using core::ByteReader;
using core::fail;

constexpr std::uint32_t kFatbinMagic = 0xBA55ED50;
constexpr std::uint64_t kContainerHeaderSize = 16;
constexpr std::uint64_t kEntryHeaderSize = 0x40;

constexpr std::uint64_t kFlagDebug = 0x2;
constexpr std::uint64_t kFlagLz4 = 0x2000;
constexpr std::uint64_t kFlagZstd = 0x8000;
constexpr std::uint64_t kFlagArchA = 0x100000;
constexpr std::uint64_t kFlagArchF = 0x200000;

EntryKind entry_kind(std::uint16_t raw) {
    switch (raw) {
        case 1:
            return EntryKind::ptx;
        case 2:
            return EntryKind::cubin;
        case 8:
            return EntryKind::ltoir;
        default:
            return EntryKind::unknown;
    }
}

bool all_zero(std::string_view bytes) {
    return std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; });
}

// The kernels of an entry's payload (decompressed when needed and allowed).
Status read_payload(FatbinEntry& entry, std::string_view stored, std::uint32_t compressed_size,
                    const InspectOptions& options, const std::string& what) {
    if (entry.kind != EntryKind::cubin && entry.kind != EntryKind::ptx) return {};
    std::string decompressed;
    std::string_view payload = stored;
    if (entry.compressed) {
        if (!options.decompress || entry.compression == Compression::unknown ||
            entry.uncompressed_size > options.max_decompressed_size) {
            return {};  // listed without kernels
        }
        // The payload is padded to 8 bytes; the header has its exact length.
        if (compressed_size != 0) {
            if (auto exact = ByteReader(stored).slice(0, compressed_size)) stored = *exact;
        }
        auto bytes = entry.compression == Compression::zstd
                         ? decompress_zstd(stored, entry.uncompressed_size)
                         : decompress_lz4(stored, entry.uncompressed_size);
        if (!bytes) return fail(EIO, fmt::format("{}: {}", what, bytes.error().message));
        decompressed = std::move(*bytes);
        payload = decompressed;
    }
    auto parsed = Result<BinaryInfo>();
    if (entry.kind == EntryKind::cubin) {
        parsed = parse_cubin(payload);
    } else {
        // PTX payloads are NUL-terminated and padded with NULs.
        const std::size_t end = payload.find_last_not_of('\0');
        parsed = parse_ptx(payload.substr(0, end == std::string_view::npos ? 0 : end + 1));
    }
    if (!parsed) {
        return fail(EIO, fmt::format("{}: {}", what, parsed.error().message));
    }
    entry.kernels = std::move(parsed->kernels);
    return {};
}

// The entries of container number `container`, whose entries (`body`) start at offset
// `body_at` of the fatbin, appended to `out`.
core::Status parse_entries(const ByteReader& body, std::uint64_t body_at, std::uint32_t container,
                           const InspectOptions& options, BinaryInfo& out) {
    std::uint64_t p = 0;
    while (p < body.size()) {
        const std::uint64_t entry_at = body_at + p;
        if (all_zero(body.data().substr(static_cast<std::size_t>(p)))) {
            break;  // padding up to the declared size
        }
        auto fixed = body.sub(p, kEntryHeaderSize);
        if (!fixed) {
            return fail(EIO, fmt::format("fatbin: entry header at {} truncated", entry_at));
        }
        FatbinEntry entry;
        entry.container = container;
        std::uint16_t reserved16 = 0, minor = 0, major = 0;
        std::uint32_t entry_header_size32 = 0, compressed_size = 0, options_offset = 0, sm = 0,
                      name_offset = 0, name_size = 0;
        std::uint64_t hash = 0, uncompressed_size = 0;
        KCACHE_TRY(fixed->read(entry.raw_kind, reserved16, entry_header_size32, entry.size,
                               compressed_size, options_offset, minor, major, sm, name_offset,
                               name_size, entry.flags, hash, uncompressed_size));
        entry.kind = entry_kind(entry.raw_kind);
        const std::uint64_t entry_header_size = entry_header_size32;

        if (entry_header_size < kEntryHeaderSize || !body.contains(p, entry_header_size) ||
            !body.contains(p + entry_header_size, entry.size)) {
            return fail(EIO, fmt::format("fatbin: entry at {} (header {} bytes, payload {} "
                                         "bytes) runs past its container",
                                         entry_at, entry_header_size, entry.size));
        }
        entry.arch = fmt::format("sm_{}", sm);
        if (entry.flags & kFlagArchA) {
            entry.arch += 'a';
        } else if (entry.flags & kFlagArchF) {
            entry.arch += 'f';
        }
        entry.debug = (entry.flags & kFlagDebug) != 0;
        if (entry.kind == EntryKind::ptx) entry.ptx_version = fmt::format("{}.{}", major, minor);
        entry.compressed = (entry.flags & (kFlagLz4 | kFlagZstd)) != 0;
        if (entry.compressed) {
            entry.compression = (entry.flags & kFlagZstd)  ? Compression::zstd
                                : (entry.flags & kFlagLz4) ? Compression::lz4
                                                           : Compression::unknown;
            if ((entry.flags & kFlagZstd) && (entry.flags & kFlagLz4)) {
                entry.compression = Compression::unknown;
            }
            entry.uncompressed_size = uncompressed_size;
        } else {
            entry.uncompressed_size = entry.size;
        }

        const std::string what = fmt::format("fatbin entry {} ({} {})", out.entries.size(),
                                             kind_name(entry.kind), entry.arch);
        const auto payload = KCACHE_TRY(body.slice(p + entry_header_size, entry.size));
        KCACHE_TRY(read_payload(entry, payload, compressed_size, options, what));
        out.entries.push_back(std::move(entry));
        p += entry_header_size + out.entries.back().size;
    }
    return {};
}

}  // namespace

Result<std::uint32_t> parse_fatbin_containers(std::string_view bytes, std::uint32_t first_container,
                                              const InspectOptions& options, BinaryInfo& out) {
    const ByteReader in(bytes, "fatbin");
    std::uint32_t container = first_container;
    std::uint64_t at = 0;
    while (at < bytes.size()) {
        // Containers are 8-byte aligned; zeros pad between and after them.
        if (all_zero(bytes.substr(static_cast<std::size_t>(at), 8))) {
            at += 8;
            continue;
        }
        const auto magic = in.le_at<std::uint32_t>(at);
        if (!magic || *magic != kFatbinMagic) {
            return fail(EIO, fmt::format("fatbin: no container header at offset {}", at));
        }
        auto header = in.sub(at, kContainerHeaderSize);
        if (!header) {
            return fail(EIO, fmt::format("fatbin: container header at {} truncated", at));
        }
        std::uint32_t header_magic = 0;
        std::uint16_t version = 0, header_size16 = 0;
        std::uint64_t body_size = 0;
        KCACHE_TRY(header->read(header_magic, version, header_size16, body_size));
        const std::uint64_t header_size = header_size16;
        if (header_size < kContainerHeaderSize || !in.contains(at, header_size) ||
            !in.contains(at + header_size, body_size)) {
            return fail(EIO, fmt::format("fatbin: container at {} (header {} bytes, {} bytes of "
                                         "entries) runs past the end ({} bytes)",
                                         at, header_size, body_size, bytes.size()));
        }
        const auto body = KCACHE_TRY(in.sub(at + header_size, body_size));
        KCACHE_TRY(parse_entries(body, at + header_size, container, options, out));
        at += header_size + body_size;
        ++container;
    }
    return container - first_container;
}

Result<BinaryInfo> parse_host_elf(const ElfFile& elf, const InspectOptions& options) {
    BinaryInfo info;
    info.format = Format::fatbin;
    std::uint32_t containers = 0;
    for (const auto& section : elf.sections) {
        if (section.name != ".nv_fatbin" && section.name != "__nv_relfatbin") continue;
        if (section.type == kShtNobits) continue;
        auto read = parse_fatbin_containers(section.data, containers, options, info);
        if (!read) {
            return fail(read.error().code,
                        fmt::format("{}: {}", section.name, read.error().message));
        }
        containers += *read;
        if (!info.host_section.empty()) info.host_section += ',';
        info.host_section += section.name;
    }
    if (info.host_section.empty()) {
        return fail(ENOEXEC, "an ELF file without CUDA device code (no .nv_fatbin section)");
    }
    return info;
}

}  // namespace kcache::loader::detail
