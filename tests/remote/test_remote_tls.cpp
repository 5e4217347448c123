// TLS to Redis (rediss://, issue 32 point 4): a redis-server serving TLS with a CA and
// certificates the test makes (tls_fixture.hpp). Entries round-trip over TLS; a wrong
// CA, a certificate for another host, a missing client certificate and a plaintext
// server behind a rediss:// URL are each a clear error, counted as a dead server is
// (breaker), with nothing written on either side: never a plaintext fallback.

#include <cerrno>
#include <chrono>

#include <catch2/catch.hpp>

#include "entry_names.hpp"
#include "kcache/remote/remote.hpp"
#include "kcache/remote/settings.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"
#include "tls.hpp"
#include "tls_fixture.hpp"

using kcache::test::kEntryA;
using kcache::test::RedisServer;
using kcache::test::run_cli;
using kcache::test::TestDb;
using kcache::test::TlsCerts;
namespace core = kcache::core;
namespace remote = kcache::remote;

namespace {

void fill(TestDb& db) {
    db.put(kEntryA + "/kernel.cubin",
           kcache::test::random_bytes(2 * remote::proto::kChunkBytes + 11, 7));
    db.put(kEntryA + "/kernel.json", "{\"name\": \"kernel\"}");
}

std::string url(std::uint16_t port) {
    return "rediss://127.0.0.1:" + std::to_string(port);
}

// A client of the TLS port that fails fast: one failure opens its breaker.
remote::Options tls_options(std::uint16_t port, remote::TlsOptions tls) {
    remote::Options o;
    o.servers.push_back(*remote::parse_endpoint(url(port)));
    o.ns = "t";
    o.tls = std::move(tls);
    o.op_timeout_ns = 1'000'000'000;
    o.connect_timeout_ns = 1'000'000'000;
    o.breaker_threshold = 1;
    o.breaker_cooldown_ns = 60'000'000'000;
    return o;
}

std::unique_ptr<remote::Remote> make(remote::Options o) {
    auto r = remote::Remote::create(std::move(o));
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    return std::move(*r);
}

// A push and a pull through `o` both fail with a message holding `needle`, count as a
// failed server (its breaker opens, the next call fails at once), and write nothing:
// Redis stays empty, the puller's db gets no entry.
void refused(RedisServer& redis, const remote::Options& o, const std::string& needle) {
    TestDb a, b;
    fill(a);
    auto pusher = make(o);
    auto pushed = pusher->push(a.store(), kEntryA);
    REQUIRE(!pushed.has_value());
    INFO(pushed.error().message);
    CHECK(pushed.error().message.find(needle) != std::string::npos);
    CHECK(pushed.error().message.find("password") == std::string::npos);
    CHECK(redis.command({"DBSIZE"}).integer == 0);
    CHECK(pusher->servers().front().breaker == "open");
    auto again = pusher->push(a.store(), kEntryA);
    REQUIRE(!again.has_value());
    CHECK(again.error().code == EAGAIN);  // the breaker: no new handshake per operation

    // The entry is in Redis now (pushed over the plaintext socket): a pull through `o`
    // still gets nothing.
    redis.command({"FLUSHALL"});
    auto good_pusher = remote::Options{};
    good_pusher.servers.push_back(redis.endpoint());
    good_pusher.ns = "t";
    REQUIRE(make(good_pusher)->push(a.store(), kEntryA).has_value());
    auto puller = make(o);
    auto pulled = puller->pull(b.store(), kEntryA);
    REQUIRE(!pulled.has_value());
    CHECK(pulled.error().message.find(needle) != std::string::npos);
    CHECK(!b.has_entry(kEntryA));
    CHECK(b.entries() == 0);
    CHECK(puller->counts().errors + puller->counts().timeouts >= 1);
}

}  // namespace

