// Misses explained across nodes (docs/misses.md, "Across nodes"): node A pushes an entry,
// which records its family member in Redis; node B, which holds no entry of that family,
// classifies its miss "first", and the pass the daemon runs (remote::explain_first_misses)
// explains it from A's member. Hostile family records, a dead Redis and the cap on a
// family's members.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "families.hpp"
#include "kcache/core/misses.hpp"
#include "kcache/remote/remote.hpp"
#include "keys.hpp"
#include "redis_fixture.hpp"

using kcache::test::RedisServer;
using kcache::test::run_cli;
using kcache::test::TestDb;
namespace core = kcache::core;
namespace remote = kcache::remote;
namespace families = kcache::remote::families;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

// One clock for both nodes' dbs, moved by the test (entries settle without sleeping).
struct Now {
    std::shared_ptr<std::atomic<std::int64_t>> ns =
        std::make_shared<std::atomic<std::int64_t>>(1'800'000'000 * kSecond);
    core::Clock clock() const {
        return [p = ns] { return p->load(); };
    }
    void advance(std::int64_t by) { ns->fetch_add(by); }
};

std::string triton_name(char key) {
    return "triton/" + std::string(51, 'A') + key;
}

struct Kernel {
    std::string name = "add_kernel";
    int num_warps = 4;
    std::string ttir =
        "module {\n  tt.func @add_kernel() {\n    arith.constant 128 : i32\n  }\n}\n";
    std::string cubin = "ELF cubin for 4 warps";
};

void put_triton(TestDb& db, char key, const Kernel& k) {
    const std::string dir = triton_name(key) + "/";
    db.put(dir + k.name + ".ttir", k.ttir);
    db.put(dir + k.name + ".cubin", k.cubin);
    db.put(
        dir + k.name + ".json",
        fmt::format(R"({{"hash": "{}", "num_warps": {}, "triton_version": "3.9.0", "name": "{}"}})",
                    std::string(64, key), k.num_warps, k.name));
    db.put(dir + "__grp__" + k.name + ".json", "{}");
}

// Lets every entry settle and classifies what is pending.
void classify(TestDb& db, Now& now) {
    now.advance(2 * kSecond);
    for (int i = 0; i < 10; ++i) {
        REQUIRE(core::classify_pending(db.store()));
        auto txn = db.store().read();
        REQUIRE(txn);
        if (*core::pending_misses(*txn) == 0) return;
    }
    FAIL("misses still pending");
}

core::Miss miss_of(TestDb& db, const std::string& name) {
    auto txn = db.store().read();
    REQUIRE(txn);
    auto m = core::find_miss(*txn, name);
    REQUIRE(m);
    REQUIRE(*m);
    return **m;
}

std::unique_ptr<remote::Remote> make_remote(const RedisServer& redis) {
    auto r = remote::Remote::create(fast_failing_options(redis));
    REQUIRE(r);
    return std::move(*r);
}

std::string host_name() {
    char host[256] = {};
    REQUIRE(gethostname(host, sizeof host - 1) == 0);
    return host;
}

// Node A pushes the kernel as first compiled; its family member goes to Redis with it.
void node_a_pushes(remote::Remote& r, Now& now, RedisServer& redis) {
    TestDb a(now.clock());
    put_triton(a, 'B', Kernel{});
    auto pushed = r.push(a.store(), triton_name('B'));
    REQUIRE(pushed);
    REQUIRE(pushed->outcome == remote::Outcome::uploaded);
    CHECK(redis.command({"HLEN", families::member_key("t", "triton:add_kernel")}).integer == 1);
    CHECK(r.counts().family_errors == 0);
}

}  // namespace

