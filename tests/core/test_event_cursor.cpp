// EventCursor (events.hpp): following the events log, and telling lost events.
#include <cstdint>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/events.hpp"

using namespace kcache;
using namespace kcache::test;

namespace {

void hits(TestStore& ts, const char* entry, int n) {
    auto txn = ts.write();
    const core::Ino k = KC_MUST(txn.resolve(entry));
    for (int i = 0; i < n; ++i) KC_MUST(txn.record_hit(k));
    KC_MUST(txn.commit());
}

void set_max_events(TestStore& ts, std::uint64_t n) {
    auto txn = ts.write();
    auto config = txn.config();
    config.max_events = n;
    KC_MUST(txn.set_config(config));
    KC_MUST(txn.commit());
}

// Reads with `cursor`, accepting every event: the seqs read and the count lost.
std::pair<std::vector<std::uint64_t>, std::uint64_t> read_all(TestStore& ts,
                                                              core::EventCursor& cursor) {
    std::vector<std::uint64_t> seqs;
    auto txn = ts.read();
    const auto lost = KC_MUST(cursor.read(txn, [&](const core::Event& e) {
        seqs.push_back(e.seq);
        return true;
    }));
    return {seqs, lost};
}

}  // namespace

TEST_CASE("event cursor: follows the log from one read to the next", "[core][events]") {
    TestStore ts;
    ts.put("k/a", "x");  // populate: event 1
    hits(ts, "k", 2);    // 2, 3
    core::EventCursor cursor;
    CHECK(cursor.seq() == 0);
    auto [first, lost] = read_all(ts, cursor);
    CHECK(first == std::vector<std::uint64_t>{1, 2, 3});
    CHECK(lost == 0);
    CHECK(cursor.seq() == 3);
    CHECK(read_all(ts, cursor).first.empty());
    hits(ts, "k", 1);
    CHECK(read_all(ts, cursor).first == std::vector<std::uint64_t>{4});
    CHECK(cursor.seq() == 4);
}

TEST_CASE("event cursor: a follower sees a publish into a populated entry", "[core][events]") {
    TestStore ts;
    ts.put("k/a.cubin", "bin");
    auto cursor = KC_MUST(core::EventCursor::at_end(ts.read()));
    ts.put("k/a.json", "{}");  // the entry was populated already
    std::vector<core::Event> seen;
    {
        auto txn = ts.read();
        const auto lost = KC_MUST(cursor.read(txn, [&](const core::Event& e) {
            seen.push_back(e);
            return true;
        }));
        CHECK(lost == 0);
    }
    REQUIRE(seen.size() == 1);
    CHECK(seen[0].kind == core::EventKind::update);
    CHECK(seen[0].entry == ts.entry("k").ino);
    CHECK(seen[0].parent == core::kRootIno);
    CHECK(seen[0].name == "k");
    CHECK(ts.entry("k").files == 2);
}

TEST_CASE("event cursor: at_end reads only what is logged later", "[core][events]") {
    TestStore ts;
    {
        auto txn = ts.read();
        CHECK(KC_MUST(core::EventCursor::at_end(txn)).seq() == 0);  // nothing logged yet
    }
    ts.put("k/a", "x");
    hits(ts, "k", 4);
    auto txn = ts.read();
    auto cursor = KC_MUST(core::EventCursor::at_end(txn));
    CHECK(cursor.seq() == 5);
    hits(ts, "k", 1);
    CHECK(read_all(ts, cursor).first == std::vector<std::uint64_t>{6});
    SECTION("also when the log is trimmed to nothing") {
        set_max_events(ts, 0);
        hits(ts, "k", 3);  // 7..9, each trimmed at once
        auto now = ts.read();
        CHECK(KC_MUST(core::EventCursor::at_end(now)).seq() == 9);
    }
}

TEST_CASE("event cursor: a callback that says stop leaves the cursor in front of that event",
          "[core][events]") {
    TestStore ts;
    ts.put("k/a", "x");
    hits(ts, "k", 4);  // 2..5
    core::EventCursor cursor;
    std::vector<std::uint64_t> seen;
    auto txn = ts.read();
    KC_MUST(cursor.read(txn, [&](const core::Event& e) {
        if (e.seq == 3) return false;
        seen.push_back(e.seq);
        return true;
    }));
    CHECK(seen == std::vector<std::uint64_t>{1, 2});
    CHECK(cursor.seq() == 2);
    CHECK(read_all(ts, cursor).first == std::vector<std::uint64_t>{3, 4, 5});
}

TEST_CASE("event cursor: events trimmed before the cursor reached them are counted as lost",
          "[core][events]") {
    TestStore ts;
    set_max_events(ts, 10);
    ts.put("k/a", "x");  // 1
    core::EventCursor cursor;
    CHECK(read_all(ts, cursor).first == std::vector<std::uint64_t>{1});
    hits(ts, "k", 5);  // 2..6: all still in the log
    auto [kept, none] = read_all(ts, cursor);
    CHECK(kept.size() == 5);
    CHECK(none == 0);
    hits(ts, "k", 25);  // 7..31: the log keeps 22..31, so 7..21 are lost
    auto [after, lost] = read_all(ts, cursor);
    CHECK(lost == 15);
    CHECK(after.front() == 22);
    CHECK(after.size() == 10);  // what is left is still read
    CHECK(cursor.seq() == 31);
    CHECK(read_all(ts, cursor).second == 0);

    SECTION("a fresh cursor reads what the log holds and loses nothing") {
        core::EventCursor fresh;
        auto [all, fresh_lost] = read_all(ts, fresh);
        CHECK(all.size() == 10);
        CHECK(fresh_lost == 0);
    }
}
