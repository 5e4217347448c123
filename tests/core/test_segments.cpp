// Segmented content: files of kSegmentedSize or more are stored as lists of
// kSegmentSize segments, each a blob of its own, so that a change of a few pages
// stores a few segments, not the whole file (issue 11: cost proportional to change).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/bundle.hpp"
#include "kcache/core/maintenance.hpp"
#include "kcache/core/staged.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::kSegmentedSize;
using core::kSegmentSize;
using core::StagedFile;

namespace {

constexpr std::size_t kPage = 4096;

// The file after writing `data` at `offset` of `content`, as a local disk would.
void model_write(std::string& content, std::size_t offset, std::string_view data) {
    if (offset + data.size() > content.size()) content.resize(offset + data.size(), '\0');
    std::memcpy(content.data() + offset, data.data(), data.size());
}

}  // namespace

TEST_CASE("segments: content of 1 MiB or more is digested by segment, smaller content flat",
          "[segments]") {
    const std::string small = random_bytes(kSegmentedSize - 1, 1);
    CHECK(core::digest_of(small) == core::flat_digest_of(small));

    const std::string big = random_bytes(kSegmentedSize + 10, 2);
    const core::Digest d = core::digest_of(big);
    CHECK_FALSE(d == core::flat_digest_of(big));
    std::vector<core::Digest> segments;
    for (std::size_t at = 0; at < big.size(); at += kSegmentSize) {
        segments.push_back(core::flat_digest_of(std::string_view(big).substr(at, kSegmentSize)));
    }
    CHECK(segments.size() == 17);
    CHECK(d == core::digest_of_segments(segments));
    // A small file holding the list itself is another digest (a seeded domain).
    std::string list;
    for (const auto& s : segments) {
        for (int i = 7; i >= 0; --i) list += static_cast<char>(s.high >> (8 * i));
        for (int i = 7; i >= 0; --i) list += static_cast<char>(s.low >> (8 * i));
    }
    CHECK_FALSE(core::digest_of(list) == d);
}

TEST_CASE("segments: a big file reads back byte for byte, whatever its size", "[segments]") {
    TestStore ts;
    for (std::size_t size : {kSegmentedSize, kSegmentedSize + 1, 3 * kSegmentedSize - 7}) {
        const std::string content = random_bytes(size, size);
        ts.put("k/big", content);
        CHECK(ts.get("k/big") == content);
        CHECK(ts.attr("k/big").digest == core::digest_of(content));
        auto txn = ts.read();
        std::string pieces;
        KC_MUST(txn.read_pieces(ts.ino("k/big"), [&](std::string_view p) { pieces.append(p); }));
        CHECK(pieces == content);
    }
    check_consistent(ts.store());
}

TEST_CASE("segments: a copy with one page changed stores one segment more, not a second file",
          "[segments]") {
    TestStore ts;
    const std::string a = random_bytes(4 << 20, 3);  // 64 segments
    std::string b = a;
    model_write(b, 1 << 20, random_bytes(kPage, 4));
    ts.put("k/a.so", a);
    const auto blobs_a = ts.counter(Counter::blobs);
    const auto stored_a = ts.counter(Counter::stored_bytes);
    CHECK(blobs_a == 64 + 1);  // the segments and the list
    ts.put("k/b.so", b);
    CHECK(ts.counter(Counter::blobs) == blobs_a + 2);  // one segment and a list
    CHECK(ts.counter(Counter::stored_bytes) - stored_a < 2 * kSegmentSize);
    CHECK(ts.get("k/a.so") == a);
    CHECK(ts.get("k/b.so") == b);
    // Each file's entry still counts all the pages behind it.
    CHECK(ts.entry("k").stored_bytes >= 2 * a.size());
    check_consistent(ts.store());
}

TEST_CASE("segments: a staged file updated a page at a time, published after each update",
          "[segments][staged]") {
    TestStore ts;
    const std::size_t size = 4 << 20;
    std::string model = random_bytes(size, 5);
    auto f = ts.put("k/db.sqlite", model);
    const auto blobs = ts.counter(Counter::blobs);
    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
    std::mt19937_64 rng(6);
    for (int i = 0; i < 40; ++i) {
        const std::size_t at = rng() % (size / kPage) * kPage;
        const std::string page = random_bytes(kPage, 100 + i);
        KC_MUST(staged.write(at, page));
        model_write(model, at, page);
        KC_MUST(staged.commit(test_origin()));  // fsync
        // Readers see each published version; old segments are freed as they go.
        CHECK(ts.attr("k/db.sqlite").digest == core::digest_of(model));
        CHECK(ts.counter(Counter::blobs) == blobs);
    }
    KC_MUST(staged.publish(test_origin()));
    CHECK(ts.get("k/db.sqlite") == model);
    check_consistent(ts.store());
}

