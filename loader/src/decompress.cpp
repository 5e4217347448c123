// Decompression of fatbin payloads.
//
// LZ4 (flag 0x2000): a raw LZ4 block (no frame), decoded by liblz4's
// LZ4_decompress_safe, which checks every length and offset against both buffers
// (and is fuzzed by its authors). Around it, ours: the format cannot expand more than
// 255:1, so a declared size beyond that is rejected before anything is allocated, and
// the block must decode to exactly the declared size.
// zstd (flag 0x8000): one or more zstd frames; the frame header's content size must
// equal the declared size before the output is allocated.

#include <lz4.h>
#include <zstd.h>

#include <cerrno>
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
    // The ratio check comes before the allocation: a hostile entry declaring gigabytes
    // must not make us allocate them.
    if (size / kLz4MaxRatio > payload.size() + 1) {
        return fail(
            EIO, fmt::format("LZ4 payload of {} bytes cannot hold {} bytes", payload.size(), size));
    }
    // LZ4's block API counts in int; its compressor never makes blocks past
    // LZ4_MAX_INPUT_SIZE, so larger ones are damaged, not merely large.
    if (payload.size() > LZ4_MAX_INPUT_SIZE || size > LZ4_MAX_INPUT_SIZE) {
        return fail(EIO, fmt::format("LZ4 payload of {} bytes declaring {} bytes is past the "
                                     "format's block limit",
                                     payload.size(), size));
    }
    auto buffer = allocate(size);
    if (!buffer) return buffer;
    // LZ4_decompress_safe never reads past `payload` nor writes past `size` bytes: a
    // negative result is a damaged block (or one that would decode past the declared
    // size), a short one a block that decodes to less than declared.
    const int n = LZ4_decompress_safe(payload.data(), buffer->data(),
                                      static_cast<int>(payload.size()), static_cast<int>(size));
    if (n < 0) {
        return fail(EIO, fmt::format("LZ4 payload damaged, or decoding past the {} bytes the "
                                     "entry declares",
                                     size));
    }
    if (static_cast<std::uint64_t>(n) != size) {
        return fail(EIO, fmt::format("LZ4 payload decompresses to {} bytes, the entry declares {}",
                                     n, size));
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
