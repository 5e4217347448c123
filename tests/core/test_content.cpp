// Content: publishing and reading bytes, digests, zero-copy reads, compression, and
// content-addressed blobs with their reference counts.
#include <cerrno>
#include <string>

#include "core_test_util.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::kRootIno;

TEST_CASE("content: digests are XXH3-128, all zero for empty content", "[content]") {
    CHECK(core::digest_of("").empty());
    CHECK(core::digest_of("").hex() == std::string(32, '0'));
    auto d = core::digest_of("kernel");
    CHECK_FALSE(d.empty());
    CHECK(d == core::digest_of("kernel"));
    CHECK_FALSE(d == core::digest_of("kernel "));
    auto hex = d.hex();
    CHECK(hex.size() == 32);
    CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
}

TEST_CASE("content: what is written is read back byte for byte", "[content]") {
    TestStore ts;
    SECTION("text") {
        ts.put("k/a.json", "{\"name\": \"add_kernel\"}");
        CHECK(ts.get("k/a.json") == "{\"name\": \"add_kernel\"}");
    }
    SECTION("binary data with NUL bytes and every byte value") {
        ts.put("k/a.cubin", all_byte_values());
        CHECK(ts.get("k/a.cubin") == all_byte_values());
        CHECK(ts.attr("k/a.cubin").size == 512);
    }
    SECTION("an empty file") {
        ts.put("k/empty", "");
        CHECK(ts.get("k/empty").empty());
        CHECK(ts.attr("k/empty").size == 0);
        CHECK(ts.attr("k/empty").digest.empty());
    }
    SECTION("a large file (8 MiB)") {
        auto big = random_bytes(8 << 20, 7);
        ts.put("k/big.so", big);
        CHECK(ts.get("k/big.so") == big);
    }
    SECTION("overwrite replaces the whole content, shorter or longer") {
        ts.put("k/f", "a long first version");
        ts.put("k/f", "short");
        CHECK(ts.get("k/f") == "short");
        ts.put("k/f", "a longer third version of the file");
        CHECK(ts.get("k/f") == "a longer third version of the file");
        CHECK(ts.attr("k/f").size == 34);
    }
    SECTION("the attributes carry the size and the digest of the content") {
        auto content = random_bytes(1000, 3);
        auto txn = ts.write();
        auto f = KC_MUST(txn.create(kRootIno, "flat", 0644));
        auto a = KC_MUST(txn.write(f.ino, content, test_origin()));
        CHECK(a.size == 1000);
        CHECK(a.digest == core::digest_of(content));
        KC_MUST(txn.commit());
        CHECK(ts.attr("flat").digest == core::digest_of(content));
    }
    check_consistent(ts.store());
}

TEST_CASE("content: write and read refuse what is not a regular file", "[content]") {
    TestStore ts;
    auto k = ts.mkdirs("k");
    auto txn = ts.write();
    auto link = KC_MUST(txn.symlink(k, "l", "target"));
    CHECK(err(txn.write(k, "x", test_origin())) == EISDIR);
    CHECK(err(txn.read(k)) == EISDIR);
    CHECK_FALSE(txn.write(link.ino, "x", test_origin()).has_value());
    CHECK(err(txn.write(987654, "x", test_origin())) == ENOENT);
    CHECK(err(txn.read(987654)) == ENOENT);
}

TEST_CASE("content: incompressible content is read zero-copy from the map", "[content]") {
    TestStore ts;
    // Up to one chunk (4080 bytes), read() itself is a view into the map.
    const auto small = random_bytes(4000, 12);
    auto s = ts.put("s/kernel.cubin", small);
    {
        auto txn = ts.read();
        auto content = KC_MUST(txn.read(s));
        CHECK(content.zero_copy());
        CHECK(content.bytes() == small);
    }
    // Larger content is kept in one-page chunks; read_pieces visits them as views into
    // the map: the same addresses every time within one transaction, never a copy.
    const auto bytes = random_bytes(64 << 10, 11);
    auto f = ts.put("k/kernel.cubin", bytes);
    auto txn = ts.read();
    std::vector<std::string_view> first, second;
    KC_MUST(txn.read_pieces(f, [&](std::string_view piece) { first.push_back(piece); }));
    KC_MUST(txn.read_pieces(f, [&](std::string_view piece) { second.push_back(piece); }));
    CHECK(first.size() == (bytes.size() + 4079) / 4080);
    std::string joined;
    for (std::size_t i = 0; i < first.size(); ++i) {
        CHECK(first[i].data() == second[i].data());
        joined.append(first[i]);
    }
    CHECK(joined == bytes);
    auto content = KC_MUST(txn.read(f));
    REQUIRE(content.bytes().size() == bytes.size());
    CHECK(content.bytes() == bytes);
    // Stored raw: nothing is gained by compression, nothing is lost either.
    CHECK(ts.counter(Counter::stored_bytes) >= bytes.size() + small.size());
    CHECK(ts.counter(Counter::blob_raw_bytes) == bytes.size() + small.size());
}

