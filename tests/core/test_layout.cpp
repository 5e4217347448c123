// Layouts (issue 10): entries follow each compiler's own layout at any depth, several
// compilers in one cache; bookkeeping never counts; a file renamed into place
// populates its entry once; a schema-1 db keeps working.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/bundle.hpp"
#include "kcache/core/layout.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::EntryKind;
using core::FileType;
using core::Placement;
using core::Producer;
using Names = std::vector<std::string>;

namespace {

const std::string kTritonKey =
    "KZ5XLZ3ZQ2UGDPZ7CLCXEQMBVIV4ONPTEEPSDC5X63IAPWQU4HAQ";  // base32, 52
const std::string kHex = "0f3c6e8a1b2d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";

core::Classified classify_path(const std::vector<std::string_view>& ancestors,
                               std::string_view name, FileType type,
                               std::uint32_t entry_depth = 1) {
    core::LayoutContext context;
    context.ancestors = ancestors;
    context.entry_depth = entry_depth;
    return core::classify(context, name, type);
}

void rename(TestStore& ts, const std::string& from, const std::string& to) {
    auto txn = ts.write();
    const auto split = [&](const std::string& path) {
        const auto slash = path.rfind('/');
        return std::pair{
            KC_MUST(txn.resolve(slash == std::string::npos ? "" : path.substr(0, slash))),
            path.substr(slash == std::string::npos ? 0 : slash + 1)};
    };
    auto [from_dir, from_name] = split(from);
    auto [to_dir, to_name] = split(to);
    const core::Origin origin = test_origin();
    KC_MUST(txn.rename(from_dir, from_name, to_dir, to_name, 0, &origin));
    KC_MUST(txn.commit());
}

void evict(TestStore& ts, const std::string& name) {
    auto txn = ts.write();
    const core::EntryInfo entry = KC_MUST(txn.find_entry(name));
    KC_MUST(txn.evict_entry(entry.ino));
    KC_MUST(txn.commit());
}

Names sorted_entry_names(TestStore& ts) {
    Names names = ts.entry_names();
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace

TEST_CASE("layout: names classify as each compiler lays its cache out", "[layout]") {
    using D = FileType;
    CHECK(classify_path({}, "triton", D::directory).placement == Placement::container);
    auto triton = classify_path({"triton"}, kTritonKey, D::directory);
    CHECK(triton.placement == Placement::entry_dir);
    CHECK(triton.producer == Producer::triton);
    CHECK(triton.by_rule);
    auto fx = classify_path({"inductor", "fxgraph", "ab"},
                            "fabcdefgh2345abcdefgh2345abcdefgh2345abcdefgh2345abc", D::directory);
    CHECK(fx.placement == Placement::entry_dir);
    CHECK(fx.producer == Producer::inductor);
    CHECK(classify_path({"inductor"}, "ab", D::directory).placement == Placement::container);
    CHECK(classify_path({"inductor", "triton"}, "0", D::directory).placement ==
          Placement::container);

    auto module = classify_path(
        {"inductor", "ab"}, "cabqzt5c2xyzpl3mnk7rrwv6q2d4h7j2y5k3l6m4n2p7q3r5s6t7u.py", D::regular);
    CHECK(module.placement == Placement::entry_stem);
    CHECK(module.stem == "cabqzt5c2xyzpl3mnk7rrwv6q2d4h7j2y5k3l6m4n2p7q3r5s6t7u");
    CHECK(module.producer == Producer::inductor);

    auto jax_cache = classify_path({"jax"}, "jit_f-" + kHex + "-cache", D::regular);
    auto jax_atime = classify_path({"jax"}, "jit_f-" + kHex + "-atime", D::regular);
    CHECK(jax_cache.placement == Placement::entry_stem);
    CHECK(jax_cache.stem == "jit_f-" + kHex);
    CHECK(jax_atime.stem == jax_cache.stem);
    CHECK(jax_cache.producer == Producer::jax);

    auto ccache =
        classify_path({"ccache", "a", "b"}, "c9a5f1c2b3d4e5f60718293a4b5c6d7eR", D::regular);
    CHECK(ccache.placement == Placement::entry_stem);
    CHECK(ccache.producer == Producer::ccache);
    CHECK(classify_path({"cute"}, "cutlass_" + kHex + ".mlir", D::regular).producer ==
          Producer::cutedsl);
    CHECK(classify_path({"helion"}, kHex + ".best_config", D::regular).producer ==
          Producer::helion);

    for (const char* name :
         {".lockfile", "locks", "lock", "tmp", "stats", "ccache.conf", "CACHEDIR.TAG",
          "tmpa1b2c3d4", "x.json.tmp.pid_12_34", ".1234.5678.tmp", "k.lock", "__pycache__",
          "c9a5f1c2b3d4e5f60718293a4b5c6d7eR.Xy12ab.tmp", "_temp_jit_f-0f3c6e8a1b2d4c5e6f70-cache",
          "cache-v1.sqlite3-journal", "cache-v1.sqlite3-wal", "cache-v1.sqlite3-shm",
          "cxqzl4w7rq2u5c5gqk3zj7bd6m2yqg3jv7x4u6h2xw5b3i2n5b4c_CxxBuild"}) {
        INFO(name);
        CHECK(core::is_bookkeeping_name(name));
        CHECK(classify_path({"jax"}, name, D::regular).placement == Placement::bookkeeping);
    }
    CHECK_FALSE(core::is_bookkeeping_name("kernel.tmpl"));
    CHECK_FALSE(core::is_bookkeeping_name("kernel.cubin"));

    // The depth fallback: an unknown directory at the entry depth is an entry, a file
    // outside every entry is one of its own, nothing forms above the entry depth.
    auto plain = classify_path({}, "myproject", D::directory);
    CHECK(plain.placement == Placement::entry_dir);
    CHECK_FALSE(plain.by_rule);
    CHECK(classify_path({}, "ab", D::directory).placement ==
          Placement::entry_dir);  // short, at the top
    CHECK(classify_path({}, "myproject", D::directory, 2).placement == Placement::container);
    auto loose = classify_path({"triton"}, "cache-v1.sqlite3", D::regular);
    CHECK(loose.placement == Placement::entry_stem);
    CHECK(loose.stem == "cache-v1.sqlite3");
    CHECK_FALSE(loose.by_rule);
}

TEST_CASE("layout: several compilers in one cache, one entry per kernel at any depth", "[layout]") {
    TestStore ts;
    // Triton, on its own and inside Inductor's tree.
    ts.put("triton/" + kTritonKey + "/add.cubin", "cubin");
    ts.put("triton/" + kTritonKey + "/add.json", "{}");
    ts.put("inductor/triton/0/" + kTritonKey + "/add.cubin", "cubin2");
    // Inductor: an FX graph, a generated module of three files, locks.
    const std::string fx = "fq3h5k7m2n4p6r2s4t6v2w4x6y2z4a6b2c4d6e2f4g6h2j4k6m2n4p6";
    ts.put("inductor/fxgraph/q3/" + fx + "/entry", "graph");
    const std::string stem = "cq3h5k7m2n4p6r2s4t6v2w4x6y2z4a6b2c4d6e2f4g6h2j4k6m2n4p7";
    ts.put("inductor/q3/" + stem + ".py", "py");
    ts.put("inductor/q3/" + stem + ".cpp", "cpp");
    ts.put("inductor/q3/" + stem + ".so", "so");
    ts.put("inductor/locks/" + stem + ".lock", "");
    // JAX: a pair, and its lock file.
    const std::string key = "jit_f-" + kHex;
    ts.put("jax/" + key + "-cache", "executable");
    ts.put("jax/" + key + "-atime", "12345678");
    ts.put("jax/.lockfile", "");
    // ccache: a result and a manifest, its bookkeeping.
    ts.put("ccache/a/b/c9a5f1c2b3d4e5f60718293a4b5c6d7eR", "result");
    ts.put("ccache/a/b/d1a5f1c2b3d4e5f60718293a4b5c6d7eM", "manifest");
    ts.put("ccache/a/stats", "1 2 3");
    ts.put("ccache/ccache.conf", "max_size = 1G");
    ts.put("ccache/CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55");
    ts.put("ccache/tmp/tmp.cpp_stdout.abc", "x");

    CHECK(sorted_entry_names(ts) == Names{"ccache/a/b/c9a5f1c2b3d4e5f60718293a4b5c6d7eR",
                                          "ccache/a/b/d1a5f1c2b3d4e5f60718293a4b5c6d7eM",
                                          "inductor/fxgraph/q3/" + fx, "inductor/q3/" + stem,
                                          "inductor/triton/0/" + kTritonKey, "jax/" + key,
                                          "triton/" + kTritonKey});
    CHECK(ts.entry("triton/" + kTritonKey).producer == Producer::triton);
    CHECK(ts.entry("inductor/triton/0/" + kTritonKey).producer == Producer::triton);
    CHECK(ts.entry("inductor/fxgraph/q3/" + fx).producer == Producer::inductor);
    const core::EntryInfo module = ts.entry("inductor/q3/" + stem);
    CHECK(module.kind == EntryKind::stem);
    CHECK(module.files == 3);
    CHECK(module.producer == Producer::inductor);
    const core::EntryInfo pair = ts.entry("jax/" + key);
    CHECK(pair.files == 2);
    CHECK(pair.producer == Producer::jax);
    CHECK(ts.entry("ccache/a/b/c9a5f1c2b3d4e5f60718293a4b5c6d7eR").producer == Producer::ccache);
    // One miss per entry; bookkeeping counts none.
    CHECK(ts.counter(Counter::misses) == 7);
    CHECK(ts.counter(Counter::entries) == 7);
    CHECK_FALSE(ts.attr("jax/.lockfile").entry);
    CHECK(ts.attr("jax/.lockfile").bookkeeping);
    check_consistent(ts.store());

    // The files of a stem entry, in name order.
    Names files;
    {
        auto txn = ts.read();
        KC_MUST(txn.for_each_entry_file(pair, [&](const core::EntryFile& f) {
            files.push_back(f.path);
            return true;
        }));
    }
    CHECK(files == Names{key + "-atime", key + "-cache"});

    // Eviction takes a whole entry: both halves of JAX's pair, never one.
    evict(ts, "jax/" + key);
    CHECK_FALSE(ts.exists("jax/" + key + "-cache"));
    CHECK_FALSE(ts.exists("jax/" + key + "-atime"));
    CHECK(ts.exists("jax/.lockfile"));
    evict(ts, "inductor/q3/" + stem);
    CHECK(ts.children("inductor/q3").empty());
    CHECK(ts.counter(Counter::entries) == 5);
    CHECK(ts.counter(Counter::evicted_entries) == 2);
    check_consistent(ts.store());
}

TEST_CASE("layout: a file renamed into place populates its entry once", "[layout]") {
    TestStore ts;
    SECTION("Triton: a temp file inside the kernel's directory") {
        ts.put("triton/" + kTritonKey + "/add.json.tmp.pid_7_1", "{}");
        CHECK(ts.counter(Counter::misses) == 0);
        CHECK_FALSE(ts.entry("triton/" + kTritonKey).populated);
        rename(ts, "triton/" + kTritonKey + "/add.json.tmp.pid_7_1",
               "triton/" + kTritonKey + "/add.json");
        CHECK(ts.counter(Counter::misses) == 1);
        const auto entry = ts.entry("triton/" + kTritonKey);
        CHECK(entry.populated);
        CHECK(entry.populated_by_pid == test_origin().pid);
        // A racing duplicate store of the same file: no second miss.
        ts.put("triton/" + kTritonKey + "/add.json.tmp.pid_8_1", "{}");
        rename(ts, "triton/" + kTritonKey + "/add.json.tmp.pid_8_1",
               "triton/" + kTritonKey + "/add.json");
        CHECK(ts.counter(Counter::misses) == 1);
    }
    SECTION("CuTe DSL: up from a temp directory at the top of its cache") {
        const std::string name = "cutlass_" + kHex + ".mlir";
        ts.put("cute/tmpk2j3h4g5/" + name, "module {}");
        CHECK(ts.counter(Counter::misses) == 0);
        CHECK(ts.counter(Counter::entries) == 0);
        rename(ts, "cute/tmpk2j3h4g5/" + name, "cute/" + name);
        CHECK(ts.counter(Counter::misses) == 1);
        const auto entry = ts.entry("cute/cutlass_" + kHex);
        CHECK(entry.populated);
        CHECK(entry.producer == Producer::cutedsl);
    }
    SECTION("Helion: racing temp files renamed onto the final name") {
        const std::string final_name = "helion/" + kHex + ".best_config";
        for (int i = 0; i < 5; ++i) {
            const std::string tmp = "helion/tmp" + std::to_string(1000 + i);
            ts.put(tmp, "config " + std::to_string(i));
            rename(ts, tmp, final_name);
        }
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.counter(Counter::entries) == 1);
        CHECK(ts.entry("helion/" + kHex).files == 1);
        CHECK(ts.get(final_name) == "config 4");
    }
    SECTION("Inductor: a directory published by rename") {
        const std::string fx = "fq3h5k7m2n4p6r2s4t6v2w4x6y2z4a6b2c4d6e2f4g6h2j4k6m2n4p6";
        ts.put("inductor/fxgraph/q3/tmpabcdef12/entry", "graph");
        CHECK(ts.counter(Counter::misses) == 0);
        rename(ts, "inductor/fxgraph/q3/tmpabcdef12", "inductor/fxgraph/q3/" + fx);
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.entry("inductor/fxgraph/q3/" + fx).files == 1);
    }
    check_consistent(ts.store());
}

