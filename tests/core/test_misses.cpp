// Misses explained (core/misses.hpp): families, the classifier's four causes with their
// evidence, its settling, its counters and records, sizing from capacity misses, and the
// schema upgrade that adds its tables.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <lmdb.h>

#include "core_test_util.hpp"
#include "kcache/core/misses.hpp"

using namespace kcache;
using kcache::test::kSecond;
using kcache::test::must;
using kcache::test::TestStore;

namespace {

// A Triton cache directory name: 52 base32 letters.
std::string triton_key(char c) {
    return std::string(51, 'A') + c;
}

struct TritonKernel {
    std::string name = "add_kernel";
    int num_warps = 4;
    std::string ttir =
        "module {\n  tt.func @add_kernel() {\n    arith.constant 128 : i32\n  }\n}\n";
    std::string cubin = "ELF cubin for 4 warps";
};

// Stores a Triton entry as Triton does (its files one after another), committed.
void put_triton(TestStore& s, char key, const TritonKernel& k) {
    const std::string dir = "triton/" + triton_key(key) + "/";
    s.put(dir + k.name + ".ttir", k.ttir);
    s.put(dir + k.name + ".cubin", k.cubin);
    s.put(dir + k.name + ".json",
          fmt::format(R"({{"hash": "{}", "target": {{"backend": "cuda", "arch": 90}}, )"
                      R"("num_warps": {}, "triton_version": "3.9.0", "name": "{}"}})",
                      std::string(64, key), k.num_warps, k.name));
    s.put(dir + "__grp__" + k.name + ".json", fmt::format(R"({{"child_paths": "{}"}})", dir));
}

// Lets every entry settle and classifies; returns how many misses were classified.
std::size_t classify(TestStore& s) {
    s.clock().advance(2 * kSecond);
    std::size_t total = 0;
    for (int batch = 0; batch < 100000; ++batch) {  // batches of a few ms each
        total += must(core::classify_pending(s.store()), "classify_pending");
        if (must(core::pending_misses(s.read()), "pending") == 0) break;
    }
    return total;
}

core::Miss miss_of(TestStore& s, const std::string& name) {
    auto txn = s.read();
    auto m = must(core::find_miss(txn, name), "find_miss");
    REQUIRE(m);
    return *m;
}

std::string triton_name(char key) {
    return "triton/" + triton_key(key);
}

}  // namespace