TEST_CASE("content: compressible content is stored compressed and read back exactly", "[content]") {
    TestStore ts;
    const auto text = compressible_text(1 << 20);
    auto f = ts.put("k/kernel.ptx", text);
    auto txn = ts.read();
    auto content = KC_MUST(txn.read(f));
    CHECK(content.bytes() == text);
    CHECK(ts.counter(Counter::bytes) == text.size());
    CHECK(ts.counter(Counter::blob_raw_bytes) == text.size());
    CHECK(ts.counter(Counter::stored_bytes) > 0);
    CHECK(ts.counter(Counter::stored_bytes) < text.size() / 4);
    auto e = ts.entry("k");
    CHECK(e.bytes == text.size());
    CHECK(e.stored_bytes > 0);
    CHECK(e.stored_bytes < e.bytes);
    check_consistent(ts.store());
}

TEST_CASE(
    "content: identical files share one blob with refcounts that follow overwrite, rename, unlink",
    "[content][dedup]") {
    TestStore ts;
    const auto same = random_bytes(4096, 21);
    ts.put("k/a", same);
    const auto stored_one = ts.counter(Counter::stored_bytes);
    REQUIRE(ts.counter(Counter::blobs) == 1);
    ts.put("k/b", same);

    auto k = ts.ino("k");
    CHECK(ts.counter(Counter::blobs) == 1);
    CHECK(ts.counter(Counter::stored_bytes) == stored_one);
    CHECK(ts.counter(Counter::blob_raw_bytes) == same.size());
    CHECK(ts.counter(Counter::bytes) == 2 * same.size());
    CHECK(ts.counter(Counter::files) == 2);
    CHECK(ts.counter(Counter::dedup_hits) == 1);

    SECTION("overwriting one with other content makes two blobs") {
        ts.put("k/b", random_bytes(4096, 22));
        CHECK(ts.counter(Counter::blobs) == 2);
        CHECK(ts.get("k/a") == same);
        SECTION("and unlinking both leaves no blob and no stored bytes") {
            auto txn = ts.write();
            KC_MUST(txn.unlink(k, "a"));
            KC_MUST(txn.unlink(k, "b"));
            KC_MUST(txn.commit());
            CHECK(ts.counter(Counter::blobs) == 0);
            CHECK(ts.counter(Counter::stored_bytes) == 0);
            CHECK(ts.counter(Counter::blob_raw_bytes) == 0);
        }
    }
    SECTION("overwriting one with the same content keeps one blob") {
        ts.put("k/b", same);
        CHECK(ts.counter(Counter::blobs) == 1);
        auto txn = ts.write();
        KC_MUST(txn.unlink(k, "a"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 1);
        CHECK(ts.get("k/b") == same);
    }
    SECTION("unlinking one keeps the blob for the other") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(k, "a"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 1);
        CHECK(ts.counter(Counter::stored_bytes) == stored_one);
        CHECK(ts.get("k/b") == same);
    }
    SECTION("unlinking both leaves no blob and no stored bytes") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(k, "a"));
        KC_MUST(txn.unlink(k, "b"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 0);
        CHECK(ts.counter(Counter::stored_bytes) == 0);
        CHECK(ts.counter(Counter::blob_raw_bytes) == 0);
        CHECK(ts.counter(Counter::bytes) == 0);
        CHECK(ts.counter(Counter::files) == 0);
    }
    SECTION("renaming one keeps one blob") {
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "a", kRootIno, "elsewhere"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 1);
        CHECK(ts.get("elsewhere") == same);
    }
    SECTION("renaming one over the other drops one reference, not the blob") {
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "a", k, "b"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 1);
        CHECK(ts.counter(Counter::files) == 1);
        CHECK(ts.get("k/b") == same);
        auto t2 = ts.write();
        KC_MUST(t2.unlink(k, "b"));
        KC_MUST(t2.commit());
        CHECK(ts.counter(Counter::blobs) == 0);
        CHECK(ts.counter(Counter::stored_bytes) == 0);
    }
    SECTION("truncating one by setattr makes it a different blob") {
        auto txn = ts.write();
        KC_MUST(txn.setattr(KC_MUST(txn.resolve("k/a")), set_size(100)));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 2);
        CHECK(ts.get("k/a") == same.substr(0, 100));
        CHECK(ts.get("k/b") == same);
    }
    SECTION("removing the whole entry directory releases both references") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(k, "a"));
        KC_MUST(txn.unlink(k, "b"));
        KC_MUST(txn.rmdir(kRootIno, "k"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 0);
        CHECK(ts.counter(Counter::entries) == 0);
    }
    check_consistent(ts.store());
}

