// Decompression of fatbin payloads.
//
// LZ4 (flag 0x2000): a raw LZ4 block (no frame), decoded here with every length and
// offset checked against both buffers; the format cannot expand more than 255:1, so a
// declared size beyond that is rejected before anything is allocated.
// zstd (flag 0x8000): one or more zstd frames; the frame header's content size must
// equal the declared size before the output is allocated.

#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "parsers.hpp"

namespace kcache::loader::detail {
namespace {

using core::fail;

constexpr std::uint64_t kLz4MaxRatio = 255;

Result<std::string> allocate(std::uint64_t size) {
    if (size > std::string().max_size()) {
        return fail(ENOMEM, fmt::format("cannot hold {} decompressed bytes", size));
    }
    try {
        std::string out;
        out.resize(static_cast<std::size_t>(size));
        return out;
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, fmt::format("cannot hold {} decompressed bytes", size));
    }
}

}  // namespace

Result<std::string> decompress_lz4(std::string_view payload, std::uint64_t size) {
    if (size / kLz4MaxRatio > payload.size() + 1) {
        return fail(
            EIO, fmt::format("LZ4 payload of {} bytes cannot hold {} bytes", payload.size(), size));
    }
    auto buffer = allocate(size);
    if (!buffer) return buffer;
    std::string& out = *buffer;
    const auto* in = reinterpret_cast<const unsigned char*>(payload.data());
    const std::size_t in_size = payload.size();
    std::size_t ip = 0;
    std::size_t op = 0;
    auto damaged = [&](std::string_view why) {
        return fail(EIO, fmt::format("LZ4 payload damaged at byte {}: {}", ip, why));
    };
    // A length continues in bytes of 255 while they last.
    auto extend = [&](std::size_t& length) {
        unsigned char b = 255;
        while (b == 255) {
            if (ip >= in_size) return false;
            b = in[ip++];
            length += b;
        }
        return true;
    };
    while (true) {
        if (ip >= in_size) return damaged("ends inside a sequence");
        const unsigned token = in[ip++];
        std::size_t literals = token >> 4;
        if (literals == 15 && !extend(literals)) return damaged("literal length runs out");
        if (literals > in_size - ip) return damaged("literals run past the input");
        if (literals > out.size() - op) return damaged("literals run past the declared size");
        std::memcpy(out.data() + op, in + ip, literals);
        ip += literals;
        op += literals;
        if (ip == in_size) break;  // the last sequence has literals only
        if (in_size - ip < 2) return damaged("match offset truncated");
        const std::size_t offset = in[ip] | static_cast<std::size_t>(in[ip + 1]) << 8;
        ip += 2;
        if (offset == 0 || offset > op) return damaged("match offset out of range");
        std::size_t match = token & 15;
        if (match == 15 && !extend(match)) return damaged("match length runs out");
        match += 4;
        if (match > out.size() - op) return damaged("match runs past the declared size");
        for (std::size_t i = 0; i < match; ++i, ++op) out[op] = out[op - offset];
    }
    if (op != out.size()) {
        return fail(EIO, fmt::format("LZ4 payload decompresses to {} bytes, the entry declares {}",
                                     op, out.size()));
    }
    return buffer;
}

Result<std::string> decompress_zstd(std::string_view payload, std::uint64_t size) {
    const unsigned long long declared = ZSTD_getFrameContentSize(payload.data(), payload.size());
    if (declared == ZSTD_CONTENTSIZE_ERROR) return fail(EIO, "not a zstd frame");
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != size) {
        return fail(
            EIO, fmt::format("zstd frame holds {} bytes, the entry declares {}", declared, size));
    }
    auto buffer = allocate(size);
    if (!buffer) return buffer;
    const std::size_t n =
        ZSTD_decompress(buffer->data(), buffer->size(), payload.data(), payload.size());
    if (ZSTD_isError(n)) {
        return fail(EIO, fmt::format("zstd payload damaged: {}", ZSTD_getErrorName(n)));
    }
    if (n != size) {
        return fail(EIO, fmt::format("zstd payload decompresses to {} bytes, the entry declares {}",
                                     n, size));
    }
    return buffer;
}

}  // namespace kcache::loader::detail
