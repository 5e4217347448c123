// kcache evict, clear, pin, unpin.

#include <catch2/catch.hpp>

#include "cli_harness.hpp"

using kcache::test::CliDb;
using kcache::test::kDayNs;
using kcache::test::kSecondNs;
using kcache::test::ManualClock;
using kcache::test::random_bytes;
using Names = std::vector<std::string>;

namespace {

constexpr std::size_t kEntryBytes = 100 * 1024;

// e1 .. e4, 100 KiB of incompressible bytes each, used in that order (e1 least
// recently, one minute apart, the last a minute ago).
void add_four(CliDb& db) {
    ManualClock clock;
    const std::int64_t now = *clock.now;
    db.store(clock.clock());
    for (int i = 1; i <= 4; ++i) {
        clock.set(now - (5 - i) * 60 * kSecondNs);
        db.add_entry("e" + std::to_string(i),
                     {{"kernel.cubin", random_bytes(kEntryBytes, static_cast<std::uint32_t>(i))}});
    }
    db.close();
}

}  // namespace

TEST_CASE("evict by name", "[cli]") {
    CliDb db;
    add_four(db);
    auto result = db.run({"evict", "e2", "e3"});
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(result.out.find("evicted 2 entries") != std::string::npos);
    CHECK(db.ls_names() == Names{"e1", "e4"});
    auto stats = db.json({"stats", "--json"});
    CHECK(stats.at("evictions") == 2);
    CHECK(stats.at("entries") == 2);
    CHECK(stats.at("bytes") == 2 * kEntryBytes);

    // All or nothing: one unknown name evicts none of them.
    auto unknown = db.run({"evict", "e1", "zzz"});
    CHECK(unknown.exit_code == 1);
    CHECK(unknown.err == "kcache: no entry zzz\n");
    CHECK(db.ls_names() == Names{"e1", "e4"});
}

TEST_CASE("evict --older-than evicts entries idle longer than the age", "[cli]") {
    CliDb db;
    ManualClock clock;
    const std::int64_t now = *clock.now;
    db.store(clock.clock());
    clock.set(now - 30 * kDayNs);
    db.add_entry("old1", {{"kernel.ptx", "old one"}});
    clock.set(now - 8 * kDayNs);
    db.add_entry("old2", {{"kernel.ptx", "old two"}});
    clock.set(now - 6 * kDayNs);
    db.add_entry("recent", {{"kernel.ptx", "six days"}});
    db.close();
    db.add_entry("new", {{"kernel.ptx", "new"}});  // the system clock

    auto result = db.run({"evict", "--older-than", "7d"});
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(result.out.find("evicted 2 entries") != std::string::npos);
    CHECK(db.ls_names() == Names{"new", "recent"});
}

TEST_CASE("evict --to-size evicts least recently used first", "[cli]") {
    CliDb db;
    add_four(db);
    auto result = db.run({"evict", "--to-size", "250K"});
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(db.ls_names() == Names{"e3", "e4"});
    CHECK(db.json({"stats", "--json"}).at("stored_bytes").get<std::uint64_t>() <= 250 * 1024);

    REQUIRE(db.run({"evict", "--to-entries", "1"}).exit_code == 0);
    CHECK(db.ls_names() == Names{"e4"});
}

TEST_CASE("pinned entries are never evicted", "[cli]") {
    CliDb db;
    add_four(db);
    auto pin = db.run({"pin", "e1", "e3"});
    INFO(pin.err);
    REQUIRE(pin.exit_code == 0);
    CHECK(pin.out == "pinned e1\npinned e3\n");
    auto listed = db.json({"ls", "--json"});
    CHECK(listed[0].at("pinned") == true);
    CHECK(listed[1].at("pinned") == false);

    auto to_zero = db.run({"evict", "--to-size", "0"});
    REQUIRE(to_zero.exit_code == 0);
    CHECK(to_zero.err.find("not reached") != std::string::npos);
    CHECK(db.ls_names() == Names{"e1", "e3"});

    auto by_name = db.run({"evict", "e1"});
    CHECK(by_name.exit_code == 1);
    CHECK(by_name.err.find("e1 is pinned") != std::string::npos);
    CHECK(db.ls_names() == Names{"e1", "e3"});

    auto clear = db.run({"clear", "--yes"});
    REQUIRE(clear.exit_code == 0);
    CHECK(clear.out.find("kept 2 entries") != std::string::npos);
    CHECK(db.ls_names() == Names{"e1", "e3"});

    REQUIRE(db.run({"unpin", "e1"}).exit_code == 0);
    REQUIRE(db.run({"evict", "e1"}).exit_code == 0);
    CHECK(db.ls_names() == Names{"e3"});
}

TEST_CASE("clear needs --yes and then evicts everything unpinned", "[cli]") {
    CliDb db;
    add_four(db);
    auto refused = db.run({"clear"});
    CHECK(refused.exit_code == 2);
    CHECK(refused.err.find("--yes") != std::string::npos);
    CHECK(db.ls_names().size() == 4);

    auto clear = db.run({"clear", "--yes"});
    INFO(clear.err);
    REQUIRE(clear.exit_code == 0);
    CHECK(clear.out.find("evicted 4 entries") != std::string::npos);
    CHECK(db.ls_names().empty());
    auto stats = db.json({"stats", "--json"});
    CHECK(stats.at("entries") == 0);
    CHECK(stats.at("bytes") == 0);
    CHECK(stats.at("evictions") == 4);
}

TEST_CASE("lowering a limit with config evicts down to it", "[cli]") {
    CliDb db;
    add_four(db);
    auto result = db.run({"config", "--max-entries", "2"});
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(result.out.find("to meet the new limits") != std::string::npos);
    const Names left = db.ls_names();
    CHECK(left.size() <= 2);
    CHECK_FALSE(left.empty());
    CHECK(left.back() == "e4");  // the most recently used stays
}
