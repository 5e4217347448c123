#include "kcache/core/units.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace kcache::core {
namespace {

// Splits "1.5GiB" into 1.5 and "GiB"; fails on anything but digits, one dot, suffix.
Result<std::pair<double, std::string_view>> number_and_unit(std::string_view text,
                                                            std::string_view what) {
    std::size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
    const std::string number(text.substr(0, i));
    char* end = nullptr;
    errno = 0;
    const double value = number.empty() ? 0 : std::strtod(number.c_str(), &end);
    if (number.empty() || errno != 0 || end != number.c_str() + number.size() || value < 0) {
        return fail(EINVAL, fmt::format("invalid {} '{}'", what, text));
    }
    std::string_view unit = text.substr(i);
    while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
    return std::pair{value, unit};
}

}  // namespace

Result<std::uint64_t> parse_size(std::string_view text) {
    auto parsed = number_and_unit(text, "size");
    if (!parsed) return tl::unexpected(parsed.error());
    auto [value, unit] = *parsed;
    std::string u(unit);
    for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (u.size() >= 2 && u.substr(u.size() - 2) == "IB") u.resize(u.size() - 2);
    else if (u.size() >= 2 && u.back() == 'B') u.pop_back();
    double scale = 1;
    if (u.empty() || u == "B") scale = 1;
    else if (u == "K") scale = 1024.0;
    else if (u == "M") scale = 1024.0 * 1024;
    else if (u == "G") scale = 1024.0 * 1024 * 1024;
    else if (u == "T") scale = 1024.0 * 1024 * 1024 * 1024;
    else return fail(EINVAL, fmt::format("invalid size '{}': unknown unit '{}'", text, unit));
    const double bytes = value * scale;
    if (bytes >= 1.8e19) return fail(ERANGE, fmt::format("size '{}' is too large", text));
    return static_cast<std::uint64_t>(std::llround(bytes));
}

Result<std::int64_t> parse_duration(std::string_view text) {
    auto parsed = number_and_unit(text, "duration");
    if (!parsed) return tl::unexpected(parsed.error());
    auto [value, unit] = *parsed;
    double seconds = 0;
    if (unit.empty() || unit == "s") seconds = value;
    else if (unit == "m" || unit == "min") seconds = value * 60;
    else if (unit == "h") seconds = value * 3600;
    else if (unit == "d") seconds = value * 86400;
    else if (unit == "w") seconds = value * 7 * 86400;
    else return fail(EINVAL, fmt::format("invalid duration '{}': unknown unit '{}'", text, unit));
    if (seconds > 9.2e9) return fail(ERANGE, fmt::format("duration '{}' is too long", text));
    return static_cast<std::int64_t>(std::llround(seconds * 1e9));
}

std::string format_size(std::uint64_t bytes) {
    static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double value = static_cast<double>(bytes);
    int unit = 0;
    while (value >= 1024 && unit < 5) {
        value /= 1024;
        ++unit;
    }
    if (unit == 0) return fmt::format("{} B", bytes);
    return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string format_age(std::int64_t ns) {
    std::int64_t s = ns / 1'000'000'000;
    if (s < 0) s = 0;
    if (s < 60) return fmt::format("{}s", s);
    if (s < 3600) return fmt::format("{}m", s / 60);
    if (s < 86400) return fmt::format("{}h {}m", s / 3600, (s % 3600) / 60);
    return fmt::format("{}d {}h", s / 86400, (s % 86400) / 3600);
}

}  // namespace kcache::core