TEST_CASE("layout: an unknown directory that turns out to hold a compiler's cache dissolves",
          "[layout]") {
    TestStore ts;
    ts.put("my-triton-cache/.lock", "");
    CHECK(sorted_entry_names(ts) == Names{"my-triton-cache"});  // the depth fallback, for now
    ts.put("my-triton-cache/" + kTritonKey + "/add.cubin", "cubin");
    ts.put("my-triton-cache/" + kTritonKey + "/add.json", "{}");
    CHECK(sorted_entry_names(ts) == Names{"my-triton-cache/" + kTritonKey});
    CHECK(ts.entry("my-triton-cache/" + kTritonKey).files == 2);
    // A plain project tree stays one entry.
    ts.put("project/src/a.txt", "a");
    ts.put("project/src/b.txt", "b");
    CHECK(ts.entry("project").files == 2);
    check_consistent(ts.store());
}

TEST_CASE("layout: stem entries travel in bundles at any depth", "[layout][bundle]") {
    TestStore from;
    const std::string key = "jit_f-" + kHex;
    from.put("jax/" + key + "-cache", "executable");
    from.put("jax/" + key + "-atime", "1");
    from.put("triton/" + kTritonKey + "/add.cubin", "cubin");
    const std::string bundle = from.dir().str() + "/b.kcb";
    KC_MUST(core::export_bundle(from.store(), {}, bundle));
    TestStore to;
    const auto report = KC_MUST(core::import_bundle(to.store(), bundle, false));
    CHECK(report.entries_added == 2);
    CHECK(to.get("jax/" + key + "-cache") == "executable");
    CHECK(to.get("jax/" + key + "-atime") == "1");
    CHECK(to.entry("jax/" + key).files == 2);
    CHECK(to.entry("triton/" + kTritonKey).files == 1);
    check_consistent(to.store());
}