TEST_CASE("segments: random writes, truncates and publishes equal a local file",
          "[segments][staged]") {
    TestStore ts;
    std::mt19937_64 rng(GENERATE(11u, 12u, 13u));
    std::string model = random_bytes(kSegmentedSize + kSegmentSize / 2, rng());
    auto f = ts.put("k/f", model);
    auto staged = KC_MUST(StagedFile::begin(ts.store(), f, false));
    for (int op = 0; op < 120; ++op) {
        switch (rng() % 5) {
            case 0:
            case 1: {
                const std::size_t at = rng() % (3 * kSegmentedSize);
                const std::string data = random_bytes(1 + rng() % (2 * kSegmentSize), rng());
                KC_MUST(staged.write(at, data));
                model_write(model, at, data);
                break;
            }
            case 2: {  // across the segmented size, both ways, and on segment boundaries
                const std::size_t sizes[] = {0,
                                             kSegmentSize,
                                             kSegmentedSize - 1,
                                             kSegmentedSize,
                                             kSegmentedSize + kSegmentSize + 3,
                                             rng() % (3 * kSegmentedSize)};
                const std::size_t to = sizes[rng() % 6];
                KC_MUST(staged.truncate(to));
                model.resize(to, '\0');
                break;
            }
            case 3:
                KC_MUST(staged.commit(test_origin()));
                break;
            default: {  // a sparse run of zeros: the same segment many times
                const std::size_t at = rng() % (2 * kSegmentedSize);
                const std::string zeros(kSegmentSize * (1 + rng() % 6), '\0');
                KC_MUST(staged.write(at, zeros));
                model_write(model, at, zeros);
            }
        }
        REQUIRE(staged.content() == model);
        if (op % 10 == 9) {
            KC_MUST(staged.commit(test_origin()));
            REQUIRE(ts.get("k/f") == model);
            REQUIRE(ts.attr("k/f").digest == core::digest_of(model));
        }
    }
    KC_MUST(staged.publish(test_origin()));
    CHECK(ts.get("k/f") == model);
    check_consistent(ts.store());
    // Removing the file frees every segment.
    {
        auto txn = ts.write();
        KC_MUST(txn.unlink(ts.ino("k"), "f"));
        KC_MUST(txn.commit());
    }
    CHECK(ts.counter(Counter::blobs) == 0);
    CHECK(ts.counter(Counter::stored_bytes) == 0);
    CHECK(ts.counter(Counter::blob_raw_bytes) == 0);
    check_consistent(ts.store());
}

TEST_CASE("segments: shared big content stays whole when one of its files changes", "[segments]") {
    TestStore ts;
    const std::string content = random_bytes(2 << 20, 21);
    auto a = ts.put("k/a", content);
    ts.put("k/b", content);
    CHECK(ts.counter(Counter::dedup_hits) == 1);
    auto staged = KC_MUST(StagedFile::begin(ts.store(), a, false));
    KC_MUST(staged.write(0, "changed"));
    KC_MUST(staged.publish(test_origin()));
    std::string changed = content;
    model_write(changed, 0, "changed");
    CHECK(ts.get("k/a") == changed);
    CHECK(ts.get("k/b") == content);
    check_consistent(ts.store());
}

TEST_CASE("segments: a file of zeros holds one segment once per occurrence", "[segments]") {
    TestStore ts;
    ts.put("k/zeros", std::string(4 << 20, '\0'));
    CHECK(ts.counter(Counter::blobs) == 2);  // the zero segment and the list
    CHECK(ts.get("k/zeros") == std::string(4 << 20, '\0'));
    ts.put("k/zeros", "small now");
    CHECK(ts.counter(Counter::blobs) == 1);
    check_consistent(ts.store());
}

