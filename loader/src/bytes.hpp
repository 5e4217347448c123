// Bounds-checked reads from untrusted bytes.
//
// Every offset and length that comes from an input is checked here before anything
// is read: a read that does not fit returns nullopt. The checks are written so that
// no addition can overflow (offset <= size, length <= size - offset), whatever
// 64-bit values a crafted header holds. Integers are little-endian (every format the
// loader reads is), assembled byte by byte: no unaligned or type-punned access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace kcache::loader::detail {

class Bytes {
  public:
    Bytes() = default;
    explicit Bytes(std::string_view data) : m_data(data) {}

    std::size_t size() const { return m_data.size(); }
    std::string_view data() const { return m_data; }

    bool contains(std::uint64_t offset, std::uint64_t length) const {
        return offset <= m_data.size() && length <= m_data.size() - offset;
    }

    std::optional<std::string_view> slice(std::uint64_t offset, std::uint64_t length) const {
        if (!contains(offset, length)) return std::nullopt;
        return m_data.substr(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
    }

    // An unsigned little-endian integer of sizeof(T) bytes at `offset`.
    template <class T>
    std::optional<T> le(std::uint64_t offset) const {
        static_assert(std::is_unsigned_v<T>);
        if (!contains(offset, sizeof(T))) return std::nullopt;
        T value = 0;
        for (std::size_t i = 0; i < sizeof(T); ++i) {
            const auto byte =
                static_cast<unsigned char>(m_data[static_cast<std::size_t>(offset) + i]);
            value = static_cast<T>(value | static_cast<T>(static_cast<T>(byte) << (8 * i)));
        }
        return value;
    }

    // The NUL-terminated string starting at `offset` (without the NUL). nullopt when
    // `offset` is outside the view or no NUL follows it inside the view.
    std::optional<std::string_view> c_str(std::uint64_t offset) const {
        if (offset >= m_data.size()) return std::nullopt;
        const std::size_t end = m_data.find('\0', static_cast<std::size_t>(offset));
        if (end == std::string_view::npos) return std::nullopt;
        return m_data.substr(static_cast<std::size_t>(offset),
                             end - static_cast<std::size_t>(offset));
    }

  private:
    std::string_view m_data;
};

// Reads fields one after another from a fixed-size record that was checked to fit.
// Used only on slices whose length covers every field read (asserted by the caller's
// slice()), so its reads cannot fail; an out-of-range read returns 0 all the same.
class Cursor {
  public:
    explicit Cursor(std::string_view record) : m_bytes(record) {}
    template <class T>
    T next() {
        const T value = m_bytes.le<T>(m_at).value_or(T{0});
        m_at += sizeof(T);
        return value;
    }
    void skip(std::size_t n) { m_at += n; }

  private:
    Bytes m_bytes;
    std::uint64_t m_at = 0;
};

}  // namespace kcache::loader::detail
