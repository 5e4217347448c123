// Caches and entries without a GPU: a plain directory and a kcache db holding the same
// entries, the binary chosen for a device, signatures in both formats, and the C ABI.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "cache_fixture.hpp"
#include "expected.hpp"
#include "kcache/loader.h"
#include "kcache/loader.hpp"
#include "kcache/loader/cache.hpp"

extern "C" int kcache_c_abi_entry(const char* cache_path, const char* key, int sm, char* out,
                                  size_t out_size);

namespace kcache::test {
namespace {

using loader::Arch;
using loader::Cache;
using loader::Format;

const Files kTritonLike = {
    {"axpy.cubin", axpy_cubin(90)},
    {"axpy.ptx", axpy_ptx(90)},
    {"axpy.json", axpy_signature()},
    {"__grp__axpy.json", R"({"child_paths": {"axpy.cubin": "/x/axpy.cubin"}})"},
    {"sub/notes.txt", "nested file"},
    {"tmp.pid_1_2/axpy.cubin", "a write in flight"},
};

// Both kinds of cache holding entry "k1" with `files`.
struct BothCaches {
    TempDir dir;
    std::shared_ptr<Cache> plain;
    std::shared_ptr<Cache> db;
    explicit BothCaches(const Files& files, const std::string& key = "k1") {
        write_dir_entry(dir / "plain", key, files);
        write_db_entry(dir / "db", key, files);
        plain = value(Cache::open((dir / "plain").string()));
        db = value(Cache::open((dir / "db").string()));
    }
};

std::vector<std::string> names(const loader::Entry& entry) {
    std::vector<std::string> out;
    for (const auto& f : entry.files()) out.push_back(f.path);
    return out;
}

}  // namespace

TEST_CASE("cache: a plain directory and a db list and read the same entry", "[loader][cache]") {
    BothCaches caches(kTritonLike);
    CHECK(caches.plain->kind() == Cache::Kind::directory);
    CHECK(caches.db->kind() == Cache::Kind::db);
    for (const auto& cache : {caches.plain, caches.db}) {
        INFO(loader::cache_kind_name(cache->kind()));
        auto entry = value(cache->entry("k1"));
        CHECK(entry->key() == "k1");
        // Name order, the tmp.* directory of a write in flight left out.
        CHECK(names(*entry) == std::vector<std::string>{"__grp__axpy.json", "axpy.cubin",
                                                        "axpy.json", "axpy.ptx", "sub/notes.txt"});
        for (const auto& f : entry->files()) {
            const auto bytes = value(entry->read(f.path));
            CHECK(bytes == kTritonLike.at(f.path));
            CHECK(f.attr.size == bytes.size());
        }
        CHECK(value(entry->read("axpy.cubin")).data() == value(entry->read("axpy.cubin")).data());
        CHECK(error(entry->read("missing.cubin")).code == ENOENT);
        // A trailing slash names the same entry.
        CHECK(value(cache->entry("k1/"))->files().size() == 5);
    }
}

TEST_CASE("cache: a db entry's small files are views into the map", "[loader][cache]") {
    std::string noise(3000, '\0');  // incompressible: stored raw, in one page
    std::uint64_t x = 88172645463325252ull;
    for (auto& c : noise) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        c = static_cast<char>(x);
    }
    BothCaches caches(Files{{"small.cubin", noise}, {"big.bin", std::string(20000, 'x')}});
    auto entry = value(caches.db->entry("k1"));
    const auto small = value(entry->read("small.cubin"));
    const auto big = value(entry->read("big.bin"));
    CHECK(big == std::string(20000, 'x'));
    // The one-page raw file is not a copy held by the entry: it lies in data.mdb's map,
    // which the snapshot keeps; compressed or multi-page content is assembled once.
    CHECK(small == noise);
    std::ifstream maps("/proc/self/maps");
    std::string line;
    bool in_map = false;
    const auto at = reinterpret_cast<std::uintptr_t>(small.data());
    while (std::getline(maps, line)) {
        if (line.find("data.mdb") == std::string::npos) continue;
        std::uintptr_t lo = 0, hi = 0;
        std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi);
        in_map = in_map || (at >= lo && at < hi);
    }
    CHECK(in_map);
}

