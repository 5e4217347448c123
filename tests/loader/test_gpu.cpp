// On a real GPU: kernels loaded from cache entries and run. Each test skips (exit 77)
// with a message where no CUDA driver or device is present, or nvcc built no kernels.

#include <dlfcn.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <vector>

#include "cache_fixture.hpp"
#include "expected.hpp"
#include "kcache/loader/runtime.hpp"
#include "mount_fixture.hpp"

namespace kcache::test {
namespace {

using loader::Cache;
using loader::Runtime;

// The driver calls the test itself needs: memory, copies, synchronization.
struct Memory {
    using CUresult = int;
    CUresult (*alloc)(std::uint64_t*, std::size_t) = nullptr;
    CUresult (*free)(std::uint64_t) = nullptr;
    CUresult (*to_device)(std::uint64_t, const void*, std::size_t) = nullptr;
    CUresult (*to_host)(void*, std::uint64_t, std::size_t) = nullptr;
    CUresult (*synchronize)() = nullptr;
    Memory() {
        void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        REQUIRE(driver);
        alloc = reinterpret_cast<decltype(alloc)>(::dlsym(driver, "cuMemAlloc_v2"));
        free = reinterpret_cast<decltype(free)>(::dlsym(driver, "cuMemFree_v2"));
        to_device = reinterpret_cast<decltype(to_device)>(::dlsym(driver, "cuMemcpyHtoD_v2"));
        to_host = reinterpret_cast<decltype(to_host)>(::dlsym(driver, "cuMemcpyDtoH_v2"));
        synchronize = reinterpret_cast<decltype(synchronize)>(::dlsym(driver, "cuCtxSynchronize"));
        REQUIRE((alloc && free && to_device && to_host && synchronize));
    }
};

std::shared_ptr<Runtime> require_gpu() {
    auto runtime = Runtime::open();
    if (!runtime) skip("no usable CUDA driver and device here: " + runtime.error().message);
    return *runtime;
}

const char* const kSignature = R"({"kcache_signature": 1, "kernel": "vector_add",
  "params": [{"name": "a", "type": "ptr"}, {"name": "b", "type": "ptr"},
             {"name": "out", "type": "ptr"}, {"name": "n", "type": "i32"}],
  "block": [128]})";

// Runs vector_add over n elements through `kernel` and checks every sum.
void check_vector_add(const loader::Kernel& kernel) {
    constexpr int n = 100000;
    std::vector<float> a(n), b(n), out(n, -1.0f);
    for (int i = 0; i < n; ++i) {
        a[i] = static_cast<float>(i);
        b[i] = static_cast<float>(2 * i);
    }
    Memory memory;
    const std::size_t bytes = n * sizeof(float);
    std::uint64_t da = 0, db = 0, dout = 0;
    REQUIRE(memory.alloc(&da, bytes) == 0);
    REQUIRE(memory.alloc(&db, bytes) == 0);
    REQUIRE(memory.alloc(&dout, bytes) == 0);
    REQUIRE(memory.to_device(da, a.data(), bytes) == 0);
    REQUIRE(memory.to_device(db, b.data(), bytes) == 0);
    auto config = kernel.default_config();
    REQUIRE(config.block[0] == 128);
    config.grid[0] = (n + 127) / 128;
    int count = n;
    void* args[] = {&da, &db, &dout, &count};
    const std::size_t sizes[] = {8, 8, 8, 4};
    const auto launched = kernel.launch(config, args, sizes, 4);
    INFO((launched ? std::string() : launched.error().message));
    REQUIRE(launched);
    REQUIRE(memory.synchronize() == 0);
    REQUIRE(memory.to_host(out.data(), dout, bytes) == 0);
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += out[i] != static_cast<float>(3 * i);
    CHECK(wrong == 0);
    memory.free(da);
    memory.free(db);
    memory.free(dout);
}

}  // namespace

TEST_CASE("gpu: a vector add stored through the mount runs from the db and the mount",
          "[loader][gpu]") {
    const std::string fatbin = kernel_bytes("vector_add.fatbin");
    auto runtime = require_gpu();
    MountedCache mounted;
    const std::string key = "4fd1c0ffee00112233445566778899aabbccddeeff00112233445566778899aa";
    REQUIRE_SYS(::mkdir(mounted.p(key).c_str(), 0755));
    REQUIRE(write_all(mounted.p(key + "/kernel.fatbin"), fatbin) == 0);
    REQUIRE(write_all(mounted.p(key + "/kernel.json"), kSignature) == 0);
    for (const auto& root : {mounted.db(), mounted.mnt()}) {
        INFO(root);
        auto cache = value(Cache::open(root.string()));
        auto kernel = value(runtime->kernel(*cache, key));
        CHECK(kernel->name() == "vector_add");
        CHECK(kernel->file() == "kernel.fatbin");
        check_vector_add(*kernel);
    }
}

TEST_CASE("gpu: PTX is compiled by the driver's JIT", "[loader][gpu]") {
    const std::string ptx = kernel_bytes("vector_add.ptx");
    auto runtime = require_gpu();
    TempDir dir;
    write_dir_entry(dir.path(), "jit", {{"kernel.ptx", ptx}, {"kernel.json", kSignature}});
    auto cache = value(Cache::open(dir.str()));
    auto entry = value(cache->entry("jit"));
    CHECK(value(loader::select_binary(*entry, runtime->sm())).jit);
    auto kernel = value(runtime->kernel(*cache, "jit"));
    CHECK(kernel->file() == "kernel.ptx");
    check_vector_add(*kernel);
}

TEST_CASE("gpu: a wrong argument list is refused", "[loader][gpu]") {
    const std::string fatbin = kernel_bytes("vector_add.fatbin");
    auto runtime = require_gpu();
    TempDir dir;
    write_dir_entry(dir.path(), "k", {{"kernel.fatbin", fatbin}, {"kernel.json", kSignature}});
    auto cache = value(Cache::open(dir.str()));
    auto kernel = value(runtime->kernel(*cache, "k"));
    std::uint64_t p = 0;
    std::int64_t wide = 1;
    void* three[] = {&p, &p, &p};
    const std::size_t three_sizes[] = {8, 8, 8};
    const auto few = kernel->launch(kernel->default_config(), three, three_sizes, 3);
    REQUIRE_FALSE(few);
    CHECK(few.error().code == EINVAL);
    void* four[] = {&p, &p, &p, &wide};
    const std::size_t four_sizes[] = {8, 8, 8, 8};
    const auto wrong = kernel->launch(kernel->default_config(), four, four_sizes, 4);
    REQUIRE_FALSE(wrong);
    CHECK_THAT(wrong.error().message,
               Catch::Contains("argument 3 is 8 bytes, the kernel expects 4"));
}

}  // namespace kcache::test