TEST_CASE("misses: Triton's family is its metadata name, and each cause has its evidence",
          "[core][misses]") {
    TestStore s;
    TritonKernel base;
    put_triton(s, 'B', base);
    CHECK(classify(s) == 1);
    auto first = miss_of(s, triton_name('B'));
    CHECK(first.cause == core::MissCause::first);
    CHECK(first.family == "triton:add_kernel");
    CHECK(first.compared == 0);

    SECTION("another num_warps: changed key, the field side by side") {
        TritonKernel k = base;
        k.num_warps = 8;
        k.cubin = "ELF cubin for 8 warps";
        put_triton(s, 'C', k);
        CHECK(classify(s) == 1);
        auto m = miss_of(s, triton_name('C'));
        CHECK(m.cause == core::MissCause::changed_key);
        CHECK(m.compared_name == triton_name('B'));
        REQUIRE(m.fields.size() == 1);  // the key's own "hash" is not evidence
        CHECK(m.fields[0].file == "add_kernel.json");
        CHECK(m.fields[0].field == "num_warps");
        CHECK(m.fields[0].before == "4");
        CHECK(m.fields[0].after == "8");
        CHECK(s.counter(core::Counter::misses_changed_key) == 1);
    }
    SECTION("another constexpr: changed key, the first differing IR line") {
        TritonKernel k = base;
        k.ttir = "module {\n  tt.func @add_kernel() {\n    arith.constant 256 : i32\n  }\n}\n";
        k.cubin = "ELF cubin for block 256";
        put_triton(s, 'D', k);
        CHECK(classify(s) == 1);
        auto m = miss_of(s, triton_name('D'));
        CHECK(m.cause == core::MissCause::changed_key);
        CHECK(m.fields.empty());
        REQUIRE(!m.lines.empty());
        CHECK(m.lines[0].file == "add_kernel.ttir");
        CHECK(m.lines[0].line == 3);
        CHECK(m.lines[0].before == "    arith.constant 128 : i32");
        CHECK(m.lines[0].after == "    arith.constant 256 : i32");
    }
    SECTION("a new key and the same binary: unstable key") {
        put_triton(s, 'E', base);  // only the hash differs (a comment changed the key)
        CHECK(classify(s) == 1);
        auto m = miss_of(s, triton_name('E'));
        CHECK(m.cause == core::MissCause::unstable_key);
        CHECK(m.same_binary == "add_kernel.cubin");
        CHECK(m.compared_name == triton_name('B'));
        CHECK(m.fields.empty());
        CHECK(m.lines.empty());
        CHECK(!m.note.empty());
        CHECK(s.counter(core::Counter::misses_unstable_key) == 1);
    }
    SECTION("another kernel: first") {
        TritonKernel k = base;
        k.name = "softmax_kernel";
        put_triton(s, 'F', k);
        CHECK(classify(s) == 1);
        auto m = miss_of(s, triton_name('F'));
        CHECK(m.cause == core::MissCause::first);
        CHECK(m.family == "triton:softmax_kernel");
        CHECK(s.counter(core::Counter::misses_first) == 2);
    }
    SECTION("compared with the closest of the family") {
        TritonKernel k8 = base;
        k8.num_warps = 8;
        k8.cubin = "8";
        put_triton(s, 'G', k8);
        TritonKernel k8b = k8;
        k8b.ttir += "// more\n";
        k8b.cubin = "8b";
        put_triton(s, 'H', k8b);
        CHECK(classify(s) == 2);
        auto m = miss_of(s, triton_name('H'));
        CHECK(m.cause == core::MissCause::changed_key);
        CHECK(m.compared_name == triton_name('G'));  // one line differs, not a field too
        CHECK(m.fields.empty());
    }
    SECTION("a member whose fields are the same is closer than one fewer lines apart") {
        // As Triton's real output: BLOCK 256 at 4 warps is a few lines further from the
        // 4-warp base than from the 8-warp entry (258 against 259 lines plus the field).
        TritonKernel k8 = base;
        k8.num_warps = 8;
        k8.ttir += "// one\n// two\n";
        k8.cubin = "8 warps";
        put_triton(s, 'G', k8);
        TritonKernel k4 = base;
        k4.ttir += "// one\n// two\n// three\n";
        k4.cubin = "4 warps, 3 lines more";
        put_triton(s, 'H', k4);
        CHECK(classify(s) == 2);
        auto m = miss_of(s, triton_name('H'));
        CHECK(m.cause == core::MissCause::changed_key);
        CHECK(m.compared_name == triton_name('B'));  // 3 lines, against 1 line and a field
        CHECK(m.fields.empty());
    }
}

TEST_CASE("misses: an evicted entry compiled again is a capacity miss, with when and why",
          "[core][misses]") {
    TestStore s;
    TritonKernel a;
    put_triton(s, 'B', a);
    TritonKernel other = a;
    other.name = "mul_kernel";
    put_triton(s, 'C', other);
    CHECK(classify(s) == 2);
    const std::int64_t evicted_at = s.clock().now();
    const auto victim = s.entry(triton_name('B')).ino;
    must(s->update([&](core::WriteTxn& txn) { return txn.evict_entry(victim); }), "evict");
    s.clock().advance(kSecond);
    put_triton(s, 'B', a);
    CHECK(classify(s) == 1);
    auto m = miss_of(s, triton_name('B'));
    CHECK(m.cause == core::MissCause::capacity);
    CHECK(m.gone_ns == evicted_at);
    CHECK(m.gone_why.starts_with("evicted"));
    // Its own bytes and mul_kernel's, used after it and before its eviction.
    CHECK(m.stack_distance == m.stored_bytes + s.entry(triton_name('C')).stored_bytes);
    CHECK(s.counter(core::Counter::misses_capacity) == 1);

    auto sizing = must(core::capacity_sizing(s.read(), 0), "sizing");
    CHECK(sizing.misses == 3);
    CHECK(sizing.capacity == 1);
    CHECK(sizing.avoid_all == m.stack_distance);
    REQUIRE(!sizing.curve.empty());
    for (const auto& p : sizing.curve) CHECK(p.capacity_misses == (p.bytes < m.stack_distance));

    // The eviction was consumed: compiled again after a plain removal, it is not one.
    std::vector<std::string> names;
    auto txn = s.read();
    must(core::for_each_miss(txn, 0,
                             [&](const core::Miss& x) {
                                 names.push_back(x.name);
                                 return true;
                             }),
         "for_each_miss");
    CHECK(names == std::vector<std::string>{triton_name('B'), triton_name('C'), triton_name('B')});
}

