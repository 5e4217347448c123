// Content addresses across writers (issue 32, item 2): blobs are keyed by XXH3-128,
// whose collisions can be constructed, so deduplication compares bytes and content
// that collides with a stored blob is stored at an alternative address
// (core/src/store_impl.hpp). No real collision is at hand: the tests plant one, as an
// attacker who constructed it would leave the db, by moving a blob that holds bytes B
// (and its file's digest) to the digest of other bytes A, through LMDB itself. Such a
// fake collision fails the content check of reads (B does not hash to A's digest, as a
// real one would), so the tests read with content checks off until it is planted.
#include <lmdb.h>

#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/bundle.hpp"
#include "kcache/core/integrity.hpp"
#include "kcache/core/maintenance.hpp"
#include "records.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::Digest;

namespace {

// Reads without content checks while alive (a planted collision is no real one).
struct NoContentChecks {
    NoContentChecks() { core::set_content_checks(false); }
    ~NoContentChecks() { core::set_content_checks(true); }
};

std::string val(const MDB_val& v) {
    return {static_cast<const char*>(v.mv_data), v.mv_size};
}

// Moves the blob of the file at `path` (store closed and reopened around it) to the
// address `target`, and points the file at it: the file's bytes now stand under the
// digest of other content, as a constructed XXH3 collision would put them.
void plant(TestStore& ts, const std::string& path, const Digest& target) {
    const core::Ino ino = ts.ino(path);
    const Digest from = ts.attr(path).digest;
    REQUIRE_FALSE(from.empty());
    ts.close();
    MDB_env* env = nullptr;
    REQUIRE(mdb_env_create(&env) == 0);
    mdb_env_set_maxdbs(env, 32);
    REQUIRE(mdb_env_open(env, ts.db_path().c_str(), MDB_NOTLS, 0644) == 0);
    MDB_txn* txn = nullptr;
    REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == 0);
    MDB_dbi inodes = 0, refs = 0, data = 0;
    REQUIRE(mdb_dbi_open(txn, "inodes", 0, &inodes) == 0);
    REQUIRE(mdb_dbi_open(txn, "blob_refs", 0, &refs) == 0);
    REQUIRE(mdb_dbi_open(txn, "blob_data", 0, &data) == 0);
    auto move = [&](MDB_dbi dbi, std::string from_key, std::string to_key) {
        MDB_val k{from_key.size(), from_key.data()}, v{};
        REQUIRE(mdb_get(txn, dbi, &k, &v) == 0);
        std::string value = val(v);
        REQUIRE(mdb_del(txn, dbi, &k, nullptr) == 0);
        MDB_val k2{to_key.size(), to_key.data()}, v2{value.size(), value.data()};
        REQUIRE(mdb_put(txn, dbi, &k2, &v2, MDB_NOOVERWRITE) == 0);
        return value;
    };
    const std::string ref_bytes =
        move(refs, core::records::digest_key(from), core::records::digest_key(target));
    const auto ref = core::records::decode_blob_ref(ref_bytes);
    REQUIRE(ref);
    REQUIRE(ref->codec != core::records::Codec::segments);
    for (std::uint32_t i = 0; i < core::records::chunk_count(ref->stored_size); ++i)
        move(data, core::records::chunk_key(from, i), core::records::chunk_key(target, i));
    std::string key = core::records::u64_key(ino);
    MDB_val k{key.size(), key.data()}, v{};
    REQUIRE(mdb_get(txn, inodes, &k, &v) == 0);
    auto node = core::records::decode_inode(ino, val(v));
    REQUIRE(node);
    node->digest = target;
    std::string encoded = core::records::encode(*node);
    MDB_val nv{encoded.size(), encoded.data()};
    REQUIRE(mdb_put(txn, inodes, &k, &nv, 0) == 0);
    REQUIRE(mdb_txn_commit(txn) == 0);
    mdb_env_close(env);
    ts.reopen();
    REQUIRE(ts.attr(path).digest == target);
}

// Every problem verify finds names the planted blob (or its file): it is damage by
// verify's lights (B does not hash to its address), nothing else is.
void check_only_planted(TestStore& ts, const Digest& planted) {
    const auto report = KC_MUST(core::verify(ts.store()));
    CHECK_FALSE(report.problems.empty());
    for (const std::string& p : report.problems) {
        INFO(p);
        CHECK((p.find(planted.hex()) != std::string::npos));
    }
}

std::string bytes_like(const std::string& text, char change) {
    std::string out = text;
    for (std::size_t i = 0; i < out.size(); i += 97) out[i] = change;
    return out;
}

}  // namespace

