// Text as the viewer shows it: lines found once, then any line at O(1), and search.
//
// Owns its text. Thread: any, one at a time. Nothing here fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kcache::gui {

class TextDocument {
  public:
    TextDocument() = default;
    explicit TextDocument(std::string text) { assign(std::move(text)); }
    void assign(std::string text);

    std::size_t line_count() const { return m_starts.size(); }
    std::string_view line(std::size_t i) const;  // without its '\n' (or "\r\n")
    const std::string& text() const { return m_text; }

    // The first line containing `query` (ASCII case-insensitive) after line `from`
    // going forward (before it going backward), wrapping around the end; `from`
    // itself is tried last. nullopt when no line contains it or the query is empty.
    std::optional<std::size_t> find(std::string_view query, std::size_t from,
                                    bool forward = true) const;
    std::size_t count_matching_lines(std::string_view query) const;

  private:
    std::string m_text;
    std::vector<std::uint32_t> m_starts;  // offset of each line
};

// ASCII case-insensitive substring test (`needle` must already be lower case).
bool contains_lower(std::string_view haystack, std::string_view needle_lower);
std::string to_lower(std::string_view text);

// One line of a hex dump: "00000010  4b 43 ...  |KC..|", 16 bytes per line.
inline constexpr std::size_t kHexBytesPerLine = 16;
std::string hex_line(std::string_view bytes, std::size_t line);
inline std::size_t hex_line_count(std::size_t size) {
    return (size + kHexBytesPerLine - 1) / kHexBytesPerLine;
}

}  // namespace kcache::gui