TEST_CASE("cache: flat-file entries, missing entries and bad keys", "[loader][cache]") {
    TempDir dir;
    std::filesystem::create_directories(dir / "plain");
    write_file(dir / "plain" / "jax_kernel", "flat");
    write_db_entry(dir / "db", "k1", {{"a.cubin", "x"}});
    auto plain = value(Cache::open((dir / "plain").string()));
    auto flat = value(plain->entry("jax_kernel"));
    CHECK(names(*flat) == std::vector<std::string>{"jax_kernel"});
    CHECK(value(flat->read("jax_kernel")) == "flat");
    auto db = value(Cache::open((dir / "db").string()));
    for (const auto& cache : {plain, db}) {
        const auto missing = error(cache->entry("nope"));
        CHECK(missing.code == ENOENT);
        CHECK_THAT(missing.message, Catch::Contains("no entry nope"));
        for (const char* bad : {"", "/etc", "../x", "a/../b", "a//b", "./a", "a/."}) {
            INFO(bad);
            CHECK(error(cache->entry(bad)).code == EINVAL);
        }
    }
    CHECK(error(Cache::open((dir / "none").string())).code == ENOENT);
    CHECK(error(Cache::open((dir / "plain" / "jax_kernel").string())).code == ENOTDIR);
    // An entry keeps its cache alive.
    auto entry = value(db->entry("k1"));
    db.reset();
    CHECK(value(entry->read("a.cubin")) == "x");
}

TEST_CASE("select: compatibility rules", "[loader][select]") {
    const auto arch = [](const char* a) {
        return value(core::Result<Arch>(*loader::parse_arch(a)));
    };
    CHECK_FALSE(loader::parse_arch("sm_"));
    CHECK_FALSE(loader::parse_arch("sm_90x"));
    CHECK_FALSE(loader::parse_arch("gfx90a"));
    CHECK(arch("compute_75").sm == 75);
    CHECK(arch("sm_100f").variant == "f");
    CHECK(loader::cubin_runs_on(arch("sm_80"), 80));
    CHECK(loader::cubin_runs_on(arch("sm_80"), 86));        // same major, later minor
    CHECK_FALSE(loader::cubin_runs_on(arch("sm_86"), 80));  // not backwards
    CHECK_FALSE(loader::cubin_runs_on(arch("sm_80"), 90));  // not across majors
    CHECK(loader::cubin_runs_on(arch("sm_90a"), 90));
    CHECK_FALSE(loader::cubin_runs_on(arch("sm_100a"), 103));
    CHECK(loader::cubin_runs_on(arch("sm_100f"), 103));
    CHECK(loader::ptx_runs_on(arch("sm_75"), 120));  // JIT forward
    CHECK_FALSE(loader::ptx_runs_on(arch("sm_120"), 90));
    CHECK_FALSE(loader::ptx_runs_on(arch("sm_90a"), 100));
}

TEST_CASE("select: cubin, then fatbin, then PTX, for the device", "[loader][select]") {
    BothCaches caches(Files{{"a.cubin", axpy_cubin(80)},
                            {"b.fatbin", axpy_fatbin({75, 90}, 75)},
                            {"c.ptx", axpy_ptx(86)},
                            {"d.json", axpy_signature()}});
    for (const auto& cache : {caches.plain, caches.db}) {
        auto entry = value(cache->entry("k1"));
        auto s80 = value(loader::select_binary(*entry, 80));
        CHECK(s80.file == "a.cubin");
        CHECK(s80.format == Format::cubin);
        CHECK(s80.arch == "sm_80");
        CHECK_FALSE(s80.jit);
        REQUIRE(s80.kernels());
        CHECK(s80.kernels()->front().name == "axpy");
        // sm_86: the sm_80 cubin is compatible and comes before the fatbin and PTX.
        CHECK(value(loader::select_binary(*entry, 86)).file == "a.cubin");
        auto s90 = value(loader::select_binary(*entry, 90));
        CHECK(s90.file == "b.fatbin");
        CHECK(s90.format == Format::fatbin);
        CHECK(s90.arch == "sm_90");
        CHECK(s90.fatbin_entry == 1);
        REQUIRE(s90.kernels());
        CHECK(s90.kernels()->front().params.size() == 4);
        // sm_120: no cubin fits; the highest PTX that fits (c.ptx's sm_86) is JIT-compiled.
        auto s120 = value(loader::select_binary(*entry, 120));
        CHECK(s120.file == "c.ptx");
        CHECK(s120.jit);
        CHECK(s120.arch == "sm_86");
        // sm_70: nothing fits; the message says what the entry has.
        const auto none = error(loader::select_binary(*entry, 70));
        CHECK(none.code == ENXIO);
        CHECK_THAT(none.message, Catch::Contains("no binary for this GPU (sm_70)"));
        CHECK_THAT(none.message, Catch::Contains("a.cubin is sm_80"));
        CHECK_THAT(none.message,
                   Catch::Contains("b.fatbin holds sm_75 cubin, sm_90 cubin, sm_75 ptx"));
        CHECK_THAT(none.message, Catch::Contains("c.ptx targets sm_86"));
        // Restricted to one file (a signature's "binary").
        CHECK(value(loader::select_binary(*entry, 90, "c.ptx")).jit);
        CHECK(error(loader::select_binary(*entry, 80, "zzz.cubin")).code == ENXIO);
    }
}

