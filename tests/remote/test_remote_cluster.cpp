// The shared tier on a Redis Cluster: key slots and hash tags, the parsers of CLUSTER
// SLOTS and MOVED / ASK, and a real local cluster (3 masters, 3 replicas, started here):
// `kcache remote push/pull` through one seed, ASK and MOVED followed while a slot
// migrates, a master killed mid-run (misses within the deadlines, never wrong bytes,
// all back once its replica is promoted), and two kcache-fsd mounts sharing through the
// cluster while a master dies (local hits never wait). Skipped without redis-server.

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <fmt/core.h>
#include <catch2/catch.hpp>

#include "cluster.hpp"
#include "cluster_fixture.hpp"
#include "kcache/remote/remote.hpp"
#include "kcache/remote/settings.hpp"
#include "mount_fixture.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::RedisCluster;
using kcache::test::run_cli;
using kcache::test::TestDb;
namespace core = kcache::core;
namespace cluster = kcache::remote::cluster;
namespace proto = kcache::remote::proto;
namespace remote = kcache::remote;
namespace test = kcache::test;

TEST_CASE("cluster key slots: CRC16 of the hash tag, as Redis computes them", "[remote]") {
    // Redis's own examples (cluster spec) and CLUSTER KEYSLOT answers.
    CHECK(cluster::key_slot("123456789") == 0x31C3 % 16384);
    CHECK(cluster::key_slot("foo") == 12182);
    CHECK(cluster::key_slot("{user1000}.following") == cluster::key_slot("{user1000}.followers"));
    CHECK(cluster::key_slot("{user1000}.following") == cluster::key_slot("user1000"));
    CHECK(cluster::hash_tag("foo{}{bar}") == "foo{}{bar}");  // an empty tag: the whole key
    CHECK(cluster::hash_tag("foo{{bar}}zap") == "{bar");
    CHECK(cluster::hash_tag("foo{bar}{zap}") == "bar");
    CHECK(cluster::hash_tag("no tag") == "no tag");
    CHECK(cluster::hash_tag("open{only") == "open{only");
}

TEST_CASE("cluster-ready keys: an entry's manifest and lease share a slot, namespaces spread",
          "[remote]") {
    const std::string entry = "triton/JYS2XUOUG4VYYBXBZYN7QL4E6AX3B7AXEAKLO5N3NS5ZC6WRD4GQ";
    CHECK(cluster::key_slot(proto::manifest_key("ns", entry)) ==
          cluster::key_slot(proto::lease_key("ns", entry)));
    // A brace in a name cannot break the tag: it is a digest of the name.
    const std::string odd = "weird/{x}}{";
    CHECK(cluster::key_slot(proto::manifest_key("ns", odd)) ==
          cluster::key_slot(proto::lease_key("ns", odd)));
    const core::Digest d = core::digest_of("blob");
    CHECK(cluster::key_slot(proto::blob_key("ns", d)) ==
          cluster::key_slot(proto::chunk_key("ns", d, 7)));
    CHECK(cluster::hash_tag(proto::blob_key("ns", d)) == d.hex());  // no namespace, no entry
    // One namespace's entries and blobs spread over the slots: no tag spans a namespace.
    std::set<std::uint16_t> manifests, blobs;
    for (int i = 0; i < 200; ++i) {
        manifests.insert(cluster::key_slot(proto::manifest_key("ns", fmt::format("e{}", i))));
        blobs.insert(cluster::key_slot(proto::blob_key("ns", core::digest_of(std::to_string(i)))));
    }
    CHECK(manifests.size() > 190);
    CHECK(blobs.size() > 190);
}

