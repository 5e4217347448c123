// kcache verify, gc, export, import.

#include <filesystem>

#include <catch2/catch.hpp>

#include "cli_harness.hpp"
#include "kcache/core/types.hpp"

using kcache::test::CliDb;
using kcache::test::random_bytes;
using kcache::test::read_file;
using kcache::test::write_file;
using Names = std::vector<std::string>;
namespace core = kcache::core;

namespace {

std::string with_nuls() {
    std::string bytes("\0\x01\x02kernel\0\xff\xfe", 12);
    bytes += random_bytes(2000, 99);
    bytes += std::string(3, '\0');
    return bytes;
}

void add_sample(CliDb& db) {
    db.add_entry("k1", {{"kernel.cubin", with_nuls()}, {"kernel.json", "{\"n\": 1}"}});
    db.add_entry("k2",
                 {{"kernel.ptx", ".version 8.0\n"}, {"sub/kernel.ll", random_bytes(50000, 5)}});
    db.add_entry("k3", {{"kernel.cubin", with_nuls()}});  // same content as k1's: stored once
}

}  // namespace

TEST_CASE("verify of a clean db exits 0", "[cli]") {
    CliDb db;
    add_sample(db);
    auto result = db.run({"verify"});
    INFO(result.out << result.err);
    CHECK(result.exit_code == 0);
    CHECK(result.out.find("ok") != std::string::npos);
    CHECK(result.err.empty());  // no progress line when stderr is not a terminal
}

TEST_CASE("verify reports a corrupted blob and exits 1", "[cli]") {
    CliDb db;
    add_sample(db);
    // Incompressible content is stored as it is, so its bytes appear in data.mdb.
    const std::string marker = "KCACHE-CLI-TEST-MARKER-7d1e9a";
    const std::string content = marker + random_bytes(64 * 1024, 1234);
    db.add_entry("victim", {{"kernel.cubin", content}});
    db.close();

    const auto data_file = db.dir() / "db" / "data.mdb";
    std::string data = read_file(data_file);
    std::size_t flipped = 0;
    for (auto at = data.find(marker); at != std::string::npos; at = data.find(marker, at + 1)) {
        const std::size_t target = at + marker.size() + 1000;
        REQUIRE(target < data.size());
        data[target] = static_cast<char>(~data[target]);
        ++flipped;
    }
    REQUIRE(flipped > 0);
    write_file(data_file, data);

    auto result = db.run({"verify"});
    INFO(result.out << result.err);
    CHECK(result.exit_code == 1);
    CHECK(result.err.find("is damaged") != std::string::npos);
    // The report names the damaged blob (by digest) or the entry holding it.
    const bool named = result.out.find(core::digest_of(content).hex()) != std::string::npos ||
                       result.out.find("victim") != std::string::npos;
    CHECK(named);
}

TEST_CASE("gc and gc --compact", "[cli]") {
    CliDb db;
    add_sample(db);
    REQUIRE(db.run({"evict", "k2"}).exit_code == 0);
    auto gc = db.run({"gc"});
    INFO(gc.err);
    CHECK(gc.exit_code == 0);
    CHECK(gc.out.find("stale") != std::string::npos);

    auto compact = db.run({"gc", "--compact"});
    INFO(compact.err);
    CHECK(compact.exit_code == 0);
    CHECK(compact.out.find("compacted") != std::string::npos);
    CHECK(db.run({"verify"}).exit_code == 0);
    CHECK(db.ls_names() == Names{"k1", "k3"});
}

TEST_CASE("gc --compact refuses while another process uses the db", "[cli]") {
    CliDb db;
    add_sample(db);
    db.store();  // this test process holds the db open
    auto result = kcache::test::run_kcache({"--db", db.path(), "gc", "--compact"});
    CHECK(result.exit_code == 1);
    CHECK(result.err.rfind("kcache: ", 0) == 0);
    CHECK(result.out.find("compacted") == std::string::npos);
    db.close();
    CHECK(db.run({"verify"}).exit_code == 0);
    CHECK(db.ls_names() == Names{"k1", "k2", "k3"});
}