TEST_CASE("select: damaged binaries and entries without one", "[loader][select]") {
    BothCaches caches(Files{{"bad.cubin",
                             "\x7f"
                             "ELF garbage"},
                            {"notes.txt", "hi"}});
    auto entry = value(caches.db->entry("k1"));
    const auto e = error(loader::select_binary(*entry, 90));
    CHECK(e.code == ENXIO);
    CHECK_THAT(e.message, Catch::Contains("bad.cubin: "));
    TempDir dir;
    write_dir_entry(dir.path(), "k", {{"x.txt", "hi"}});
    auto empty = value(value(Cache::open(dir.str()))->entry("k"));
    CHECK_THAT(error(loader::select_binary(*empty, 90)).message,
               Catch::Contains("no .cubin, .fatbin or .ptx file"));
}

TEST_CASE("select: nvcc's cubins, sm_90a only on sm_90", "[loader][select]") {
    const auto cubin = kernel_bytes("params_sm_90a.cubin");
    BothCaches caches(Files{{"k.cubin", cubin}});
    auto entry = value(caches.plain->entry("k1"));
    CHECK(value(loader::select_binary(*entry, 90)).arch == "sm_90a");
    CHECK(error(loader::select_binary(*entry, 100)).code == ENXIO);
}

TEST_CASE("signature: kcache's schema", "[loader][signature]") {
    auto s = value(loader::parse_signature(R"({"kcache_signature": 1, "kernel": "_Z3addPfi",
        "binary": "kernel.fatbin",
        "params": [{"name": "p", "type": "ptr"}, {"type": "i32"}, {"name": "s", "type": "bytes", "size": 24},
                   {"name": "h", "type": "f16", "size": 2}],
        "block": [16, 8], "cluster": [2, 1, 1], "dynamic_shared_memory": 65536})"));
    CHECK(s.format == loader::SignatureFormat::kcache);
    CHECK(s.kernel == "_Z3addPfi");
    CHECK(s.binary == "kernel.fatbin");
    REQUIRE(s.params);
    REQUIRE(s.params->size() == 4);
    CHECK((*s.params)[0].size == 8);
    CHECK((*s.params)[1].name.empty());
    CHECK((*s.params)[1].size == 4);
    CHECK((*s.params)[2].size == 24);
    CHECK(s.block == std::array<std::uint32_t, 3>{16, 8, 1});
    CHECK(s.cluster == std::array<std::uint32_t, 3>{2, 1, 1});
    CHECK(s.shared_memory == 65536);

    struct Bad {
        const char* json;
        int code;
        const char* says;
    };
    for (
        const Bad& bad : {
            Bad{R"({"kcache_signature": 1, "params": []})", EIO, "no kernel"},
            Bad{R"({"kcache_signature": 1, "kernel": "k"})", EIO, "params is not a list"},
            Bad{R"({"kcache_signature": 1, "kernel": "k", "params": [{"type": "f128"}]})", EIO,
                "params[0]: unknown type \"f128\""},
            Bad{R"({"kcache_signature": 1, "kernel": "k", "params": [{"type": "i32", "size": 8}]})",
                EIO, "size 8 does not match type i32"},
            Bad{R"({"kcache_signature": 1, "kernel": "k", "params": [{"type": "bytes"}]})", EIO,
                "type bytes needs a size"},
            Bad{R"({"kcache_signature": 1, "kernel": "k", "params": [], "block": [1024, 2]})", EIO,
                "more than 1024"},
            Bad{R"({"kcache_signature": 1, "kernel": "k", "params": [], "block": [0]})", EIO,
                "block[0] is 0"},
            Bad{R"({"kcache_signature": 1, "kernel": "k", "params": [], "dynamic_shared_memory": -1})",
                EIO, "dynamic_shared_memory is -1"},
            Bad{R"({"kcache_signature": 1, "kernel": 7, "params": []})", EIO,
                "kernel is not a string"},
            Bad{R"({"kcache_signature": 2, "kernel": "k", "params": []})", ENOTSUP,
                "version 2 is newer"},
            Bad{R"({"kcache_signature": 1, "kernel": "k", "params": [)", ENOEXEC, "not JSON"},
            Bad{"[1, 2]", ENOEXEC, "not an object"},
            Bad{R"({"child_paths": {}})", ENOEXEC, "neither a kcache signature"},
        }) {
        INFO(bad.json);
        const auto e = error(loader::parse_signature(bad.json));
        CHECK(e.code == bad.code);
        CHECK_THAT(e.message, Catch::Contains(bad.says));
    }
    CHECK(error(loader::parse_signature(std::string(100, '[') + std::string(100, ']'))).code ==
          ENOEXEC);
}

