// Holds (holds.hpp): a blob kept for a reader after its last file went, released by
// the reader's close, cleared by a fresh mount; verify counts them as references.
#include <cerrno>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/holds.hpp"
#include "kcache/core/staged.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Ino;

namespace {

void must_verify(core::Store& store) {
    auto report = KC_MUST(core::verify(store));
    for (const auto& p : report.problems) INFO(p);
    CHECK(report.ok());
    check_consistent(store);
}

std::uint64_t holds(core::Store& store) {
    auto txn = KC_MUST(store.read());
    std::uint64_t n = 0;
    KC_MUST(core::for_each_hold(txn, [&](const core::Digest&, std::uint64_t count) {
        n += count;
        return true;
    }));
    return n;
}

bool has_blob(core::Store& store, const core::Digest& digest) {
    auto txn = KC_MUST(store.read());
    return KC_MUST(txn.has_blob(digest));
}

// Puts `path` with `content` and returns its digest.
core::Digest put_file(TestStore& ts, std::string_view path, std::string_view content) {
    const Ino ino = ts.put(path, content);
    return KC_MUST(ts.read().getattr(ino)).digest;
}

// Unlinks `path`, holding its blob in the same transaction.
void unlink_held(TestStore& ts, std::string_view dir, std::string_view name,
                 const core::Digest& digest) {
    auto txn = ts.write();
    KC_MUST(core::hold_blob(txn, digest));
    KC_MUST(txn.unlink(KC_MUST(txn.resolve(dir)), name));
    KC_MUST(txn.commit());
}

}  // namespace

TEST_CASE("holds: a held blob outlives its file until the hold is released", "[holds]") {
    TestStore ts;
    const std::string content = random_bytes(20000, 7) + compressible_text(5000);
    const core::Digest digest = put_file(ts, "a/k.bin", content);
    const auto before = KC_MUST(ts.read().stats());

    unlink_held(ts, "a", "k.bin", digest);
    CHECK(holds(ts.store()) == 1);
    REQUIRE(has_blob(ts.store(), digest));
    {
        auto txn = ts.read();
        CHECK(KC_MUST(txn.read_blob(digest, content.size())).bytes() == content);
        // Not an entry: only the directory "a" is one, with no file left in it.
        std::uint64_t entries = 0, files = 0;
        KC_MUST(txn.for_each_entry([&](const core::EntryInfo& e) {
            files += e.files;
            return ++entries, true;
        }));
        CHECK(entries == 1);
        CHECK(files == 0);
        const auto stats = KC_MUST(txn.stats());
        CHECK(stats.get(core::Counter::entries) == 1);
        CHECK(stats.get(core::Counter::files) == 0);
        CHECK(stats.get(core::Counter::blobs) == before.get(core::Counter::blobs));
    }
    must_verify(ts.store());

    {
        auto txn = ts.write();
        KC_MUST(core::release_hold(txn, digest));
        KC_MUST(txn.commit());
    }
    CHECK(holds(ts.store()) == 0);
    CHECK_FALSE(has_blob(ts.store(), digest));
    CHECK(KC_MUST(ts.read().stats()).get(core::Counter::blobs) == 0);
    must_verify(ts.store());

    // A second release must not free anything: ENOENT.
    auto txn = ts.write();
    CHECK(err(core::release_hold(txn, digest)) == ENOENT);
    CHECK(err(core::hold_blob(txn, digest)) == ENOENT);  // the blob is gone
}

TEST_CASE("holds: a hold on a blob files still share keeps it after the files go", "[holds]") {
    TestStore ts;
    const std::string content = compressible_text(9000);
    const core::Digest digest = put_file(ts, "a/k.bin", content);
    put_file(ts, "b/k.bin", content);
    {
        auto txn = ts.write();
        KC_MUST(core::hold_blob(txn, digest));
        KC_MUST(core::hold_blob(txn, digest));  // two readers
        KC_MUST(txn.commit());
    }
    must_verify(ts.store());
    for (const char* dir : {"a", "b"}) {
        auto txn = ts.write();
        KC_MUST(txn.unlink(KC_MUST(txn.resolve(dir)), "k.bin"));
        KC_MUST(txn.commit());
    }
    CHECK(holds(ts.store()) == 2);
    CHECK(has_blob(ts.store(), digest));
    must_verify(ts.store());
    {
        auto txn = ts.write();
        KC_MUST(core::release_hold(txn, digest));
        KC_MUST(txn.commit());
    }
    CHECK(has_blob(ts.store(), digest));
    {
        auto txn = ts.write();
        KC_MUST(core::release_hold(txn, digest));
        KC_MUST(txn.commit());
    }
    CHECK_FALSE(has_blob(ts.store(), digest));
    must_verify(ts.store());
}

TEST_CASE("holds: clear_holds (a fresh mount) frees what only holds kept", "[holds]") {
    TestStore ts;
    const core::Digest gone = put_file(ts, "a/gone.bin", random_bytes(3000, 1));
    const core::Digest kept = put_file(ts, "a/kept.bin", random_bytes(3000, 2));
    unlink_held(ts, "a", "gone.bin", gone);
    {
        auto txn = ts.write();
        KC_MUST(core::hold_blob(txn, kept));  // a reader of a file still named
        KC_MUST(txn.commit());
    }
    CHECK(holds(ts.store()) == 2);
    {
        auto txn = ts.write();
        CHECK(KC_MUST(core::clear_holds(txn)) == 2);
        KC_MUST(txn.commit());
    }
    CHECK(holds(ts.store()) == 0);
    CHECK_FALSE(has_blob(ts.store(), gone));
    CHECK(has_blob(ts.store(), kept));
    must_verify(ts.store());
    auto txn = ts.write();
    CHECK(KC_MUST(core::clear_holds(txn)) == 0);
}

TEST_CASE("holds: a commit that replaces a file's content can hold the old blob with it",
          "[holds][staged]") {
    TestStore ts;
    const core::Digest old_digest = put_file(ts, "k/f", "the version a reader has open");
    const Ino f = KC_MUST(ts.read().resolve("k/f"));
    auto staged = KC_MUST(core::StagedFile::begin(ts.store(), f, true));
    KC_MUST(staged.write(0, "rewritten"));

    SECTION("the hold commits with the new content") {
        KC_MUST(staged.commit(
            test_origin(), [&](core::WriteTxn& txn) { return core::hold_blob(txn, old_digest); }));
        CHECK(ts.get("k/f") == "rewritten");
        CHECK(has_blob(ts.store(), old_digest));
        CHECK(holds(ts.store()) == 1);
        must_verify(ts.store());
        KC_MUST(ts.store().update(
            [&](core::WriteTxn& txn) { return core::release_hold(txn, old_digest); }));
        CHECK_FALSE(has_blob(ts.store(), old_digest));
    }
    SECTION("a failure of the first step publishes nothing") {
        auto s = staged.commit(test_origin(), [&](core::WriteTxn& txn) -> core::Status {
            KC_MUST(core::hold_blob(txn, old_digest));
            return core::fail(EIO, "refused");
        });
        REQUIRE_FALSE(s);
        CHECK(s.error().code == EIO);
        CHECK(staged.dirty());
        CHECK(ts.get("k/f") == "the version a reader has open");
        CHECK(holds(ts.store()) == 0);
        KC_MUST(staged.commit(test_origin()));  // and it can publish later
        CHECK(ts.get("k/f") == "rewritten");
        CHECK_FALSE(has_blob(ts.store(), old_digest));
    }
    KC_MUST(staged.publish(test_origin()));
    must_verify(ts.store());
}
