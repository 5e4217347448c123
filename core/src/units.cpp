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
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
        ++i;
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
    // Exact integer arithmetic: every 64-bit byte count round-trips.
    auto invalid = [&] { return fail(EINVAL, fmt::format("invalid size '{}'", text)); };
    auto too_large = [&] { return fail(ERANGE, fmt::format("size '{}' is too large", text)); };
    std::size_t i = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (i == 0) return invalid();
    std::uint64_t whole = 0;
    if (std::from_chars(text.data(), text.data() + i, whole).ec != std::errc{}) return too_large();
    std::string_view fraction;
    if (i < text.size() && text[i] == '.') {
        const std::size_t from = ++i;
        while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
        fraction = text.substr(from, i - from);
        if (fraction.empty()) return invalid();
    }
    std::string unit(text.substr(i));
    while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
    for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (unit.size() >= 2 && unit.substr(unit.size() - 2) == "IB")
        unit.resize(unit.size() - 2);
    else if (unit.size() >= 2 && unit.back() == 'B')
        unit.pop_back();
    int shift = 0;
    if (unit.empty() || unit == "B")
        shift = 0;
    else if (unit == "K")
        shift = 10;
    else if (unit == "M")
        shift = 20;
    else if (unit == "G")
        shift = 30;
    else if (unit == "T")
        shift = 40;
    else
        return fail(EINVAL,
                    fmt::format("invalid size '{}': unknown unit '{}'", text, text.substr(i)));
    if (shift == 0 && !fraction.empty()) return invalid();  // no fractions of a byte
    const std::uint64_t scale = std::uint64_t{1} << shift;
    std::uint64_t bytes = 0;
    if (__builtin_mul_overflow(whole, scale, &bytes)) return too_large();
    // The fraction, rounded to the byte; six digits (a millionth of a unit) bound the
    // product below 2^64 for every unit up to T.
    std::uint64_t numerator = 0, denominator = 1;
    for (char c : fraction.substr(0, 6)) {
        numerator = numerator * 10 + static_cast<std::uint64_t>(c - '0');
        denominator *= 10;
    }
    const std::uint64_t part = (numerator * scale + denominator / 2) / denominator;
    if (__builtin_add_overflow(bytes, part, &bytes)) return too_large();
    return bytes;
}

Result<std::int64_t> parse_duration(std::string_view text) {
    auto parsed = KCACHE_TRY(number_and_unit(text, "duration"));
    auto [value, unit] = parsed;
    double seconds = 0;
    if (unit.empty() || unit == "s")
        seconds = value;
    else if (unit == "m" || unit == "min")
        seconds = value * 60;
    else if (unit == "h")
        seconds = value * 3600;
    else if (unit == "d")
        seconds = value * 86400;
    else if (unit == "w")
        seconds = value * 7 * 86400;
    else
        return fail(EINVAL, fmt::format("invalid duration '{}': unknown unit '{}'", text, unit));
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
