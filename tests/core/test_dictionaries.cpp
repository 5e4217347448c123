// File kinds and trained dictionaries (core/include/kcache/core/dictionaries.hpp):
// classification, training, new blobs and gc's rewrite with a dictionary, the
// lifetime of a replaced dictionary, bundles, and an older db's upgrade.
#include <lmdb.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/bundle.hpp"
#include "kcache/core/dictionaries.hpp"
#include "kcache/core/maintenance.hpp"
#include "kernel_text.hpp"
#include "records.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;

namespace {

void put_kernels(TestStore& ts, int from, int to) {
    for (int i = from; i < to; ++i) {
        ts.put(kernel_dir(i) + "/k.ptx", ptx(i));
        ts.put(kernel_dir(i) + "/k.json", metadata(i));
    }
}

core::KindStats kind(TestStore& ts, std::string_view name) {
    auto txn = ts.read();
    for (auto& k : KC_MUST(core::kind_stats(txn))) {
        if (k.name == name) return k;
    }
    FAIL("no kind " << name);
    return {};
}

core::DictionaryPolicy small_policy() {
    core::DictionaryPolicy p;
    p.min_blobs = 16;
    p.min_raw_bytes = 16 * 1024;
    return p;
}

}  // namespace

TEST_CASE("dictionaries: a file's kind is its producer and file kind, cubins by arch",
          "[dictionaries]") {
    CHECK(core::kind_name("k.ptx", core::Producer::triton, "") == "triton/ptx");
    CHECK(core::kind_name("__grp__kernel.json", core::Producer::triton, "") == "triton/group");
    CHECK(core::kind_name("kernel.json", core::Producer::triton, "") == "triton/json");
    CHECK(core::kind_name("abcR", core::Producer::ccache, "") == "ccache/other");
    // A 64-bit ELF header: e_ident[EI_ABIVERSION] at 8, e_flags at 48.
    std::string elf(64, '\0');
    elf.replace(0, 4,
                "\x7f"
                "ELF");
    elf[4] = 2;
    elf[8] = 8;      // ABI version 8: the SM number in bits 8..15
    elf[49] = 0x5a;  // sm_90
    CHECK(core::kind_name("k.cubin", core::Producer::triton, elf) == "triton/cubin-sm_90");
    elf[8] = 7;  // older ABI: bits 0..7
    elf[48] = 80;
    CHECK(core::kind_name("k.cubin", core::Producer::triton, elf) == "triton/cubin-sm_80");
    CHECK(core::kind_name("k.cubin", core::Producer::triton, "not an elf") == "triton/cubin");
}

TEST_CASE("dictionaries: blobs are counted by kind as they come and go", "[dictionaries]") {
    TestStore ts;
    put_kernels(ts, 0, 3);
    const auto p = kind(ts, "triton/ptx");
    CHECK(p.blobs == 3);
    CHECK(p.raw_bytes == ptx(0).size() + ptx(1).size() + ptx(2).size());
    CHECK(p.stored_bytes > 0);
    CHECK(p.stored_bytes < p.raw_bytes);
    CHECK(p.dictionary == 0);
    KC_MUST(ts->update([&](core::WriteTxn& txn) {
        return txn.unlink(KC_MUST(txn.resolve(kernel_dir(1))), "k.ptx");
    }));
    CHECK(kind(ts, "triton/ptx").blobs == 2);
    CHECK(kind(ts, "triton/ptx").raw_bytes == ptx(0).size() + ptx(2).size());
    CHECK(kind(ts, "triton/json").blobs == 3);
    check_consistent(ts.store());
}

TEST_CASE("dictionaries: nothing is trained before a kind has enough samples", "[dictionaries]") {
    TestStore ts;
    put_kernels(ts, 0, 5);
    CHECK_FALSE(KC_MUST(core::dictionaries_due(ts.store(), small_policy())));
    CHECK(KC_MUST(core::train_dictionaries(ts.store(), small_policy())).empty());
    CHECK(kind(ts, "triton/ptx").dictionary == 0);
}

