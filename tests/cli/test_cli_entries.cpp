// kcache ls, show, cat.

#include <catch2/catch.hpp>

#include "cli_harness.hpp"
#include "kcache/core/types.hpp"

using kcache::test::CliDb;
using kcache::test::kSecondNs;
using kcache::test::ManualClock;
using kcache::test::random_bytes;
using Names = std::vector<std::string>;
namespace core = kcache::core;

namespace {

// Every byte value, NULs included, in a recognisable order.
std::string all_bytes() {
    std::string bytes;
    for (int round = 0; round < 4; ++round) {
        for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
    }
    bytes += std::string(10, '\0');
    return bytes;
}

// Three entries with distinct sizes, hits and last-access times:
//   name   bytes  hits  last access
//   alpha    100     0  3h ago
//   beta    5000     2  1h ago (its hits)
//   gamma    700     5  2h ago (its hits)
void add_three(CliDb& db) {
    ManualClock clock;
    const std::int64_t now = *clock.now;
    db.store(clock.clock());
    clock.set(now - 4 * 3600 * kSecondNs);
    db.add_entry("beta", {{"kernel.cubin", random_bytes(5000, 11)}});
    db.add_entry("gamma", {{"kernel.hsaco", random_bytes(700, 12)}});
    clock.set(now - 3 * 3600 * kSecondNs);
    db.add_entry("alpha", {{"kernel.ptx", random_bytes(100, 13)}});
    clock.set(now - 2 * 3600 * kSecondNs);
    db.record_hits("gamma", 5);
    clock.set(now - 1 * 3600 * kSecondNs);
    db.record_hits("beta", 2);
    db.close();
}

}  // namespace

TEST_CASE("ls sorts by name, size, hits and age", "[cli]") {
    CliDb db;
    add_three(db);
    CHECK(db.ls_names() == Names{"alpha", "beta", "gamma"});
    CHECK(db.ls_names({"--sort", "name"}) == Names{"alpha", "beta", "gamma"});
    CHECK(db.ls_names({"--sort", "size"}) == Names{"beta", "gamma", "alpha"});
    CHECK(db.ls_names({"--sort", "hits"}) == Names{"gamma", "beta", "alpha"});
    CHECK(db.ls_names({"--sort", "age"}) == Names{"beta", "gamma", "alpha"});
    CHECK(db.ls_names({"--sort", "size", "--reverse"}) == Names{"alpha", "gamma", "beta"});
    CHECK(db.ls_names({"--sort", "hits", "--limit", "2"}) == Names{"gamma", "beta"});
    CHECK(db.ls_names({"--limit", "0"}).empty());

    auto json = db.json({"ls", "--json", "--sort", "size"});
    REQUIRE(json.size() == 3);
    CHECK(json[0].at("bytes") == 5000);
    CHECK(json[0].at("files") == 1);
    CHECK(json[0].at("hits") == 2);
    CHECK(json[0].at("pinned") == false);
    CHECK(json[0].at("producer").is_string());
    CHECK(json[0].at("last_access_age_ns").get<std::int64_t>() >= 3600 * kSecondNs);

    // The table has a header and one line per entry, in the same order.
    auto table = db.run({"ls", "--sort", "size"});
    REQUIRE(table.exit_code == 0);
    const auto beta = table.out.find("\nbeta ");
    const auto gamma = table.out.find("\ngamma ");
    const auto alpha = table.out.find("\nalpha ");
    CHECK(table.out.rfind("NAME", 0) == 0);
    CHECK(beta < gamma);
    CHECK(gamma < alpha);
    CHECK(alpha != std::string::npos);
}

TEST_CASE("ls of an empty db prints nothing", "[cli]") {
    CliDb db;
    REQUIRE(db.run({"init"}).exit_code == 0);
    auto result = db.run({"ls"});
    CHECK(result.exit_code == 0);
    CHECK(result.out.empty());
    CHECK(db.json({"ls", "--json"}) == nlohmann::json::array());
}

