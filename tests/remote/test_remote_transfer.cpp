// Two dbs share one Redis: what A pushes, B pulls byte-exact; jobs; big blobs; ACLs.

#include <set>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::RedisServer;
using kcache::test::run_cli;
using kcache::test::TestDb;
namespace core = kcache::core;
namespace proto = kcache::remote::proto;

namespace {

const std::string kTriton = "4FD1E3QZ7KXAB2MC5N6P7Q8R9S0T1U2V3W4X5Y6Z7A8B9C0D1E2F";
const std::string kJaxKey = "jit_f-1a2b3c4d5e6f70819a2b3c4d5e6f7081";

// A Triton-shaped entry: several files, a subdirectory, a symlink, and a blob of
// several chunks.
void add_triton(TestDb& db, const std::string& big) {
    db.put(kTriton + "/kernel.cubin", kcache::test::random_bytes(200'000, 1));
    db.put(kTriton + "/kernel.json", "{\"name\": \"kernel\", \"num_warps\": 4}\n");
    db.put(kTriton + "/kernel.ptx", std::string(50'000, 'p'));
    db.put(kTriton + "/kernel.ttir", "module {}\n", 0600);
    db.put(kTriton + "/__grp__kernel.json", "{\"child_paths\": {}}");
    db.put(kTriton + "/launcher/__triton_launcher.so", big, 0755);
    db.put(kTriton + "/empty", "");
    db.symlink(kTriton + "/current", "kernel.cubin");
}

void add_jax(TestDb& db) {
    db.put("jax/" + kJaxKey + "-cache", kcache::test::random_bytes(30'000, 2));
    db.put("jax/" + kJaxKey + "-atime", "1712345678");
}

std::vector<std::string> remote_args(const RedisServer& redis, std::vector<std::string> tail) {
    std::vector<std::string> args = {"remote", "--remote", redis.url(), "--remote-namespace",
                                     "test"};
    args.insert(args.end(), tail.begin(), tail.end());
    return args;
}

kcache::test::RunResult kc(TestDb& db, const RedisServer& redis, std::vector<std::string> tail,
                           const std::map<std::string, std::string>& env = {}) {
    db.close();
    std::vector<std::string> args = {"--db", db.path()};
    auto r = remote_args(redis, std::move(tail));
    args.insert(args.end(), r.begin(), r.end());
    return run_cli(args, env);
}

}  // namespace

TEST_CASE("entries pushed from one db are pulled into another byte-exact", "[remote]") {
    RedisServer redis;
    TestDb a, b;
    const std::string big =
        kcache::test::random_bytes(5 * proto::kChunkBytes + 123, 3);  // 6 chunks
    add_triton(a, big);
    add_jax(a);
    const std::string jax = "jax/" + kJaxKey;
    REQUIRE(a.has_entry(kTriton));
    REQUIRE(a.has_entry(jax));

    auto push = kc(a, redis, {"push", "--job-tag", "job-1"});
    INFO(push.out << push.err);
    REQUIRE(push.exit_code == 0);
    CHECK(push.out.find("pushed 2, already remote 0, failed 0") != std::string::npos);

    // No value nears Redis's limit: the big blob lies in 1 MiB chunks.
    const core::Digest big_digest = core::digest_of(big);
    for (std::uint32_t i = 0; i < 6; ++i) {
        const auto len = redis.command({"STRLEN", proto::chunk_key("test", big_digest, i)});
        CHECK(len.integer > 0);
        CHECK(len.integer <= static_cast<long long>(proto::kChunkBytes + 16));
    }
    CHECK(redis.command({"EXISTS", proto::chunk_key("test", big_digest, 6)}).integer == 0);
    // Small files ride in the manifest: no blob of their own.
    CHECK(redis.command({"EXISTS", proto::blob_key("test", core::digest_of("module {}\n"))})
              .integer == 0);

    // A second push sends no blob: every manifest is there (first writer wins).
    const auto sets_before = redis.calls("set");
    auto again = kc(a, redis, {"push"});
    REQUIRE(again.exit_code == 0);
    CHECK(again.out.find("pushed 0, already remote 2") != std::string::npos);
    CHECK(redis.calls("set") == sets_before);

    auto pull = kc(b, redis, {"pull", "--job-tag", "job-1"});
    INFO(pull.out << pull.err);
    REQUIRE(pull.exit_code == 0);
    CHECK(pull.out.find("pulled 2, already local 0") != std::string::npos);
    CHECK(b.snapshot(kTriton) == a.snapshot(kTriton));
    CHECK(b.snapshot(jax) == a.snapshot(jax));
    CHECK(b.snapshot(kTriton).at("launcher/__triton_launcher.so").find(big) != std::string::npos);
    {
        auto txn = b.store().read();
        REQUIRE(txn);
        auto entry = txn->find_entry(jax);
        REQUIRE(entry);
        CHECK(entry->kind == core::EntryKind::stem);
        CHECK(entry->files == 2);
        CHECK(txn->find_entry(kTriton)->producer == core::Producer::triton);
    }
    CHECK(b.counter(core::Counter::remote_hits) == 2);
    CHECK(b.counter(core::Counter::remote_bytes_down) > big.size() / 2);
    CHECK(a.counter(core::Counter::remote_uploads) == 2);
    CHECK(a.counter(core::Counter::remote_upload_skipped) == 2);

    // Pulling again changes nothing; a name the remote lacks is a counted miss.
    auto twice = kc(b, redis, {"pull", kTriton, "nosuch/entry"});
    CHECK(twice.exit_code == 1);
    CHECK(twice.out.find("already local") != std::string::npos);
    CHECK(twice.out.find("miss") != std::string::npos);
    CHECK(b.counter(core::Counter::remote_misses) == 1);

    // The counters are part of `kcache stats --json` and of `kcache remote stats`.
    b.close();
    auto stats = run_cli({"--db", b.path(), "stats", "--json"});
    REQUIRE(stats.exit_code == 0);
    auto json = nlohmann::json::parse(stats.out);
    CHECK(json.at("remote_hits") == 2);
    CHECK(json.at("remote_misses") == 1);
    auto rstats = kc(b, redis, {"stats", "--json"});
    INFO(rstats.err);
    REQUIRE(rstats.exit_code == 0);
    auto rjson = nlohmann::json::parse(rstats.out);
    CHECK(rjson.at("remote_hits") == 2);
    CHECK(rjson.at("servers").at(0).at("reachable") == true);
    CHECK(rjson.at("servers").at(0).at("breaker") == "closed");
}

TEST_CASE("a read-only ACL user never writes to Redis", "[remote]") {
    RedisServer redis;
    // The two users of docs/operations.md.
    REQUIRE(redis
                .command({"ACL", "SETUSER", "writer", "on", ">writerpw", "~kc2:*", "resetchannels",
                          "-@all", "+get", "+set", "+exists", "+del", "+sadd", "+smembers", "+ping",
                          "+select"})
                .is_ok());
    REQUIRE(redis
                .command({"ACL", "SETUSER", "reader", "on", ">readerpw", "~kc2:*", "resetchannels",
                          "-@all", "+get", "+exists", "+smembers", "+ping", "+select"})
                .is_ok());
    TestDb a, b;
    add_jax(a);
    a.put("other/ABCDEF0123456789ABCD/kernel.cubin", kcache::test::random_bytes(20'000, 9));
    REQUIRE(a.has_entry("other/ABCDEF0123456789ABCD"));
    a.close();
    auto push_a = run_cli(
        {"--db", a.path(), "remote", "--remote", redis.url() + "?user=writer", "--remote-namespace",
         "test", "--remote-password-env", "WRITER_PW", "push", "--job-tag", "j"},
        {{"WRITER_PW", "writerpw"}});
    INFO(push_a.out << push_a.err);
    REQUIRE(push_a.exit_code == 0);
    const auto dbsize = redis.command({"DBSIZE"}).integer;
    REQUIRE(redis.command({"CONFIG", "RESETSTAT"}).is_ok());

    const std::string ro_url = redis.url() + "?user=reader";
    const std::map<std::string, std::string> env = {{"KCACHE_REMOTE_PASSWORD", "readerpw"}};
    auto run_ro = [&](std::vector<std::string> tail) {
        b.close();
        std::vector<std::string> args = {
            "--db", b.path(), "remote", "--remote", ro_url, "--remote-namespace", "test"};
        args.insert(args.end(), tail.begin(), tail.end());
        return run_cli(args, env);
    };
    auto pull = run_ro({"--remote-read-only", "pull", "--job-tag", "j"});
    INFO(pull.out << pull.err);
    CHECK(pull.exit_code == 0);
    CHECK(b.has_entry("jax/" + kJaxKey));
    // Even without --remote-read-only, the server refuses the reader's writes.
    b.put("mine/FEDCBA9876543210FEDC/kernel.cubin", kcache::test::random_bytes(20'000, 10));
    auto push = run_ro({"push", "mine/FEDCBA9876543210FEDC"});
    CHECK(push.exit_code == 1);
    CHECK(push.err.find("NOPERM") != std::string::npos);
    auto refused = run_ro({"--remote-read-only", "push"});
    CHECK(refused.exit_code == 1);
    CHECK(refused.err.find("read-only") != std::string::npos);
    // A wrong password is a clear error that does not echo it.
    auto wrong = run_cli({"--db", b.path(), "remote", "--remote", ro_url, "pull", "x"},
                         {{"KCACHE_REMOTE_PASSWORD", "not-the-password"}});
    CHECK(wrong.exit_code == 1);
    CHECK(wrong.err.find("AUTH") != std::string::npos);
    CHECK(wrong.err.find("not-the-password") == std::string::npos);

    for (const char* write : {"set", "setnx", "del", "sadd", "setrange", "expire", "unlink"}) {
        INFO(write);
        CHECK(redis.calls(write) == 0);
    }
    CHECK(redis.command({"DBSIZE"}).integer == dbsize);
}

TEST_CASE("a full Redis (OOM) pauses uploads with a clear error and loses nothing", "[remote]") {
    RedisServer redis({"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"});
    TestDb a;
    for (int i = 0; i < 3; ++i) {
        a.put(
            "big/ABCDEF012345678" + std::to_string(i) + "ABCD/kernel.cubin",
            kcache::test::random_bytes(2 * proto::kChunkBytes, 20 + static_cast<std::uint32_t>(i)));
    }
    const auto before = a.entries();
    auto push = kc(a, redis, {"push"});
    INFO(push.out << push.err);
    CHECK(push.exit_code == 1);
    CHECK(push.err.find("OOM") != std::string::npos);
    CHECK(push.err.find("paused") != std::string::npos);
    CHECK(a.entries() == before);
    // No manifest of an entry whose blobs did not all make it.
    const auto keys = redis.command({"KEYS", "kc2:test:m:*"});
    CHECK(keys.elements.size() < 3);
    for (const auto& k : keys.elements) {
        auto m = proto::decode_manifest(redis.command({"GET", k.str}).str);
        REQUIRE(m);
        for (const auto& n : m->files) {
            if (n.type == core::FileType::regular && !n.has_content && n.size > 0) {
                CHECK(redis.command({"EXISTS", proto::blob_key("test", n.digest)}).integer == 1);
            }
        }
    }
}

TEST_CASE("a pull fetches only the blobs the local db lacks", "[remote]") {
    RedisServer redis;
    TestDb a, b;
    const std::string shared =
        kcache::test::random_bytes(3 * proto::kChunkBytes, 31);  // several MiB
    const std::string own = kcache::test::random_bytes(100'000, 32);
    a.put(kTriton + "/kernel.so", shared);
    a.put(kTriton + "/kernel.cubin", own);
    REQUIRE(kc(a, redis, {"push"}).exit_code == 0);
    // B already holds `shared` under another entry (a rebuilt launcher, say).
    const std::string other = "7QWZ2LX5RM4UVJ6YTH2CPA7SGEF4NOIQ5ZK6LW3XT2RYMBB0123";
    b.put(other + "/kernel.so", shared);
    REQUIRE(kc(b, redis, {"pull", kTriton}).exit_code == 0);
    const auto got = b.snapshot(kTriton);
    CHECK(got == a.snapshot(kTriton));
    // Only `own` and the manifest crossed: far less than `shared`.
    const std::uint64_t down = b.counter(core::Counter::remote_bytes_down);
    CHECK(down > 0);
    CHECK(down < shared.size() / 4);
}

TEST_CASE("a push records the containers above its entry, also for an entry already in Redis",
          "[remote]") {
    RedisServer redis;
    TestDb a;
    const std::string fx =
        "inductor/fxgraph/ch/fchx2ys3kjbgm5jbn3zpqnhu4lbfw2zrzu3kbxbi7yszgmmu5yjt";
    a.put(fx + "/pmdoqmjylzn4aq2lo5ocb5yvfvwq3jn3fvaaqkzbayjqe7pt4nrs", "graph");
    add_jax(a);
    REQUIRE(a.has_entry(fx));
    auto push = kc(a, redis, {"push"});
    INFO(push.out << push.err);
    REQUIRE(push.exit_code == 0);
    auto members = [&] {
        auto r = redis.command({"SMEMBERS", proto::containers_key("test")});
        std::set<std::string> out;
        for (const auto& e : r.elements) out.insert(e.str);
        return out;
    };
    const std::set<std::string> want = {"inductor", "inductor/fxgraph", "inductor/fxgraph/ch",
                                        "jax"};
    CHECK(members() == want);

    // Entries pushed before the set existed (an older kcache): a push again records them.
    redis.command({"DEL", proto::containers_key("test")});
    auto again = kc(a, redis, {"push"});
    REQUIRE(again.exit_code == 0);
    CHECK(again.out.find("pushed 0, already remote 2") != std::string::npos);
    CHECK(members() == want);
}

TEST_CASE(
    "a pull that misses takes the compile lease in the manifest's round trip, never over "
    "a manifest",
    "[remote]") {
    namespace remote = kcache::remote;
    RedisServer redis;
    TestDb a, b;
    add_jax(a);
    const std::string jax = "jax/" + kJaxKey;
    auto made = remote::Remote::create(kcache::test::fast_failing_options(redis));
    REQUIRE(made);
    remote::Remote& r = **made;
    const remote::Remote::LeaseAsk mine{"node-b:1", 5000}, theirs{"node-c:2", 5000};

    // A miss: the lease is this caller's now, in one pipeline with the GET.
    const auto pipelines = redis.calls("get");
    auto miss = r.pull(b.store(), jax, &mine);
    REQUIRE(miss);
    CHECK(miss->outcome == remote::Outcome::miss);
    REQUIRE(miss->lease_taken.has_value());
    CHECK(*miss->lease_taken);
    CHECK(redis.calls("get") == pipelines + 1);  // the manifest's GET, once
    CHECK(redis.command({"GET", proto::lease_key("t", jax)}).str == "node-b:1");
    // Another node's miss finds it held.
    auto other = r.pull(b.store(), jax, &theirs);
    REQUIRE(other);
    REQUIRE(other->lease_taken.has_value());
    CHECK_FALSE(*other->lease_taken);
    // Without an ask nothing is said of a lease.
    CHECK_FALSE(r.pull(b.store(), jax)->lease_taken.has_value());

    // Once the manifest is there the pull fetches it and takes no lease.
    REQUIRE(r.push(a.store(), jax)->outcome == remote::Outcome::uploaded);
    redis.command({"DEL", proto::lease_key("t", jax)});
    auto hit = r.pull(b.store(), jax, &theirs);
    REQUIRE(hit);
    CHECK(hit->outcome == remote::Outcome::pulled);
    CHECK_FALSE(hit->lease_taken.has_value());
    CHECK(redis.command({"EXISTS", proto::lease_key("t", jax)}).integer == 0);
}