TEST_CASE("content: one blob shared by two entries is counted in each entry", "[content][dedup]") {
    TestStore ts;
    const auto same = random_bytes(4096, 31);
    ts.put("k1/kernel.cubin", same);
    ts.put("k2/kernel.cubin", same);
    CHECK(ts.counter(Counter::blobs) == 1);
    auto e1 = ts.entry("k1");
    auto e2 = ts.entry("k2");
    CHECK(e1.bytes == same.size());
    CHECK(e2.bytes == same.size());
    CHECK(e1.stored_bytes == e2.stored_bytes);
    CHECK(e1.stored_bytes == ts.counter(Counter::stored_bytes));

    SECTION("evicting one entry keeps the blob for the other") {
        auto txn = ts.write();
        KC_MUST(txn.evict_entry(e1.ino));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::blobs) == 1);
        CHECK(ts.get("k2/kernel.cubin") == same);
    }
    check_consistent(ts.store());
}

TEST_CASE("content: many writes in one transaction are accounted once each", "[content]") {
    TestStore ts;
    auto txn = ts.write();
    for (int i = 0; i < 50; ++i) {
        put(txn, "k" + std::to_string(i % 5) + "/f" + std::to_string(i),
            random_bytes(100, static_cast<std::uint64_t>(i % 10)));
    }
    KC_MUST(txn.commit());
    CHECK(ts.counter(Counter::files) == 50);
    CHECK(ts.counter(Counter::blobs) == 10);
    CHECK(ts.counter(Counter::bytes) == 5000);
    CHECK(ts.counter(Counter::entries) == 5);
    CHECK(ts.counter(Counter::stores) == 50);
    CHECK(ts.counter(Counter::bytes_written) == 5000);
    check_consistent(ts.store());
}

TEST_CASE("content: a full map fails the transaction with ENOSPC and writes nothing",
          "[content][limits]") {
    TestStore ts([](core::OpenOptions& o) { o.map_size = 2 << 20; });
    ts.put("k/small", "kept");
    auto stats_before = KC_MUST(ts.read().stats()).values;

    auto txn = ts.write();
    auto f = KC_MUST(txn.create(KC_MUST(txn.resolve("k")), "huge", 0644));
    auto written = txn.write(f.ino, random_bytes(4 << 20, 41), test_origin());
    auto committed = txn.commit();
    REQUIRE_FALSE(committed.has_value());
    CHECK(committed.error().code == ENOSPC);
    if (!written) CHECK(written.error().code == ENOSPC);

    CHECK_FALSE(ts.exists("k/huge"));
    CHECK(ts.get("k/small") == "kept");
    auto stats_after = KC_MUST(ts.read().stats()).values;
    for (auto c : {Counter::bytes, Counter::files, Counter::blobs, Counter::stored_bytes}) {
        INFO(core::counter_name(c));
        CHECK(stats_after[c] == stats_before[c]);
    }
    // The store is still usable.
    ts.put("k/after", "still works");
    CHECK(ts.get("k/after") == "still works");
    check_consistent(ts.store());
}

TEST_CASE(
    "content: has_blob and read_blob find content by digest, flat or segmented, until it is gone",
    "[content]") {
    TestStore ts;
    const std::string small = random_bytes(5000, 21);
    const std::string big = random_bytes(core::kSegmentedSize + 12345, 22);
    const std::string absent = random_bytes(5000, 23);
    ts.put("k/small.bin", small);
    ts.put("k/big.so", big);
    {
        auto txn = ts.read();
        CHECK(KC_MUST(txn.has_blob(core::digest_of(small))));
        CHECK(KC_MUST(txn.has_blob(core::digest_of(big))));
        CHECK_FALSE(KC_MUST(txn.has_blob(core::digest_of(absent))));
        CHECK(KC_MUST(txn.has_blob(core::Digest{})));  // empty content needs no blob
        CHECK(std::string(KC_MUST(txn.read_blob(core::digest_of(small), small.size())).bytes()) ==
              small);
        CHECK(std::string(KC_MUST(txn.read_blob(core::digest_of(big), big.size())).bytes()) == big);
        auto missing = txn.read_blob(core::digest_of(absent), absent.size());
        REQUIRE_FALSE(missing);
        CHECK(missing.error().code == ENOENT);
        auto wrong_size = txn.read_blob(core::digest_of(small), small.size() + 1);
        REQUIRE_FALSE(wrong_size);
        CHECK(wrong_size.error().code == EIO);
        CHECK(KC_MUST(txn.path(ts.ino("k/big.so"))) == "k/big.so");
        CHECK(KC_MUST(txn.path(kRootIno)).empty());
    }
    {
        auto txn = ts.write();
        KC_MUST(txn.unlink(ts.ino("k"), "small.bin"));
        KC_MUST(txn.commit());
    }
    CHECK_FALSE(KC_MUST(ts.read().has_blob(core::digest_of(small))));
}
