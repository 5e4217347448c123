// The events log: what is logged, in which order, resuming after a seq, trimming.
#include <set>
#include <string>
#include <vector>

#include "core_test_util.hpp"

using namespace kcache;
using namespace kcache::test;
using core::EventKind;
using core::kRootIno;

namespace {

std::vector<core::Event> events_after(TestStore& ts, std::uint64_t after = 0) {
    std::vector<core::Event> out;
    auto txn = ts.read();
    KC_MUST(txn.for_each_event(after, [&](const core::Event& e) {
        out.push_back(e);
        return true;
    }));
    return out;
}

std::vector<EventKind> kinds(const std::vector<core::Event>& events) {
    std::vector<EventKind> out;
    for (const auto& e : events) out.push_back(e.kind);
    return out;
}

void hit(TestStore& ts, const std::string& entry) {
    auto txn = ts.write();
    KC_MUST(txn.record_hit(KC_MUST(txn.resolve(entry))));
    KC_MUST(txn.commit());
}

void pin(TestStore& ts, const std::string& entry, bool pinned) {
    auto txn = ts.write();
    KC_MUST(txn.set_pinned(KC_MUST(txn.resolve(entry)), pinned));
    KC_MUST(txn.commit());
}

}  // namespace

namespace Catch {
template <>
struct StringMaker<EventKind> {
    static std::string convert(EventKind k) { return std::string(core::event_kind_name(k)); }
};
}  // namespace Catch

TEST_CASE("events: every kind has a distinct name", "[events]") {
    std::set<std::string> names;
    for (auto k : {EventKind::populate, EventKind::hit, EventKind::evict, EventKind::pin,
                   EventKind::unpin, EventKind::remove, EventKind::rename, EventKind::import,
                   EventKind::reset, EventKind::member, EventKind::update}) {
        auto name = std::string(core::event_kind_name(k));
        CHECK_FALSE(name.empty());
        CHECK(names.insert(name).second);
    }
    CHECK(core::event_kind_name(EventKind::populate) == "populate");
    CHECK(core::event_kind_name(EventKind::update) == "update");
    CHECK(static_cast<int>(EventKind::update) == 11);  // stable: stored in the log
    // A kind from a newer binary: named, not an error (readers skip what they do not know).
    CHECK(core::event_kind_name(static_cast<EventKind>(200)) == "unknown");
}

TEST_CASE("events: populate, hit, pin, unpin and evict are logged in order", "[events]") {
    TestStore ts;
    CHECK(events_after(ts).empty());

    const auto t1 = ts.clock().advance();
    ts.put("k/a.cubin", "bin");
    ts.put("k/a.json", "{}");  // same entry: no second populate, an update
    const auto t2 = ts.clock().advance();
    hit(ts, "k");
    pin(ts, "k", true);
    pin(ts, "k", false);
    const auto t3 = ts.clock().advance();
    {
        auto txn = ts.write();
        KC_MUST(txn.evict_entry(KC_MUST(txn.resolve("k"))));
        KC_MUST(txn.commit());
    }
    auto events = events_after(ts);
    REQUIRE(kinds(events) == std::vector<EventKind>{EventKind::populate, EventKind::update,
                                                    EventKind::hit, EventKind::pin,
                                                    EventKind::unpin, EventKind::evict});
    for (std::size_t i = 1; i < events.size(); ++i) CHECK(events[i].seq > events[i - 1].seq);
    const auto k = events[0].entry;
    CHECK(k != 0);
    for (const auto& e : events) {
        INFO("event " << core::event_kind_name(e.kind));
        CHECK(e.entry == k);
        CHECK(e.parent == kRootIno);
        CHECK(e.name == "k");
    }
    CHECK(events[0].time_ns == t1);
    CHECK(events[1].time_ns == t1);
    CHECK(events[2].time_ns == t2);
    CHECK(events[5].time_ns == t3);

    SECTION("for_each_event resumes after a seq") {
        auto tail = events_after(ts, events[3].seq);
        CHECK(kinds(tail) == std::vector<EventKind>{EventKind::unpin, EventKind::evict});
        CHECK(events_after(ts, events.back().seq).empty());
    }
    SECTION("returning false stops the walk") {
        int seen = 0;
        auto txn = ts.read();
        KC_MUST(txn.for_each_event(0, [&](const core::Event&) { return ++seen < 2; }));
        CHECK(seen == 2);
    }
    SECTION("seqs continue after reopen") {
        ts.reopen();
        ts.put("k2/a", "x");
        auto more = events_after(ts, events.back().seq);
        REQUIRE(more.size() == 1);
        CHECK(more[0].kind == EventKind::populate);
        CHECK(more[0].seq > events.back().seq);
        CHECK(more[0].name == "k2");
    }
}

