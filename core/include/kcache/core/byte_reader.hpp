// ByteReader: the one bounds-checked reader of untrusted bytes in kcache.
//
// Used by everything that decodes bytes it did not just produce itself: core's LMDB
// records (records.cpp), the bundle format (bundle.cpp, over each piece it reads from
// the file) and the loader's ELF, cubin, fatbin and PTX parsers. Header-only and
// dependency-free (error.hpp aside), so the loader and the fuzz targets that compile
// the loader's sources alone can use it.
//
// The contract:
//   * A reader is a view of bytes it does not own (they must outlive it) and a position
//     in them, 0 <= position() <= size().
//   * Integers are little-endian (le<T>, u8 ... i64, read) or big-endian (be<T>, for
//     LMDB keys), assembled byte by byte: no unaligned or type-punned access.
//   * Every offset and length is checked before anything is read, written so that no
//     addition can overflow whatever 64-bit values a crafted header holds
//     (offset <= size && length <= size - offset).
//   * The one behaviour past the end: an accessor that would read, skip or seek past
//     the end returns an Error (code EIO, the code of a damaged input) and leaves the
//     position where it was; nothing is read, no value is made up. Its message names
//     the input, the request and the size:
//       "<what>: 8 bytes at offset 40 run past the end (43 bytes)"
//     (offsets count from `base`, the view's offset in a larger input, when one is
//     given). There is no sticky "failed" state and no zero standing in for a value.
//   * Random-access accessors (le_at, slice, c_str, sub) never move the position and
//     fail the same way.
//   * Nothing throws.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "kcache/core/error.hpp"

namespace kcache::core {

// The error of a request for `length` bytes at `offset` of an input of `size` bytes
// named `what`: the message every past-the-end read in kcache reports.
inline Error past_end_error(std::string_view what, std::uint64_t offset, std::uint64_t length,
                            std::uint64_t size) {
    std::string message(what);
    message += ": ";
    message += std::to_string(length);
    message += length == 1 ? " byte at offset " : " bytes at offset ";
    message += std::to_string(offset);
    message += length == 1 ? " runs past the end (" : " run past the end (";
    message += std::to_string(size);
    message += size == 1 ? " byte)" : " bytes)";
    return Error{EIO, std::move(message)};
}

class ByteReader {
  public:
    ByteReader() = default;
    // `what` names the input in error messages (kept as a view: it must outlive the
    // reader, as the bytes must); `base` is the offset of `bytes` in the input the
    // messages speak of.
    explicit ByteReader(std::string_view bytes, std::string_view what = "input",
                        std::uint64_t base = 0) noexcept
        : m_data(bytes), m_what(what), m_base(base) {}

    // ---- where ------------------------------------------------------------------
    std::uint64_t size() const { return m_data.size(); }
    std::uint64_t position() const { return m_pos; }
    std::uint64_t remaining() const { return m_data.size() - m_pos; }
    bool at_end() const { return m_pos == m_data.size(); }
    std::string_view data() const { return m_data; }                // all of it
    std::string_view rest() const { return m_data.substr(m_pos); }  // what is left
    std::string_view what() const { return m_what; }
    std::uint64_t base() const { return m_base; }

    // True when [offset, offset + length) lies inside the view.
    bool contains(std::uint64_t offset, std::uint64_t length) const {
        return offset <= m_data.size() && length <= m_data.size() - offset;
    }

    // The error of reading `length` bytes at `offset` (of this view).
    Error past_end(std::uint64_t offset, std::uint64_t length) const {
        return past_end_error(m_what, m_base + offset, length, m_base + m_data.size());
    }

    // ---- sequential reads: consume on success, nothing on failure ----------------
    template <class T>
    Result<T> le() {
        auto v = le_at<T>(m_pos);
        if (v) m_pos += sizeof(T);
        return v;
    }
    template <class T>
    Result<T> be() {
        auto v = be_at<T>(m_pos);
        if (v) m_pos += sizeof(T);
        return v;
    }
    Result<std::uint8_t> u8() { return le<std::uint8_t>(); }
    Result<std::uint16_t> u16() { return le<std::uint16_t>(); }
    Result<std::uint32_t> u32() { return le<std::uint32_t>(); }
    Result<std::uint64_t> u64() { return le<std::uint64_t>(); }
    Result<std::int64_t> i64() { return le<std::int64_t>(); }

    // The next `n` bytes.
    Result<std::string_view> bytes(std::uint64_t n) {
        auto v = slice(m_pos, n);
        if (v) m_pos += n;
        return v;
    }
    // A u16 / u32 length, then that many bytes; all or nothing.
    Result<std::string_view> str16() { return counted<std::uint16_t>(); }
    Result<std::string_view> str32() { return counted<std::uint32_t>(); }