TEST_CASE("show prints an entry and its files", "[cli]") {
    CliDb db;
    const std::string cubin = random_bytes(4096, 3);
    const std::string sig = R"({"name": "add_kernel"})";
    const std::string ir = "define void @k() { ret void }\n";
    db.add_entry(
        "4fd1c0ffee",
        {{"kernel.cubin", cubin}, {"kernel.json", sig}, {"ir/kernel.ll", ir}, {"notes.txt", ""}});
    db.record_hits("4fd1c0ffee", 1);

    auto json = db.json({"show", "4fd1c0ffee", "--json"});
    CHECK(json.at("entry").at("name") == "4fd1c0ffee");
    CHECK(json.at("entry").at("files") == 4);
    CHECK(json.at("entry").at("bytes") == cubin.size() + sig.size() + ir.size());
    CHECK(json.at("entry").at("hits") == 1);
    CHECK(json.at("entry").at("populated_by").at("pid") == 4242);
    const auto& files = json.at("files");
    REQUIRE(files.size() == 4);
    CHECK(files[0].at("path") == "ir/kernel.ll");
    CHECK(files[0].at("role") == "ir");
    CHECK(files[0].at("size") == ir.size());
    CHECK(files[0].at("digest") == core::digest_of(ir).hex());
    CHECK(files[1].at("path") == "kernel.cubin");
    CHECK(files[1].at("role") == "binary");
    CHECK(files[1].at("digest") == core::digest_of(cubin).hex());
    CHECK(files[2].at("path") == "kernel.json");
    CHECK(files[2].at("role") == "signature");
    CHECK(files[3].at("path") == "notes.txt");
    CHECK(files[3].at("role") == "other");
    CHECK(files[3].at("size") == 0);

    auto human = db.run({"show", "4fd1c0ffee"});
    REQUIRE(human.exit_code == 0);
    CHECK(human.out.find("4fd1c0ffee") != std::string::npos);
    CHECK(human.out.find(core::digest_of(cubin).hex()) != std::string::npos);
    CHECK(human.out.find("ir/kernel.ll") != std::string::npos);
    CHECK(human.out.find("binary") != std::string::npos);

    // A unique prefix names the entry; an unknown name is an error.
    CHECK(db.json({"show", "4fd1", "--json"}).at("entry").at("name") == "4fd1c0ffee");
    auto missing = db.run({"show", "ffff"});
    CHECK(missing.exit_code == 1);
    CHECK(missing.err == "kcache: no entry ffff\n");
}

TEST_CASE("show refuses an ambiguous prefix", "[cli]") {
    CliDb db;
    db.add_entry("abc111", {{"a.ptx", "1"}});
    db.add_entry("abc222", {{"a.ptx", "2"}});
    auto result = db.run({"show", "abc"});
    CHECK(result.exit_code == 1);
    CHECK(result.err.find("ambiguous") != std::string::npos);
    CHECK(result.err.find("abc111") != std::string::npos);
}

TEST_CASE("cat writes a file byte-exact", "[cli]") {
    CliDb db;
    const std::string binary = all_bytes();
    const std::string big = random_bytes(300 * 1024, 7);
    db.add_entry("e1", {{"kernel.cubin", binary}, {"sub/dir/big.bin", big}, {"empty", ""}});
    db.add_entry("flat.bin", {{"", binary}});

    auto cubin = db.run({"cat", "e1", "kernel.cubin"});
    REQUIRE(cubin.exit_code == 0);
    CHECK(cubin.out.size() == binary.size());
    CHECK(cubin.out == binary);
    CHECK(cubin.err.empty());

    auto nested = db.run({"cat", "e1", "./sub//dir/big.bin"});
    REQUIRE(nested.exit_code == 0);
    CHECK(nested.out == big);

    auto empty = db.run({"cat", "e1", "empty"});
    REQUIRE(empty.exit_code == 0);
    CHECK(empty.out.empty());

    auto flat = db.run({"cat", "flat.bin"});
    REQUIRE(flat.exit_code == 0);
    CHECK(flat.out == binary);

    auto missing = db.run({"cat", "e1", "nope.cubin"});
    CHECK(missing.exit_code == 1);
    CHECK(missing.err == "kcache: entry e1 has no file nope.cubin\n");
    CHECK(missing.out.empty());

    auto directory = db.run({"cat", "e1", "sub"});
    CHECK(directory.exit_code == 1);
    CHECK(directory.err.find("not a regular file") != std::string::npos);

    CHECK(db.run({"cat", "e1"}).exit_code == 2);  // which file?
}