TEST_CASE("misses: JAX's family is the jit_<function> prefix of its key", "[core][misses]") {
    TestStore s;
    const std::string k1 =
        "jit_scaled-5a16466f1b070e09f576d3821eb7327a258d88e2d0ab97cb1462702f8535e6f6";
    const std::string k2 =
        "jit_scaled-eb4383dd54de8369960437f16efb8a02ad20fd210cc1ffe7020c6643493a2b07";
    s.put("jax/" + k1 + "-cache", "executable with constant 2");
    s.put("jax/" + k1 + "-atime", "1");
    CHECK(classify(s) == 1);
    s.put("jax/" + k2 + "-cache", "executable with constant 3");
    s.put("jax/" + k2 + "-atime", "2");
    CHECK(classify(s) == 1);
    auto m = miss_of(s, "jax/" + k2);
    CHECK(m.family == "jax:jit_scaled");
    CHECK(m.cause == core::MissCause::changed_key);
    CHECK(m.compared_name == "jax/" + k1);
    REQUIRE(m.lines.size() == 1);  // the -atime file is no evidence
    CHECK(m.lines[0].file == "{key}-cache");
    CHECK(m.lines[0].after.find("first difference at byte 25") != std::string::npos);
    CHECK(miss_of(s, "jax/" + k1).cause == core::MissCause::first);
}

TEST_CASE("misses: a miss is classified once its entry settled, and once", "[core][misses]") {
    TestStore s;
    s.put("triton/" + triton_key('B') + "/add_kernel.ttir", "module");
    s.clock().advance(kSecond / 10);
    CHECK(must(core::classify_pending(s.store()), "classify") == 0);  // still being written
    CHECK(must(core::pending_misses(s.read()), "pending") == 1);
    s.put("triton/" + triton_key('B') + "/add_kernel.json",
          R"({"name": "add_kernel", "num_warps": 4})");
    s.clock().advance(kSecond / 2);
    CHECK(must(core::classify_pending(s.store()), "classify") == 0);  // the last file reset it
    CHECK(classify(s) == 1);
    CHECK(classify(s) == 0);
    CHECK(must(core::pending_misses(s.read()), "pending") == 0);
    CHECK(miss_of(s, triton_name('B')).family == "triton:add_kernel");  // all files seen
    CHECK(s.counter(core::Counter::misses_first) == 1);
}

TEST_CASE("misses: a read-only store classifies nothing and lists what is kept", "[core][misses]") {
    TestStore s;
    put_triton(s, 'B', TritonKernel{});
    s.clock().advance(2 * kSecond);
    core::OpenOptions ro = s.options();
    ro.read_only = true;
    s.close();
    auto reader = must(core::Store::open(ro), "open read-only");
    CHECK(must(core::classify_pending(*reader), "classify") == 0);
    reader.reset();
    s.reopen();
    CHECK(classify(s) == 1);
}

TEST_CASE("misses: a schema-2 db gets the tables when opened for writing", "[core][misses]") {
    kcache::test::TempDir dir;
    const std::string db =
        kcache::test::copy_fixture_db(dir, std::string(KCACHE_TEST_DATA_DIR) + "/schema2/data.mdb");
    core::OpenOptions options;
    options.path = db;
    options.create = false;
    {
        options.read_only = true;
        auto ro = must(core::Store::open(options), "open read-only");
        auto txn = must(ro->read(), "read");
        std::size_t n = 0;
        must(core::for_each_miss(txn, 0,
                                 [&](const core::Miss&) {
                                     ++n;
                                     return true;
                                 }),
             "for_each_miss without the tables");
        CHECK(n == 0);
    }
    options.read_only = false;
    auto store = must(core::Store::open(options), "open for writing");
    // Its existing populate events are classified (no settling needed: long ago).
    CHECK(must(core::classify_pending(*store), "classify") >= 1);
}

