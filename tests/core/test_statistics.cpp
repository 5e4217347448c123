// The table of statistics (core/statistics.hpp): its rows, what is derived from it,
// and docs/stats.md, which must document every row with its id and name.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/statistics.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;

namespace {

std::uint32_t id_of(Counter c) {
    return static_cast<std::uint32_t>(c);
}

std::string read_docs() {
    std::ifstream in(std::string(KCACHE_DOCS_DIR) + "/stats.md");
    REQUIRE(in);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace

TEST_CASE("statistics table: each row is found by its id and named by it", "[stats]") {
    for (const core::StatisticField& f : core::kStatistics) {
        INFO(f.name);
        CHECK(core::statistic_field(f.id) == &f);
        CHECK(core::counter_name(f.id) == f.name);
        CHECK(core::is_gauge(f.id) == (f.kind == core::StatisticKind::gauge));
        CHECK(core::counts_bytes(f.id) == (f.unit == core::Unit::bytes));
        CHECK_FALSE(f.description.empty());
    }
    CHECK(core::statistic_field(static_cast<Counter>(99)) == nullptr);
    CHECK(core::counter_name(static_cast<Counter>(99)) == "unknown");
    CHECK(core::counter_label(Counter::stored_bytes) == "stored bytes");
}

TEST_CASE("statistics table: who counts what", "[stats]") {
    constexpr std::size_t n = core::statistics_counted_by(core::by_daemon);
    constexpr auto daemon = core::statistics_counted_by_list<n>(core::by_daemon);
    const std::vector<Counter> expected = {
        Counter::negative_lookups,    Counter::opens,
        Counter::bytes_read,          Counter::errors_nospc,
        Counter::errors_io,           Counter::errors_other,
        Counter::single_flight_waits, Counter::single_flight_timeouts,
        Counter::damaged_blobs,       Counter::damaged_dbs,
        Counter::remote_containers};  // made by the daemon's lookups, a shared tier's row
    CHECK(std::vector<Counter>(daemon.begin(), daemon.end()) == expected);

    constexpr std::size_t r = core::statistics_counted_by(core::by_remote);
    constexpr auto remote = core::statistics_counted_by_list<r>(core::by_remote);
    CHECK(r == 25);  // 21, and the 4 remote_rejected_* (signed entries)
    for (Counter c : remote) {
        INFO(core::counter_name(c));
        CHECK(core::counter_name(c).substr(0, 7) == "remote_");
        // Counters from 40, the running daemon's breaker gauges from 110.
        if (core::is_gauge(c)) {
            CHECK(id_of(c) >= 110);
            CHECK(id_of(c) < 120);
        } else {
            CHECK(id_of(c) >= 40);
        }
    }
}

TEST_CASE("statistics table: a new db reports exactly its rows", "[stats]") {
    TestStore ts;
    auto stats = KC_MUST(ts.read().stats());
    std::set<Counter> reported;
    for (const auto& [c, v] : stats.values) reported.insert(c);
    std::set<Counter> rows;
    for (const core::StatisticField& f : core::kStatistics) rows.insert(f.id);
    CHECK(reported == rows);
}

TEST_CASE("statistics table: docs/stats.md documents every row and no other", "[stats]") {
    const std::string docs = read_docs();
    const std::size_t gauges_at = docs.find("## Gauges");
    REQUIRE(gauges_at != std::string::npos);
    for (const core::StatisticField& f : core::kStatistics) {
        const std::string row =
            "| " + std::to_string(id_of(f.id)) + " | `" + std::string(f.name) + "` |";
        INFO(row);
        const std::size_t at = docs.find(row);
        REQUIRE(at != std::string::npos);
        CHECK(docs.find(row, at + 1) == std::string::npos);
        // counters under "Counters", gauges under "Gauges"
        CHECK((at > gauges_at) == (f.kind == core::StatisticKind::gauge));
    }
    // and every documented id is a row, under its name
    const std::regex documented(R"(\| (\d+) \| `(\w+)` \|)");
    int rows = 0;
    for (auto it = std::sregex_iterator(docs.begin(), docs.end(), documented);
         it != std::sregex_iterator(); ++it) {
        const auto id = static_cast<std::uint32_t>(std::stoul((*it)[1].str()));
        INFO("docs/stats.md: " << (*it)[0].str());
        const core::StatisticField* f = core::statistic_field(static_cast<Counter>(id));
        REQUIRE(f != nullptr);
        CHECK(f->name == (*it)[2].str());
        ++rows;
    }
    CHECK(rows == static_cast<int>(core::kStatisticCount));
}
