// parse_size, parse_duration, format_size, format_age.
#include <cerrno>
#include <cstdint>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/units.hpp"

using namespace kcache;
using namespace kcache::test;
using core::format_age;
using core::format_size;
using core::parse_duration;
using core::parse_size;

namespace {
constexpr std::uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024, TiB = GiB * 1024;
constexpr std::int64_t kMinute = 60 * kSecond, kHour = 60 * kMinute, kDay = 24 * kHour;
}  // namespace

TEST_CASE("units: parse_size reads bytes and binary suffixes", "[units]") {
    CHECK(KC_MUST(parse_size("0")) == 0);
    CHECK(KC_MUST(parse_size("1024")) == 1024);
    CHECK(KC_MUST(parse_size("10K")) == 10 * KiB);
    CHECK(KC_MUST(parse_size("1M")) == MiB);
    CHECK(KC_MUST(parse_size("5G")) == 5 * GiB);
    CHECK(KC_MUST(parse_size("2T")) == 2 * TiB);
    CHECK(KC_MUST(parse_size("1KiB")) == KiB);
    CHECK(KC_MUST(parse_size("1.5GiB")) == GiB + GiB / 2);
    CHECK(KC_MUST(parse_size("10GB")) == 10 * GiB);  // K/M/G/T are powers of 1024
    CHECK(KC_MUST(parse_size("1.5K")) == 1536);
    CHECK(KC_MUST(parse_size("0.5M")) == MiB / 2);
}

TEST_CASE("units: parse_size is exact for every 64-bit byte count", "[units]") {
    CHECK(KC_MUST(parse_size("9007199254740993")) == 9007199254740993ull);  // 2^53 + 1
    CHECK(KC_MUST(parse_size("18446744073709551615")) == UINT64_MAX);
    CHECK(KC_MUST(parse_size("16777215T")) == 16777215 * TiB);
}

TEST_CASE("units: parse_size refuses what is not a size with EINVAL", "[units]") {
    for (const char* text : {"", " ", "abc", "G", "-1", "-5G", "10X", "10KX", "1.5.5G", "1,5G",
                             "0x10", "5 G extra", ".", "K10"}) {
        INFO("'" << text << "'");
        CHECK(err(parse_size(text)) == EINVAL);
    }
}

TEST_CASE("units: parse_size refuses values that do not fit in 64 bits", "[units]") {
    for (const char* text :
         {"18446744073709551616", "99999999999999999999999", "16777216T", "20000000T"}) {
        INFO("'" << text << "'");
        auto r = parse_size(text);
        REQUIRE_FALSE(r.has_value());
        CHECK((r.error().code == EINVAL || r.error().code == ERANGE));
    }
}

TEST_CASE("units: parse_duration reads s, m, h, d, w and bare seconds", "[units]") {
    CHECK(KC_MUST(parse_duration("30s")) == 30 * kSecond);
    CHECK(KC_MUST(parse_duration("15m")) == 15 * kMinute);
    CHECK(KC_MUST(parse_duration("12h")) == 12 * kHour);
    CHECK(KC_MUST(parse_duration("7d")) == 7 * kDay);
    CHECK(KC_MUST(parse_duration("2w")) == 14 * kDay);
    CHECK(KC_MUST(parse_duration("45")) == 45 * kSecond);
    CHECK(KC_MUST(parse_duration("0s")) == 0);
    CHECK(KC_MUST(parse_duration("0")) == 0);
}

TEST_CASE("units: parse_duration refuses what is not a duration", "[units]") {
    for (const char* text :
         {"", "d", "7x", "-5s", "-1", "1.2.3h", "abc", "5 days later", "999999999999999999w"}) {
        INFO("'" << text << "'");
        auto r = parse_duration(text);
        REQUIRE_FALSE(r.has_value());
        CHECK((r.error().code == EINVAL || r.error().code == ERANGE));
    }
}

TEST_CASE("units: format_size prints binary units people read", "[units]") {
    CHECK(format_size(GiB + GiB / 2) == "1.5 GiB");
    CHECK(format_size(0).find('0') != std::string::npos);
    CHECK(format_size(0).find("B") != std::string::npos);
    CHECK(format_size(512).find("512") != std::string::npos);
    CHECK(format_size(1023).find("KiB") == std::string::npos);
    CHECK(format_size(1536).find("KiB") != std::string::npos);
    CHECK(format_size(5 * MiB).find("MiB") != std::string::npos);
    CHECK(format_size(10 * GiB).find("GiB") != std::string::npos);
    CHECK(format_size(3 * TiB).find("TiB") != std::string::npos);
    CHECK_FALSE(format_size(UINT64_MAX).empty());
}

TEST_CASE("units: format_age prints the two largest units", "[units]") {
    CHECK(format_age(5 * kSecond) == "5s");
    CHECK(format_age(12 * kMinute) == "12m");
    CHECK(format_age(3 * kDay + 4 * kHour) == "3d 4h");
    CHECK_FALSE(format_age(0).empty());
}