TEST_CASE("signature: Triton's metadata", "[loader][signature]") {
    auto s = value(loader::parse_signature(
        R"({"hash": "4fd1", "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "num_warps": 8, "num_ctas": 1, "cluster_dims": [1, 1, 1], "shared": 16384,
            "name": "add_kernel",
            "signature": {"x_ptr": "*fp32", "y_ptr": "*fp16", "n": "i32", "scale": "fp32",
                          "flag": "i1", "BLOCK": "constexpr"}})"));
    CHECK(s.format == loader::SignatureFormat::triton);
    CHECK(s.kernel == "add_kernel");
    CHECK(s.block == std::array<std::uint32_t, 3>{256, 1, 1});
    CHECK(s.shared_memory == 16384);
    REQUIRE(s.params);
    std::vector<std::string> got;
    for (const auto& p : *s.params)
        got.push_back(p.name + ":" + p.type + ":" + std::to_string(p.size));
    CHECK(got == std::vector<std::string>{"x_ptr:*fp32:8", "y_ptr:*fp16:8", "n:i32:4",
                                          "scale:fp32:4", "flag:i1:4"});
    // Older metadata: the signature by argument index (in any key order); none at all.
    auto old = value(loader::parse_signature(
        R"({"num_warps": 4, "shared": 0, "name": "k", "signature": {"1": "i64", "0": "*bf16"}})"));
    REQUIRE(old.params);
    REQUIRE(old.params->size() == 2);
    CHECK((*old.params)[0].type == "*bf16");
    CHECK((*old.params)[1].size == 8);
    auto bare = value(loader::parse_signature(R"({"num_warps": 2, "name": "k"})"));
    CHECK_FALSE(bare.params);
    CHECK(bare.block[0] == 64);
    CHECK(error(loader::parse_signature(R"({"num_warps": 64, "name": "k"})")).code == EIO);
    CHECK(error(loader::parse_signature(
                    R"({"num_warps": 4, "name": "k", "signature": {"0": "u128"}})"))
              .code == EIO);
}