TEST_CASE("misses: the families of evicted entries do not pile up", "[core][misses]") {
    TestStore s([](core::OpenOptions& o) { o.durability = core::Durability::none; });
    // 1100 kernels of their own families, classified, then all evicted: their rows in
    // the families table outnumber the entries left, and the next batch drops them.
    for (int i = 0; i < 1100; ++i) {
        s.put(fmt::format("kcache/k{:015d}x/kernel.json", i),
              fmt::format(R"({{"kernel": "kernel_{}"}})", i));
    }
    CHECK(classify(s) == 1100);
    CHECK(must(core::miss_tables(s.read()), "sizes").families == 1100);
    core::EvictRequest all;
    all.max_entries = 0;
    CHECK(must(s->evict(all), "evict all").entries == 1100);
    s.put("kcache/k999999999999999x/kernel.json", R"({"kernel": "kernel_0"})");
    CHECK(classify(s) == 1);
    auto sizes = must(core::miss_tables(s.read()), "sizes");
    CHECK(sizes.families == 1);  // kernel_0's row of the gone entry went with its miss
    CHECK(sizes.misses == 1101);
    CHECK(sizes.evictions == 1100);
}

TEST_CASE("misses: Wave's family is its kernel_info func_name, files compared by role",
          "[core][misses]") {
    // Wave names every file of an entry after the entry's hash: compared as "{key}...".
    TestStore s;
    auto put_wave = [&](const std::string& key, const std::string& blocks) {
        const std::string dir = "wave/" + key + "/" + key;
        s.put(dir + ".kernel_info.json",
              R"({"blocks": )" + blocks +
                  R"(, "cluster_dims": [0, 0, 0], "shared_memory_bytes": 9216, )"
                  R"j("func_name": "gemm", "grid_str": "lambda _0: (lambda : ([8, 4, 1]))()"})j");
        s.put(dir + ".json", R"(["INPUT", "INPUT", "OUTPUT"])");
        s.put(dir + ".mlir", "module {\n  func.func @gemm() {\n  }\n}\n");
        s.put(dir + ".vmfb", "vmfb for blocks " + blocks);
    };
    const std::string a = "1c3e6cc647c31401d6c096f0c31f7a78961d291cd6eca53ee0d278c8d4e955ef";
    const std::string b = "45eab410166fafe53539ef0dfb9e6a5eabe3ac9d4baa8bb8fafbc430fb730818";
    put_wave(a, "[128, 2, 1]");
    CHECK(classify(s) == 1);
    put_wave(b, "[256, 1, 1]");
    CHECK(classify(s) == 1);
    auto m = miss_of(s, "wave/" + b);
    CHECK(m.family == "wave:gemm");
    CHECK(m.cause == core::MissCause::changed_key);
    CHECK(m.compared_name == "wave/" + a);
    REQUIRE(m.fields.size() == 1);
    CHECK(m.fields[0].file == "{key}.kernel_info.json");
    CHECK(m.fields[0].field == "blocks");
    CHECK(m.fields[0].before == "[128,2,1]");
    CHECK(m.fields[0].after == "[256,1,1]");
    REQUIRE(m.lines.size() == 1);
    CHECK(m.lines[0].file == "{key}.vmfb");  // the same .json and .mlir: no lines
}

TEST_CASE("misses: entry names and families longer than an LMDB key are classified too",
          "[core][misses]") {
    TestStore s;
    std::string dir;
    for (int i = 0; i < 70; ++i) dir += "triton/";  // containers: a 490-byte entry name
    const std::string name = dir + triton_key('B');
    const std::string family(600, 'k');  // a kernel name past LMDB's 511-byte keys
    auto put = [&] { s.put(name + "/k.json", R"({"num_warps": 4, "name": ")" + family + R"("})"); };
    put();
    CHECK(classify(s) == 1);
    CHECK(miss_of(s, name).family == "triton:" + family);
    const auto victim = s.entry(name).ino;
    must(s->update([&](core::WriteTxn& txn) { return txn.evict_entry(victim); }), "evict");
    put();
    CHECK(classify(s) == 1);
    CHECK(miss_of(s, name).cause == core::MissCause::capacity);
}