TEST_CASE("cluster replies: CLUSTER SLOTS and MOVED / ASK parsed, malformed ones refused",
          "[remote]") {
    auto replies = remote::parse_replies(
        "*2\r\n"
        "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"
        "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$2\r\nr1\r\n"
        "*3\r\n:5461\r\n:16383\r\n*2\r\n$0\r\n\r\n:7001\r\n");
    REQUIRE(replies);
    REQUIRE(replies->size() == 1);
    auto ranges = cluster::parse_slots(replies->front(), "10.0.0.9");
    REQUIRE(ranges);
    REQUIRE(ranges->size() == 2);
    CHECK((*ranges)[0].first == 0);
    CHECK((*ranges)[0].last == 5460);
    CHECK((*ranges)[0].host == "127.0.0.1");
    CHECK((*ranges)[0].port == 7000);
    CHECK((*ranges)[1].host == "10.0.0.9");  // empty: the node asked
    CHECK((*ranges)[1].port == 7001);

    for (const char* bad : {"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",  // slot range
                            "*1\r\n*3\r\n:9\r\n:3\r\n*2\r\n$1\r\nh\r\n:1\r\n",      // reversed
                            "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\nh\r\n:0\r\n",      // port 0
                            "*1\r\n*2\r\n:0\r\n:3\r\n",                             // no master
                            ":5\r\n", "-ERR This instance has cluster support disabled\r\n"}) {
        auto r = remote::parse_replies(bad);
        REQUIRE(r);
        REQUIRE(r->size() == 1);
        auto parsed = cluster::parse_slots(r->front(), "h");
        INFO(bad);
        CHECK_FALSE(parsed);
        CHECK(parsed.error().code == EBADMSG);
    }

    auto moved = cluster::parse_redirect("MOVED 3999 127.0.0.1:6381", "x");
    REQUIRE(moved);
    CHECK_FALSE(moved->ask);
    CHECK(moved->slot == 3999);
    CHECK(moved->host == "127.0.0.1");
    CHECK(moved->port == 6381);
    auto ask = cluster::parse_redirect("ASK 12 ::1:7002", "x");
    REQUIRE(ask);
    CHECK(ask->ask);
    CHECK(ask->host == "::1");
    auto same = cluster::parse_redirect("MOVED 12 :7002", "10.1.1.1");
    REQUIRE(same);
    CHECK(same->host == "10.1.1.1");
    for (const char* bad : {"MOVED", "MOVED 16384 h:1", "MOVED x h:1", "ASK 1 h", "ASK 1 h:0",
                            "ASK 1 h:70000", "MOVED 1 ?:5", "ERR wrong", "MOVED -1 h:1"}) {
        INFO(bad);
        CHECK_FALSE(cluster::parse_redirect(bad, "x"));
    }
}

TEST_CASE("redis-cluster:// URLs: seeds, one user, db 0 only, never mixed with plain servers",
          "[remote]") {
    auto seeds = remote::parse_cluster_url("redis-cluster://ci@10.0.0.1:7000,10.0.0.2:7001");
    REQUIRE(seeds);
    REQUIRE(seeds->size() == 2);
    CHECK((*seeds)[0].host == "10.0.0.1");
    CHECK((*seeds)[1].port == 7001);
    CHECK((*seeds)[1].user == "ci");
    CHECK_FALSE(remote::parse_cluster_url("redis-cluster://h:1/2"));
    CHECK_FALSE(remote::parse_cluster_url("redis-cluster://h:1,,h:2"));
    CHECK_FALSE(remote::parse_cluster_url("redis-cluster://"));
    const auto pw = remote::parse_cluster_url("redis-cluster://u:secret@h:1");
    REQUIRE_FALSE(pw);
    CHECK(pw.error().message.find("secret") == std::string::npos);

    remote::Settings s;
    s.urls = {"redis-cluster://127.0.0.1:7000", "redis-cluster://127.0.0.1:7001"};
    auto options = remote::resolve(s);
    REQUIRE(options);
    CHECK(options->cluster);
    CHECK(options->servers.size() == 2);
    s.urls = {"redis-cluster://127.0.0.1:7000", "redis://127.0.0.1:6379"};
    auto mixed = remote::resolve(s);
    REQUIRE_FALSE(mixed);
    CHECK(mixed.error().message.find("mixed") != std::string::npos);
}

