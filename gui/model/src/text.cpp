#include "kcache/gui/text.hpp"

#include <algorithm>

namespace kcache::gui {
namespace {

char lower(char c) {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

std::string to_lower(std::string_view text) {
    std::string out(text);
    for (char& c : out) c = lower(c);
    return out;
}

bool contains_lower(std::string_view haystack, std::string_view needle_lower) {
    if (needle_lower.empty()) return true;
    if (needle_lower.size() > haystack.size()) return false;
    const auto it = std::search(haystack.begin(), haystack.end(), needle_lower.begin(),
                                needle_lower.end(), [](char h, char n) { return lower(h) == n; });
    return it != haystack.end();
}

void TextDocument::assign(std::string text) {
    m_text = std::move(text);
    m_starts.clear();
    m_starts.push_back(0);
    for (std::size_t i = 0; i < m_text.size(); ++i) {
        if (m_text[i] == '\n' && i + 1 < m_text.size()) {
            m_starts.push_back(static_cast<std::uint32_t>(i + 1));
        }
    }
}

std::string_view TextDocument::line(std::size_t i) const {
    const std::size_t begin = m_starts[i];
    std::size_t end = i + 1 < m_starts.size() ? m_starts[i + 1] - 1 : m_text.size();
    if (end > begin && m_text[end - 1] == '\n') --end;
    if (end > begin && m_text[end - 1] == '\r') --end;
    return std::string_view(m_text).substr(begin, end - begin);
}

std::optional<std::size_t> TextDocument::find(std::string_view query, std::size_t from,
                                              bool forward) const {
    if (query.empty() || m_starts.empty()) return std::nullopt;
    const std::string needle = to_lower(query);
    const std::size_t n = m_starts.size();
    from = std::min(from, n - 1);
    for (std::size_t step = 1; step <= n; ++step) {
        const std::size_t i = forward ? (from + step) % n : (from + n - step % n) % n;
        if (contains_lower(line(i), needle)) return i;
    }
    return std::nullopt;
}

std::size_t TextDocument::count_matching_lines(std::string_view query) const {
    if (query.empty()) return 0;
    const std::string needle = to_lower(query);
    std::size_t count = 0;
    for (std::size_t i = 0; i < m_starts.size(); ++i) count += contains_lower(line(i), needle);
    return count;
}

std::string hex_line(std::string_view bytes, std::size_t line) {
    static constexpr char kDigits[] = "0123456789abcdef";
    const std::size_t begin = line * kHexBytesPerLine;
    std::string out;
    out.reserve(80);
    for (int shift = 28; shift >= 0; shift -= 4) out += kDigits[(begin >> shift) & 0xf];
    out += "  ";
    std::string ascii;
    for (std::size_t i = 0; i < kHexBytesPerLine; ++i) {
        if (begin + i < bytes.size()) {
            const auto b = static_cast<unsigned char>(bytes[begin + i]);
            out += kDigits[b >> 4];
            out += kDigits[b & 0xf];
            ascii += (b >= 0x20 && b < 0x7f) ? static_cast<char>(b) : '.';
        } else {
            out += "  ";
        }
        out += i == 7 ? "  " : " ";
    }
    out += " |" + ascii + "|";
    return out;
}

}  // namespace kcache::gui