// ---- across nodes: family members (another node's entries, from the shared tier) -----

namespace {

core::FamilyMember member_of(TestStore& s, const std::string& name, const std::string& host,
                             std::int64_t time_ns) {
    auto txn = s.read();
    auto m = must(core::family_member(txn, s.entry(name)), "family_member");
    REQUIRE(m);
    m->host = host;
    m->time_ns = time_ns;
    return *m;
}

std::uint64_t seq_of(TestStore& s, const std::string& name) {
    return miss_of(s, name).seq;
}

}  // namespace

TEST_CASE("misses: another node's family member explains a first miss", "[core][misses]") {
    TestStore a;  // node A: the kernel as first compiled
    TritonKernel base;
    put_triton(a, 'B', base);
    const core::FamilyMember from_a = member_of(a, triton_name('B'), "node-a", 100);
    CHECK(from_a.family == "triton:add_kernel");
    CHECK(from_a.files.size() == 3);  // the group file is skipped

    TestStore b;  // node B: none of the family here
    SECTION("num_warps 4 -> 8: changed key, the field named, node and namespace kept") {
        TritonKernel k = base;
        k.num_warps = 8;
        k.cubin = "ELF cubin for 8 warps";
        put_triton(b, 'C', k);
        CHECK(classify(b) == 1);
        CHECK(miss_of(b, triton_name('C')).cause == core::MissCause::first);
        CHECK(must(
            core::explain_with_members(b.store(), seq_of(b, triton_name('C')), {from_a}, "fleet"),
            "explain"));
        auto m = miss_of(b, triton_name('C'));
        CHECK(m.cause == core::MissCause::changed_key);
        CHECK(m.compared_name == triton_name('B'));
        CHECK(m.compared == 0);
        CHECK(m.compared_host == "node-a");
        CHECK(m.compared_namespace == "fleet");
        REQUIRE(m.fields.size() == 1);
        CHECK(m.fields[0].field == "num_warps");
        CHECK(m.fields[0].before == "4");
        CHECK(m.fields[0].after == "8");
        CHECK(b.counter(core::Counter::misses_first) == 0);
        CHECK(b.counter(core::Counter::misses_changed_key) == 1);
        // Once: it is no longer first.
        CHECK(!must(core::explain_with_members(b.store(), m.seq, {from_a}, "fleet"), "again"));
        CHECK(b.counter(core::Counter::misses_changed_key) == 1);
        CHECK(must(core::first_misses(b.read(), 0, 10), "first_misses").empty());
    }
    SECTION("the same binary: unstable key") {
        put_triton(b, 'E', base);
        CHECK(classify(b) == 1);
        CHECK(must(
            core::explain_with_members(b.store(), seq_of(b, triton_name('E')), {from_a}, "fleet"),
            "explain"));
        auto m = miss_of(b, triton_name('E'));
        CHECK(m.cause == core::MissCause::unstable_key);
        CHECK(m.same_binary == "add_kernel.cubin");
        CHECK(b.counter(core::Counter::misses_unstable_key) == 1);
    }
    SECTION("another family, or the entry's own name, explains nothing") {
        TritonKernel k = base;
        k.num_warps = 8;
        k.cubin = "x";
        put_triton(b, 'B', k);  // B's own entry of the name A pushed
        TritonKernel other = base;
        other.name = "softmax_kernel";
        put_triton(b, 'F', other);
        CHECK(classify(b) == 2);
        const auto firsts = must(core::first_misses(b.read(), 0, 10), "first_misses");
        CHECK(firsts.size() == 2);
        for (const auto& m : firsts) {
            CHECK(
                !must(core::explain_with_members(b.store(), m.seq, {from_a}, "fleet"), "explain"));
        }
        CHECK(b.counter(core::Counter::misses_first) == 2);
    }
}