TEST_CASE("events: a publish into a populated entry logs one update", "[events]") {
    TestStore ts;
    ts.put("k/a.cubin", "bin");
    auto first = events_after(ts);
    // The first publish populates the entry: a populate, no update.
    REQUIRE(kinds(first) == std::vector<EventKind>{EventKind::populate});
    const auto k = first[0].entry;
    const auto last = first.back().seq;

    auto only_update = [&](const std::vector<core::Event>& events) {
        REQUIRE(kinds(events) == std::vector<EventKind>{EventKind::update});
        CHECK(events[0].entry == k);
        CHECK(events[0].parent == kRootIno);
        CHECK(events[0].name == "k");
    };
    SECTION("a new file") {
        ts.put("k/a.json", "{}");
        only_update(events_after(ts, last));
        CHECK(ts.entry("k").files == 2);
    }
    SECTION("a rewrite of a file") {
        ts.put("k/a.cubin", "a longer binary");
        only_update(events_after(ts, last));
    }
    SECTION("several files in one transaction: still one update") {
        auto txn = ts.write();
        put(txn, "k/b.ptx", "ptx");
        put(txn, "k/c.json", "{}");
        put(txn, "k/a.cubin", "new");
        KC_MUST(txn.commit());
        only_update(events_after(ts, last));
    }
    SECTION("a hit changes the record too, but logs only the hit") {
        hit(ts, "k");
        CHECK(kinds(events_after(ts, last)) == std::vector<EventKind>{EventKind::hit});
    }
    SECTION("a transaction that does not commit logs nothing") {
        {
            auto txn = ts.write();
            put(txn, "k/b.ptx", "ptx");
        }
        CHECK(events_after(ts, last).empty());
    }
    SECTION("a publish that also evicts the entry logs only the eviction") {
        auto txn = ts.write();
        put(txn, "k/b.ptx", "ptx");
        KC_MUST(txn.evict_entry(KC_MUST(txn.resolve("k"))));
        KC_MUST(txn.commit());
        CHECK(kinds(events_after(ts, last)) == std::vector<EventKind>{EventKind::evict});
    }
}

TEST_CASE("events: an uncommitted transaction logs nothing", "[events]") {
    TestStore ts;
    ts.put("k/a", "x");
    const auto n = events_after(ts).size();
    {
        auto txn = ts.write();
        KC_MUST(txn.record_hit(KC_MUST(txn.resolve("k"))));
    }
    CHECK(events_after(ts).size() == n);
}