TEST_CASE("misses: a miss on node B is explained by node A's entry of its family in Redis",
          "[remote][misses]") {
    RedisServer redis;
    Now now;
    auto r = make_remote(redis);
    node_a_pushes(*r, now, redis);

    TestDb b(now.clock());
    Kernel other;
    other.name = "softmax_kernel";
    put_triton(b, 'F', other);  // another kernel: stays first
    Kernel k;
    char key = 'C';
    SECTION("num_warps 4 -> 8") {
        k.num_warps = 8;
        k.cubin = "ELF cubin for 8 warps";
    }
    SECTION("a constexpr: the IR line") {
        key = 'D';
        k.ttir = "module {\n  tt.func @add_kernel() {\n    arith.constant 256 : i32\n  }\n}\n";
        k.cubin = "ELF cubin for block 256";
    }
    SECTION("the same binary: unstable key") {
        key = 'E';
    }
    put_triton(b, key, k);
    classify(b, now);
    CHECK(miss_of(b, triton_name(key)).cause == core::MissCause::first);
    CHECK(b.counter(core::Counter::misses_first) == 2);

    std::uint64_t after = 0;
    auto pass = remote::explain_first_misses(*r, b.store(), after);
    REQUIRE(pass);
    CHECK(pass->misses == 2);
    CHECK(pass->families == 2);
    CHECK(pass->explained == 1);
    CHECK(after == miss_of(b, triton_name(key)).seq);  // the newer of the two

    const auto m = miss_of(b, triton_name(key));
    CHECK(m.compared_name == triton_name('B'));
    CHECK(m.compared_host == host_name());
    CHECK(m.compared_namespace == "t");
    CHECK(miss_of(b, triton_name('F')).cause == core::MissCause::first);
    CHECK(b.counter(core::Counter::misses_first) == 1);
    if (key == 'C') {
        CHECK(m.cause == core::MissCause::changed_key);
        REQUIRE(m.fields.size() == 1);
        CHECK(m.fields[0].field == "num_warps");
        CHECK(m.fields[0].before == "4");
        CHECK(m.fields[0].after == "8");
        CHECK(b.counter(core::Counter::misses_changed_key) == 1);
        // `kcache why` on B names the node and the namespace.
        b.close();
        auto json = run_cli({"--db", b.path(), "why", triton_name(key), "--json"});
        REQUIRE(json.exit_code == 0);
        const auto doc = nlohmann::json::parse(json.out);
        CHECK(doc["compared_remote"]["host"] == host_name());
        CHECK(doc["compared_remote"]["namespace"] == "t");
        auto text = run_cli({"--db", b.path(), "why", triton_name(key)});
        REQUIRE(text.exit_code == 0);
        CHECK(text.out.find(fmt::format("is in the shared tier (pushed by {}, namespace t)",
                                        host_name())) != std::string::npos);
    } else if (key == 'D') {
        CHECK(m.cause == core::MissCause::changed_key);
        CHECK(m.fields.empty());
        REQUIRE(!m.lines.empty());
        CHECK(m.lines[0].file == "add_kernel.ttir");
        CHECK(m.lines[0].line == 3);
        CHECK(m.lines[0].after == "    arith.constant 256 : i32");
    } else {
        CHECK(m.cause == core::MissCause::unstable_key);
        CHECK(m.same_binary == "add_kernel.cubin");
        CHECK(b.counter(core::Counter::misses_unstable_key) == 1);
    }
    // A second pass asks about nothing: both were asked.
    auto again = remote::explain_first_misses(*r, b.store(), after);
    REQUIRE(again);
    CHECK(again->misses == 0);
}

TEST_CASE("misses: hostile family records in Redis are passed over", "[remote][misses]") {
    RedisServer redis;
    Now now;
    auto r = make_remote(redis);
    node_a_pushes(*r, now, redis);
    const std::string key = families::member_key("t", "triton:add_kernel");
    core::FamilyMember foreign;  // a valid member, but of another family
    foreign.family = "triton:mul_kernel";
    foreign.files.push_back({"add_kernel.cubin", core::MemberKind::binary, 21,
                             core::digest_of("ELF cubin for 4 warps"), "", false});
    const std::string good = families::encode_member(foreign);
    std::string bad_kind = good;
    bad_kind[bad_kind.size() - 4 - 8 - 8 - 8 - 2] = 9;  // the file's kind byte
    redis.command({"HSET", key, "triton/garbage", "not a member at all"});
    redis.command({"HSET", key, "triton/short", good.substr(0, good.size() - 3)});
    redis.command({"HSET", key, "triton/kind", bad_kind});
    redis.command({"HSET", key, "triton/foreign", good});
    redis.command(
        {"HSET", key, "triton/huge", "KCF1" + std::string(families::kMaxValueBytes, 'x')});
    // Another family's key holds no hash at all.
    redis.command({"SET", families::member_key("t", "triton:softmax_kernel"), "a string"});

    TestDb b(now.clock());
    Kernel k;
    k.num_warps = 8;
    k.cubin = "8";
    put_triton(b, 'C', k);
    Kernel other;
    other.name = "softmax_kernel";
    put_triton(b, 'F', other);
    classify(b, now);
    const auto corrupt_before = r->counts().corrupt;
    std::uint64_t after = 0;
    auto pass = remote::explain_first_misses(*r, b.store(), after);
    REQUIRE(pass);
    CHECK(pass->explained == 1);
    CHECK(r->counts().corrupt - corrupt_before == 6);
    const auto m = miss_of(b, triton_name('C'));
    CHECK(m.cause == core::MissCause::changed_key);
    CHECK(m.compared_name == triton_name('B'));
    CHECK(miss_of(b, triton_name('F')).cause == core::MissCause::first);
}

TEST_CASE("misses: with Redis dead the miss stays first and the classifier goes on",
          "[remote][misses]") {
    RedisServer redis;
    Now now;
    auto r = make_remote(redis);
    node_a_pushes(*r, now, redis);
    TestDb b(now.clock());
    Kernel k;
    k.num_warps = 8;
    k.cubin = "8";
    put_triton(b, 'C', k);
    classify(b, now);
    redis.signal(SIGKILL);
    std::uint64_t after = 0;
    auto pass = remote::explain_first_misses(*r, b.store(), after);
    CHECK(!pass);
    CHECK(after == 0);
    CHECK(r->counts().family_errors == 1);
    CHECK(miss_of(b, triton_name('C')).cause == core::MissCause::first);
    CHECK(b.counter(core::Counter::misses_first) == 1);
    // The local classifier goes on: another entry is classified as ever.
    Kernel again = k;
    again.cubin = "again";
    put_triton(b, 'D', again);
    classify(b, now);
    CHECK(miss_of(b, triton_name('D')).cause == core::MissCause::changed_key);
    CHECK(miss_of(b, triton_name('D')).compared_name == triton_name('C'));
}

