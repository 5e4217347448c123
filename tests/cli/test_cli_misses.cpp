// kcache why, kcache misses (core/misses.hpp): classified with --classify as kcache-fsd
// would in the background, by entry name, prefix or a path of one of its files.

#include <catch2/catch.hpp>

#include "cli_harness.hpp"

using kcache::test::CliDb;
using kcache::test::kSecondNs;
using kcache::test::ManualClock;

namespace {

std::string metadata(int warps) {
    return "{\"hash\": \"" + std::to_string(warps) +
           "\", \"name\": \"add_kernel\", \"triton_version\": \"3.9.0\", \"num_warps\": " +
           std::to_string(warps) + "}";
}

// Two Triton entries of one kernel (num_warps 4, then 8), stored a minute ago: settled.
void add_two(CliDb& db) {
    ManualClock clock;
    clock.set(kcache::core::system_clock_ns() - 60 * kSecondNs);
    db.store(clock.clock());
    db.add_entry("first4kernelkey0001", {{"add_kernel.json", metadata(4)},
                                         {"add_kernel.cubin", kcache::test::random_bytes(300, 4)}});
    clock.set(kcache::core::system_clock_ns() - 50 * kSecondNs);
    db.add_entry("second8kernelkey002", {{"add_kernel.json", metadata(8)},
                                         {"add_kernel.cubin", kcache::test::random_bytes(300, 8)}});
    db.close();
}

}  // namespace

TEST_CASE("misses and why: pending until classified and then the cause and the field", "[cli]") {
    CliDb db;
    add_two(db);
    auto pending = db.run({"misses"});
    REQUIRE(pending.exit_code == 0);
    CHECK(pending.out.find("no classified misses") != std::string::npos);
    CHECK(pending.out.find("2 misses not classified yet") != std::string::npos);
    auto none = db.run({"why", "second8"});
    CHECK(none.exit_code == 1);
    CHECK(none.err.find("not classified yet") != std::string::npos);

    auto why = db.run({"why", "--classify", "second8"});  // a unique prefix
    REQUIRE(why.exit_code == 0);
    CHECK(why.out.find("changed key: first4kernelkey0001") != std::string::npos);
    CHECK(why.out.find("num_warps") != std::string::npos);

    const auto all = db.json({"misses", "--json"});
    REQUIRE(all["misses"].size() == 2);
    CHECK(all["pending"] == 0);
    CHECK(all["misses"][0]["entry"] == "second8kernelkey002");  // newest first
    CHECK(all["misses"][1]["cause"] == "first");
    const auto changed = db.json({"misses", "--json", "--cause", "changed_key"});
    REQUIRE(changed["misses"].size() == 1);
    const auto& fields = changed["misses"][0]["fields"];
    REQUIRE(fields.size() == 1);
    CHECK(fields[0]["field"] == "num_warps");
    CHECK(fields[0]["before"] == "4");
    CHECK(fields[0]["after"] == "8");
    CHECK(db.json({"misses", "--json", "--since", "1s"})["misses"].empty());

    // A path of a file of the entry, as on a mount.
    const auto by_path =
        db.json({"why", "--json", "/mnt/kcache/second8kernelkey002/add_kernel.cubin"});
    CHECK(by_path["entry"] == "second8kernelkey002");
    CHECK(by_path["compared_with"] == "first4kernelkey0001");

    CHECK(db.run({"misses", "--cause", "sideways"}).exit_code == 2);
    CHECK(db.run({"why", "nosuchentry"}).exit_code == 1);
    const auto stats = db.json({"stats", "--json"});
    CHECK(stats["misses_first"] == 1);
    CHECK(stats["misses_changed_key"] == 1);
    CHECK(stats["sizing"]["all"]["misses"] == 2);
    CHECK(stats["sizing"]["all"]["capacity_misses"] == 0);
}
