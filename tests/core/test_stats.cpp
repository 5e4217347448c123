// Statistics: stable counter ids, names, persistence, reset of counters but not gauges.
#include <set>
#include <string>
#include <vector>

#include "core_test_util.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;

namespace {

const std::vector<Counter> kCounters = {
    Counter::hits,          Counter::misses,
    Counter::stores,        Counter::negative_lookups,
    Counter::opens,         Counter::bytes_read,
    Counter::bytes_written, Counter::evicted_entries,
    Counter::evicted_bytes, Counter::dedup_hits,
    Counter::errors_nospc,  Counter::errors_io,
    Counter::errors_other,  Counter::imported_entries,
};
const std::vector<Counter> kGauges = {
    Counter::entries, Counter::bytes, Counter::stored_bytes,
    Counter::blobs,   Counter::files, Counter::blob_raw_bytes,
};

void add(TestStore& ts, Counter c, std::uint64_t delta) {
    auto txn = ts.write();
    KC_MUST(txn.add(c, delta));
    KC_MUST(txn.commit());
}

void hit(TestStore& ts, const std::string& entry) {
    auto txn = ts.write();
    KC_MUST(txn.record_hit(KC_MUST(txn.resolve(entry))));
    KC_MUST(txn.commit());
}

}  // namespace

TEST_CASE("stats: counter ids are the documented stable integers", "[stats]") {
    CHECK(static_cast<int>(Counter::hits) == 1);
    CHECK(static_cast<int>(Counter::misses) == 2);
    CHECK(static_cast<int>(Counter::imported_entries) == 14);
    CHECK(static_cast<int>(Counter::entries) == 100);
    CHECK(static_cast<int>(Counter::blob_raw_bytes) == 105);
    for (auto c : kCounters) CHECK_FALSE(core::is_gauge(c));
    for (auto g : kGauges) CHECK(core::is_gauge(g));
}

TEST_CASE("stats: every counter has a distinct name", "[stats]") {
    CHECK(core::counter_name(Counter::hits) == "hits");
    CHECK(core::counter_name(Counter::stored_bytes) == "stored_bytes");
    CHECK(core::counter_name(Counter::misses) == "misses");
    std::set<std::string> names;
    for (const auto& list : {kCounters, kGauges}) {
        for (auto c : list) {
            auto name = std::string(core::counter_name(c));
            INFO("counter " << static_cast<int>(c));
            CHECK_FALSE(name.empty());
            CHECK(names.insert(name).second);
        }
    }
}

TEST_CASE("stats: a new db reports every known counter as zero", "[stats]") {
    TestStore ts;
    auto stats = KC_MUST(ts.read().stats());
    for (const auto& list : {kCounters, kGauges}) {
        for (auto c : list) {
            INFO(core::counter_name(c));
            CHECK(stats.values.count(c) == 1);
            CHECK(stats.get(c) == 0);
        }
    }
    CHECK(stats.reset_ns == 0);
}

TEST_CASE("stats: add changes a counter at commit only", "[stats]") {
    TestStore ts;
    add(ts, Counter::negative_lookups, 3);
    add(ts, Counter::negative_lookups, 4);
    CHECK(ts.counter(Counter::negative_lookups) == 7);
    {
        auto txn = ts.write();
        KC_MUST(txn.add(Counter::opens, 10));
        CHECK(ts.counter(Counter::opens) == 0);
        KC_MUST(txn.commit());
    }
    CHECK(ts.counter(Counter::opens) == 10);
    CHECK(KC_MUST(ts.read().stats()).get(Counter::opens) == 10);
}

TEST_CASE("stats: publishing counts stores and bytes written", "[stats]") {
    TestStore ts;
    ts.put("k/a", std::string(100, 'a'));
    ts.put("k/b", std::string(50, 'b'));
    ts.put("k/a", std::string(10, 'c'));
    CHECK(ts.counter(Counter::stores) == 3);
    CHECK(ts.counter(Counter::bytes_written) == 160);
    CHECK(ts.counter(Counter::misses) == 1);
    CHECK(ts.counter(Counter::bytes) == 60);
    CHECK(ts.counter(Counter::files) == 2);
    CHECK(ts.counter(Counter::entries) == 1);
}

TEST_CASE("stats: counters and gauges survive close and reopen", "[stats]") {
    TestStore ts;
    ts.put("k/a", random_bytes(1000, 1));
    ts.put("k2/b", random_bytes(500, 2));
    hit(ts, "k");
    add(ts, Counter::negative_lookups, 42);
    const auto before = KC_MUST(ts.read().stats());
    REQUIRE(before.get(Counter::hits) == 1);
    REQUIRE(before.get(Counter::misses) == 2);

    ts.reopen();
    const auto after = KC_MUST(ts.read().stats());
    CHECK(after.values == before.values);
    CHECK(after.reset_ns == before.reset_ns);
    CHECK(ts.entry("k").hits == 1);

    SECTION("and keep counting from there") {
        hit(ts, "k2");
        CHECK(ts.counter(Counter::hits) == 2);
    }
}

TEST_CASE("stats: reset_stats zeroes counters but not gauges", "[stats]") {
    TestStore ts;
    ts.put("k/a", random_bytes(1000, 1));
    ts.put("k2/b", random_bytes(1000, 1));
    hit(ts, "k");
    add(ts, Counter::errors_io, 2);
    const auto before = KC_MUST(ts.read().stats());
    REQUIRE(before.get(Counter::hits) == 1);
    REQUIRE(before.get(Counter::dedup_hits) == 1);

    const auto when = ts.clock().advance(60 * kSecond);
    {
        auto txn = ts.write();
        KC_MUST(txn.reset_stats());
        KC_MUST(txn.commit());
    }
    auto after = KC_MUST(ts.read().stats());
    for (auto c : kCounters) {
        INFO(core::counter_name(c));
        CHECK(after.get(c) == 0);
    }
    for (auto g : kGauges) {
        INFO(core::counter_name(g));
        CHECK(after.get(g) == before.get(g));
        CHECK(after.get(g) > 0);
    }
    CHECK(after.reset_ns == when);

    SECTION("per-entry data is kept") {
        CHECK(ts.entry("k").hits == 1);
        CHECK(ts.entry("k").populated);
    }
    SECTION("the reset time survives reopen") {
        ts.reopen();
        CHECK(KC_MUST(ts.read().stats()).reset_ns == when);
    }
    SECTION("counting resumes from zero") {
        hit(ts, "k2");
        CHECK(ts.counter(Counter::hits) == 1);
        ts.put("k3/c", "x");
        CHECK(ts.counter(Counter::misses) == 1);
    }
    check_consistent(ts.store());
}

TEST_CASE("stats: eviction counters add up across evictions", "[stats][evict]") {
    TestStore ts;
    for (int i = 0; i < 5; ++i) {
        ts.clock().advance();
        ts.put("e" + std::to_string(i) + "/f",
               std::string(static_cast<std::size_t>(10 * (i + 1)), 'x'));
    }
    KC_MUST(ts->evict(down_to_entries(3)));
    KC_MUST(ts->evict(down_to_entries(2)));
    CHECK(ts.counter(Counter::evicted_entries) == 3);
    CHECK(ts.counter(Counter::evicted_bytes) == 10 + 20 + 30);
    CHECK(ts.counter(Counter::entries) == 2);
    CHECK(ts.counter(Counter::bytes) == 40 + 50);
}