TEST_CASE("misses: a family keeps its newest 32 members for 30 days", "[remote][misses]") {
    RedisServer redis;
    auto r = make_remote(redis);
    core::FamilyMember m;
    m.family = "triton:add_kernel";
    m.host = "node";
    m.files.push_back(
        {"add_kernel.json", core::MemberKind::metadata, 2, core::digest_of("{}"), "{}", true});
    for (int i = 0; i < 40; ++i) {
        m.entry = fmt::format("triton/K{:02}", i);
        m.time_ns = (1'800'000'000 + i) * kSecond;
        REQUIRE(r->record_family_member(m));
    }
    const std::string key = families::member_key("t", m.family);
    const std::string order = families::order_key("t", m.family);
    CHECK(redis.command({"HLEN", key}).integer == 32);
    CHECK(redis.command({"ZCARD", order}).integer == 32);
    CHECK(redis.command({"HEXISTS", key, "triton/K07"}).integer == 0);
    CHECK(redis.command({"HEXISTS", key, "triton/K08"}).integer == 1);
    CHECK(redis.command({"HEXISTS", key, "triton/K39"}).integer == 1);
    for (const auto& k : {key, order}) {
        const auto ttl = redis.command({"TTL", k}).integer;
        CHECK(ttl > 29 * 24 * 3600);
        CHECK(ttl <= families::kTtlSeconds);
    }
    auto got = r->family_members({m.family, "triton:none"});
    REQUIRE(got);
    REQUIRE(got->size() == 2);
    CHECK((*got)[0].size() == 32);
    CHECK((*got)[1].empty());
    CHECK((*got)[0][0].family == m.family);
    CHECK((*got)[0][0].files.size() == 1);
    CHECK((*got)[0][0].files[0].text == "{}");
}

TEST_CASE("misses: a family member's value decodes to what was encoded, and only that",
          "[remote][misses]") {
    core::FamilyMember m;
    m.entry = "triton/K";
    m.family = "triton:add_kernel";
    m.host = "node-a";
    m.time_ns = 42;
    m.files.push_back({"add_kernel.json", core::MemberKind::metadata, 8,
                       core::digest_of("{\"a\": 1}"), "{\"a\": 1}", true});
    m.files.push_back(
        {"add_kernel.ttir", core::MemberKind::text, 5000, core::Digest{1, 2}, "line 1\n", false});
    const std::string v = families::encode_member(m);
    auto back = families::decode_member(m.entry, v);
    REQUIRE(back);
    CHECK(back->family == m.family);
    CHECK(back->host == m.host);
    CHECK(back->time_ns == 42);
    REQUIRE(back->files.size() == 2);
    CHECK(back->files[1].text == "line 1\n");
    CHECK(!back->files[1].whole);
    CHECK(back->files[1].digest == (core::Digest{1, 2}));
    for (std::size_t cut = 0; cut < v.size(); ++cut) {
        auto r = families::decode_member(m.entry, v.substr(0, cut));
        REQUIRE(!r);
        CHECK(r.error().code == EBADMSG);
    }
    CHECK(!families::decode_member(m.entry, v + "x"));
    CHECK(!families::decode_member("", v));
    auto lying = m;  // a text said to be whole but shorter than its size
    lying.files[1].whole = true;
    CHECK(!families::decode_member(m.entry, families::encode_member(lying)));
    auto binary_text = m;
    binary_text.files[1].kind = core::MemberKind::binary;
    CHECK(!families::decode_member(m.entry, families::encode_member(binary_text)));
}

TEST_CASE(
    "misses: a family member has a magic of its own, and members older nodes wrote still "
    "decode",
    "[remote][misses]") {
    core::FamilyMember m;
    m.entry = "triton/K";
    m.family = "triton:add_kernel";
    m.host = "node-a";
    m.files.push_back(
        {"add_kernel.json", core::MemberKind::metadata, 2, core::digest_of("{}"), "{}", true});
    const std::string v = families::encode_member(m);
    CHECK(v.starts_with(kcache::remote::keys::kFamilyMemberMagic));
    CHECK(!v.starts_with(kcache::remote::keys::kFrameMagic));  // a frame's magic names a frame
    // Before issue 34 a member began with the frame's magic: such values are still read.
    const std::string old =
        std::string(kcache::remote::keys::kLegacyFamilyMemberMagic) + v.substr(4);
    auto back = families::decode_member(m.entry, old);
    REQUIRE(back);
    CHECK(back->family == m.family);
    CHECK(back->files.size() == 1);
    CHECK(!families::decode_member(m.entry, "KCM1" + v.substr(4)));  // any other magic: refused
}