TEST_CASE("layout: a schema-1 db opens, keeps its entries and takes stem entries",
          "[layout][open]") {
    TempDir dir;
    const std::string db =
        copy_fixture_db(dir, std::string(KCACHE_TEST_DATA_DIR) + "/schema1/data.mdb");
    {  // read-only first: nothing is upgraded, everything reads
        core::OpenOptions options;
        options.path = db;
        options.read_only = true;
        auto store = KC_MUST(core::Store::open(options));
        auto txn = KC_MUST(store->read());
        CHECK(KC_MUST(txn.find_entry("plain")).files == 1);
        CHECK(KC_MUST(txn.find_entry("top.bin")).files == 1);
    }
    core::OpenOptions options;
    options.path = db;
    auto store = KC_MUST(core::Store::open(options));
    {
        auto txn = KC_MUST(store->read());
        const auto kernel = KC_MUST(txn.find_entry("0123456789abcdef0123456789abcdef"));
        CHECK(kernel.files == 2);
        CHECK(kernel.kind == EntryKind::node);
        const auto top = KC_MUST(txn.find_entry("top.bin"));
        Names files;
        KC_MUST(txn.for_each_entry_file(top, [&](const core::EntryFile& f) {
            files.push_back(f.path);
            return true;
        }));
        CHECK(files == Names{"top.bin"});
    }
    {
        auto txn = KC_MUST(store->write());
        const auto jax = KC_MUST(txn.mkdir(core::kRootIno, "jax", 0755));
        const auto file = KC_MUST(txn.create(jax.ino, "jit_g-" + kHex + "-cache", 0644));
        KC_MUST(txn.write(file.ino, "exe", test_origin()));
        KC_MUST(txn.commit());
    }
    auto txn = KC_MUST(store->read());
    CHECK(KC_MUST(txn.find_entry("jax/jit_g-" + kHex)).kind == EntryKind::stem);
    const auto report = KC_MUST(core::verify(*store));
    INFO(report.problems.size() << " problems, first: "
                                << (report.problems.empty() ? "" : report.problems[0]));
    CHECK(report.problems.empty());
}

