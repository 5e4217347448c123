// StagedFile: content built in memory under a write lease, published atomically.
#include <cerrno>
#include <string>
#include <utility>

#include "core_test_util.hpp"
#include "kcache/core/integrity.hpp"
#include "kcache/core/staged.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::StagedFile;

namespace {

bool in_flight(TestStore& ts, const std::string& entry) {
    auto txn = ts.read();
    return KC_MUST(txn.in_flight(KC_MUST(txn.resolve(entry))));
}

}  // namespace

TEST_CASE("staged: readers see the old content until publish", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "old content");
    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
    CHECK(staged.ino() == f);
    CHECK(staged.content() == "old content");
    CHECK_FALSE(staged.dirty());

    KC_MUST(staged.write(0, "NEW"));
    CHECK(staged.dirty());
    CHECK(staged.content() == "NEW content");
    CHECK(ts.get("k/f") == "old content");
    CHECK(ts.attr("k/f").size == 11);

    KC_MUST(staged.publish(test_origin()));
    CHECK(ts.get("k/f") == "NEW content");
    CHECK(ts.attr("k/f").digest == core::digest_of("NEW content"));
    check_consistent(ts.store());
}

TEST_CASE("staged: truncate starts from empty content (O_TRUNC)", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "old content");
    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, true));
    CHECK(staged.size() == 0);
    CHECK(ts.get("k/f") == "old content");
    KC_MUST(staged.write(0, "v2"));
    KC_MUST(staged.publish(test_origin()));
    CHECK(ts.get("k/f") == "v2");
}

TEST_CASE("staged: writes at offsets fill gaps with zeros", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "");
    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, true));

    KC_MUST(staged.write(10, "x"));
    CHECK(staged.content() == std::string(10, '\0') + "x");
    KC_MUST(staged.write(2, "yy"));
    CHECK(staged.content() == std::string("\0\0yy\0\0\0\0\0\0x", 11));
    KC_MUST(staged.write(11, "tail"));
    CHECK(staged.content() == std::string("\0\0yy\0\0\0\0\0\0xtail", 15));
    KC_MUST(staged.write(9, "ABCDEFGH"));  // overlaps the end and extends
    CHECK(staged.content() == std::string("\0\0yy\0\0\0\0\0ABCDEFGH", 17));

    SECTION("truncate shrinks and extends with zeros") {
        staged.truncate(4);
        CHECK(staged.content() == std::string("\0\0yy", 4));
        staged.truncate(6);
        CHECK(staged.content() == std::string("\0\0yy\0\0", 6));
        KC_MUST(staged.publish(test_origin()));
        CHECK(ts.get("k/f") == std::string("\0\0yy\0\0", 6));
    }
    SECTION("published exactly as staged") {
        KC_MUST(staged.publish(test_origin()));
        CHECK(ts.get("k/f") == std::string("\0\0yy\0\0\0\0\0ABCDEFGH", 17));
        CHECK(ts.attr("k/f").size == 17);
    }
}

TEST_CASE("staged: abandon leaves the old content and releases the lease", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "old content");
    const auto files_before = ts.counter(Counter::stores);

    SECTION("abandon()") {
        auto staged = KC_MUST(StagedFile::begin(ts.store(), f, true));
        KC_MUST(staged.write(0, "never seen"));
        CHECK(in_flight(ts, "k"));
        KC_MUST(staged.abandon());
        CHECK_FALSE(in_flight(ts, "k"));
    }
    SECTION("destruction without publish") {
        {
            auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
            KC_MUST(staged.write(0, "never seen"));
            CHECK(in_flight(ts, "k"));
        }
        CHECK_FALSE(in_flight(ts, "k"));
    }
    CHECK(ts.get("k/f") == "old content");
    CHECK(ts.counter(Counter::stores) == files_before);
    check_consistent(ts.store());
}

TEST_CASE("staged: the entry is in flight from begin until publish", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "v1");
    ts.put("other/f", "v1");
    CHECK_FALSE(in_flight(ts, "k"));

    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
    CHECK(in_flight(ts, "k"));
    CHECK_FALSE(in_flight(ts, "other"));

    SECTION("publish releases it") {
        KC_MUST(staged.publish(test_origin()));
        CHECK_FALSE(in_flight(ts, "k"));
    }
    SECTION("two leases of one process on one entry are counted") {
        auto g = ts.put("k/g", "g1");
        auto second = KC_MUST(StagedFile::begin(ts.store(), g, false));
        KC_MUST(staged.publish(test_origin()));
        CHECK(in_flight(ts, "k"));
        KC_MUST(second.publish(test_origin()));
        CHECK_FALSE(in_flight(ts, "k"));
    }
    SECTION("a moved-from StagedFile does not release the lease") {
        {
            StagedFile moved = std::move(staged);
            CHECK(moved.ino() == f);
            CHECK(in_flight(ts, "k"));
            StagedFile again = std::move(moved);
            CHECK(in_flight(ts, "k"));
            KC_MUST(again.write(0, "v2"));
            KC_MUST(again.publish(test_origin()));
        }
        CHECK_FALSE(in_flight(ts, "k"));
        CHECK(ts.get("k/f") == "v2");
    }
}

TEST_CASE("staged: writes past the maximum size fail with EFBIG", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "");
    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, true));
    staged.set_max_size(16);
    KC_MUST(staged.write(0, std::string(16, 'a')));
    CHECK(err(staged.write(16, "b")) == EFBIG);
    CHECK(err(staged.write(100, "b")) == EFBIG);
    CHECK(staged.content() == std::string(16, 'a'));
}