TEST_CASE("collisions: content whose digest holds other bytes is stored apart, both read back",
          "[collisions]") {
    NoContentChecks no_checks;
    std::string a, b;
    SECTION("raw, same size") {
        a = random_bytes(3000, 1);
        b = random_bytes(3000, 2);
    }
    SECTION("compressed, same size") {
        a = compressible_text(20000);
        b = bytes_like(a, '#');
    }
    SECTION("different sizes") {
        a = random_bytes(3000, 1);
        b = random_bytes(5000, 2);
    }
    SECTION("several pages (chunks)") {
        a = random_bytes(200000, 3);
        b = random_bytes(200000, 4);
    }
    TestStore ts;
    ts.put("k/planted.so", b);
    const Digest da = core::digest_of(a);
    plant(ts, "k/planted.so", da);

    const auto blobs = ts.counter(Counter::blobs);
    ts.put("v/kernel.so", a);
    CHECK(ts.get("v/kernel.so") == a);
    CHECK(ts.get("k/planted.so") == b);
    const Digest stored = ts.attr("v/kernel.so").digest;
    CHECK_FALSE(stored == da);
    CHECK_FALSE(stored.empty());
    CHECK(ts.counter(Counter::blobs) == blobs + 1);  // a blob of its own

    // Read with content checks on: the alternative address is one of A's addresses.
    core::set_content_checks(true);
    CHECK(ts.get("v/kernel.so") == a);
    {
        auto txn = ts.read();
        CHECK(err(txn.read(ts.ino("k/planted.so"))) == core::kDamagedContent);  // fake
    }
    core::set_content_checks(false);

    // A's next store deduplicates onto A's blob, at its alternative address.
    const auto dedups = ts.counter(Counter::dedup_hits);
    ts.put("w/kernel.so", a);
    CHECK(ts.attr("w/kernel.so").digest == stored);
    CHECK(ts.counter(Counter::blobs) == blobs + 1);
    CHECK(ts.counter(Counter::dedup_hits) == dedups + 1);
    check_only_planted(ts, da);

    // A bundle carries A's own digest, so it imports where the collision is not.
    TempDir dir;
    const std::string bundle = (dir / "all.kcb").string();
    KC_MUST(core::export_bundle(ts.store(), {}, bundle));
    TestStore dst;
    KC_MUST(core::import_bundle(dst.store(), bundle));
    CHECK(dst.get("v/kernel.so") == a);
    CHECK(dst.attr("v/kernel.so").digest == da);

    // Its last file gone, A's blob goes.
    {
        auto txn = ts.write();
        KC_MUST(txn.unlink(ts.ino("v"), "kernel.so"));
        KC_MUST(txn.unlink(ts.ino("w"), "kernel.so"));
        KC_MUST(txn.commit());
    }
    CHECK(ts.counter(Counter::blobs) == blobs);
    CHECK(ts.get("k/planted.so") == b);
}

TEST_CASE("collisions: identical content is still deduplicated", "[collisions]") {
    TestStore ts;
    std::string content;
    SECTION("raw") {
        content = random_bytes(5000, 9);
    }
    SECTION("compressed") {
        content = compressible_text(30000);
    }
    SECTION("segmented, with a repeated segment") {
        content = random_bytes(3 << 20, 9);
        content.replace(5 * core::kSegmentSize, core::kSegmentSize,
                        content.substr(0, core::kSegmentSize));
    }
    ts.put("a/f", content);
    const auto blobs = ts.counter(Counter::blobs);
    const auto stored = ts.counter(Counter::stored_bytes);
    const auto dedups = ts.counter(Counter::dedup_hits);
    ts.put("b/f", content);
    CHECK(ts.counter(Counter::blobs) == blobs);
    CHECK(ts.counter(Counter::stored_bytes) == stored);
    CHECK(ts.counter(Counter::dedup_hits) == dedups + 1);
    CHECK(ts.attr("a/f").digest == core::digest_of(content));
    CHECK(ts.attr("b/f").digest == core::digest_of(content));
    CHECK(ts.get("b/f") == content);
    check_consistent(ts.store());
}

TEST_CASE("collisions: a big file whose segment's digest holds other bytes", "[collisions]") {
    NoContentChecks no_checks;
    TestStore ts;
    const std::size_t seg = core::kSegmentSize;
    const std::string a = random_bytes(2 * core::kSegmentedSize + 1000, 11);
    const std::string target = a.substr(5 * seg, seg);  // segment 5
    const std::string b = random_bytes(seg, 12);
    ts.put("k/planted.bin", b);
    const Digest planted = core::flat_digest_of(target);
    plant(ts, "k/planted.bin", planted);

    SECTION("a new file") {
        ts.put("v/big.so", a);
        CHECK(ts.get("v/big.so") == a);
        CHECK(ts.get("k/planted.bin") == b);
        CHECK_FALSE(ts.attr("v/big.so").digest == core::digest_of(a));
        // Its copy deduplicates onto it, with every segment compared.
        const auto blobs = ts.counter(Counter::blobs);
        const auto stored = ts.counter(Counter::stored_bytes);
        ts.put("w/big.so", a);
        CHECK(ts.attr("w/big.so").digest == ts.attr("v/big.so").digest);
        CHECK(ts.counter(Counter::blobs) == blobs);
        CHECK(ts.counter(Counter::stored_bytes) == stored);
    }
    SECTION("a rewrite that changes the colliding segment (segments replaced in place)") {
        std::string before = a;
        before.replace(5 * seg, seg, random_bytes(seg, 13));
        ts.put("v/big.so", before);
        CHECK(ts.get("v/big.so") == before);
        ts.put("v/big.so", a);
        CHECK(ts.get("v/big.so") == a);
        CHECK(ts.get("k/planted.bin") == b);
        // And back: the alternative segment is released, the planted one stays.
        ts.put("v/big.so", before);
        CHECK(ts.get("v/big.so") == before);
        CHECK(ts.get("k/planted.bin") == b);
    }
    core::set_content_checks(true);
    CHECK(ts.get("v/big.so").size() == a.size());
    core::set_content_checks(false);
    check_only_planted(ts, planted);
}