TEST_CASE("rediss:// URLs and TLS options parse, and bad combinations are refused",
          "[remote][tls]") {
    auto e = remote::parse_endpoint("rediss://reader@cache.example:6380/2");
    REQUIRE(e.has_value());
    CHECK(e->tls);
    CHECK(e->host == "cache.example");
    CHECK(e->port == 6380);
    CHECK(e->db == 2);
    CHECK(e->user == "reader");
    CHECK(e->id() == "rediss://cache.example:6380/2");
    CHECK(!remote::parse_endpoint("redis://cache.example:6380")->tls);
    CHECK(!remote::parse_endpoint("rediss://u:secret@cache.example").has_value());

    auto seeds = remote::parse_cluster_url("rediss-cluster://10.0.0.1:7000,10.0.0.2:7000");
    REQUIRE(seeds.has_value());
    REQUIRE(seeds->size() == 2);
    CHECK((*seeds)[0].tls);
    CHECK((*seeds)[1].id() == "rediss://10.0.0.2:7000/0");

    remote::Settings s;
    s.urls = {"rediss-cluster://10.0.0.1:7000", "redis-cluster://10.0.0.2:7000"};
    auto mixed = remote::resolve(s);
    REQUIRE(!mixed.has_value());
    CHECK(mixed.error().message.find("mix") != std::string::npos);

    s.urls = {"redis://10.0.0.1:6379"};
    s.tls_ca = "/etc/ssl/certs/ca-certificates.crt";
    auto plain = remote::resolve(s);
    REQUIRE(!plain.has_value());  // TLS files but no TLS server: a mistake, said
    CHECK(plain.error().message.find("--remote-tls-ca") != std::string::npos);

    s.urls = {"rediss://10.0.0.1:6379"};
    s.tls_cert = "/tmp/client.pem";
    auto half = remote::resolve(s);
    REQUIRE(!half.has_value());
    CHECK(half.error().message.find("--remote-tls-key") != std::string::npos);

    TlsCerts certs;
    s.tls_cert.clear();
    s.tls_ca = certs.path("server.key");  // not a certificate
    auto resolved = remote::resolve(s);
    REQUIRE(resolved.has_value());  // files are read when the Remote is made
    CHECK(resolved->tls.ca_file == s.tls_ca);
    auto bad_ca = remote::Remote::create(*resolved);
    REQUIRE(!bad_ca.has_value());
    CHECK(bad_ca.error().code == EINVAL);
    CHECK(bad_ca.error().message.find("--remote-tls-ca") != std::string::npos);

    remote::TlsOptions swapped = certs.options(true);
    swapped.key_file = certs.path("server.key");  // another certificate's key
    auto mismatch = remote::TlsContext::create(swapped);
    REQUIRE(!mismatch.has_value());
    INFO(mismatch.error().message);
    CHECK(mismatch.error().message.find("--remote-tls-key") != std::string::npos);
}

TEST_CASE("entries pushed over rediss:// are pulled over rediss:// byte-exact", "[remote][tls]") {
    TlsCerts certs;
    const std::uint16_t port = kcache::test::free_port();
    RedisServer redis(kcache::test::tls_server_args(certs, port));
    TestDb a, b;
    fill(a);
    const auto expected = a.snapshot(kEntryA);
    auto cli = [&](TestDb& db, std::vector<std::string> tail) {
        db.close();
        std::vector<std::string> args = {"--db",     db.path(),         "remote",
                                         "--remote", url(port),         "--remote-namespace",
                                         "t",        "--remote-tls-ca", certs.ca()};
        args.insert(args.end(), tail.begin(), tail.end());
        return run_cli(args);
    };
    auto push = cli(a, {"push"});
    INFO(push.out << push.err);
    REQUIRE(push.exit_code == 0);
    CHECK(push.out.find("pushed 1") != std::string::npos);
    CHECK(redis.command({"DBSIZE"}).integer > 0);

    auto pull = cli(b, {"pull", kEntryA});
    INFO(pull.out << pull.err);
    REQUIRE(pull.exit_code == 0);
    CHECK(b.snapshot(kEntryA) == expected);
    CHECK(b.counter(core::Counter::remote_bytes_down) > 2 * remote::proto::kChunkBytes);

    // The same through the environment ($KCACHE_REMOTE_TLS_CA), as kcache-fsd reads it.
    TestDb c;
    c.close();
    auto env_pull = run_cli({"--db", c.path(), "remote", "--remote", url(port),
                             "--remote-namespace", "t", "pull", kEntryA},
                            {{"KCACHE_REMOTE_TLS_CA", certs.ca()}});
    INFO(env_pull.out << env_pull.err);
    REQUIRE(env_pull.exit_code == 0);
    CHECK(c.snapshot(kEntryA) == expected);
}