TEST_CASE("layout: a user's rules place a compiler the built-in rules do not know", "[layout]") {
    TestStore ts;
    {
        auto txn = ts.write();
        core::Config config = txn.config();
        config.layout_rules =
            "# mycc: <shard>/<name>/ per kernel\ncontainer mycc/*\nignore mycc/*/*.journal\nentry "
            "mycc/*/*\n";
        KC_MUST(txn.set_config(config));
        KC_MUST(txn.commit());
    }
    ts.put("mycc/s1/kernel_a/a.bin", "a");
    ts.put("mycc/s1/kernel_a/b.bin", "b");
    ts.put("mycc/s1/kernel_b/a.bin", "c");
    ts.put("mycc/s1/x.journal", "log");
    CHECK(sorted_entry_names(ts) == Names{"mycc/s1/kernel_a", "mycc/s1/kernel_b"});
    CHECK(ts.entry("mycc/s1/kernel_a").files == 2);
    CHECK(ts.entry("mycc/s1/kernel_a").by_rule);
    CHECK(ts.attr("mycc/s1/x.journal").bookkeeping);
    CHECK(ts.counter(Counter::misses) == 2);
    check_consistent(ts.store());

    auto txn = ts.write();
    core::Config bad = txn.config();
    bad.layout_rules = "entry a/*\nsometimes b/*\n";
    const auto refused = txn.set_config(bad);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == EINVAL);
    CHECK(refused.error().message.find("line 2") != std::string::npos);
}