namespace {

const std::vector<std::string> kEntries = [] {
    std::vector<std::string> names;
    for (int i = 0; i < 24; ++i) names.push_back(fmt::format("E{:02}-4FD1E3QZ7KXAB2MC5N6P", i));
    return names;
}();

// Entries with a small (inlined) file, a blob of their own, a blob they share, and one
// of several chunks.
void fill(TestDb& db) {
    const std::string shared = test::random_bytes(std::size_t{20'000}, std::uint64_t{99});
    for (std::size_t i = 0; i < kEntries.size(); ++i) {
        const std::string& e = kEntries[i];
        db.put(e + "/kernel.json", fmt::format("{{\"n\": {}}}", i));
        db.put(e + "/kernel.cubin", test::random_bytes(std::size_t{30'000} + i, std::uint64_t{i}));
        db.put(e + "/libdevice.bc", shared);
    }
    db.put(kEntries[0] + "/big.so",
           test::random_bytes(2 * proto::kChunkBytes + 5, std::uint64_t{7}));
}

std::vector<std::string> cli_args(TestDb& db, const RedisCluster& c,
                                  std::vector<std::string> tail) {
    db.close();
    std::vector<std::string> a = {"--db",   db.path(),
                                  "remote", "--remote",
                                  c.url(),  "--remote-namespace",
                                  "ct",     "--remote-timeout",
                                  "500ms",  "--remote-connect-timeout",
                                  "500ms"};
    a.insert(a.end(), tail.begin(), tail.end());
    return a;
}

remote::Options options(const RedisCluster& c) {
    remote::Options o;
    o.servers = *remote::parse_cluster_url(c.url());
    o.cluster = true;
    o.ns = "ct";
    o.op_timeout_ns = 500'000'000;
    o.connect_timeout_ns = 500'000'000;
    o.breaker_cooldown_ns = 200'000'000;
    return o;
}

// Every entry of `got` is byte-exact as in `want` (those it has); how many it has.
std::size_t same_entries(TestDb& want, TestDb& got) {
    std::size_t n = 0;
    for (const std::string& e : kEntries) {
        if (!got.has_entry(e)) continue;
        INFO(e);
        REQUIRE(got.snapshot(e) == want.snapshot(e));
        ++n;
    }
    return n;
}

}  // namespace

TEST_CASE("cluster: kcache remote push and pull through one seed, keys spread over the masters",
          "[remote][cluster]") {
    RedisCluster c;
    TestDb a, b;
    fill(a);
    auto push = run_cli(cli_args(a, c, {"push", "--job-tag", "job-c"}));
    INFO(push.out << push.err);
    REQUIRE(push.exit_code == 0);
    CHECK(push.out.find(fmt::format("pushed {}", kEntries.size())) != std::string::npos);

    // Every master holds some of them: nothing sits on one node.
    const auto masters = c.masters();
    REQUIRE(masters.size() == 3);
    for (const std::uint16_t m : masters) {
        INFO("master " << m);
        CHECK(c.command(m, {"DBSIZE"}).integer > 0);
    }
    // A manifest and its lease's key live where CLUSTER KEYSLOT says, on one master.
    const std::string mkey = proto::manifest_key("ct", kEntries[3]);
    CHECK(c.command(masters[0], {"CLUSTER", "KEYSLOT", mkey}).integer == cluster::key_slot(mkey));
    CHECK(c.command(c.master_of(mkey), {"EXISTS", mkey}).integer == 1);

    auto pull = run_cli(cli_args(b, c, {"pull", "--job-tag", "job-c"}));
    INFO(pull.out << pull.err);
    REQUIRE(pull.exit_code == 0);
    CHECK(same_entries(a, b) == kEntries.size());

    // `kcache remote stats` pings every master, and names each.
    auto stats = run_cli(cli_args(b, c, {"stats"}));
    INFO(stats.out << stats.err);
    CHECK(stats.exit_code == 0);
    for (const std::uint16_t m : masters)
        CHECK(stats.out.find(fmt::format("127.0.0.1:{}/0: reachable", m)) != std::string::npos);
}

TEST_CASE("cluster: ASK and MOVED are followed while a slot migrates to another master",
          "[remote][cluster]") {
    RedisCluster c;
    TestDb a;
    fill(a);
    REQUIRE(run_cli(cli_args(a, c, {"push"})).exit_code == 0);
    a.close();

    // The slot of one entry's manifest moves from its master to another: first half
    // way (the manifest already on the target: the source answers ASK), then for good
    // (MOVED), while a Remote keeps the slot map it read before.
    const std::string entry = kEntries[5];
    const std::string mkey = proto::manifest_key("ct", entry);
    const auto slot = std::to_string(cluster::key_slot(mkey));
    const std::uint16_t from = c.master_of(mkey);
    std::uint16_t to = 0;
    for (const std::uint16_t m : c.masters()) {
        if (m != from) to = m;
    }
    const std::string from_id = c.command(from, {"CLUSTER", "MYID"}).str;
    const std::string to_id = c.command(to, {"CLUSTER", "MYID"}).str;

    auto r = remote::Remote::create(options(c));
    REQUIRE(r);
    remote::Remote& rem = **r;
    REQUIRE(rem.ping() == std::vector<std::string>(3));  // reads the map: 3 masters

    REQUIRE(c.command(to, {"CLUSTER", "SETSLOT", slot, "IMPORTING", from_id}).is_ok());
    REQUIRE(c.command(from, {"CLUSTER", "SETSLOT", slot, "MIGRATING", to_id}).is_ok());
    const auto migrated = c.command(
        from, {"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000", "KEYS", mkey});
    INFO(migrated.str);
    REQUIRE(migrated.is_ok());
    const std::uint64_t asking = [&] {
        const std::string info = c.command(to, {"INFO", "commandstats"}).str;
        const auto at = info.find("cmdstat_asking:calls=");
        return at == std::string::npos ? 0 : std::stoull(info.substr(at + 21));
    }();
    {
        TestDb b;
        const auto got = rem.pull(b.store(), entry);
        INFO((got ? std::string() : got.error().message));
        REQUIRE(got);
        CHECK(got->outcome == remote::Outcome::pulled);
        REQUIRE(b.snapshot(entry) == a.snapshot(entry));
    }
    const std::string info = c.command(to, {"INFO", "commandstats"}).str;
    const auto at = info.find("cmdstat_asking:calls=");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoull(info.substr(at + 21)) > asking);

    // The slot is the target's now: the source answers MOVED; the map the Remote holds
    // is stale until it follows that.
    REQUIRE(c.command(to, {"CLUSTER", "SETSLOT", slot, "NODE", to_id}).is_ok());
    REQUIRE(c.command(from, {"CLUSTER", "SETSLOT", slot, "NODE", to_id}).is_ok());
    c.wait_stable();
    {
        TestDb b;
        const auto got = rem.pull(b.store(), entry);
        INFO((got ? std::string() : got.error().message));
        REQUIRE(got);
        CHECK(got->outcome == remote::Outcome::pulled);
        REQUIRE(b.snapshot(entry) == a.snapshot(entry));
    }
    CHECK(rem.counts().errors == 0);
}

TEST_CASE("cluster: a master killed mid-run costs misses within the deadlines, never wrong bytes",
          "[remote][cluster]") {
    RedisCluster c;
    TestDb a;
    fill(a);
    REQUIRE(run_cli(cli_args(a, c, {"push"})).exit_code == 0);
    a.close();
    c.wait_replicated();  // every write reached its master's replica before a master dies

    auto r = remote::Remote::create(options(c));
    REQUIRE(r);
    remote::Remote& rem = **r;
    // Pulls of every entry, pass after pass into fresh dbs, while a master is killed:
    // each pass ends (a hang guard, not a timing check), every entry it writes is
    // byte-exact, and once the replica is promoted a pass gets them all again.
    const std::uint16_t victim = c.master_of(proto::manifest_key("ct", kEntries[0]));
    const pid_t victim_pid = c.pid(victim);
    std::atomic<bool> killed{false};
    bool settled = false;
    std::size_t passes_after_kill = 0, complete_after_settle = 0, partial = 0;
    std::thread killer([&] {  // no Catch2 assertion here: they are not thread-safe
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(victim_pid, SIGKILL);
        killed = true;
    });
    const auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (complete_after_settle < 2 && std::chrono::steady_clock::now() < guard) {
        const bool was_settled = settled;
        TestDb b;
        const auto begin = std::chrono::steady_clock::now();
        const remote::PullSummary s = rem.pull_entries(b.store(), kEntries);
        // Hang guard: every node costs at most a connect and an operation deadline per
        // pipeline, and open breakers cost nothing.
        CHECK(std::chrono::steady_clock::now() - begin < std::chrono::seconds(20));
        CHECK(s.pulled + s.missing + s.failed == kEntries.size());
        CHECK(same_entries(a, b) == s.pulled);
        if (killed) ++passes_after_kill;
        if (s.pulled < kEntries.size()) ++partial;
        if (was_settled && s.pulled == kEntries.size()) ++complete_after_settle;
        if (killed && !settled) {
            killer.join();
            c.kill(victim);   // reaps it
            c.wait_stable();  // its replica is promoted
            settled = true;
        }
    }
    if (killer.joinable()) killer.join();
    CHECK(passes_after_kill > 0);
    CHECK(complete_after_settle == 2);
    CHECK(rem.counts().corrupt == 0);
    INFO("passes with misses: " << partial);
}

namespace {

const std::string kKey1 = "JYS2XUOUG4VYYBXBZYN7QL4E6AX3B7AXEAKLO5N3NS5ZC6WRD4GQ";
const std::string kKey2 = "Q7LZ3WJ5UE2RS4VN6KXA3MBY7DHC2PGTF5OIQ4ZL6NW3RT2XYKAA";
const std::string kKey3 = "B3NDK7QWZ2LX5RM4UVJ6YTH2CPA7SGEF4NOIQ5ZK6LW3XT2RYMBB";
const std::string kKey4 = "C4PEL8RXA3MY6SN5VWK7ZUI3DQB8THFG5OPJR6AL7MX4YU3SZNCC";

std::map<std::string, std::string> triton_files(std::uint64_t seed) {
    return {
        {"add_kernel.cubin", test::random_bytes(std::size_t{200'000}, std::uint64_t{seed})},
        {"add_kernel.json", "{\"seed\": " + std::to_string(seed) + "}"},
    };
}

void store(const test::MountedCache& m, const std::string& key,
           const std::map<std::string, std::string>& files) {
    REQUIRE_SYS(::mkdir(m.p(key).c_str(), 0755));
    for (const auto& [name, content] : files)
        REQUIRE(test::write_all(m.p(key + "/" + name), content) == 0);
}

void require_same(const test::MountedCache& m, const std::string& key,
                  const std::map<std::string, std::string>& files) {
    for (const auto& [name, content] : files) {
        INFO(m.p(key + "/" + name));
        const auto got = test::read_all(m.p(key + "/" + name));
        REQUIRE(got.has_value());
        REQUIRE(*got == content);
    }
}

std::uint64_t stat_of(const test::MountedCache& m, const std::string& name) {
    return test::stat_value(test::cache_stats(m.db()), name);
}

}  // namespace

TEST_CASE("cluster: two kcache-fsd mounts share through a cluster while a master dies",
          "[remote][fsd][cluster]") {
    RedisCluster c;
    test::DaemonOptions o;
    o.args = {"--remote",         c.url(), "--remote-namespace",       "fsd",
              "--remote-timeout", "500ms", "--remote-connect-timeout", "500ms"};
    test::MountedCache a(o), b(o);
    const auto files1 = triton_files(1), files2 = triton_files(2);
    store(a, kKey1, files1);
    {
        INFO(a.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(a, "remote_uploads") >= 1; }, 30));
    }
    require_same(b, kKey1, files1);  // read through: now local to B
    c.wait_replicated();

    // The master of kKey1's manifest dies; B's local hit is served as before, and a
    // miss is answered (ENOENT) by the deadlines: no lookup is stuck.
    c.kill(c.master_of(proto::manifest_key("fsd", kKey1)));
    require_same(b, kKey1, files1);
    for (const std::string& key : {kKey2, kKey3}) {
        const auto begin = std::chrono::steady_clock::now();
        REQUIRE_FAILS_WITH(::access(b.p(key).c_str(), F_OK), ENOENT);
        CHECK(std::chrono::steady_clock::now() - begin < std::chrono::seconds(20));  // hang guard
    }

    // Once the replica is promoted, sharing works again, byte-exact (a name B never
    // asked for: B may hold the compile leases of those it missed, as a node that
    // compiles them would).
    c.wait_stable();
    store(a, kKey4, files2);
    {
        INFO(a.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(a, "remote_uploads") >= 2; }, 40));
    }
    require_same(b, kKey4, files2);
    require_same(b, kKey1, files1);
    CHECK(stat_of(b, "remote_corrupt") == 0);
}