TEST_CASE("misses: a family member holds the first lines of a long IR, and compares them",
          "[core][misses]") {
    std::string ttir;
    for (int i = 0; i < 400; ++i) ttir += fmt::format("  %{} = arith.addi %a, %b : i32\n", i);
    TestStore a;
    TritonKernel base;
    base.ttir = ttir;
    put_triton(a, 'B', base);
    const auto from_a = member_of(a, triton_name('B'), "node-a", 1);
    const core::MemberFile* ir = nullptr;
    for (const auto& f : from_a.files) {
        if (f.path == "add_kernel.ttir") ir = &f;
    }
    REQUIRE(ir);
    CHECK(!ir->whole);
    CHECK(ir->size == ttir.size());
    CHECK(ir->text.size() <= core::kMemberTextBytes);
    CHECK(ir->text.ends_with("\n"));
    CHECK(ttir.starts_with(ir->text));

    TestStore b;
    TritonKernel k = base;
    k.cubin = "another cubin";
    SECTION("a difference in the lines held: that line") {
        k.ttir.replace(k.ttir.find("%3 ="), 4, "%3 ~");
        put_triton(b, 'C', k);
        CHECK(classify(b) == 1);
        CHECK(
            must(core::explain_with_members(b.store(), seq_of(b, triton_name('C')), {from_a}, "n"),
                 "explain"));
        auto m = miss_of(b, triton_name('C'));
        REQUIRE(!m.lines.empty());
        CHECK(m.lines[0].file == "add_kernel.ttir");
        CHECK(m.lines[0].line == 4);
    }
    SECTION("a difference past them: the file named, the lines held the same") {
        k.ttir += "  tt.return\n";
        put_triton(b, 'C', k);
        CHECK(classify(b) == 1);
        CHECK(
            must(core::explain_with_members(b.store(), seq_of(b, triton_name('C')), {from_a}, "n"),
                 "explain"));
        auto m = miss_of(b, triton_name('C'));
        REQUIRE(!m.lines.empty());
        CHECK(m.lines[0].file == "add_kernel.ttir");
        CHECK(m.lines[0].line == 0);
        CHECK(m.lines[0].after.find("lines the same") != std::string::npos);
    }
}

TEST_CASE("misses: records of format 1 (before nodes were named) still decode", "[core][misses]") {
    TestStore s;
    put_triton(s, 'B', TritonKernel{});
    CHECK(classify(s) == 1);
    s.close();
    {  // rewrite the record as format 1 wrote it: no node, no namespace
        MDB_env* env = nullptr;
        REQUIRE(mdb_env_create(&env) == 0);
        mdb_env_set_maxdbs(env, 32);
        REQUIRE(mdb_env_open(env, s.db_path().c_str(), MDB_NOTLS, 0644) == 0);
        MDB_txn* txn = nullptr;
        REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == 0);
        MDB_dbi dbi = 0;
        REQUIRE(mdb_dbi_open(txn, "misses", 0, &dbi) == 0);
        MDB_cursor* cursor = nullptr;
        REQUIRE(mdb_cursor_open(txn, dbi, &cursor) == 0);
        MDB_val k{}, v{};
        REQUIRE(mdb_cursor_get(cursor, &k, &v, MDB_FIRST) == 0);
        std::string key(static_cast<const char*>(k.mv_data), k.mv_size);
        std::string value(static_cast<const char*>(v.mv_data), v.mv_size);
        mdb_cursor_close(cursor);
        REQUIRE(value[0] == 2);
        REQUIRE(value.ends_with(std::string(4, '\0')));  // two empty str16
        value[0] = 1;
        value.resize(value.size() - 4);
        MDB_val k2{key.size(), key.data()}, v2{value.size(), value.data()};
        REQUIRE(mdb_put(txn, dbi, &k2, &v2, 0) == 0);
        REQUIRE(mdb_txn_commit(txn) == 0);
        mdb_env_close(env);
    }
    s.reopen();
    auto m = miss_of(s, triton_name('B'));
    CHECK(m.cause == core::MissCause::first);
    CHECK(m.family == "triton:add_kernel");
    CHECK(m.compared_host.empty());
    CHECK(m.compared_namespace.empty());
}