TEST_CASE("events: removing and renaming an entry's node are logged", "[events]") {
    TestStore ts;
    ts.put("flat", "x");
    ts.mkdirs("dir");
    ts.put("work/a", "y");                   // (a name starting "tmp" is bookkeeping)
    const auto flat = ts.entry("flat").ino;  // a stem entry: its own id
    const auto tmp = ts.ino("work");
    const auto last = events_after(ts).back().seq;

    SECTION("unlink of a flat-file entry") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(kRootIno, "flat"));
        KC_MUST(txn.commit());
        auto events = events_after(ts, last);
        REQUIRE(kinds(events) == std::vector<EventKind>{EventKind::remove});
        CHECK(events[0].entry == flat);
        CHECK(events[0].name == "flat");
        CHECK(events[0].parent == kRootIno);
    }
    SECTION("rmdir of an entry directory") {
        auto txn = ts.write();
        KC_MUST(txn.rmdir(kRootIno, "dir"));
        KC_MUST(txn.commit());
        auto events = events_after(ts, last);
        REQUIRE(kinds(events) == std::vector<EventKind>{EventKind::remove});
        CHECK(events[0].name == "dir");
    }
    SECTION("rename of an entry logs the old name") {
        auto txn = ts.write();
        KC_MUST(txn.rename(kRootIno, "work", kRootIno, "hash"));
        KC_MUST(txn.commit());
        auto events = events_after(ts, last);
        REQUIRE(kinds(events) == std::vector<EventKind>{EventKind::rename});
        CHECK(events[0].entry == tmp);
        CHECK(events[0].name == "work");
        CHECK(events[0].parent == kRootIno);
    }
    SECTION("rename over an entry logs the replaced one's removal") {
        auto txn = ts.write();
        KC_MUST(txn.rename(kRootIno, "work", kRootIno, "dir"));
        KC_MUST(txn.commit());
        auto events = events_after(ts, last);
        std::set<std::pair<EventKind, std::string>> got;
        for (const auto& e : events) got.insert({e.kind, e.name});
        CHECK(got.count({EventKind::rename, "work"}) == 1);
        CHECK(got.count({EventKind::remove, "dir"}) == 1);
    }
    SECTION("changes inside an entry are not removals or renames: an update") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(KC_MUST(txn.resolve("work")), "a"));
        KC_MUST(txn.commit());
        auto events = events_after(ts, last);
        REQUIRE(kinds(events) == std::vector<EventKind>{EventKind::update});
        CHECK(events[0].entry == tmp);
        CHECK(events[0].name == "work");
    }
}

TEST_CASE("events: reset_stats is logged", "[events][stats]") {
    TestStore ts;
    auto txn = ts.write();
    KC_MUST(txn.reset_stats());
    KC_MUST(txn.commit());
    auto events = events_after(ts);
    REQUIRE(events.size() == 1);
    CHECK(events[0].kind == EventKind::reset);
}

TEST_CASE("events: the log keeps the newest Config::max_events", "[events]") {
    TestStore ts;
    {
        auto txn = ts.write();
        auto config = txn.config();
        config.max_events = 10;
        KC_MUST(txn.set_config(config));
        KC_MUST(txn.commit());
    }
    CHECK(ts.read().config().max_events == 10);
    ts.put("k/a", "x");
    for (int i = 0; i < 30; ++i) {
        ts.clock().advance();
        hit(ts, "k");
    }
    const auto newest_time = ts.clock().now();
    auto events = events_after(ts);
    REQUIRE(events.size() == 10);
    for (std::size_t i = 1; i < events.size(); ++i) CHECK(events[i].seq > events[i - 1].seq);
    CHECK(events.back().kind == EventKind::hit);
    CHECK(events.back().time_ns == newest_time);

    SECTION("seqs keep growing after trimming") {
        const auto last = events.back().seq;
        hit(ts, "k");
        auto more = events_after(ts, last);
        REQUIRE(more.size() == 1);
        CHECK(more[0].seq > last);
        CHECK(events_after(ts).size() == 10);
    }
    SECTION("one transaction with many events is trimmed too") {
        auto txn = ts.write();
        auto k = KC_MUST(txn.resolve("k"));
        for (int i = 0; i < 25; ++i) KC_MUST(txn.record_hit(k));
        KC_MUST(txn.commit());
        CHECK(events_after(ts).size() == 10);
    }
}

TEST_CASE("events: lowering max_events trims the log at the next event", "[events]") {
    TestStore ts;
    ts.put("k/a", "x");
    {
        auto txn = ts.write();
        auto k = KC_MUST(txn.resolve("k"));
        for (int i = 0; i < 300; ++i) KC_MUST(txn.record_hit(k));
        KC_MUST(txn.commit());
    }
    REQUIRE(events_after(ts).size() == 301);
    {
        auto txn = ts.write();
        auto config = txn.config();
        config.max_events = 10;
        KC_MUST(txn.set_config(config));
        KC_MUST(txn.commit());
    }
    hit(ts, "k");
    CHECK(events_after(ts).size() == 10);
}