TEST_CASE("export and import round-trip byte-exact", "[cli]") {
    CliDb source;
    add_sample(source);
    const std::string bundle = (source.dir() / "all.kcb").string();
    auto exported = source.run({"export", "-o", bundle});
    INFO(exported.err);
    REQUIRE(exported.exit_code == 0);
    CHECK(exported.out.find("exported 3 entries") != std::string::npos);
    REQUIRE(std::filesystem::exists(bundle));

    CliDb target;
    REQUIRE(target.run({"init"}).exit_code == 0);
    auto imported = target.run({"import", bundle});
    INFO(imported.err);
    REQUIRE(imported.exit_code == 0);
    CHECK(imported.out.find("imported 3 entries") != std::string::npos);

    CHECK(target.ls_names() == Names{"k1", "k2", "k3"});
    for (const std::string name : {"k1", "k2", "k3"}) {
        INFO(name);
        auto want = source.json({"show", name, "--json"});
        auto got = target.json({"show", name, "--json"});
        REQUIRE(got.at("files").size() == want.at("files").size());
        for (std::size_t i = 0; i < want.at("files").size(); ++i) {
            const auto& file = want.at("files")[i];
            CHECK(got.at("files")[i].at("path") == file.at("path"));
            CHECK(got.at("files")[i].at("digest") == file.at("digest"));
            const std::string path = file.at("path");
            auto a = source.run({"cat", name, path});
            auto b = target.run({"cat", name, path});
            REQUIRE(a.exit_code == 0);
            REQUIRE(b.exit_code == 0);
            CHECK(a.out == b.out);
        }
    }
    CHECK(target.run({"cat", "k1", "kernel.cubin"}).out == with_nuls());
    CHECK(target.run({"verify"}).exit_code == 0);

    // Again: present entries are skipped, or replaced with --replace.
    auto again = target.run({"import", bundle});
    REQUIRE(again.exit_code == 0);
    CHECK(again.out.find("skipped 3 entries") != std::string::npos);
    auto replace = target.run({"import", bundle, "--replace"});
    REQUIRE(replace.exit_code == 0);
    CHECK(replace.out.find("replaced 3 entries") != std::string::npos);
    CHECK(target.ls_names() == Names{"k1", "k2", "k3"});
}

TEST_CASE("export of named entries", "[cli]") {
    CliDb source;
    add_sample(source);
    const std::string bundle = (source.dir() / "some.kcb").string();
    auto exported = source.run({"export", "k2", "k3", "-o", bundle});
    INFO(exported.err);
    REQUIRE(exported.exit_code == 0);
    CHECK(exported.out.find("exported 2 entries") != std::string::npos);

    CliDb target;
    REQUIRE(target.run({"init"}).exit_code == 0);
    REQUIRE(target.run({"import", bundle}).exit_code == 0);
    CHECK(target.ls_names() == Names{"k2", "k3"});

    auto unknown = source.run({"export", "nope", "-o", (source.dir() / "x.kcb").string()});
    CHECK(unknown.exit_code == 1);
    CHECK_FALSE(std::filesystem::exists(source.dir() / "x.kcb"));
}

TEST_CASE("import of a truncated bundle fails and changes nothing", "[cli]") {
    CliDb source;
    add_sample(source);
    const std::string bundle = (source.dir() / "all.kcb").string();
    REQUIRE(source.run({"export", "-o", bundle}).exit_code == 0);
    const std::string bytes = read_file(bundle);
    const std::string truncated = (source.dir() / "truncated.kcb").string();
    write_file(truncated, bytes.substr(0, bytes.size() / 2));

    CliDb target;
    target.add_entry("resident", {{"kernel.ptx", "already here"}});
    target.close();
    auto before_ls = target.json({"ls", "--json"});
    auto before_stats = target.json({"stats", "--json"});

    auto result = target.run({"import", truncated});
    CHECK(result.exit_code == 1);
    CHECK(result.err.rfind("kcache: ", 0) == 0);
    CHECK(result.out.empty());

    // The same entries with the same fields (the age moves on with the clock).
    auto after_ls = target.json({"ls", "--json"});
    for (auto* list : {&before_ls, &after_ls}) {
        for (auto& entry : *list) entry.erase("last_access_age_ns");
    }
    CHECK(after_ls == before_ls);
    auto after_stats = target.json({"stats", "--json"});
    for (const char* key : {"entries", "files", "bytes", "stored_bytes", "blobs", "stores",
                            "misses", "imported_entries"}) {
        INFO(key);
        CHECK(after_stats.at(key) == before_stats.at(key));
    }
}
