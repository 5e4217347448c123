// Frames over the shared tier (remote/src/transfer.cpp, pull.cpp; core/frames.hpp): a blob
// stored with a trained dictionary travels as its stored frame, the dictionary once, and is
// stored by the puller as it came under the puller's own id for that dictionary. A missing
// dictionary is a clean miss, and the pusher sends it again; a hostile dictionary, frame
// or header is refused with nothing stored; values in the older chunked form still read.
#include <functional>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "kcache/core/dictionaries.hpp"
#include "kcache/core/frames.hpp"
#include "kcache/remote/remote.hpp"
#include "kernel_text.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::kernel_dir;
using kcache::test::metadata;
using kcache::test::ptx;
using kcache::test::RedisServer;
using kcache::test::TestDb;
namespace core = kcache::core;
namespace proto = kcache::remote::proto;
namespace remote = kcache::remote;

namespace {

// The value of `r`, failing the test with its error when there is none.
template <class T>
T must(core::Result<T> r, const char* what) {
    if (!r) FAIL(what << " failed: " << r.error().message);
    return std::move(*r);
}
#define MUST(expr) must((expr), #expr)

remote::Options options(const RedisServer& redis) {
    remote::Options o;
    o.servers.push_back(redis.endpoint());
    o.ns = "t";
    o.op_timeout_ns = 2'000'000'000;
    o.connect_timeout_ns = 2'000'000'000;
    return o;
}

std::unique_ptr<remote::Remote> make_remote(const RedisServer& redis) {
    auto r = remote::Remote::create(options(redis));
    REQUIRE(r);
    return std::move(*r);
}

core::DictionaryPolicy small_policy() {
    core::DictionaryPolicy p;
    p.min_blobs = 16;
    p.min_raw_bytes = 16 * 1024;
    return p;
}

void put_kernels(TestDb& db, int from, int to) {
    for (int i = from; i < to; ++i) {
        db.put(kernel_dir(i) + "/k.ptx", ptx(i));
        db.put(kernel_dir(i) + "/k.json", metadata(i));
    }
}

// A: PTX and JSON dictionaries trained on kernels [0, 40); kernels [100, 100 + n) then
// stored with them, the entries the tests push.
void pusher(TestDb& a, int n) {
    put_kernels(a, 0, 40);
    REQUIRE(MUST(core::train_dictionaries(a.store(), small_policy())).size() == 2);
    put_kernels(a, 100, 100 + n);
}

core::StoredFrame frame_of(TestDb& db, const std::string& content) {
    auto txn = MUST(db.store().read());
    auto frame = MUST(core::read_frame(txn, core::digest_of(content)));
    REQUIRE(frame);
    return *frame;
}

std::uint32_t kind_dictionary(TestDb& db, std::string_view name) {
    auto txn = MUST(db.store().read());
    for (const auto& k : MUST(core::kind_stats(txn))) {
        if (k.name == name) return k.dictionary;
    }
    return 0;
}

std::size_t keys(RedisServer& redis, const std::string& pattern) {
    return redis.command({"KEYS", pattern}).elements.size();
}

void push_all(remote::Remote& r, TestDb& db, int from, int to) {
    for (int i = from; i < to; ++i) {
        auto pushed = r.push(db.store(), kernel_dir(i));
        INFO(i);
        REQUIRE(pushed);
        CHECK(pushed->outcome == remote::Outcome::uploaded);
    }
}

remote::Outcome pull(remote::Remote& r, TestDb& db, int i) {
    auto pulled = r.pull(db.store(), kernel_dir(i));
    REQUIRE(pulled);
    return pulled->outcome;
}

}  // namespace

