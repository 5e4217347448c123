// Compiler-like flows (tests/fsd/flows/*.py, run by /usr/bin/python3) and the hit/miss
// statistics they produce (docs/stats.md): N keys stored by one process are N misses;
// two fresh processes that look up and read every key are 2*N hits, one per entry per
// process, however many files each reads and however often.

#include <sys/stat.h>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

#ifndef KCACHE_FSD_TESTLIB_PATH
#error "KCACHE_FSD_TESTLIB_PATH must name the test shared library"
#endif

using namespace kcache::test;

namespace {

constexpr int kKeys = 20;

void run_flow_ok(const std::string& script, const MountedCache& cache, const std::string& mode,
                 const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"--root", cache.mnt().string(), "--mode", mode,
                                  "--keys", std::to_string(kKeys)};
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcResult r = run_flow(script, args);
    INFO(script << " --mode " << mode << ": " << r.describe() << "\ndaemon stderr:\n"
                << cache.daemon_stderr());
    REQUIRE(r.exit_code == 0);
}

void check_flow(const std::string& script, const std::vector<std::string>& extra = {}) {
    MountedCache cache;
    run_flow_ok(script, cache, "store", extra);
    run_flow_ok(script, cache, "lookup", extra);
    run_flow_ok(script, cache, "lookup", extra);
    cache.unmount();

    const auto stats = cache_stats(cache.db());
    INFO("stats: " << stats.dump());
    CHECK(stat_value(stats, "misses") == kKeys);
    CHECK(stat_value(stats, "hits") == 2 * kKeys);
    CHECK(stat_value(stats, "entries") == kKeys);
}

}  // namespace

TEST_CASE("Triton flow with per-file tmp dirs and a group file gives N misses and 2N hits",
          "[fsd][flow]") {
    check_flow("triton.py", {"--so", KCACHE_FSD_TESTLIB_PATH});
}

TEST_CASE("Wave flow writing files in place gives N misses and 2N hits", "[fsd][flow]") {
    check_flow("wave.py");
}

TEST_CASE("Inductor flow with write_atomic gives N misses and 2N hits", "[fsd][flow]") {
    check_flow("inductor.py");
}

TEST_CASE("JAX flow with flat files renamed into place gives N misses and 2N hits", "[fsd][flow]") {
    check_flow("jax.py");
}

TEST_CASE("statistics reach the db while mounted", "[fsd][flow][stats]") {
    MountedCache cache;
    run_flow_ok("wave.py", cache, "store");
    run_flow_ok("wave.py", cache, "lookup");
    // The daemon flushes at least every second; allow five.
    std::uint64_t misses = 0, hits = 0;
    const bool flushed = wait_until(
        [&] {
            const auto stats = cache_stats(cache.db());
            misses = stat_value(stats, "misses");
            hits = stat_value(stats, "hits");
            return misses == kKeys && hits == kKeys;
        },
        5);
    INFO("misses " << misses << ", hits " << hits << " while mounted");
    CHECK(flushed);
    CHECK(cache.mounted());
    // Another process looking everything up: one more hit per entry.
    run_flow_ok("wave.py", cache, "lookup");
    cache.unmount();
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "misses") == kKeys);
    CHECK(stat_value(stats, "hits") == 2 * kKeys);
}

TEST_CASE("rewriting or removing files of an entry follows the miss rules", "[fsd][stats]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k1").c_str(), 0755));
    // One miss however many files an entry gets and however often they are rewritten.
    for (int i = 0; i < 3; ++i) {
        REQUIRE(write_all(cache.p("k1/a.cubin"), "v" + std::to_string(i)) == 0);
        REQUIRE(write_all(cache.p("k1/b.json"), "{}") == 0);
    }
    // An empty directory is no populated entry: no miss.
    REQUIRE_SYS(mkdir(cache.p("k2").c_str(), 0755));
    // Removing an entry, then publishing under its name again: a miss again.
    REQUIRE(write_all(cache.p("k3"), "flat") == 0);
    REQUIRE_SYS(unlink(cache.p("k3").c_str()));
    REQUIRE(write_all(cache.p("k3"), "flat again") == 0);
    cache.unmount();
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "misses") == 3);
    CHECK(stat_value(stats, "hits") == 0);  // only the populating process read anything
}

TEST_CASE("CuTe DSL's cache raced by 6 processes counts every load from the cache as a hit",
          "[fsd][flow][stats]") {
    // Six processes go through 40 kernels together: each stores a kernel it did not
    // find (a temp dir, os.replace up into the cache dir) or loads the one there. A load
    // whose open names a file another process's rename replaced after the lookup still
    // loaded the kernel: it counts (once). Several rounds: the race is a matter of timing.
    MountedCache cache;
    std::uint64_t loads = 0;
    constexpr int kRounds = 5;
    for (int round = 0; round < kRounds; ++round) {
        const auto root = cache.mnt() / ("cutedsl" + std::to_string(round));
        const ProcResult r = run_flow("cutedsl_race.py", {"--root", root.string()}, 300);
        INFO(r.describe() << "\ndaemon stderr:\n" << cache.daemon_stderr());
        REQUIRE(r.exit_code == 0);
        const auto report = nlohmann::json::parse(r.out);
        loads += report["loads"].get<std::uint64_t>();
    }
    cache.unmount();
    const auto stats = cache_stats(cache.db());
    INFO("stats: " << stats.dump());
    CHECK(stat_value(stats, "misses") == 40 * kRounds);
    CHECK(stat_value(stats, "hits") == loads);
}
