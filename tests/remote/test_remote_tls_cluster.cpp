// A Redis Cluster over TLS (rediss-cluster://, issue 32 point 4): 3 masters and 3
// replicas serving TLS only (tls-port, tls-cluster, tls-replication), so that CLUSTER
// SLOTS, MOVED and ASK name TLS ports: a push and a pull through one seed, a slot moved
// for good while a Remote holds the old map (MOVED followed over TLS), and a plaintext
// cluster URL to the same nodes failing cleanly. Skipped without redis-server,
// redis-cli or openssl.

#include <fmt/core.h>
#include <catch2/catch.hpp>

#include "cluster.hpp"
#include "cluster_fixture.hpp"
#include "kcache/remote/remote.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"
#include "tls_fixture.hpp"

using kcache::test::RedisCluster;
using kcache::test::run_cli;
using kcache::test::TestDb;
using kcache::test::TlsCerts;
namespace cluster = kcache::remote::cluster;
namespace proto = kcache::remote::proto;
namespace remote = kcache::remote;

namespace {

const std::vector<std::string> kEntries = [] {
    std::vector<std::string> names;
    for (int i = 0; i < 12; ++i) names.push_back(fmt::format("T{:02}-4FD1E3QZ7KXAB2MC5N6P", i));
    return names;
}();

void fill(TestDb& db) {
    for (std::size_t i = 0; i < kEntries.size(); ++i) {
        db.put(kEntries[i] + "/kernel.json", fmt::format("{{\"n\": {}}}", i));
        db.put(kEntries[i] + "/kernel.cubin",
               kcache::test::random_bytes(std::size_t{30'000} + i, std::uint32_t(i)));
    }
}

std::vector<std::string> cli_args(TestDb& db, const std::string& url, const TlsCerts& certs,
                                  std::vector<std::string> tail) {
    db.close();
    std::vector<std::string> a = {"--db",    db.path(),
                                  "remote",  "--remote",
                                  url,       "--remote-namespace",
                                  "ct",      "--remote-timeout",
                                  "1s",      "--remote-connect-timeout",
                                  "1s",      "--remote-tls-ca",
                                  certs.ca()};
    a.insert(a.end(), tail.begin(), tail.end());
    return a;
}

}  // namespace

TEST_CASE("cluster over TLS: push and pull through one rediss-cluster:// seed, MOVED followed",
          "[remote][tls][cluster]") {
    TlsCerts certs;
    RedisCluster c(&certs);
    REQUIRE(c.url().starts_with("rediss-cluster://"));
    TestDb a, b;
    fill(a);
    auto push = run_cli(cli_args(a, c.url(), certs, {"push", "--job-tag", "job-t"}));
    INFO(push.out << push.err);
    REQUIRE(push.exit_code == 0);
    CHECK(push.out.find(fmt::format("pushed {}", kEntries.size())) != std::string::npos);
    // The slot map named the masters' TLS ports, and every master holds some keys.
    const auto masters = c.masters();
    REQUIRE(masters.size() == 3);
    for (const std::uint16_t m : masters) {
        INFO("master " << m);
        CHECK(c.command(m, {"DBSIZE"}).integer > 0);
    }
    auto pull = run_cli(cli_args(b, c.url(), certs, {"pull", "--job-tag", "job-t"}));
    INFO(pull.out << pull.err);
    REQUIRE(pull.exit_code == 0);
    for (const std::string& e : kEntries) {
        INFO(e);
        REQUIRE(b.snapshot(e) == a.snapshot(e));
    }

    // One manifest's slot moves to another master for good while a Remote keeps the map
    // it read before: its pull is answered MOVED and follows it, over TLS.
    remote::Options o;
    o.servers = *remote::parse_cluster_url(c.url());
    o.cluster = true;
    o.ns = "ct";
    o.tls = certs.options();
    auto made = remote::Remote::create(o);
    INFO((made ? std::string() : made.error().message));
    REQUIRE(made.has_value());
    remote::Remote& rem = **made;
    REQUIRE(rem.ping() == std::vector<std::string>(3));  // reads the map: 3 masters
    const std::string entry = kEntries[5];
    const std::string mkey = proto::manifest_key("ct", entry);
    const auto slot = std::to_string(cluster::key_slot(mkey));
    const std::uint16_t from = c.master_of(mkey);
    std::uint16_t to = 0;
    for (const std::uint16_t m : masters) {
        if (m != from) to = m;
    }
    const std::string from_id = c.command(from, {"CLUSTER", "MYID"}).str;
    const std::string to_id = c.command(to, {"CLUSTER", "MYID"}).str;
    REQUIRE(c.command(to, {"CLUSTER", "SETSLOT", slot, "IMPORTING", from_id}).is_ok());
    REQUIRE(c.command(from, {"CLUSTER", "SETSLOT", slot, "MIGRATING", to_id}).is_ok());
    const auto migrated = c.command(
        from, {"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000", "KEYS", mkey});
    INFO(migrated.str);
    REQUIRE(migrated.is_ok());
    REQUIRE(c.command(to, {"CLUSTER", "SETSLOT", slot, "NODE", to_id}).is_ok());
    REQUIRE(c.command(from, {"CLUSTER", "SETSLOT", slot, "NODE", to_id}).is_ok());
    c.wait_stable();
    TestDb d;
    const auto got = rem.pull(d.store(), entry);
    INFO((got ? std::string() : got.error().message));
    REQUIRE(got.has_value());
    CHECK(got->outcome == remote::Outcome::pulled);
    CHECK(d.snapshot(entry) == a.snapshot(entry));
    CHECK(rem.counts().errors == 0);

    // The same nodes through a plaintext cluster URL: an error within the deadlines,
    // nothing pulled.
    TestDb e;
    const std::string plain = "redis-cluster://127.0.0.1:" + std::to_string(c.ports().front());
    auto args = cli_args(e, plain, certs, {"pull", kEntries[0]});
    args.erase(args.end() - 4, args.end() - 2);  // no --remote-tls-ca: no TLS server named
    auto refused = run_cli(args, {}, 60);
    INFO(refused.out << refused.err);
    CHECK(!refused.timed_out);
    CHECK(refused.exit_code == 1);
    CHECK(!e.has_entry(kEntries[0]));
}