TEST_CASE("remote frames: frames travel as stored, their dictionary once, under the puller's id",
          "[remote]") {
    RedisServer redis;
    TestDb a, b;
    pusher(a, 12);
    // B has a dictionary of its own (another kind), so the ids it gives differ from A's.
    for (int i = 0; i < 40; ++i) b.put(kernel_dir(500 + i) + "/k.ttir", ptx(1000 + i));
    REQUIRE(!MUST(core::train_dictionaries(b.store(), small_policy())).empty());

    const std::uint64_t sets = redis.calls("set");
    push_all(*make_remote(redis), a, 100, 106);
    // Two dictionaries (PTX, JSON), then two frames and a manifest per entry: no file
    // inline (a dictionary frame is smaller than the text in the manifest).
    CHECK(keys(redis, "kc2:t:d:*") == 2);
    CHECK(redis.calls("set") - sets == 2 + 6 * 3);
    // Another process pushing more of them sends no dictionary again.
    push_all(*make_remote(redis), a, 106, 112);
    CHECK(redis.calls("set") - sets == 2 + 12 * 3);

    // Each blob's value is its frame as A stores it.
    for (int i = 100; i < 112; ++i) {
        const core::StoredFrame f = frame_of(a, ptx(i));
        REQUIRE(f.dictionary != 0);
        const std::string value =
            redis.command({"GET", proto::blob_key("t", core::digest_of(ptx(i)))}).str;
        auto decoded = proto::decode_frame(value);
        REQUIRE(decoded);
        CHECK(decoded->frame == f.frame);
        CHECK(decoded->raw_size == ptx(i).size());
    }

    auto r = make_remote(redis);
    const std::uint64_t gets = redis.calls("get");
    for (int i = 100; i < 112; ++i) CHECK(pull(*r, b, i) == remote::Outcome::pulled);
    // Per entry its manifest and per frame a GET of its value and of the chunk a value of
    // the older form would have; the two dictionaries once, by the first pull.
    CHECK(redis.calls("get") - gets == 12 * 5 + 2);
    for (int i = 100; i < 112; ++i) {
        INFO(i);
        CHECK(b.snapshot(kernel_dir(i)) == a.snapshot(kernel_dir(i)));
        const core::StoredFrame theirs = frame_of(a, ptx(i)), ours = frame_of(b, ptx(i));
        // Stored as it came: the same frame but for the id, B's own for the same bytes.
        CHECK(ours.dictionary != 0);
        CHECK(ours.dictionary != theirs.dictionary);
        CHECK(ours.frame == MUST(core::with_frame_dictionary(theirs.frame, ours.dictionary)));
    }
    CHECK(kind_dictionary(b, "triton/ptx") == frame_of(b, ptx(100)).dictionary);
    {
        auto txn = MUST(b.store().read());
        CHECK(MUST(core::dictionary_ids(txn)).size() == 3);  // its own and A's two
    }
    // A new PTX in B is compressed with the dictionary it pulled.
    b.put(kernel_dir(130) + "/k.ptx", ptx(130));
    CHECK(frame_of(b, ptx(130)).dictionary == kind_dictionary(b, "triton/ptx"));
}

TEST_CASE("remote frames: a puller that cannot get a frame's dictionary misses cleanly",
          "[remote]") {
    RedisServer redis;
    TestDb a, c;
    pusher(a, 3);
    // One long-lived pusher, as a daemon's uploader is.
    auto pusher_remote = make_remote(redis);
    push_all(*pusher_remote, a, 100, 103);
    // Redis evicted the dictionaries.
    for (const auto& k : redis.command({"KEYS", "kc2:t:d:*"}).elements)
        REQUIRE(redis.command({"DEL", k.str}).integer == 1);

    auto r = make_remote(redis);
    CHECK(pull(*r, c, 100) == remote::Outcome::dangling);
    CHECK(r->counts().misses == 1);
    CHECK(r->counts().corrupt == 0);
    CHECK(!c.has_entry(kernel_dir(100)));
    CHECK(c.counter(core::Counter::blobs) == 0);
    // The frames and the manifest were dropped, so the next push sends them again, and
    // the same pusher the dictionaries it sent before, which Redis lost.
    CHECK(redis.command({"EXISTS", proto::manifest_key("t", kernel_dir(100))}).integer == 0);
    CHECK(redis.command({"EXISTS", proto::blob_key("t", core::digest_of(ptx(100)))}).integer == 0);
    push_all(*pusher_remote, a, 100, 101);
    CHECK(keys(redis, "kc2:t:d:*") == 2);
    CHECK(pull(*r, c, 100) == remote::Outcome::pulled);
    CHECK(c.snapshot(kernel_dir(100)) == a.snapshot(kernel_dir(100)));
}