TEST_CASE("segments: a flipped byte in one segment is found by verify and named by its file",
          "[segments][verify]") {
    TestStore ts;
    const std::string marker = "KCACHE-SEGMENT-MARKER-51c9a3f7";
    std::string content = random_bytes(2 << 20, 31);
    content.replace(5 * kSegmentSize, marker.size(), marker);  // raw (incompressible) segment 5
    ts.put("k/big.so", content);
    REQUIRE(KC_MUST(core::verify(ts.store())).ok());
    ts.close();

    const auto data_file = std::filesystem::path(ts.db_path()) / "data.mdb";
    auto disk = read_file(data_file);
    const auto pos = disk.find(marker);
    REQUIRE(pos != std::string::npos);
    disk[pos + marker.size() + 100] ^= 0x01;
    write_file(data_file, disk);

    ts.reopen();
    auto report = KC_MUST(core::verify(ts.store()));
    CHECK_FALSE(report.ok());
    bool named = false;
    for (const auto& p : report.problems) named = named || p.find("k/big.so") != std::string::npos;
    CHECK(named);
}

TEST_CASE("segments: bundles carry big files whole and import them segmented",
          "[segments][bundle]") {
    TestStore from;
    const std::string content = random_bytes(3 << 20, 41) + std::string(1 << 20, 'x');
    from.put("t/abc/kernel.so", content);
    const std::string bundle = (from.dir().path() / "out.kcb").string();
    KC_MUST(core::export_bundle(from.store(), {}, bundle));
    TestStore to;
    KC_MUST(core::import_bundle(to.store(), bundle));
    CHECK(to.get("t/abc/kernel.so") == content);
    CHECK(to.attr("t/abc/kernel.so").digest == core::digest_of(content));
    CHECK(to.counter(Counter::blobs) == from.counter(Counter::blobs));
    check_consistent(to.store());
}

namespace {
// The one 1.7 MiB file in tests/core/data/schema2 (a db written by kcache-fsd of
// schema 2, and format2.kcb, a bundle of it written by `kcache export` of then).
std::string schema2_file() {
    std::string expected;
    for (int i = 0; i < 60000; ++i) {
        char line[40];
        std::snprintf(line, sizeof line, "segment fixture line %07d\n", i);
        expected += line;
    }
    return expected;
}
}  // namespace

TEST_CASE("segments: a format-2 bundle's big file (a flat digest) imports, segmented",
          "[segments][bundle]") {
    TestStore to;
    auto report = KC_MUST(core::import_bundle(
        to.store(), std::string(KCACHE_TEST_DATA_DIR) + "/schema2/format2.kcb"));
    CHECK(report.files == 1);
    const std::string expected = schema2_file();
    CHECK(to.get("0123456789abcdef0123456789abcdef/big.so") == expected);
    CHECK(to.attr("0123456789abcdef0123456789abcdef/big.so").digest == core::digest_of(expected));
    check_consistent(to.store());
}

TEST_CASE("segments: a schema-2 db's big file keeps its flat digest until it changes",
          "[segments][open]") {
    std::string expected = schema2_file();
    const std::string path = "0123456789abcdef0123456789abcdef/big.so";
    TempDir dir;
    const std::string db =
        copy_fixture_db(dir, std::string(KCACHE_TEST_DATA_DIR) + "/schema2/data.mdb");
    core::OpenOptions options;
    options.path = db;
    {  // read-only: read and verified as it is
        options.read_only = true;
        auto store = KC_MUST(core::Store::open(options));
        auto txn = KC_MUST(store->read());
        const auto file = KC_MUST(txn.resolve(path));
        CHECK(KC_MUST(txn.read(file)).bytes() == expected);
        CHECK(KC_MUST(txn.getattr(file)).digest == core::flat_digest_of(expected));
        CHECK(KC_MUST(core::verify(*store)).ok());
    }
    options.read_only = false;
    auto store = KC_MUST(core::Store::open(options));
    CHECK(KC_MUST(core::verify(*store)).ok());
    core::Ino file = 0;
    {
        auto txn = KC_MUST(store->read());
        file = KC_MUST(txn.resolve(path));
    }
    auto staged = KC_MUST(StagedFile::begin(*store, file, false));
    KC_MUST(staged.write(100, "CHANGED"));
    KC_MUST(staged.publish(test_origin()));
    model_write(expected, 100, "CHANGED");
    auto txn = KC_MUST(store->read());
    CHECK(KC_MUST(txn.read(file)).bytes() == expected);
    CHECK(KC_MUST(txn.getattr(file)).digest == core::digest_of(expected));
    check_consistent(*store);  // the flat blob is gone, the segments are counted
}
