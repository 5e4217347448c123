// The shared tier behind its transport seam (remote/src/backend.hpp): push and pull run on
// an in-memory Backend (fake_backend.hpp), with no Redis anywhere. The Options name a
// socket where nothing listens: a tier that reached Redis around the seam would fail
// every operation here (and the fake would not see the commands these tests count).

#include <cerrno>

#include <catch2/catch.hpp>

#include "entry_names.hpp"
#include "fake_backend.hpp"
#include "kcache/remote/remote.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::FakeBackend;
using kcache::test::kEntryA;
using kcache::test::kEntryB;
using kcache::test::TestDb;
namespace core = kcache::core;
namespace proto = kcache::remote::proto;
namespace remote = kcache::remote;

namespace {

// A incompressible, over three chunks (a header and four chunk keys); B one chunk.
const std::string kBytesA = kcache::test::random_bytes(3 * proto::kChunkBytes + 7, 1);
const std::string kBytesB = kcache::test::random_bytes(40'000, 2);

std::unique_ptr<remote::Remote> on_fake(const std::shared_ptr<FakeBackend::State>& state) {
    remote::Options o;
    o.servers = {*remote::parse_endpoint("unix:/nonexistent/kcache-seam-test.sock")};
    o.ns = "t";
    o.connect_timeout_ns = 50'000'000;
    o.op_timeout_ns = 50'000'000;
    auto r = remote::Remote::create(o, FakeBackend::maker(state));
    REQUIRE(r);
    return std::move(*r);
}

// A db holding A and B, both pushed to `state`.
void push_both(TestDb& a, const std::shared_ptr<FakeBackend::State>& state) {
    a.put(kEntryA + "/kernel.cubin", kBytesA);
    a.put(kEntryA + "/kernel.json", "{}");
    a.put(kEntryB + "/kernel.cubin", kBytesB);
    auto r = on_fake(state);
    for (const std::string& e : {kEntryA, kEntryB}) {
        auto pushed = r->push(a.store(), e, "job1");
        INFO(e << ": " << (pushed ? "" : pushed.error().message));
        REQUIRE(pushed);
        CHECK(pushed->outcome == remote::Outcome::uploaded);
    }
}

std::size_t count_of(const FakeBackend::State& s, const std::string& op, const std::string& key) {
    std::size_t n = 0;
    for (const remote::Command& c : s.log) n += c.size() > 1 && c[0] == op && c[1] == key;
    return n;
}

}  // namespace

TEST_CASE("seam: push and pull run on an in-memory Backend, no Redis", "[remote]") {
    auto state = std::make_shared<FakeBackend::State>();
    TestDb a, b;
    push_both(a, state);
    // What the tier sent went to the fake: manifests first writer wins, blobs in chunks,
    // the job's set.
    CHECK(state->strings.count(proto::manifest_key("t", kEntryA)));
    CHECK(state->strings.count(proto::blob_key("t", core::digest_of(kBytesA))));
    CHECK(state->strings.count(proto::chunk_key("t", core::digest_of(kBytesA), 3)));
    CHECK(state->sets[proto::job_key("t", "job1")].size() == 2);
    CHECK(count_of(*state, "SET", proto::manifest_key("t", kEntryB)) == 1);

    auto r = on_fake(state);
    auto again = r->push(a.store(), kEntryA);  // the manifest is there: nothing sent
    REQUIRE(again);
    CHECK(again->outcome == remote::Outcome::already_remote);

    auto names = r->job_entries("job1");
    REQUIRE(names);
    CHECK(*names == std::vector<std::string>{kEntryA, kEntryB});
    const auto summary = r->pull_entries(b.store(), *names);
    CHECK(summary.pulled == 2);
    CHECK(summary.failed == 0);
    CHECK(b.snapshot(kEntryA) == a.snapshot(kEntryA));
    CHECK(b.snapshot(kEntryB) == a.snapshot(kEntryB));
    CHECK(r->counts().hits == 2);
    CHECK(r->counts().errors == 0);
    CHECK(r->ping() == std::vector<std::string>{"", ""});  // PING on each of the fake's shards
}

TEST_CASE("seam: a timeout the Backend injects fails the entries it reaches, nothing written",
          "[remote]") {
    auto state = std::make_shared<FakeBackend::State>();
    TestDb a, b;
    push_both(a, state);
    // A's blob times out (the pipeline that asks for its header); B's does not.
    const std::string a_blob = proto::blob_key("t", core::digest_of(kBytesA));
    state->fail = [&](const remote::Command& c) -> std::optional<core::Error> {
        if (c.size() > 1 && c[0] == "GET" && c[1] == a_blob)
            return core::Error{ETIMEDOUT, "fake: deadline passed"};
        return std::nullopt;
    };
    auto r = on_fake(state);
    auto pulled = r->pull(b.store(), kEntryA);
    REQUIRE(!pulled);
    CHECK(pulled.error().code == ETIMEDOUT);
    CHECK(!b.has_entry(kEntryA));
    CHECK(r->counts().timeouts == 1);
    CHECK(r->counts().hits == 0);
    // Nothing was dropped for a failure: the manifest and blob are still there.
    CHECK(state->strings.count(proto::manifest_key("t", kEntryA)));
    CHECK(state->strings.count(a_blob));

    auto other = r->pull(b.store(), kEntryB);
    REQUIRE(other);
    CHECK(other->outcome == remote::Outcome::pulled);
    CHECK(b.snapshot(kEntryB) == a.snapshot(kEntryB));

    state->fail = nullptr;  // the "server" is back: A comes through
    auto retried = r->pull(b.store(), kEntryA);
    REQUIRE(retried);
    CHECK(retried->outcome == remote::Outcome::pulled);
    CHECK(b.snapshot(kEntryA) == a.snapshot(kEntryA));
}

TEST_CASE("seam: a blob the Backend lost is a dangling miss, and its manifest is dropped",
          "[remote]") {
    auto state = std::make_shared<FakeBackend::State>();
    TestDb a, b;
    push_both(a, state);
    const core::Digest b_digest = core::digest_of(kBytesB);
    REQUIRE(state->strings.erase(proto::blob_key("t", b_digest)) == 1);  // evicted, whole
    REQUIRE(state->strings.erase(proto::chunk_key("t", b_digest, 0)) == 1);
    auto r = on_fake(state);
    auto pulled = r->pull(b.store(), kEntryB);
    REQUIRE(pulled);
    CHECK(pulled->outcome == remote::Outcome::dangling);
    CHECK(pulled->detail.find("is gone") != std::string::npos);
    CHECK(!b.has_entry(kEntryB));
    CHECK(r->counts().dangling == 1);
    CHECK(r->counts().misses == 1);
    // Dropped through the seam, so that the next push of B uploads it whole.
    CHECK(count_of(*state, "DEL", proto::manifest_key("t", kEntryB)) == 1);
    CHECK(!state->strings.count(proto::manifest_key("t", kEntryB)));

    auto pushed = r->push(a.store(), kEntryB);
    REQUIRE(pushed);
    CHECK(pushed->outcome == remote::Outcome::uploaded);
    auto again = r->pull(b.store(), kEntryB);
    REQUIRE(again);
    CHECK(again->outcome == remote::Outcome::pulled);
}

TEST_CASE("seam: a miss takes the compile lease in the manifest's round trip, once", "[remote]") {
    auto state = std::make_shared<FakeBackend::State>();
    TestDb b, c;
    auto r = on_fake(state);
    const remote::Remote::LeaseAsk first{"node-b", 5000}, second{"node-c", 5000};
    auto miss = r->pull(b.store(), kEntryA, &first);
    REQUIRE(miss);
    CHECK(miss->outcome == remote::Outcome::miss);
    CHECK(miss->lease_taken == true);
    CHECK(state->strings[proto::lease_key("t", kEntryA)] == "node-b");
    auto other = r->pull(c.store(), kEntryA, &second);
    REQUIRE(other);
    CHECK(other->lease_taken == false);
    CHECK(r->counts().misses == 2);
    // One pipeline per pull: the GET and the script together.
    CHECK(state->pipelines == 2);
}