TEST_CASE("remote frames: a hostile dictionary, frame or header is refused, nothing stored",
          "[remote]") {
    RedisServer redis;
    TestDb a;
    pusher(a, 1);
    const int k = 100;
    const core::Digest blob = core::digest_of(ptx(k));
    const std::string bkey = proto::blob_key("t", blob);
    const core::StoredFrame f = frame_of(a, ptx(k));
    std::string dictionary;
    {
        auto txn = MUST(a.store().read());
        dictionary = MUST(core::read_dictionary(txn, f.dictionary));
    }
    const core::Digest dd = core::dictionary_digest(dictionary);
    const std::string dkey = proto::dictionary_key("t", dd);

    struct Case {
        const char* what;
        std::function<void()> damage;
    };
    std::string flipped = f.frame;
    flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x10);
    std::string damaged = dictionary;
    for (std::size_t i = damaged.size() / 2; i < damaged.size(); i += 16)
        damaged[i] = static_cast<char>(damaged[i] ^ 0x55);
    std::string other;  // JSON's dictionary
    {
        auto txn = MUST(a.store().read());
        const auto j = frame_of(a, metadata(k));
        other = MUST(core::read_dictionary(txn, j.dictionary));
    }
    const std::vector<Case> cases = {
        {"a damaged dictionary",
         [&] {
             redis.command({"SET", dkey, proto::encode_dictionary(damaged)});
         }},
        {"another dictionary under its digest",
         [&] {
             redis.command({"SET", dkey, proto::encode_dictionary(other)});
         }},
        {"a flipped byte in the frame",
         [&] {
             redis.command({"SET", bkey, proto::encode_frame(ptx(k).size(), dd, flipped)});
         }},
        {"a header cut before its Dictionary_ID",
         [&] {
             redis.command(
                 {"SET", bkey, proto::encode_frame(ptx(k).size(), dd, f.frame.substr(0, 6))});
         }},
        {"a frame naming no dictionary in a value that names one",
         [&] {
             redis.command({"SET", bkey,
                            proto::encode_frame(ptx(k).size(), dd,
                                                MUST(core::with_frame_dictionary(f.frame, 0)))});
         }},
        {"a value naming another size",
         [&] {
             redis.command({"SET", bkey, proto::encode_frame(ptx(k).size() + 1, dd, f.frame)});
         }},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        push_all(*make_remote(redis), a, k, k + 1);
        c.damage();
        TestDb b;
        auto r = make_remote(redis);
        CHECK(pull(*r, b, k) == remote::Outcome::corrupt);
        CHECK(r->counts().corrupt == 1);
        CHECK(!b.has_entry(kernel_dir(k)));
        CHECK(b.counter(core::Counter::blobs) == 0);
        {
            auto txn = MUST(b.store().read());
            CHECK(MUST(core::dictionary_ids(txn)).empty());
        }
        // Dropped from Redis, the manifest with it: the next push sends them again.
        CHECK(redis.command({"EXISTS", bkey}).integer == 0);
        CHECK(redis.command({"EXISTS", proto::manifest_key("t", kernel_dir(k))}).integer == 0);
        redis.command({"DEL", dkey});  // a damaged dictionary was dropped; a sound one too
    }
    push_all(*make_remote(redis), a, k, k + 1);
    TestDb b;
    CHECK(pull(*make_remote(redis), b, k) == remote::Outcome::pulled);
    CHECK(b.snapshot(kernel_dir(k)) == a.snapshot(kernel_dir(k)));
}

TEST_CASE("remote frames: a blob of raw content in chunks (KCB1) still reads", "[remote]") {
    RedisServer redis;
    TestDb a, b;
    pusher(a, 1);
    const int k = 100;
    push_all(*make_remote(redis), a, k, k + 1);
    // What a pusher built before frames wrote: header and chunks of the content.
    for (const std::string& content : {ptx(k), metadata(k)}) {
        const core::Digest d = core::digest_of(content);
        REQUIRE(proto::is_frame(redis.command({"GET", proto::blob_key("t", d)}).str));
        redis.command({"SET", proto::chunk_key("t", d, 0), proto::encode_chunk(content)});
        redis.command(
            {"SET", proto::blob_key("t", d), proto::encode(proto::BlobHeader{content.size(), 1})});
    }
    for (const auto& key : redis.command({"KEYS", "kc2:t:d:*"}).elements)
        redis.command({"DEL", key.str});
    CHECK(pull(*make_remote(redis), b, k) == remote::Outcome::pulled);
    CHECK(b.snapshot(kernel_dir(k)) == a.snapshot(kernel_dir(k)));
    // Stored as content, compressed here (B has no dictionary).
    CHECK(frame_of(b, ptx(k)).dictionary == 0);
}