TEST_CASE("dictionaries: a trained dictionary compresses new blobs of its kind better",
          "[dictionaries]") {
    TestStore ts, plain;
    put_kernels(ts, 0, 40);
    REQUIRE(KC_MUST(core::dictionaries_due(ts.store(), small_policy())));
    const auto trained = KC_MUST(core::train_dictionaries(ts.store(), small_policy()));
    for (const auto& t : trained)
        UNSCOPED_INFO(t.kind << ": id " << t.id << ", " << t.samples << " samples, "
                             << t.sample_bytes << " bytes, " << t.stored_without << " -> "
                             << t.stored_with << " + " << t.bytes);
    const auto ptx_kind = kind(ts, "triton/ptx");
    REQUIRE(ptx_kind.dictionary >= 32768);  // zstd's private id range
    CHECK(ptx_kind.dictionary_bytes > 0);
    bool reported = false;
    for (const auto& t : trained) {
        if (t.kind != "triton/ptx") continue;
        reported = true;
        CHECK(t.id == ptx_kind.dictionary);
        CHECK(t.stored_with < t.stored_without);
    }
    CHECK(reported);
    CHECK_FALSE(KC_MUST(core::dictionaries_due(ts.store(), small_policy())));  // until it grows

    // New kernels: smaller with the dictionary than in a store without, same bytes back.
    put_kernels(ts, 100, 110);
    put_kernels(plain, 100, 110);
    std::uint64_t with = 0, without = 0;
    for (int i = 100; i < 110; ++i) {
        with += ts.entry(kernel_dir(i)).stored_bytes;
        without += plain.entry(kernel_dir(i)).stored_bytes;
        CHECK(ts.get(kernel_dir(i) + "/k.ptx") == ptx(i));
        CHECK(ts.get(kernel_dir(i) + "/k.json") == metadata(i));
    }
    CHECK(with < without * 3 / 4);
    check_consistent(ts.store());

    // Another process (a fresh open) reads them through the dictionary from the db.
    ts.reopen();
    CHECK(ts.get(kernel_dir(105) + "/k.ptx") == ptx(105));
}

TEST_CASE("dictionaries: gc rewrites older blobs with their kind's dictionary",
          "[dictionaries][gc]") {
    TestStore ts;
    put_kernels(ts, 0, 40);
    const std::uint64_t stored_before = ts.counter(Counter::stored_bytes);
    const std::uint64_t entry_before = ts.entry(kernel_dir(7)).stored_bytes;
    auto report = KC_MUST(core::recompress_blobs(ts.store(), small_policy()));
    CHECK(report.classified == 0);  // classified when stored
    CHECK(report.rewritten > 40);
    CHECK(report.stored_after < report.stored_before);
    CHECK(ts.counter(Counter::stored_bytes) < stored_before);
    CHECK(ts.entry(kernel_dir(7)).stored_bytes < entry_before);
    for (int i = 0; i < 40; ++i) CHECK(ts.get(kernel_dir(i) + "/k.ptx") == ptx(i));
    check_consistent(ts.store());  // entries' stored bytes, kinds, dictionary users

    // Nothing left to rewrite.
    CHECK(KC_MUST(core::recompress_blobs(ts.store(), small_policy())).rewritten == 0);
}

TEST_CASE("dictionaries: a replaced dictionary stays while a blob uses it", "[dictionaries]") {
    TestStore ts;
    put_kernels(ts, 0, 40);
    KC_MUST(core::train_dictionaries(ts.store(), small_policy()));
    const std::uint32_t first = kind(ts, "triton/ptx").dictionary;
    REQUIRE(first != 0);
    put_kernels(ts, 100, 110);  // compressed with the first
    // Grow the kind four times over: due again, and the newer one replaces it.
    put_kernels(ts, 200, 400);
    KC_MUST(core::train_dictionaries(ts.store(), small_policy()));
    const auto now = kind(ts, "triton/ptx");
    REQUIRE(now.dictionary != 0);
    REQUIRE(now.dictionary != first);
    CHECK(now.dictionaries == 2);  // the first is in use
    CHECK(ts.get(kernel_dir(103) + "/k.ptx") == ptx(103));
    check_consistent(ts.store());

    // Its last users (every PTX stored after the first training) go: so does it.
    auto drop = [&](int from, int to) {
        KC_MUST(ts->update([&](core::WriteTxn& txn) -> core::Status {
            for (int i = from; i < to; ++i) {
                auto dir = KC_MUST(txn.resolve(kernel_dir(i)));
                if (auto s = txn.unlink(dir, "k.ptx"); !s) return s;
            }
            return {};
        }));
    };
    drop(100, 110);
    drop(200, 399);
    CHECK(kind(ts, "triton/ptx").dictionaries == 2);  // one user left
    CHECK(ts.get(kernel_dir(399) + "/k.ptx") == ptx(399));
    drop(399, 400);
    CHECK(kind(ts, "triton/ptx").dictionaries == 1);
    check_consistent(ts.store());
}

