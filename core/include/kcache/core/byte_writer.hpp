// ByteWriter: the one writer of the bytes ByteReader reads back (byte_reader.hpp), as
// LevelDB keeps one writer beside one reader (util/coding.h).
//
// Used by everything in kcache that encodes bytes for another to decode: core's LMDB
// records and keys (records.cpp), the bundle format (bundle_export.cpp) and the shared
// tier's values (remote/src/protocol.cpp, remote/src/families.cpp). Header-only and
// dependency-free, as ByteReader is.
//
// The contract, ByteReader's mirrored:
//   * A writer appends to a string it does not own (it must outlive the writer); it
//     never reads, moves or clears what the string held before.
//   * Integers are little-endian (le<T>, u8 ... i64, write) or big-endian (be<T>, for
//     LMDB keys whose byte order must be numeric order), written byte by byte: no
//     unaligned or type-punned access. Enums are written as their underlying type.
//   * str16 / str32 write a u16 / u32 length, then the bytes: what ByteReader's str16 /
//     str32 read. The length is the string's size cut to the field's width: a caller
//     that may hold a longer string cuts it first (records do; see records.cpp).
//   * Nothing fails and nothing throws (but std::string's own bad_alloc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace kcache::core {

class ByteWriter {
  public:
    explicit ByteWriter(std::string& out) noexcept : m_out(out) {}

    // ---- integers -----------------------------------------------------------------
    template <class T>
    void le(T value) {
        const std::uint64_t v = bits(value);
        for (std::size_t i = 0; i < sizeof(T); ++i) put(v >> (8 * i));
    }
    template <class T>
    void be(T value) {
        const std::uint64_t v = bits(value);
        for (std::size_t i = sizeof(T); i-- > 0;) put(v >> (8 * i));
    }
    void u8(std::uint8_t v) { le(v); }
    void u16(std::uint16_t v) { le(v); }
    void u32(std::uint32_t v) { le(v); }
    void u64(std::uint64_t v) { le(v); }
    void i64(std::int64_t v) { le(v); }

    // Writes each field in turn as a little-endian integer of its own width (integers,
    // and enums as their underlying type): what ByteReader::read reads back.
    template <class... Ts>
    void write(const Ts&... fields) {
        (le(fields), ...);
    }

    // ---- bytes --------------------------------------------------------------------
    void bytes(std::string_view s) { m_out.append(s); }
    // A u16 / u32 length (the size cut to that width), then the bytes.
    void str16(std::string_view s) {
        u16(static_cast<std::uint16_t>(s.size()));
        bytes(s);
    }
    void str32(std::string_view s) {
        u32(static_cast<std::uint32_t>(s.size()));
        bytes(s);
    }

  private:
    // The value's bits (an enum's as its underlying type), sign-extended to 64: their
    // low sizeof(T) bytes are the value's.
    template <class T>
    static std::uint64_t bits(T value) {
        if constexpr (std::is_enum_v<T>) {
            return static_cast<std::uint64_t>(static_cast<std::underlying_type_t<T>>(value));
        } else {
            static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>,
                          "ByteWriter writes integers and enums");
            return static_cast<std::uint64_t>(value);
        }
    }
    void put(std::uint64_t byte) { m_out.push_back(static_cast<char>(byte & 0xff)); }

    std::string& m_out;
};

}  // namespace kcache::core