    // Reads each field in turn as a little-endian integer of its own width (integers,
    // and enums as their underlying type); all or nothing: when they do not all fit,
    // no field is written and the position does not move.
    template <class... Ts>
    Status read(Ts&... fields) {
        constexpr std::uint64_t total = (std::uint64_t{0} + ... + sizeof(Ts));
        if (!contains(m_pos, total)) return tl::unexpected(past_end(m_pos, total));
        (assign(fields), ...);
        return {};
    }

    Status skip(std::uint64_t n) {
        if (!contains(m_pos, n)) return tl::unexpected(past_end(m_pos, n));
        m_pos += n;
        return {};
    }
    // Moves to `position` (0 ... size(); size() is the end).
    Status seek(std::uint64_t position) {
        if (position > m_data.size()) return tl::unexpected(past_end(position, 0));
        m_pos = position;
        return {};
    }
    // Succeeds when every byte was read; else an error naming the trailing bytes.
    Status expect_end() const {
        if (at_end()) return {};
        return tl::unexpected(Error{EIO, std::string(m_what) + ": " + std::to_string(remaining()) +
                                             " trailing bytes at offset " +
                                             std::to_string(m_base + m_pos)});
    }

    // ---- random access: never moves the position ---------------------------------
    template <class T>
    Result<T> le_at(std::uint64_t offset) const {
        using U = unsigned_of<T>;
        if (!contains(offset, sizeof(T))) return tl::unexpected(past_end(offset, sizeof(T)));
        U value = 0;
        for (std::size_t i = sizeof(T); i-- > 0;) {
            value = static_cast<U>(static_cast<U>(value << 8) | byte(offset + i));
        }
        return static_cast<T>(value);
    }
    template <class T>
    Result<T> be_at(std::uint64_t offset) const {
        using U = unsigned_of<T>;
        if (!contains(offset, sizeof(T))) return tl::unexpected(past_end(offset, sizeof(T)));
        U value = 0;
        for (std::size_t i = 0; i < sizeof(T); ++i) {
            value = static_cast<U>(static_cast<U>(value << 8) | byte(offset + i));
        }
        return static_cast<T>(value);
    }
    Result<std::string_view> slice(std::uint64_t offset, std::uint64_t length) const {
        if (!contains(offset, length)) return tl::unexpected(past_end(offset, length));
        return m_data.substr(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
    }
    // A reader over [offset, offset + length), at its start, its messages counting
    // offsets in this reader's input.
    Result<ByteReader> sub(std::uint64_t offset, std::uint64_t length) const {
        auto s = slice(offset, length);
        if (!s) return tl::unexpected(s.error());
        return ByteReader(*s, m_what, m_base + offset);
    }
    // The NUL-terminated string at `offset`, without its NUL: fails when `offset` is
    // not inside the view or no NUL follows it inside the view.
    Result<std::string_view> c_str(std::uint64_t offset) const {
        if (offset >= m_data.size()) return tl::unexpected(past_end(offset, 1));
        const std::size_t at = static_cast<std::size_t>(offset);
        const std::size_t end = m_data.find('\0', at);
        if (end == std::string_view::npos) {
            return tl::unexpected(Error{
                EIO, std::string(m_what) + ": string at offset " + std::to_string(m_base + offset) +
                         " runs past the end without a NUL (" +
                         std::to_string(m_base + m_data.size()) + " bytes)"});
        }
        return m_data.substr(at, end - at);
    }

  private:
    template <class T>
    static constexpr auto unsigned_of_impl() {
        if constexpr (std::is_enum_v<T>) {
            return std::make_unsigned_t<std::underlying_type_t<T>>{};
        } else {
            static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>,
                          "ByteReader reads integers and enums");
            return std::make_unsigned_t<T>{};
        }
    }
    template <class T>
    using unsigned_of = decltype(unsigned_of_impl<T>());

    unsigned char byte(std::uint64_t at) const {
        return static_cast<unsigned char>(m_data[static_cast<std::size_t>(at)]);
    }
    template <class T>
    void assign(T& field) {
        field = *le_at<T>(m_pos);  // checked by read()
        m_pos += sizeof(T);
    }
    template <class N>
    Result<std::string_view> counted() {
        const std::uint64_t start = m_pos;
        auto n = le<N>();
        if (!n) return tl::unexpected(n.error());
        auto body = bytes(*n);
        if (!body) m_pos = start;
        return body;
    }

    std::string_view m_data;
    std::string_view m_what = "input";
    std::uint64_t m_base = 0;
    std::uint64_t m_pos = 0;
};

}  // namespace kcache::core