TEST_CASE("dictionaries: a bundle of dictionary blobs imports where the dictionary is not",
          "[dictionaries][bundle]") {
    TestStore src;
    put_kernels(src, 0, 40);
    KC_MUST(core::recompress_blobs(src.store(), small_policy()));
    REQUIRE(kind(src, "triton/ptx").dictionary != 0);
    TempDir out;
    const std::string bundle = (out / "all.kcb").string();
    KC_MUST(core::export_bundle(src.store(), {}, bundle));
    TestStore dst;
    KC_MUST(core::import_bundle(dst.store(), bundle));
    for (int i = 0; i < 40; ++i) CHECK(dst.get(kernel_dir(i) + "/k.ptx") == ptx(i));
    check_consistent(dst.store());
}

TEST_CASE("dictionaries: an older db is upgraded, and gc classifies its blobs",
          "[dictionaries][open]") {
    TempDir dir;
    const std::string db =
        copy_fixture_db(dir, std::string(KCACHE_TEST_DATA_DIR) + "/schema2/data.mdb");
    core::OpenOptions options;
    options.path = db;
    options.read_only = true;
    {  // read-only: no dicts table, nothing classified, still read
        auto store = KC_MUST(core::Store::open(options));
        auto txn = KC_MUST(store->read());
        CHECK(KC_MUST(core::kind_stats(txn)).empty());
        CHECK(KC_MUST(core::verify(*store)).ok());
    }
    options.read_only = false;
    auto store = KC_MUST(core::Store::open(options));
    auto report = KC_MUST(core::recompress_blobs(*store));
    CHECK(report.classified > 0);
    auto txn = KC_MUST(store->read());
    CHECK_FALSE(KC_MUST(core::kind_stats(txn)).empty());
    auto verified = KC_MUST(core::verify(*store));
    CHECK(verified.problems == std::vector<std::string>{});
}

TEST_CASE(
    "dictionaries: a blob whose dictionary is gone is an EIO naming it, and verify "
    "reports it",
    "[dictionaries][verify]") {
    TestStore ts;
    put_kernels(ts, 0, 40);
    KC_MUST(core::recompress_blobs(ts.store(), small_policy()));
    const std::uint32_t id = kind(ts, "triton/ptx").dictionary;
    REQUIRE(id != 0);
    ts.close();
    {  // damage: the dictionary's record goes (as a bad disk or a bad tool would do it)
        MDB_env* env = nullptr;
        REQUIRE(mdb_env_create(&env) == 0);
        mdb_env_set_maxdbs(env, 16);
        REQUIRE(mdb_env_open(env, ts.db_path().c_str(), MDB_NOTLS, 0644) == 0);
        MDB_txn* txn = nullptr;
        REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == 0);
        MDB_dbi dbi = 0;
        REQUIRE(mdb_dbi_open(txn, "dicts", 0, &dbi) == 0);
        std::string key = core::records::dictionary_key(id);
        MDB_val k{key.size(), key.data()};
        REQUIRE(mdb_del(txn, dbi, &k, nullptr) == 0);
        REQUIRE(mdb_txn_commit(txn) == 0);
        mdb_env_close(env);
    }
    ts.reopen();
    auto txn = ts.read();
    const auto read = txn.read(KC_MUST(txn.resolve(kernel_dir(3) + "/k.ptx")));
    REQUIRE(err(read) == EIO);
    CHECK_THAT(read.error().message, Catch::Contains("dictionary " + std::to_string(id)));
    // Other kinds are not affected.
    CHECK(ts.get(kernel_dir(3) + "/k.json") == metadata(3));
    const auto report = KC_MUST(core::verify(ts.store()));
    bool named = false;
    for (const auto& p : report.problems) {
        named = named ||
                p.find("dictionary " + std::to_string(id) + " is missing") != std::string::npos;
    }
    CHECK(named);
}