TEST_CASE("a server certificate of an unknown CA is refused: an error, nothing written",
          "[remote][tls]") {
    TlsCerts certs;
    const std::uint16_t port = kcache::test::free_port();
    RedisServer redis(kcache::test::tls_server_args(certs, port));
    remote::TlsOptions wrong = certs.options();
    wrong.ca_file = certs.other_ca();
    refused(redis, tls_options(port, wrong), "certificate is refused");

    // The CLI says it too, and exits 1 (an operation that failed).
    TestDb b;
    b.close();
    auto pull = run_cli({"--db", b.path(), "remote", "--remote", url(port), "--remote-namespace",
                         "t", "--remote-tls-ca", certs.other_ca(), "pull", kEntryA});
    INFO(pull.out << pull.err);
    CHECK(pull.exit_code == 1);
    CHECK(pull.err.find("TLS handshake: the server's certificate is refused") != std::string::npos);
    CHECK(!b.has_entry(kEntryA));
}

TEST_CASE("a server certificate for another host name is refused", "[remote][tls]") {
    TlsCerts certs;
    const std::uint16_t port = kcache::test::free_port();
    RedisServer redis(kcache::test::tls_server_args(certs, port, "other-host"));
    // Signed by the right CA, but for DNS:other.invalid, not 127.0.0.1.
    refused(redis, tls_options(port, certs.options()), "mismatch");
}

TEST_CASE(
    "a server that asks for client certificates serves a client with one and refuses "
    "one without",
    "[remote][tls]") {
    TlsCerts certs;
    const std::uint16_t port = kcache::test::free_port();
    RedisServer redis(kcache::test::tls_server_args(certs, port, "server", true));
    {
        TestDb a, b;
        fill(a);
        auto with_cert = make(tls_options(port, certs.options(true)));
        auto pushed = with_cert->push(a.store(), kEntryA);
        INFO((pushed ? std::string() : pushed.error().message));
        REQUIRE(pushed.has_value());
        CHECK(pushed->outcome == remote::Outcome::uploaded);
        auto pulled = make(tls_options(port, certs.options(true)))->pull(b.store(), kEntryA);
        REQUIRE(pulled.has_value());
        CHECK(pulled->outcome == remote::Outcome::pulled);
        CHECK(b.snapshot(kEntryA) == a.snapshot(kEntryA));
    }
    redis.command({"FLUSHALL"});
    // TLS 1.3: the server refuses after the handshake, on the first read.
    refused(redis, tls_options(port, certs.options(false)), "TLS");
}

TEST_CASE("a plaintext Redis behind a rediss:// URL fails within the deadline, never in clear",
          "[remote][tls]") {
    TlsCerts certs;
    const std::uint16_t port = kcache::test::free_port();
    RedisServer redis({"--bind", "127.0.0.1", "--port", std::to_string(port)});
    remote::Options o = tls_options(port, certs.options());
    o.connect_timeout_ns = 300'000'000;
    o.op_timeout_ns = 300'000'000;
    const auto start = std::chrono::steady_clock::now();
    refused(redis, o, "redis rediss://127.0.0.1:" + std::to_string(port));
    // A hang guard, not a timing check: two failed connects of 300 ms each at most.
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}
