#include "kcache/loader/introspect.hpp"

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "elf.hpp"
#include "kcache/core/byte_reader.hpp"
#include "parsers.hpp"

namespace kcache::loader {
namespace {

using core::fail;

constexpr std::uint32_t kFatbinMagic = 0xBA55ED50;

tl::unexpected<Error> not_a_binary(std::string_view why) {
    return fail(ENOEXEC, fmt::format("not a cubin, fatbin or PTX file ({})", why));
}

// What an unrecognized input looks like, for the error message.
std::string describe(std::string_view bytes) {
    if (bytes.empty()) return "empty";
    const bool text = std::all_of(
        bytes.begin(), bytes.begin() + std::min<std::size_t>(bytes.size(), 512), [](char c) {
            const auto u = static_cast<unsigned char>(c);
            return u >= 0x20 || c == '\n' || c == '\r' || c == '\t';
        });
    if (text) return "text without a .version directive";
    std::string head = "starts with";
    for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 4); ++i) {
        head += fmt::format(" {:02x}", static_cast<unsigned char>(bytes[i]));
    }
    return head;
}

Result<BinaryInfo> inspect_elf(std::string_view bytes, const InspectOptions& options) {
    const auto machine = core::ByteReader(bytes).le_at<std::uint16_t>(18);
    const bool cuda = machine && *machine == detail::kEmCuda;
    auto elf = KCACHE_TRY(detail::parse_elf(bytes, cuda ? "cubin" : "ELF file"));
    return cuda ? detail::parse_cubin(elf) : detail::parse_host_elf(elf, options);
}

}  // namespace

std::string_view format_name(Format format) {
    switch (format) {
        case Format::cubin:
            return "cubin";
        case Format::fatbin:
            return "fatbin";
        case Format::ptx:
            return "ptx";
    }
    return "unknown";
}

std::string_view kind_name(EntryKind kind) {
    switch (kind) {
        case EntryKind::cubin:
            return "cubin";
        case EntryKind::ptx:
            return "ptx";
        case EntryKind::ltoir:
            return "ltoir";
        case EntryKind::unknown:
            return "unknown";
    }
    return "unknown";
}

std::string_view compression_name(Compression c) {
    switch (c) {
        case Compression::none:
            return "none";
        case Compression::lz4:
            return "lz4";
        case Compression::zstd:
            return "zstd";
        case Compression::unknown:
            return "unknown";
    }
    return "unknown";
}

const KernelInfo* BinaryInfo::find_kernel(std::string_view name) const {
    for (const auto& kernel : kernels) {
        if (kernel.name == name) return &kernel;
    }
    return nullptr;
}

Result<BinaryInfo> inspect(std::string_view bytes, const InspectOptions& options) {
    Result<BinaryInfo> info;
    if (const auto magic = core::ByteReader(bytes).le_at<std::uint32_t>(0);
        magic && *magic == kFatbinMagic) {
        info = BinaryInfo{};
        info->format = Format::fatbin;
        KCACHE_TRY(detail::parse_fatbin_containers(bytes, 0, options, *info));
    } else if (detail::is_elf(bytes)) {
        info = inspect_elf(bytes, options);
    } else if (detail::looks_like_ptx(bytes)) {
        info = detail::parse_ptx(bytes);
    } else {
        return not_a_binary(describe(bytes));
    }
    if (!info && info.error().code == ENOEXEC) return not_a_binary(info.error().message);
    return info;
}

Status check_arguments(const KernelInfo& kernel, const std::vector<std::size_t>& sizes) {
    if (sizes.size() != kernel.params.size()) {
        return fail(EINVAL,
                    fmt::format("{}: {} argument{} given, the kernel takes {}", kernel.name,
                                sizes.size(), sizes.size() == 1 ? "" : "s", kernel.params.size()));
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] != kernel.params[i].size) {
            return fail(EINVAL, fmt::format("{}: argument {} is {} byte{}, the kernel expects {}",
                                            kernel.name, i, sizes[i], sizes[i] == 1 ? "" : "s",
                                            kernel.params[i].size));
        }
    }
    return {};
}

namespace detail {

Status finish_kernel(KernelInfo& kernel, std::string_view what) {
    std::sort(kernel.params.begin(), kernel.params.end(),
              [](const ParamInfo& a, const ParamInfo& b) { return a.index < b.index; });
    std::uint64_t end = 0;
    for (std::size_t i = 0; i < kernel.params.size(); ++i) {
        const ParamInfo& p = kernel.params[i];
        if (p.index != i) {
            return fail(EIO, fmt::format("{}: parameter {} {}", what, i,
                                         p.index < i ? "is described twice" : "is missing"));
        }
        end = std::max(end, std::uint64_t{p.offset} + p.size);
    }
    kernel.param_bytes = static_cast<std::uint32_t>(std::min<std::uint64_t>(end, UINT32_MAX));
    return {};
}

}  // namespace detail
}  // namespace kcache::loader
