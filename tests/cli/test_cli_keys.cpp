// kcache keys generate | list | trust | revoke (signed entries, docs/operations.md "Trust
// model"): file modes, the trust file's edits and its rule.

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "cli_harness.hpp"

using kcache::test::read_file;
using kcache::test::run_kcache;
using kcache::test::TempDir;

namespace {

std::uint32_t mode_of(const std::string& path) {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return st.st_mode & 07777;
}

}  // namespace

TEST_CASE("kcache keys: generate, trust, list, revoke", "[cli][keys]") {
    TempDir dir;
    const std::string keys = (dir / "keys").string();
    const std::string trust = (dir / "etc" / "trusted-keys").string();

    auto gen = run_kcache({"keys", "generate", "node-a", "--dir", keys, "--json"});
    INFO(gen.out << gen.err);
    REQUIRE(gen.exit_code == 0);
    const auto g = nlohmann::json::parse(gen.out);
    const std::string id = g.at("id");
    const std::string pub = g.at("public_key");
    CHECK(id.size() == 16);
    CHECK(pub.starts_with("kcache-ed25519:"));
    CHECK(g.at("private_key_file") == keys + "/node-a.key");
    CHECK(mode_of(keys + "/node-a.key") == 0600);
    CHECK(mode_of(keys) == 0700);
    CHECK(read_file(keys + "/node-a.pub") == pub + " node-a\n");
    CHECK(read_file(keys + "/node-a.key").starts_with("-----BEGIN PRIVATE KEY-----"));

    // A second key of that name is refused; a bad name is a usage error.
    CHECK(run_kcache({"keys", "generate", "node-a", "--dir", keys}).exit_code == 1);
    CHECK(run_kcache({"keys", "generate", "../evil", "--dir", keys}).exit_code == 2);

    // trust: from the .pub file (its name comes along), into a new trust file.
    auto t = run_kcache({"keys", "trust", keys + "/node-a.pub", "--trust-file", trust});
    INFO(t.out << t.err);
    REQUIRE(t.exit_code == 0);
    CHECK(t.out.find("trusted " + id) != std::string::npos);
    CHECK(mode_of(trust) == 0644);
    CHECK(read_file(trust).find("trust " + pub + " node-a\n") != std::string::npos);
    // and a second key by its text, with a name
    auto gen_b = run_kcache({"keys", "generate", "ci", "--dir", keys, "--json"});
    REQUIRE(gen_b.exit_code == 0);
    const std::string pub_b = nlohmann::json::parse(gen_b.out).at("public_key");
    REQUIRE(
        run_kcache({"keys", "trust", pub_b, "--name", "ci job", "--trust-file", trust}).exit_code ==
        0);
    CHECK(
        run_kcache({"keys", "trust", "kcache-ed25519:garbage", "--trust-file", trust}).exit_code ==
        1);

    auto list = run_kcache({"keys", "list", "--dir", keys, "--trust-file", trust, "--json"});
    INFO(list.out << list.err);
    REQUIRE(list.exit_code == 0);
    const auto l = nlohmann::json::parse(list.out);
    REQUIRE(l.at("keys").size() == 4);  // two private keys, two trusted keys
    int trusted = 0;
    for (const auto& k : l.at("keys")) {
        if (k.at("state") == "trusted") ++trusted;
    }
    CHECK(trusted == 2);
    auto table = run_kcache({"keys", "list", "--dir", keys, "--trust-file", trust});
    CHECK(table.out.find("SOURCE") != std::string::npos);
    CHECK(table.out.find("ci job") != std::string::npos);

    // revoke by id: the key stays named, as revoked; the message says how to evict.
    auto r = run_kcache({"keys", "revoke", id, "--trust-file", trust});
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("kcache evict --signer " + id) != std::string::npos);
    CHECK(read_file(trust).find("revoke " + pub + " node-a\n") != std::string::npos);
    CHECK(read_file(trust).find("trust " + pub_b + " ci job\n") != std::string::npos);
    // by name
    REQUIRE(run_kcache({"keys", "revoke", "ci job", "--trust-file", trust}).exit_code == 0);
    CHECK(read_file(trust).find("revoke " + pub_b) != std::string::npos);
    CHECK(run_kcache({"keys", "revoke", "nosuchkey", "--trust-file", trust}).exit_code == 1);
}

TEST_CASE("kcache keys: a trust file others may write is refused", "[cli][keys]") {
    TempDir dir;
    const std::string keys = (dir / "keys").string();
    const std::string trust = (dir / "trusted-keys").string();
    REQUIRE(run_kcache({"keys", "generate", "n", "--dir", keys}).exit_code == 0);
    REQUIRE(run_kcache({"keys", "trust", keys + "/n.pub", "--trust-file", trust}).exit_code == 0);
    const std::string before = read_file(trust);

    REQUIRE(::chmod(trust.c_str(), 0666) == 0);
    auto edit = run_kcache({"keys", "revoke", "n", "--trust-file", trust});
    CHECK(edit.exit_code == 1);
    CHECK(edit.err.find("writable by group or others") != std::string::npos);
    CHECK(read_file(trust) == before);  // untouched
    auto list = run_kcache({"keys", "list", "--dir", keys, "--trust-file", trust});
    CHECK(list.err.find("writable by group or others") != std::string::npos);

    // So is one in a directory others may write (they could replace it).
    REQUIRE(::chmod(trust.c_str(), 0644) == 0);
    REQUIRE(::chmod(dir.str().c_str(), 0777) == 0);
    auto in_open_dir = run_kcache({"keys", "revoke", "n", "--trust-file", trust});
    CHECK(in_open_dir.exit_code == 1);
    CHECK(in_open_dir.err.find("directory") != std::string::npos);
    REQUIRE(::chmod(dir.str().c_str(), 0700) == 0);
    CHECK(run_kcache({"keys", "revoke", "n", "--trust-file", trust}).exit_code == 0);
}
