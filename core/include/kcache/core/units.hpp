// Parsing and printing of sizes and durations as people write them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kcache/core/error.hpp"

namespace kcache::core {

// "1024", "10K", "5G", "1.5GiB", "10GB" (K/M/G/T are powers of 1024). EINVAL otherwise.
Result<std::uint64_t> parse_size(std::string_view text);
// "30s", "15m", "12h", "7d", "2w" (a bare number is seconds) into nanoseconds.
Result<std::int64_t> parse_duration(std::string_view text);
std::string format_size(std::uint64_t bytes);  // "1.5 GiB"
std::string format_age(std::int64_t ns);       // "3d 4h", "12m", "5s"

}  // namespace kcache::core