TEST_CASE("staged: a write at an absurd offset fails instead of throwing", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "old");
    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
    core::Status result;
    CHECK_NOTHROW(result = staged.write(std::uint64_t{1} << 62, "x"));
    CHECK_FALSE(result.has_value());
    CHECK_NOTHROW(result = staged.write(UINT64_MAX, "xy"));
    CHECK(err(result) == EFBIG);
    CHECK(staged.content() == "old");
}

TEST_CASE("staged: begin refuses directories and missing inodes", "[staged]") {
    TestStore ts;
    auto k = ts.mkdirs("k");
    CHECK(err(StagedFile::begin(ts.store(), k, false)) == EISDIR);
    CHECK(err(StagedFile::begin(ts.store(), 987654, false)) == ENOENT);
    CHECK_FALSE(in_flight(ts, "k"));
}

TEST_CASE("staged: publishing inside a caller's transaction is visible at its commit", "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "v1");
    auto g = ts.put("k/g", "v1");
    auto sf = KC_MUST(StagedFile::begin(ts.store(), f, true));
    auto sg = KC_MUST(StagedFile::begin(ts.store(), g, true));
    KC_MUST(sf.write(0, "f2"));
    KC_MUST(sg.write(0, "g2"));

    auto txn = ts.write();
    KC_MUST(sf.publish(txn, test_origin()));
    KC_MUST(sg.publish(txn, test_origin()));
    CHECK(ts.get("k/f") == "v1");
    KC_MUST(txn.commit());
    CHECK(ts.get("k/f") == "f2");
    CHECK(ts.get("k/g") == "g2");
    CHECK_FALSE(in_flight(ts, "k"));
    check_consistent(ts.store());
}

TEST_CASE("staged: the first publish into an empty entry counts one miss", "[staged][stats]") {
    TestStore ts;
    auto txn = ts.write();
    auto k = KC_MUST(txn.mkdir(core::kRootIno, "k", 0755));
    auto f = KC_MUST(txn.create(k.ino, "kernel.cubin", 0644));
    KC_MUST(txn.commit());
    CHECK(ts.counter(Counter::misses) == 0);

    auto staged = KC_MUST(StagedFile::begin(ts.store(), f.ino, true));
    KC_MUST(staged.write(0, "binary"));
    KC_MUST(staged.publish(core::Origin{777, "compiler"}));
    CHECK(ts.counter(Counter::misses) == 1);
    auto e = ts.entry("k");
    CHECK(e.populated);
    CHECK(e.populated_by_pid == 777);
    CHECK(e.populated_by_name == "compiler");
    CHECK(e.bytes == 6);
}

TEST_CASE(
    "staged: the content is read at its first use, so a version published since begin "
    "is the one written over",
    "[staged]") {
    TestStore ts;
    auto f = ts.put("k/f", "0123456789");
    auto early = KC_MUST(StagedFile::begin(ts.store(), f, false));
    CHECK(early.size() == 10);  // known without reading the content
    {
        auto rewrite = KC_MUST(StagedFile::begin(ts.store(), f, true));
        KC_MUST(rewrite.write(0, "abcdefghij"));
        KC_MUST(rewrite.publish(test_origin()));
    }
    KC_MUST(early.write(0, "X"));  // as on a disk: over what is there now
    CHECK(early.content() == "Xbcdefghij");
    CHECK(early.stored_digest() == core::digest_of("abcdefghij"));
    KC_MUST(early.publish(test_origin()));
    CHECK(ts.get("k/f") == "Xbcdefghij");
    check_consistent(ts.store());
}

// Damaged content shows what an open for writing reads: until a change needs the bytes
// begun from, nothing of them is read.
TEST_CASE(
    "staged: an open for writing reads nothing of a file it does not change, or "
    "overwrites or empties whole",
    "[staged]") {
    TestStore ts;
    const std::string marker = "KCACHE-STAGED-MARKER-52c1e07d";
    const std::string content = marker + random_bytes(64 << 10, 7);  // stored raw
    auto f = ts.put("k/f", content);
    ts.close();
    const auto data_file = std::filesystem::path(ts.db_path()) / "data.mdb";
    auto disk = read_file(data_file);
    const auto at = disk.find(marker);
    REQUIRE(at != std::string::npos);
    disk[at + marker.size() + 100] ^= 0x01;
    write_file(data_file, disk);
    ts.reopen();

    SECTION("an open that changes nothing") {
        auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
        CHECK(staged.size() == content.size());
        CHECK_FALSE(staged.dirty());
        KC_MUST(staged.abandon());
    }
    SECTION("a write over the whole file") {
        auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
        const std::string fresh(content.size() + 1, 'y');
        KC_MUST(staged.write(0, fresh));
        KC_MUST(staged.publish(test_origin()));
        CHECK(ts.get("k/f") == fresh);
    }
    SECTION("a truncate to zero") {
        auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
        KC_MUST(staged.truncate(0));
        CHECK(staged.dirty());
        CHECK(staged.size() == 0);
        SECTION("then written") {
            KC_MUST(staged.write(0, "new"));
            KC_MUST(staged.publish(test_origin()));
            CHECK(ts.get("k/f") == "new");
        }
        SECTION("alone (ftruncate(fd, 0))") {
            KC_MUST(staged.publish(test_origin()));
            CHECK(ts.get("k/f").empty());
        }
    }
    SECTION("a write into part of it reads it, finds the damage and changes nothing") {
        auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
        auto s = staged.write(10, "z");
        REQUIRE_FALSE(s);
        CHECK(s.error().code == core::kDamagedContent);
        CHECK_FALSE(staged.dirty());
        CHECK(staged.size() == content.size());
        CHECK_FALSE(staged.content());
        KC_MUST(staged.abandon());
    }
}
