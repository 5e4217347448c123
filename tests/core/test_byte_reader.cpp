// ByteReader (kcache/core/byte_reader.hpp): every accessor at the end and past it.
// Past the end is always an EIO error naming the input, the request and the size; the
// position never moves on a failure and no value is made up.
#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "core_test_util.hpp"
#include "kcache/core/byte_reader.hpp"
#include "kcache/core/byte_writer.hpp"
#include "records.hpp"

using kcache::core::ByteReader;
using kcache::core::Error;

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

// A failed result: EIO, and a message naming `what` and the end.
template <class R>
void check_past_end(const R& r, std::string_view expected) {
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == EIO);
    CHECK(r.error().message == expected);
}

const std::string kBytes("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b", 11);

}  // namespace

TEST_CASE("byte reader: little- and big-endian integers of every width", "[byte_reader]") {
    ByteReader r(kBytes, "t");
    CHECK(*r.u8() == 0x01);
    CHECK(*r.u16() == 0x0302);
    CHECK(*r.u32() == 0x07060504u);
    CHECK(r.position() == 7);
    CHECK(r.remaining() == 4);
    CHECK(*r.le_at<std::uint64_t>(0) == 0x0807060504030201ull);
    CHECK(*r.be_at<std::uint64_t>(0) == 0x0102030405060708ull);
    CHECK(*r.be_at<std::uint16_t>(9) == 0x0a0b);
    CHECK(*ByteReader(std::string_view("\xff\xff\xff\xff\xff\xff\xff\xff", 8)).i64() == -1);
    CHECK(*ByteReader(std::string_view("\xfe", 1)).le<std::int8_t>() == -2);
    CHECK(r.position() == 7);  // random access does not move
}

TEST_CASE("byte reader: every sequential accessor at and past the end", "[byte_reader]") {
    ByteReader r(kBytes, "t");
    REQUIRE(r.skip(11));  // at the end exactly: fine
    CHECK(r.at_end());
    CHECK(r.rest().empty());
    CHECK(r.skip(0));
    CHECK(*r.bytes(0) == "");
    CHECK(r.expect_end());
    check_past_end(r.u8(), "t: 1 byte at offset 11 runs past the end (11 bytes)");
    check_past_end(r.u16(), "t: 2 bytes at offset 11 run past the end (11 bytes)");
    check_past_end(r.u32(), "t: 4 bytes at offset 11 run past the end (11 bytes)");
    check_past_end(r.u64(), "t: 8 bytes at offset 11 run past the end (11 bytes)");
    check_past_end(r.i64(), "t: 8 bytes at offset 11 run past the end (11 bytes)");
    check_past_end(r.be<std::uint32_t>(), "t: 4 bytes at offset 11 run past the end (11 bytes)");
    check_past_end(r.bytes(1), "t: 1 byte at offset 11 runs past the end (11 bytes)");
    check_past_end(r.bytes(kMax),
                   "t: 18446744073709551615 bytes at offset 11 run past the end (11 bytes)");
    check_past_end(r.skip(1), "t: 1 byte at offset 11 runs past the end (11 bytes)");
    check_past_end(r.str16(), "t: 2 bytes at offset 11 run past the end (11 bytes)");
    check_past_end(r.str32(), "t: 4 bytes at offset 11 run past the end (11 bytes)");
    std::uint8_t a = 7;
    check_past_end(r.read(a), "t: 1 byte at offset 11 runs past the end (11 bytes)");
    CHECK(a == 7);
    CHECK(r.position() == 11);
    check_past_end(r.seek(12), "t: 0 bytes at offset 12 run past the end (11 bytes)");
    REQUIRE(r.seek(11));
    REQUIRE(r.seek(0));
    CHECK(r.position() == 0);
}