TEST_CASE("signature: found among an entry's files", "[loader][signature]") {
    BothCaches caches(Files{{"__grp__axpy.json", R"({"child_paths": {}})"},
                            {"a_wave.json", R"({"something": "else"})"},
                            {"axpy.json", axpy_signature(1024)},
                            {"axpy.cubin", axpy_cubin(90)}});
    for (const auto& cache : {caches.plain, caches.db}) {
        auto entry = value(cache->entry("k1"));
        auto s = value(loader::find_signature(*entry));
        CHECK(s.kernel == "axpy");
        CHECK(s.shared_memory == 1024);
    }
    BothCaches none(Files{{"a_wave.json", "{}"}, {"x.cubin", "x"}});
    const auto e = error(loader::find_signature(*value(none.db->entry("k1"))));
    CHECK(e.code == ENOENT);
    CHECK_THAT(e.message, Catch::Contains("a_wave.json: JSON that is neither"));
    BothCaches broken(
        Files{{"kernel.json", R"({"kcache_signature": 1, "kernel": "k", "params": 3})"}});
    const auto b = error(loader::find_signature(*value(broken.plain->entry("k1"))));
    CHECK(b.code == EIO);
    CHECK_THAT(b.message, Catch::Contains("entry k1: kernel.json: kcache signature: params"));
}

TEST_CASE("C ABI: caches, entries, selection and signatures", "[loader][c_api]") {
    BothCaches caches(Files{{"axpy.cubin", axpy_cubin(90)}, {"axpy.json", axpy_signature(0)}});
    for (const char* kind : {"plain", "db"}) {
        const std::string path = (caches.dir / kind).string();
        char out[1024];
        REQUIRE(kcache_c_abi_entry(path.c_str(), "k1", 90, out, sizeof out) == 0);
        CHECK(std::string(out) ==
              std::string(std::strcmp(kind, "db") == 0 ? "db" : "directory") +
                  " k1: axpy.cubin axpy.json | axpy.cubin cubin sm_90 jit=0 | "
                  "kcache axpy block=128 shared=0 params=f32:4,ptr:8,ptr:8,i32:4");
        CHECK(kcache_c_abi_entry(path.c_str(), "k1", 70, out, sizeof out) ==
              KCACHE_ERROR_NO_BINARY);
        CHECK_THAT(out, Catch::Contains("no binary for this GPU (sm_70)"));
        CHECK(kcache_c_abi_entry(path.c_str(), "k2", 90, out, sizeof out) ==
              KCACHE_ERROR_NOT_FOUND);
        CHECK(kcache_c_abi_entry(path.c_str(), "../k1", 90, out, sizeof out) ==
              KCACHE_ERROR_INVALID_ARGUMENT);
    }
    kcache_cache* cache = nullptr;
    CHECK(kcache_cache_open(nullptr, &cache) == KCACHE_ERROR_INVALID_ARGUMENT);
    CHECK(kcache_cache_open("/nonexistent/kcache", &cache) == KCACHE_ERROR_NOT_FOUND);
    CHECK(cache == nullptr);
    kcache_signature* sig = nullptr;
    CHECK(kcache_signature_parse("{\"kcache_signature\": 9}", 23, &sig) ==
          KCACHE_ERROR_UNSUPPORTED);
    CHECK(kcache_signature_parse("{\"kcache_signature\": 1}", 23, &sig) == KCACHE_ERROR_CORRUPT);
    CHECK(kcache_signature_parse("nope", 4, &sig) == KCACHE_ERROR_NOT_A_BINARY);
    CHECK(sig == nullptr);
}

TEST_CASE("C++ API: header-only, exceptions with the status", "[loader][c_api]") {
    BothCaches caches(Files{{"axpy.cubin", axpy_cubin(90)}, {"axpy.json", axpy_signature(0)}});
    kcache::Cache cache((caches.dir / "db").string());
    CHECK(cache.kind() == "db");
    auto entry = cache.entry("k1");
    CHECK(entry.files() == std::vector<std::string>{"axpy.cubin", "axpy.json"});
    CHECK(entry.read("axpy.cubin") == axpy_cubin(90));
    const auto selection = entry.select_binary(90);
    CHECK(selection.file == "axpy.cubin");
    CHECK(selection.format == "cubin");
    const auto sig = entry.signature();
    CHECK(sig.kernel() == "axpy");
    CHECK(sig.launch_config().block[0] == 128);
    CHECK(sig.params().size() == 4);
    try {
        cache.entry("missing");
        FAIL("no exception");
    } catch (const kcache::Error& e) {
        CHECK(e.status() == KCACHE_ERROR_NOT_FOUND);
        CHECK_THAT(e.what(), Catch::Contains("no entry missing"));
    }
    CHECK_THROWS_AS(kcache::Cache("/nonexistent/kcache"), kcache::Error);
}

}  // namespace kcache::test
