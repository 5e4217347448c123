// core::verify: a sound db verifies clean; a damaged blob on disk is reported.
#include <string>

#include "core_test_util.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::kRootIno;

TEST_CASE("verify: a new db is sound", "[verify]") {
    TestStore ts;
    auto report = KC_MUST(core::verify(ts.store()));
    CHECK(report.ok());
    CHECK(report.entries == 0);
    CHECK(report.blobs == 0);
}

TEST_CASE("verify: a db after a mixed workload is sound and counted", "[verify]") {
    TestStore ts;
    ts.put("k1/a.cubin", random_bytes(5000, 1));
    ts.put("k1/b.ptx", compressible_text(50000));
    ts.put("k2/a.cubin", random_bytes(5000, 1));  // shared blob
    ts.put("k3/x", "x");
    ts.put("flat", "");
    {
        auto txn = ts.write();
        KC_MUST(txn.rename(KC_MUST(txn.resolve("k3")), "x", KC_MUST(txn.resolve("k1")), "x"));
        KC_MUST(txn.rmdir(kRootIno, "k3"));
        KC_MUST(txn.symlink(KC_MUST(txn.resolve("k2")), "l", "a.cubin"));
        KC_MUST(txn.commit());
    }
    std::uint64_t calls = 0;
    auto report = KC_MUST(core::verify(ts.store(), [&](std::uint64_t, std::uint64_t) { ++calls; }));
    INFO(report.problems.size() << " problems, first: "
                                << (report.problems.empty() ? "" : report.problems.front()));
    CHECK(report.ok());
    CHECK(report.entries == 3);
    CHECK(report.blobs == ts.counter(Counter::blobs));
    CHECK(report.blobs == 3);
    CHECK(report.inodes >= 8);  // root, 3 entries, 4 files, a symlink
    check_consistent(ts.store());
}

TEST_CASE("verify: a flipped byte in a stored blob is reported", "[verify]") {
    TestStore ts;
    const std::string marker = "KCACHE-VERIFY-MARKER-7f3a9c51";
    const auto content = marker + random_bytes(64 << 10, 99);
    ts.put("k/kernel.cubin", content);
    ts.put("k/other.cubin", random_bytes(64 << 10, 100));
    REQUIRE(KC_MUST(core::verify(ts.store())).ok());
    ts.close();

    const auto data_file = std::filesystem::path(ts.db_path()) / "data.mdb";
    auto disk = read_file(data_file);
    std::size_t flipped = 0;
    for (auto pos = disk.find(marker); pos != std::string::npos; pos = disk.find(marker, pos + 1)) {
        auto at = pos + marker.size() + 100;
        REQUIRE(at < disk.size());
        disk[at] = static_cast<char>(disk[at] ^ 0x01);
        ++flipped;
    }
    INFO("the incompressible content is stored raw, so its marker is in data.mdb");
    REQUIRE(flipped >= 1);
    write_file(data_file, disk);

    ts.reopen();
    auto report = KC_MUST(core::verify(ts.store()));
    CHECK_FALSE(report.ok());
    REQUIRE(report.problems.size() >= 1);
    CHECK_FALSE(report.problems.front().empty());

    SECTION("the undamaged file still reads back") {
        auto other = ts.get("k/other.cubin");
        CHECK(other == random_bytes(64 << 10, 100));
    }
}
