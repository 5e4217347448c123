// A dead Redis (SIGKILL), a frozen one (SIGSTOP: a black hole), corrupt and missing
// blobs, hostile manifests: every one is a clear error or a counted miss, fails within
// its deadline, and leaves nothing bad in the local db.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>

#include <fmt/core.h>
#include <catch2/catch.hpp>

#include "entry_names.hpp"
#include "kcache/core/bundle.hpp"
#include "kcache/core/entry_image.hpp"
#include "kcache/remote/remote.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::kEntryA;
using kcache::test::kEntryB;
using kcache::test::RedisServer;
using kcache::test::run_cli;
using kcache::test::TestDb;
namespace core = kcache::core;
namespace proto = kcache::remote::proto;
namespace remote = kcache::remote;

namespace {

std::vector<std::string> args(TestDb& db, const RedisServer& redis, std::vector<std::string> tail) {
    db.close();
    std::vector<std::string> a = {"--db",      db.path(),
                                  "remote",    "--remote",
                                  redis.url(), "--remote-namespace",
                                  "t",         "--remote-timeout",
                                  "300ms",     "--remote-connect-timeout",
                                  "300ms"};
    a.insert(a.end(), tail.begin(), tail.end());
    return a;
}

void fill(TestDb& db) {
    db.put(kEntryA + "/kernel.cubin", kcache::test::random_bytes(3 * proto::kChunkBytes + 7, 1));
    db.put(kEntryA + "/kernel.json", "{}");
    db.put(kEntryB + "/kernel.cubin", kcache::test::random_bytes(40'000, 2));
}

}  // namespace

TEST_CASE("a frozen Redis (SIGSTOP) fails commands within their deadline and SIGCONT recovers",
          "[remote]") {
    RedisServer redis;
    TestDb a, b;
    fill(a);
    REQUIRE(run_cli(args(a, redis, {"push"})).exit_code == 0);
    const auto a_before = a.snapshot(kEntryA);

    redis.signal(SIGSTOP);
    // The kernel still accepts the connection: only kcache's own deadline ends the wait.
    auto pull = run_cli(args(b, redis, {"pull", kEntryA, kEntryB}));
    INFO(pull.out << pull.err);
    CHECK(!pull.timed_out);
    CHECK(pull.exit_code == 1);
    // Both manifests were asked for in one pipeline (a batch): one deadline fails both.
    CHECK(pull.err.find(kEntryA + ": redis") != std::string::npos);
    CHECK(pull.err.find(kEntryB + ": redis") != std::string::npos);
    CHECK(pull.err.find("deadline") != pull.err.rfind("deadline"));
    CHECK(b.entries() == 0);
    CHECK(b.counter(core::Counter::remote_timeouts) ==
          1);  // one round trip, told apart from errors
    CHECK(b.counter(core::Counter::remote_errors) == 0);

    auto push = run_cli(args(a, redis, {"push"}));
    CHECK(!push.timed_out);
    CHECK(push.exit_code == 1);
    CHECK(a.snapshot(kEntryA) == a_before);
    CHECK(a.counter(core::Counter::remote_timeouts) >= 1);

    redis.signal(SIGCONT);
    auto again = run_cli(args(b, redis, {"pull", kEntryA, kEntryB}));
    INFO(again.out << again.err);
    CHECK(again.exit_code == 0);
    CHECK(b.snapshot(kEntryA) == a_before);
}

TEST_CASE("a killed Redis (SIGKILL) is a clear error and nothing local is lost", "[remote]") {
    RedisServer redis;
    TestDb a, b;
    fill(a);
    REQUIRE(run_cli(args(a, redis, {"push"})).exit_code == 0);
    const auto a_before = a.snapshot(kEntryA);
    redis.signal(SIGKILL);
    auto pull = run_cli(args(b, redis, {"pull", kEntryA}));
    INFO(pull.err);
    CHECK(pull.exit_code == 1);
    CHECK(pull.err.find("redis unix:") != std::string::npos);
    CHECK(pull.err.find("connect") != std::string::npos);
    CHECK(b.entries() == 0);
    CHECK(b.counter(core::Counter::remote_errors) >= 1);
    auto push = run_cli(args(a, redis, {"push"}));
    CHECK(push.exit_code == 1);
    CHECK(a.snapshot(kEntryA) == a_before);
}

TEST_CASE("Redis frozen or killed under a live connection: timeout, open circuit, recovery",
          "[remote]") {
    RedisServer redis;
    TestDb a, b;
    fill(a);
    auto r = remote::Remote::create(fast_failing_options(redis));
    REQUIRE(r);
    REQUIRE((*r)->push(a.store(), kEntryA)->outcome == remote::Outcome::uploaded);
    REQUIRE((*r)->push(a.store(), kEntryB)->outcome == remote::Outcome::uploaded);

    redis.signal(
        SIGSTOP);  // the connection is open and idle: the next request falls into a black hole
    auto frozen = (*r)->pull(b.store(), kEntryA);
    REQUIRE(!frozen);
    CHECK(frozen.error().code == ETIMEDOUT);
    CHECK((*r)->counts().timeouts == 1);
    CHECK((*r)->servers().front().breaker == "open");
    auto refused = (*r)->pull(b.store(), kEntryB);  // no wait at all while the circuit is open
    REQUIRE(!refused);
    CHECK(refused.error().code == EAGAIN);
    CHECK(b.entries() == 0);

    redis.signal(SIGCONT);
    bool recovered = false;
    for (int i = 0; i < 200 && !recovered; ++i) {  // the cool-down ends; a trial closes the circuit
        auto p = (*r)->pull(b.store(), kEntryA);
        recovered = p && p->outcome == remote::Outcome::pulled;
        if (!recovered) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(recovered);
    CHECK((*r)->servers().front().breaker == "closed");
    CHECK(b.snapshot(kEntryA) == a.snapshot(kEntryA));

    redis.signal(SIGKILL);
    auto dead = (*r)->pull(b.store(), kEntryB);
    REQUIRE(!dead);
    CHECK(dead.error().code != ETIMEDOUT);  // an I/O error, told apart from a timeout
    CHECK(!b.has_entry(kEntryB));
}

TEST_CASE("a flipped byte and a deleted blob in Redis are detected and nothing bad is stored",
          "[remote]") {
    RedisServer redis;
    TestDb a, b;
    fill(a);
    REQUIRE(run_cli(args(a, redis, {"push"})).exit_code == 0);
    const std::string cubin = a.snapshot(kEntryA).at("kernel.cubin");
    const core::Digest big = core::digest_of(cubin.substr(cubin.find(' ', 2) + 1));
    REQUIRE(redis.command({"EXISTS", proto::blob_key("t", big)}).integer == 1);

    // One byte of the second chunk flipped (random bytes are stored raw).
    const std::string chunk1 = proto::chunk_key("t", big, 1);
    std::string value = redis.command({"GET", chunk1}).str;
    REQUIRE(value.size() > 1000);
    value[1000] = static_cast<char>(value[1000] ^ 1);
    REQUIRE(redis.command({"SET", chunk1, value}).is_ok());

    auto pull = run_cli(args(b, redis, {"pull", kEntryA}));
    INFO(pull.out << pull.err);
    CHECK(pull.exit_code == 1);
    CHECK(pull.out.find("corrupt") != std::string::npos);
    CHECK(!b.has_entry(kEntryA));
    CHECK(b.counter(core::Counter::remote_corrupt) == 1);
    // The corrupt blob was dropped from Redis: its manifest is now dangling, a counted
    // miss that drops the manifest, and A's next push uploads the entry whole again.
    CHECK(redis.command({"EXISTS", proto::blob_key("t", big)}).integer == 0);
    auto dangling = run_cli(args(b, redis, {"pull", kEntryA}));
    CHECK(dangling.exit_code == 1);
    CHECK(dangling.out.find("dangling") != std::string::npos);
    CHECK(b.counter(core::Counter::remote_dangling) == 1);
    CHECK(!b.has_entry(kEntryA));
    REQUIRE(run_cli(args(a, redis, {"push", kEntryA})).exit_code == 0);
    REQUIRE(run_cli(args(b, redis, {"pull", kEntryA})).exit_code == 0);
    CHECK(b.snapshot(kEntryA) == a.snapshot(kEntryA));

    // A deleted blob: a dangling manifest, a miss; nothing stored.
    const std::string small = a.snapshot(kEntryB).at("kernel.cubin");
    const core::Digest d = core::digest_of(small.substr(small.find(' ', 2) + 1));
    REQUIRE(redis.command({"DEL", proto::chunk_key("t", d, 0)}).integer == 1);
    auto gone = run_cli(args(b, redis, {"pull", kEntryB}));
    CHECK(gone.exit_code == 1);
    CHECK(gone.out.find("dangling") != std::string::npos);
    CHECK(!b.has_entry(kEntryB));
    CHECK(b.counter(core::Counter::remote_dangling) == 2);
    CHECK(b.counter(core::Counter::remote_misses) >= 2);

    // A flipped byte in a manifest: corrupt, dropped.
    const std::string mkey = proto::manifest_key("t", kEntryA);
    std::string m = redis.command({"GET", mkey}).str;
    m[m.size() / 2] = static_cast<char>(m[m.size() / 2] ^ 0x40);
    REQUIRE(redis.command({"SET", mkey, m}).is_ok());
    TestDb c;
    auto bad = run_cli(args(c, redis, {"pull", kEntryA}));
    CHECK(bad.exit_code == 1);
    CHECK(bad.out.find("corrupt") != std::string::npos);
    CHECK(c.entries() == 0);
}

TEST_CASE(
    "a job pulled in batches drops just the entries whose blob is corrupt or gone, counted, and "
    "reports every entry in order",
    "[remote]") {
    RedisServer redis;
    TestDb a, b;
    // More than two batches (Remote::kPullBatch), with the faults in different ones.
    constexpr std::size_t kEntries = 2 * remote::Remote::kPullBatch + 22;
    std::vector<std::string> names;
    std::vector<std::string> blobs;
    for (std::size_t i = 0; i < kEntries; ++i) {
        names.push_back(fmt::format("{:024X}", 0xABCDEF000000 + i * 7919));
        blobs.push_back(kcache::test::random_bytes(20'000, static_cast<std::uint32_t>(100 + i)));
        a.put(names[i] + "/kernel.cubin", blobs[i]);
        a.put(names[i] + "/kernel.json", "{\"i\": " + std::to_string(i) + "}");
    }
    // Two entries share one blob, which goes: both are dangling.
    const std::size_t shared1 = kEntries - 3, shared2 = kEntries - 2;
    blobs[shared2] = blobs[shared1];
    a.put(names[shared2] + "/kernel.cubin", blobs[shared2]);
    REQUIRE(run_cli(args(a, redis, {"push", "--job-tag", "j"})).exit_code == 0);
    std::sort(names.begin(), names.end());  // the order a job's entries are pulled in
    auto index_of = [&](std::size_t i) { return names[i]; };

    const std::size_t corrupt = 5, gone = remote::Remote::kPullBatch + 7, no_manifest = 40;
    auto digest_of_entry = [&](const std::string& name) {
        const std::string cubin = a.snapshot(name).at("kernel.cubin");
        return core::digest_of(cubin.substr(cubin.find(' ', 2) + 1));
    };
    {
        const std::string chunk = proto::chunk_key("t", digest_of_entry(index_of(corrupt)), 0);
        std::string value = redis.command({"GET", chunk}).str;
        REQUIRE(value.size() > 1000);
        value[1000] = static_cast<char>(value[1000] ^ 1);
        REQUIRE(redis.command({"SET", chunk, value}).is_ok());
    }
    REQUIRE(redis.command({"DEL", proto::blob_key("t", digest_of_entry(index_of(gone)))}).integer ==
            1);
    REQUIRE(redis.command({"DEL", proto::manifest_key("t", index_of(no_manifest))}).integer == 1);
    const core::Digest shared = core::digest_of(blobs[shared1]);
    REQUIRE(redis.command({"DEL", proto::chunk_key("t", shared, 0)}).integer == 1);

    auto made = remote::Remote::create(fast_failing_options(redis));
    REQUIRE(made);
    remote::Remote& r = **made;
    std::vector<std::string> seen;
    std::map<std::string, remote::Outcome> outcomes;
    auto summary = r.pull_job(b.store(), "j", [&](const std::string& name, const auto& result) {
        seen.push_back(name);
        REQUIRE(result);
        outcomes[name] = result->outcome;
        return true;
    });
    REQUIRE(summary);
    CHECK(seen == names);
    CHECK(summary->pulled == kEntries - 5);
    CHECK(summary->missing == 5);
    CHECK(summary->failed == 0);
    CHECK(outcomes.at(index_of(corrupt)) == remote::Outcome::corrupt);
    CHECK(outcomes.at(index_of(gone)) == remote::Outcome::dangling);
    CHECK(outcomes.at(index_of(no_manifest)) == remote::Outcome::miss);
    const std::string n1 = fmt::format("{:024X}", 0xABCDEF000000 + shared1 * 7919),
                      n2 = fmt::format("{:024X}", 0xABCDEF000000 + shared2 * 7919);
    CHECK(outcomes.at(n1) == remote::Outcome::dangling);
    CHECK(outcomes.at(n2) == remote::Outcome::dangling);
    const remote::Counts counts = r.counts();
    CHECK(counts.corrupt == 1);
    CHECK(counts.dangling == 3);
    CHECK(counts.misses == 4);  // the missing manifest and the three dangling ones
    CHECK(counts.hits == kEntries - 5);
    for (const std::string& name : names) {
        INFO(name);
        const bool bad = outcomes.at(name) != remote::Outcome::pulled;
        CHECK(b.has_entry(name) == !bad);
        if (!bad) CHECK(b.snapshot(name) == a.snapshot(name));
    }
    // The corrupt blob and the dangling manifests were dropped from Redis, so that the
    // next push uploads them whole.
    CHECK(redis.command({"EXISTS", proto::blob_key("t", digest_of_entry(index_of(corrupt)))})
              .integer == 0);
    CHECK(redis.command({"EXISTS", proto::manifest_key("t", index_of(gone))}).integer == 0);
    CHECK(redis.command({"EXISTS", proto::manifest_key("t", n1)}).integer == 0);
    CHECK(redis.command({"EXISTS", proto::manifest_key("t", index_of(corrupt))}).integer == 1);

    // A progress that stops: the pulls stop after the transaction in progress, and every
    // entry written was reported.
    TestDb c;
    std::size_t calls = 0, pulled = 0;
    auto stopped = r.pull_job(c.store(), "j", [&](const std::string&, const auto& result) {
        pulled += result && result->outcome == remote::Outcome::pulled;
        return ++calls < 5;
    });
    REQUIRE(stopped);
    CHECK(calls >= 5);
    CHECK(calls < kEntries);
    CHECK(c.entries() == pulled);
}

TEST_CASE("hostile manifests are refused before anything is fetched or stored", "[remote]") {
    RedisServer redis;
    TestDb b;
    auto plant = [&](const std::string& name, const std::function<void(proto::Manifest&)>& edit) {
        proto::Manifest m;
        m.name = name;
        proto::Node f;
        f.path = "kernel.json";
        f.mode = 04755;
        f.content = "{}";
        f.size = 2;
        f.digest = core::digest_of("{}");
        f.has_content = true;
        m.files.push_back(f);
        edit(m);
        REQUIRE(redis.command({"SET", proto::manifest_key("t", name), proto::encode(m)}).is_ok());
    };
    const std::string good = "CDEF0123456789ABCDEF0123";
    plant("escape1", [](proto::Manifest& m) { m.files[0].path = "../../etc/x"; });
    plant("escape2", [](proto::Manifest& m) {
        proto::Node l;
        l.path = "link";
        l.type = core::FileType::symlink;
        l.target = "../../../etc/passwd";
        m.files.push_back(l);
    });
    plant("escape3", [](proto::Manifest& m) {
        proto::Node l;
        l.path = "abs";
        l.type = core::FileType::symlink;
        l.target = "/etc/passwd";
        m.files.push_back(l);
    });
    plant("orphan", [](proto::Manifest& m) { m.files[0].path = "nodir/kernel.json"; });
    plant("twice", [](proto::Manifest& m) { m.files.push_back(m.files[0]); });
    plant("other-name", [](proto::Manifest& m) { m.name = "something-else"; });
    plant("../up", [](proto::Manifest&) {});
    plant(good, [](proto::Manifest&) {});
    for (const char* name :
         {"escape1", "escape2", "escape3", "orphan", "twice", "other-name", "../up"}) {
        auto r = run_cli(args(b, redis, {"pull", name}));
        INFO(name << ": " << r.out << r.err);
        CHECK(r.exit_code == 1);
        CHECK(r.out.find("corrupt") != std::string::npos);
    }
    CHECK(b.entries() == 0);
    CHECK(b.counter(core::Counter::remote_corrupt) == 7);
    // A manifest that passes every check lands, with set-uid bits dropped.
    auto ok = run_cli(args(b, redis, {"pull", good}));
    INFO(ok.out << ok.err);
    REQUIRE(ok.exit_code == 0);
    CHECK(b.snapshot(good).at("kernel.json") == "1 " + std::to_string(0100755) + " {}");
}

TEST_CASE("a bundle and a manifest with the same bad name are refused with the same error",
          "[remote]") {
    // Both decode into an entry image and go through core::check_image, so one fault is
    // one message, whichever way the entry came.
    RedisServer redis;
    TestDb a, b;
    a.put(kEntryA + "/ab/kernel.cubin", "cubin");
    a.put(kEntryA + "/kernel.json", "{}");
    const std::string bundle = a.path() + "-bad.kcb";
    REQUIRE(core::export_bundle(a.store(), {}, bundle));
    std::string bytes;
    {
        std::ifstream in(bundle, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string from = kEntryA + "/ab/kernel.cubin";
    const auto at = bytes.find(from);
    REQUIRE(at != std::string::npos);
    bytes.replace(at, from.size(), kEntryA + "/../kernel.cubin");  // same length
    std::ofstream(bundle, std::ios::binary | std::ios::trunc) << bytes;

    proto::Manifest m;
    m.name = kEntryA;
    proto::Node dir;
    dir.path = "ab";
    dir.type = core::FileType::directory;
    dir.mode = 0755;
    proto::Node f;
    f.path = "../kernel.cubin";
    f.mode = 0644;
    f.content = "cubin";
    f.size = 5;
    f.digest = core::digest_of("cubin");
    f.has_content = true;
    m.files = {dir, f};
    REQUIRE(redis.command({"SET", proto::manifest_key("t", kEntryA), proto::encode(m)}).is_ok());

    const auto rule = core::check_image(m);
    REQUIRE(!rule);
    const std::string why = rule.error().message;
    CHECK(why.find("refused file") != std::string::npos);
    CHECK(why.find("..") != std::string::npos);

    auto imported = core::import_bundle(b.store(), bundle);
    REQUIRE(!imported);
    CHECK(imported.error().code == EINVAL);
    INFO(imported.error().message);
    CHECK(imported.error().message.ends_with(": " + why));

    auto r = remote::Remote::create(fast_failing_options(redis));
    REQUIRE(r);
    auto pulled = (*r)->pull(b.store(), kEntryA);
    REQUIRE(pulled);
    CHECK(pulled->outcome == remote::Outcome::corrupt);
    CHECK(pulled->detail == "manifest: " + why);
    CHECK(b.entries() == 0);
}