TEST_CASE("byte reader: a read that straddles the end fails whole and consumes nothing",
          "[byte_reader]") {
    ByteReader r(kBytes, "t");
    REQUIRE(r.skip(8));
    check_past_end(r.u32(), "t: 4 bytes at offset 8 run past the end (11 bytes)");
    check_past_end(r.u64(), "t: 8 bytes at offset 8 run past the end (11 bytes)");
    check_past_end(r.bytes(4), "t: 4 bytes at offset 8 run past the end (11 bytes)");
    check_past_end(r.skip(4), "t: 4 bytes at offset 8 run past the end (11 bytes)");
    std::uint16_t x = 1, y = 2;
    check_past_end(r.read(x, y), "t: 4 bytes at offset 8 run past the end (11 bytes)");
    CHECK((x == 1 && y == 2));  // all or nothing
    CHECK(r.position() == 8);
    REQUIRE(r.read(x));
    CHECK(x == 0x0a09);
    CHECK(r.position() == 10);
    CHECK_FALSE(r.expect_end());
    CHECK(r.expect_end().error().message == "t: 1 trailing bytes at offset 10");
}

TEST_CASE("byte reader: length-prefixed strings", "[byte_reader]") {
    const std::string in = std::string("\x03\x00", 2) + "abc" + std::string("\x05\x00", 2) + "de";
    ByteReader r(in, "s");
    CHECK(*r.str16() == "abc");
    // The length says 5, 2 bytes follow: fails and leaves the position at the length.
    check_past_end(r.str16(), "s: 5 bytes at offset 7 run past the end (9 bytes)");
    CHECK(r.position() == 5);
    ByteReader r32(std::string_view("\x01\x00\x00\x00z", 5), "s");
    CHECK(*r32.str32() == "z");
    CHECK(r32.at_end());
}

TEST_CASE("byte reader: random access at and past the end", "[byte_reader]") {
    const ByteReader r(kBytes, "t");
    CHECK(r.contains(11, 0));
    CHECK(r.contains(0, 11));
    CHECK_FALSE(r.contains(12, 0));
    CHECK_FALSE(r.contains(1, kMax));  // no overflow
    CHECK_FALSE(r.contains(kMax, 1));
    CHECK(*r.le_at<std::uint8_t>(10) == 0x0b);
    check_past_end(r.le_at<std::uint16_t>(10),
                   "t: 2 bytes at offset 10 run past the end (11 bytes)");
    check_past_end(r.be_at<std::uint16_t>(10),
                   "t: 2 bytes at offset 10 run past the end (11 bytes)");
    check_past_end(r.le_at<std::uint64_t>(kMax),
                   "t: 8 bytes at offset 18446744073709551615 run past the end (11 bytes)");
    CHECK(*r.slice(11, 0) == "");
    check_past_end(r.slice(10, 2), "t: 2 bytes at offset 10 run past the end (11 bytes)");
    check_past_end(
        r.slice(kMax, kMax),
        "t: 18446744073709551615 bytes at offset 18446744073709551615 run past the end (11 bytes)");
    check_past_end(r.sub(4, 8), "t: 8 bytes at offset 4 run past the end (11 bytes)");
    check_past_end(r.c_str(11), "t: 1 byte at offset 11 runs past the end (11 bytes)");
    REQUIRE_FALSE(r.c_str(0).has_value());  // no NUL in the view
    CHECK(r.c_str(0).error().code == EIO);
    CHECK(r.c_str(0).error().message ==
          "t: string at offset 0 runs past the end without a NUL (11 bytes)");
    const ByteReader s(std::string_view("ab\0c\0", 5), "s");
    CHECK(*s.c_str(0) == "ab");
    CHECK(*s.c_str(2) == "");
    CHECK(*s.c_str(3) == "c");
    CHECK(r.position() == 0);
}

TEST_CASE("byte reader: a sub-reader counts offsets in the whole input", "[byte_reader]") {
    const ByteReader r(kBytes, "file");
    auto sub = r.sub(4, 4);
    REQUIRE(sub);
    CHECK(sub->size() == 4);
    CHECK(*sub->u16() == 0x0605);
    check_past_end(sub->u32(), "file: 4 bytes at offset 6 run past the end (8 bytes)");
    CHECK(*sub->u16() == 0x0807);
    check_past_end(sub->u8(), "file: 1 byte at offset 8 runs past the end (8 bytes)");
}

