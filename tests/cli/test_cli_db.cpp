// kcache init, config, stats; a missing db; usage errors.

#include <filesystem>

#include <catch2/catch.hpp>

#include "cli_harness.hpp"
#include "kcache/core/statistics.hpp"
#include "kcache/core/types.hpp"

using kcache::test::CliDb;
using kcache::test::run_kcache;
using kcache::test::TempDir;
namespace core = kcache::core;

namespace {

const std::vector<core::Counter> kAllCounters = {
    core::Counter::hits,          core::Counter::misses,
    core::Counter::stores,        core::Counter::negative_lookups,
    core::Counter::opens,         core::Counter::bytes_read,
    core::Counter::bytes_written, core::Counter::evicted_entries,
    core::Counter::evicted_bytes, core::Counter::dedup_hits,
    core::Counter::errors_nospc,  core::Counter::errors_io,
    core::Counter::errors_other,  core::Counter::imported_entries,
    core::Counter::entries,       core::Counter::bytes,
    core::Counter::stored_bytes,  core::Counter::blobs,
    core::Counter::files,         core::Counter::blob_raw_bytes,
};

// Two entries, three files, 300 + 5 + 1000 bytes, three hits on the first.
void add_known_set(CliDb& db) {
    db.add_entry("aaaa1111", {{"kernel.cubin", kcache::test::random_bytes(300, 1)},
                              {"kernel.json", "{}\n\n\n"}});
    db.add_entry("bbbb2222", {{"kernel.ptx", kcache::test::random_bytes(1000, 2)}});
    db.record_hits("aaaa1111", 3);
}

}  // namespace

TEST_CASE("init creates a db, is idempotent and sets limits", "[cli]") {
    CliDb db;
    auto first = db.run({"init", "--max-size", "1G", "--max-entries", "100"});
    INFO(first.err);
    REQUIRE(first.exit_code == 0);
    CHECK(first.out.find("created db at " + db.path()) != std::string::npos);
    CHECK(std::filesystem::exists(db.dir() / "db" / "data.mdb"));

    auto second = db.run({"init"});
    REQUIRE(second.exit_code == 0);
    CHECK(second.out.find("existing db at") != std::string::npos);

    auto config = db.json({"config", "--json"});
    CHECK(config.at("max_bytes") == 1024ull * 1024 * 1024);
    CHECK(config.at("max_entries") == 100);
    CHECK(config.at("entry_depth") == 1);

    // An existing db keeps its entry depth: asking for another one is an error.
    auto depth = db.run({"init", "--entry-depth", "2"});
    CHECK(depth.exit_code == 1);
    CHECK(depth.err.find("entry depth") != std::string::npos);
}

TEST_CASE("init --entry-depth on a new db", "[cli]") {
    CliDb db;
    REQUIRE(db.run({"init", "--entry-depth", "2"}).exit_code == 0);
    CHECK(db.json({"config", "--json"}).at("entry_depth") == 2);
}

TEST_CASE("config sets and prints limits", "[cli]") {
    CliDb db;
    REQUIRE(db.run({"init"}).exit_code == 0);
    auto set = db.run({"config", "--max-size", "1.5GiB", "--max-entries", "7"});
    INFO(set.err);
    REQUIRE(set.exit_code == 0);
    CHECK(set.out.find("max size") != std::string::npos);
    auto config = db.json({"config", "--json"});
    CHECK(config.at("max_bytes") == 1536ull * 1024 * 1024);
    CHECK(config.at("max_entries") == 7);

    REQUIRE(db.run({"config", "--max-size", "none"}).exit_code == 0);
    CHECK(db.json({"config", "--json"}).at("max_bytes") == 0);
    CHECK(db.json({"config", "--json"}).at("max_entries") == 7);

    auto bad = db.run({"config", "--max-size", "12 parsecs"});
    CHECK(bad.exit_code == 2);
    CHECK(bad.err.rfind("kcache: ", 0) == 0);
}

TEST_CASE("stats --json reports counters and gauges of a known set", "[cli]") {
    CliDb db;
    add_known_set(db);
    const std::uint64_t stored = *db.store().read()->counter(core::Counter::stored_bytes);
    const std::uint64_t blobs = *db.store().read()->counter(core::Counter::blobs);

    auto stats = db.json({"stats", "--json"});
    CHECK(stats.at("entries") == 2);
    CHECK(stats.at("files") == 3);
    CHECK(stats.at("bytes") == 300 + 5 + 1000);
    CHECK(stats.at("stored_bytes") == stored);
    CHECK(stats.at("blobs") == blobs);
    CHECK(stats.at("hits") == 3);
    CHECK(stats.at("misses") == 2);
    CHECK(stats.at("stores") == 3);
    CHECK(stats.at("evictions") == 0);
    CHECK(stats.at("evicted_entries") == 0);
    CHECK(stats.at("hit_rate").get<double>() == Approx(3.0 / 5.0));
    CHECK(stats.at("db") == db.path());
    CHECK(stats.at("data_file_bytes").get<std::uint64_t>() > 0);
    CHECK(stats.at("config").at("entry_depth") == 1);
    for (core::Counter c : kAllCounters) {
        INFO(core::counter_name(c));
        CHECK(stats.contains(std::string(core::counter_name(c))));
    }

    auto human = db.run({"stats"});
    REQUIRE(human.exit_code == 0);
    CHECK(human.out.find("hit rate") != std::string::npos);
    CHECK(human.out.find("60.0%") != std::string::npos);
    CHECK(human.out.find("stored bytes") != std::string::npos);
}