TEST_CASE("byte reader: an empty view", "[byte_reader]") {
    ByteReader r;
    CHECK(r.at_end());
    CHECK(r.size() == 0);
    check_past_end(r.u8(), "input: 1 byte at offset 0 runs past the end (0 bytes)");
    check_past_end(r.le_at<std::uint8_t>(0),
                   "input: 1 byte at offset 0 runs past the end (0 bytes)");
    check_past_end(r.c_str(0), "input: 1 byte at offset 0 runs past the end (0 bytes)");
    CHECK(r.expect_end());
}

TEST_CASE("byte reader: records decoders report a short record as the reader's error",
          "[byte_reader]") {
    namespace records = kcache::core::records;
    records::Dirent d{42, kcache::core::FileType::regular};
    const std::string whole = records::encode(d);
    CHECK(records::decode_dirent(whole)->child == 42);
    const auto cut = records::decode_dirent(std::string_view(whole).substr(0, 5));
    REQUIRE_FALSE(cut);
    CHECK(cut.error().code == EUCLEAN);  // kCorruptDb (kcache/core/integrity.hpp): a damaged db
    CHECK(cut.error().message ==
          "corrupt directory entry record: directory entry: 9 bytes at offset 0 run past the end "
          "(5 bytes)");
    const auto longer = records::decode_dirent(whole + "x");
    REQUIRE_FALSE(longer);
    CHECK(longer.error().message ==
          "corrupt directory entry record: directory entry: 1 trailing bytes at offset 9");
    CHECK(records::decode_u32(std::string_view("\x01\x00\x00\x00", 4), "lease").value() == 1);
    CHECK_FALSE(records::decode_u32("abc", "lease"));
    // Keys too short for their integer decode as 0 (no record's key).
    CHECK(records::u64_from_key("abc") == 0);
    CHECK(records::u64_from_key(records::u64_key(7)) == 7);
    CHECK(records::digest_from_key("short").empty());
}

// ByteWriter (kcache/core/byte_writer.hpp) writes what ByteReader reads back: the same
// widths, byte orders and length prefixes.
TEST_CASE("byte writer: what it writes the reader reads back, byte for byte", "[byte_reader]") {
    enum class Tag : std::uint8_t { a = 7 };
    std::string out("x");  // what the string held stays
    kcache::core::ByteWriter w(out);
    w.u8(0x01);
    w.u16(0x0302);
    w.u32(0x07060504u);
    w.i64(-2);
    w.be<std::uint32_t>(0x0a0b0c0du);
    w.write(Tag::a, std::uint16_t{0xbeef}, std::int32_t{-1});
    w.str16("ab");
    w.str32("");
    w.bytes("z");
    CHECK(out == std::string("x\x01\x02\x03\x04\x05\x06\x07"
                             "\xfe\xff\xff\xff\xff\xff\xff\xff"
                             "\x0a\x0b\x0c\x0d\x07\xef\xbe\xff\xff\xff\xff"
                             "\x02\x00"
                             "ab\x00\x00\x00\x00z",
                             36));
    ByteReader r(std::string_view(out).substr(1), "t");
    std::uint8_t a = 0;
    std::uint16_t b = 0;
    std::uint32_t c = 0;
    std::int64_t d = 0;
    REQUIRE(r.read(a, b, c, d));
    CHECK((a == 0x01 && b == 0x0302 && c == 0x07060504u && d == -2));
    CHECK(*r.be<std::uint32_t>() == 0x0a0b0c0du);
    Tag t{};
    std::uint16_t e = 0;
    std::int32_t f = 0;
    REQUIRE(r.read(t, e, f));
    CHECK((t == Tag::a && e == 0xbeef && f == -1));
    CHECK(*r.str16() == "ab");
    CHECK(*r.str32() == "");
    CHECK(*r.bytes(1) == "z");
    CHECK(r.expect_end());
}