TEST_CASE("stats shows the shared tier only where the db has used one, --json always", "[cli]") {
    CliDb db;
    add_known_set(db);
    std::vector<const core::StatisticField*> remote_counters;
    for (const core::StatisticField& f : core::kStatistics) {
        if ((f.counted_by & core::by_remote) && !core::is_gauge(f.id))
            remote_counters.push_back(&f);
    }
    REQUIRE_FALSE(remote_counters.empty());

    // Never used: not a word of it, but every statistic in --json, zero.
    auto local = db.run({"stats"});
    REQUIRE(local.exit_code == 0);
    CHECK(local.out.find("remote") == std::string::npos);
    CHECK(local.out.find("shared tier") == std::string::npos);
    auto json = db.json({"stats", "--json"});
    for (const core::StatisticField& f : core::kStatistics) {
        if (!(f.counted_by & core::by_remote)) continue;
        INFO(f.name);
        CHECK(json.at(std::string(f.name)) == 0);
    }

    // Once a remote has counted: every counter of the tier, under its group's heading.
    REQUIRE(db.store().update([](core::WriteTxn& txn) -> core::Status {
        KCACHE_TRY(txn.add(core::Counter::remote_hits, 3));
        return txn.add(core::Counter::remote_bytes_down, 5000);
    }));
    auto used = db.run({"stats"});
    REQUIRE(used.exit_code == 0);
    const auto section = used.out.find("\nshared tier since the db was created\n");
    REQUIRE(section != std::string::npos);
    const std::string tier = used.out.substr(section);
    CHECK(tier.find("\n  reads\n") != std::string::npos);
    CHECK(tier.find("\n  failures\n") != std::string::npos);
    for (const core::StatisticField* f : remote_counters) {
        INFO(f->name);
        CHECK(tier.find("    " + core::counter_label(f->id) + " ") != std::string::npos);
    }
    CHECK(tier.find("remote hits") < tier.find("remote misses"));
    CHECK(tier.find("4.9 KiB") != std::string::npos);
    // The rest lists none of them.
    CHECK(used.out.substr(0, section).find("remote") == std::string::npos);
    json = db.json({"stats", "--json"});
    CHECK(json.at("remote_hits") == 3);
    CHECK(json.at("remote_bytes_down") == 5000);

    // A reset zeroes them: the section goes until the tier counts again.
    REQUIRE(db.run({"stats", "--reset"}).exit_code == 0);
    CHECK(db.run({"stats"}).out.find("shared tier") == std::string::npos);
}

TEST_CASE("stats --reset zeroes counters but not gauges", "[cli]") {
    CliDb db;
    add_known_set(db);
    auto before = db.json({"stats", "--json"});
    REQUIRE(before.at("hits") == 3);

    auto reset = db.json({"stats", "--reset", "--json"});
    auto after = db.json({"stats", "--json"});
    for (const auto& stats : {reset, after}) {
        for (core::Counter c : kAllCounters) {
            const std::string name(core::counter_name(c));
            INFO(name);
            if (core::is_gauge(c)) {
                CHECK(stats.at(name) == before.at(name));
            } else {
                CHECK(stats.at(name) == 0);
            }
        }
        CHECK(stats.at("hit_rate").is_null());
        CHECK(stats.at("reset_ns").get<std::int64_t>() > 0);
    }
}

TEST_CASE("a missing db is a clear error and is not created", "[cli]") {
    TempDir dir;
    const std::string missing = (dir / "nope").string();
    const std::vector<std::vector<std::string>> commands = {
        {"stats"},
        {"stats", "--reset"},
        {"ls"},
        {"show", "abc"},
        {"cat", "abc", "x"},
        {"evict", "abc"},
        {"evict", "--to-size", "1G"},
        {"clear", "--yes"},
        {"pin", "abc"},
        {"unpin", "abc"},
        {"verify"},
        {"export", "-o", (dir / "b.kcb").string()},
        {"import", (dir / "b.kcb").string()},
        {"gc"},
        {"gc", "--compact"},
        {"config"},
        {"config", "--max-size", "1G"},
    };
    for (auto args : commands) {
        INFO(args.front());
        args.insert(args.begin(), {"--db", missing});
        auto result = run_kcache(args);
        CHECK(result.exit_code == 1);
        CHECK(result.err == "kcache: no db at " + missing + " (run `kcache init`)\n");
        CHECK(result.out.empty());
        CHECK_FALSE(std::filesystem::exists(missing));
    }

    // Without --db, $KCACHE_DB names the db.
    auto from_env = run_kcache({"stats"}, {{"KCACHE_DB", missing}});
    CHECK(from_env.exit_code == 1);
    CHECK(from_env.err.find("no db at " + missing) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(missing));

    // init is the one command that creates it; --db may follow the command too.
    REQUIRE(run_kcache({"init", "--db", missing}).exit_code == 0);
    CHECK(run_kcache({"stats"}, {{"KCACHE_DB", missing}}).exit_code == 0);
}

TEST_CASE("usage errors exit 2", "[cli]") {
    CliDb db;
    REQUIRE(db.run({"init"}).exit_code == 0);
    const std::vector<std::vector<std::string>> bad = {
        {},
        {"frobnicate"},
        {"ls", "--sort", "colour"},
        {"evict"},
        {"evict", "abc", "--to-size", "1G"},
        {"evict", "--older-than", "soon"},
        {"evict", "--to-size", "lots"},
        {"clear"},
        {"show"},
        {"export"},
        {"cat", "abc", "../x"},
    };
    for (const auto& args : bad) {
        INFO((args.empty() ? std::string("(none)") : args.front()));
        auto result = args.empty() ? run_kcache({}) : db.run(args);
        CHECK(result.exit_code == 2);
        CHECK_FALSE(result.err.empty());
    }
    CHECK(run_kcache({"--help"}).exit_code == 0);
    CHECK(run_kcache({"--version"}).exit_code == 0);
}
