// The runtime's driver path on a fake driver (fake_cuda.c, built as libcuda.so.1):
// what it asks the driver for, in which cases, and the message for each failure.

#include <dlfcn.h>
#include <stdlib.h>

#include <cerrno>
#include <string>

#include "cache_fixture.hpp"
#include "kcache/loader.hpp"
#include "kcache/loader/runtime.hpp"

namespace kcache::test {
namespace {

using loader::Cache;
using loader::Runtime;
using loader::RuntimeOptions;

// The fake's call log, and setting its behaviour for one test.
class FakeDriver {
  public:
    FakeDriver() {
        for (const char* v : {"FAKE_CUDA_SM", "FAKE_CUDA_DEVICES", "FAKE_CUDA_STUB",
                              "FAKE_CUDA_FAIL", "FAKE_CUDA_JIT_LOG", "KCACHE_LIBCUDA"}) {
            ::unsetenv(v);
        }
        m_handle = ::dlopen(KCACHE_FAKE_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
        REQUIRE(m_handle);
        m_log = reinterpret_cast<const char* (*)()>(::dlsym(m_handle, "fake_cuda_log"));
        m_reset = reinterpret_cast<void (*)()>(::dlsym(m_handle, "fake_cuda_reset"));
        REQUIRE(m_log);
        REQUIRE(m_reset);
        m_reset();
    }
    ~FakeDriver() { ::dlclose(m_handle); }
    void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
    std::string log() const { return m_log(); }
    void reset() { m_reset(); }
    std::size_t count(const std::string& call) const {
        const std::string text = log();
        std::size_t n = 0;
        for (std::size_t at = 0; (at = text.find(call, at)) != std::string::npos; at += call.size())
            ++n;
        return n;
    }

  private:
    void* m_handle = nullptr;
    const char* (*m_log)() = nullptr;
    void (*m_reset)() = nullptr;
};

RuntimeOptions fake_options(std::size_t capacity = 16) {
    RuntimeOptions options;
    options.driver_library = KCACHE_FAKE_LIBCUDA;
    options.cache_capacity = capacity;
    return options;
}

struct Entry {
    TempDir dir;
    std::shared_ptr<Cache> cache;
    explicit Entry(const Files& files) {
        write_db_entry(dir / "db", "k1", files);
        cache = value(Cache::open((dir / "db").string()));
    }
};

// Arguments of axpy(float, float*, float*, int).
struct AxpyArgs {
    float a = 2;
    std::uint64_t x = 0x1000, y = 0x2000;
    int n = 10;
    void* args[4] = {&a, &x, &y, &n};
    std::size_t sizes[4] = {4, 8, 8, 4};
};

}  // namespace

TEST_CASE("runtime: starts on the driver, device and primary context", "[loader][runtime]") {
    FakeDriver fake;
    fake.set("FAKE_CUDA_SM", "86");
    auto runtime = value(Runtime::open(fake_options()));
    CHECK(runtime->sm() == 86);
    CHECK(runtime->driver_version() == 12040);
    CHECK(fake.count("cuInit") == 1);
    CHECK(fake.count("cuDevicePrimaryCtxRetain 0") == 1);
    runtime.reset();
    CHECK(fake.count("cuDevicePrimaryCtxRelease 0") == 1);
}

TEST_CASE("runtime: KCACHE_LIBCUDA names the driver library", "[loader][runtime]") {
    FakeDriver fake;
    fake.set("KCACHE_LIBCUDA", KCACHE_FAKE_LIBCUDA);
    auto runtime = value(Runtime::open());
    CHECK(runtime->sm() == 90);
    CHECK(fake.count("cuInit") == 1);
}

TEST_CASE("runtime: load, launch, and the session cache", "[loader][runtime]") {
    FakeDriver fake;
    Entry entry({{"axpy.cubin", axpy_cubin(90)}, {"axpy.json", axpy_signature()}});
    auto runtime = value(Runtime::open(fake_options()));
    auto kernel = value(runtime->kernel(*entry.cache, "k1"));
    CHECK(kernel->name() == "axpy");
    CHECK(kernel->file() == "axpy.cubin");
    CHECK(fake.count("cuModuleLoadDataEx cubin") == 1);
    CHECK(fake.count("cuModuleGetFunction axpy") == 1);
    CHECK(fake.count("cuFuncSetAttribute") == 0);

    auto config = kernel->default_config();
    CHECK(config.block[0] == 128);
    config.grid = {3, 1, 1};
    AxpyArgs args;
    REQUIRE(kernel->launch(config, args.args, args.sizes, 4));
    CHECK(fake.count("cuLaunchKernel axpy grid=3,1,1 block=128,1,1 shared=0 params=yes") == 1);

    // Hits: no module loaded again, by name or by default; a miss for another name.
    for (int i = 0; i < 3; ++i) CHECK(value(runtime->kernel(*entry.cache, "k1")) == kernel);
    CHECK(fake.count("cuModuleLoadDataEx") == 1);
    auto stats = runtime->cache_stats();
    CHECK(stats.hits == 3);
    CHECK(stats.misses == 1);
    CHECK(value(runtime->kernel(*entry.cache, "k1", "axpy"))->name() == "axpy");
    CHECK(fake.count("cuModuleLoadDataEx") == 2);
    const auto missing = error(runtime->kernel(*entry.cache, "k1", "nope"));
    CHECK(missing.code == ENOENT);
    CHECK_THAT(missing.message, Catch::Contains("axpy.cubin has no kernel nope (it has: axpy)"));

    // The module stays loaded while a kernel holds it, evicted or not.
    kernel.reset();
    runtime.reset();
    CHECK(fake.count("cuModuleUnload") == 2);
    CHECK(fake.count("cuDevicePrimaryCtxRelease") == 1);
}

TEST_CASE("runtime: the session cache evicts beyond its capacity", "[loader][runtime]") {
    FakeDriver fake;
    TempDir dir;
    for (const char* key : {"k1", "k2", "k3"}) {
        write_db_entry(dir / "db", key, {{"axpy.cubin", axpy_cubin(90)}});
    }
    auto cache = value(Cache::open((dir / "db").string()));
    auto runtime = value(Runtime::open(fake_options(2)));
    for (const char* key : {"k1", "k2", "k3", "k1"}) value(runtime->kernel(*cache, key));
    const auto stats = runtime->cache_stats();
    CHECK(stats.capacity == 2);
    CHECK(stats.size == 2);
    CHECK(stats.evictions >= 1);
    CHECK(stats.misses == 4);
    CHECK(fake.count("cuModuleLoadDataEx") == 4);
}

TEST_CASE("runtime: dynamic shared memory above 48 KiB is opted in, only then",
          "[loader][runtime]") {
    FakeDriver fake;
    auto runtime = value(Runtime::open(fake_options()));
    {
        Entry at_limit({{"axpy.cubin", axpy_cubin(90)}, {"axpy.json", axpy_signature(49152)}});
        auto kernel = value(runtime->kernel(*at_limit.cache, "k1"));
        AxpyArgs args;
        REQUIRE(kernel->launch(kernel->default_config(), args.args, args.sizes, 4));
        CHECK(fake.count("cuFuncSetAttribute") == 0);
        CHECK(fake.count("shared=49152") == 1);
    }
    fake.reset();
    Entry above({{"axpy.cubin", axpy_cubin(90)}, {"axpy.json", axpy_signature(65536)}});
    auto kernel = value(runtime->kernel(*above.cache, "k1"));
    CHECK(fake.log().find("cuFuncSetAttribute axpy 8 65536") != std::string::npos);
    AxpyArgs args;
    auto config = kernel->default_config();
    REQUIRE(kernel->launch(config, args.args, args.sizes, 4));
    config.shared_memory = 1000;
    REQUIRE(kernel->launch(config, args.args, args.sizes, 4));
    CHECK(fake.count("cuFuncSetAttribute") == 1);
    config.shared_memory = 100000;  // a launch asking for more opts in first
    REQUIRE(kernel->launch(config, args.args, args.sizes, 4));
    CHECK(fake.log().find("cuFuncSetAttribute axpy 8 100000") != std::string::npos);
    CHECK(fake.count("cuFuncSetAttribute") == 2);
    config.shared_memory = 300000;  // more than the device has
    const auto e = kernel->launch(config, args.args, args.sizes, 4);
    REQUIRE_FALSE(e);
    CHECK(e.error().code == ERANGE);
    CHECK_THAT(e.error().message, Catch::Contains("the device allows at most 232448"));
}

TEST_CASE("runtime: a wrong argument list is refused before cuLaunchKernel", "[loader][runtime]") {
    FakeDriver fake;
    Entry entry({{"axpy.cubin", axpy_cubin(90)}});
    auto runtime = value(Runtime::open(fake_options()));
    auto kernel = value(runtime->kernel(*entry.cache, "k1"));  // the binary's only kernel
    AxpyArgs args;
    const auto few = kernel->launch({}, args.args, args.sizes, 3);
    REQUIRE_FALSE(few);
    CHECK(few.error().code == EINVAL);
    CHECK_THAT(few.error().message, Catch::Contains("axpy: 3 arguments given, the kernel takes 4"));
    args.sizes[1] = 4;
    const auto narrow = kernel->launch({}, args.args, args.sizes, 4);
    REQUIRE_FALSE(narrow);
    CHECK_THAT(narrow.error().message,
               Catch::Contains("argument 1 is 4 bytes, the kernel expects 8"));
    CHECK_FALSE(kernel->launch({}, nullptr, nullptr, 4));
    CHECK(fake.count("cuLaunchKernel") == 0);
}

TEST_CASE("runtime: every driver failure has its clear message", "[loader][runtime]") {
    FakeDriver fake;
    struct Case {
        const char* fail;  // FAKE_CUDA_FAIL
        const char* file;  // the entry's binary
        int code;
        kcache_status status;
        std::vector<const char*> says;
    };
    const std::vector<Case> cases = {
        {"cuModuleLoadDataEx:209",
         "axpy.cubin",
         ENXIO,
         KCACHE_ERROR_NO_BINARY,
         {"entry k1: loading axpy.cubin (cubin for sm_90) on device 0 (sm_90)",
          "CUDA_ERROR_NO_BINARY_FOR_GPU: no kernel image is available"}},
        {"cuModuleLoadDataEx:218",
         "axpy.ptx",
         EBADMSG,
         KCACHE_ERROR_BAD_PTX,
         {"loading axpy.ptx (ptx for sm_90, JIT)", "CUDA_ERROR_INVALID_PTX",
          "PTX ISA 8.0, driver for CUDA 12.4", "JIT log: ptxas fatal: bad input"}},
        {"cuModuleLoadDataEx:222",
         "axpy.ptx",
         EBADMSG,
         KCACHE_ERROR_BAD_PTX,
         {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "PTX ISA 8.0, driver for CUDA 12.4"}},
        {"cuModuleLoadDataEx:2",
         "axpy.cubin",
         ENOMEM,
         KCACHE_ERROR_OUT_OF_MEMORY,
         {"CUDA_ERROR_OUT_OF_MEMORY: out of memory"}},
        {"cuModuleGetFunction:500",
         "axpy.cubin",
         ENOENT,
         KCACHE_ERROR_NOT_FOUND,
         {"looking up kernel axpy in axpy.cubin", "CUDA_ERROR_NOT_FOUND"}},
    };
    for (const auto& c : cases) {
        INFO(c.fail);
        fake.set("FAKE_CUDA_FAIL", c.fail);
        fake.set("FAKE_CUDA_JIT_LOG", "ptxas fatal: bad input");
        Entry entry(
            {{c.file, std::string(c.file).ends_with(".ptx") ? axpy_ptx(90) : axpy_cubin(90)}});
        auto runtime = value(Runtime::open(fake_options()));
        const auto e = error(runtime->kernel(*entry.cache, "k1"));
        CHECK(e.code == c.code);
        for (const char* text : c.says) CHECK_THAT(e.message, Catch::Contains(text));
        // The same through the C ABI.
        kcache_runtime_options options{};
        options.driver_library = KCACHE_FAKE_LIBCUDA;
        kcache_runtime* rt = nullptr;
        REQUIRE(kcache_runtime_open(&options, &rt) == KCACHE_OK);
        kcache_cache* cache = nullptr;
        REQUIRE(kcache_cache_open((entry.dir / "db").c_str(), &cache) == KCACHE_OK);
        kcache_kernel* kernel = nullptr;
        CHECK(kcache_runtime_get_kernel(rt, cache, "k1", nullptr, &kernel) == c.status);
        CHECK(kernel == nullptr);
        CHECK_THAT(kcache_last_error(), Catch::Contains(c.says.front()));
        kcache_cache_close(cache);
        kcache_runtime_close(rt);
    }
    // A launch the driver refuses.
    fake.set("FAKE_CUDA_FAIL", "cuLaunchKernel:701");
    Entry entry({{"axpy.cubin", axpy_cubin(90)}});
    auto runtime = value(Runtime::open(fake_options()));
    auto kernel = value(runtime->kernel(*entry.cache, "k1"));
    AxpyArgs args;
    const auto launch = kernel->launch({}, args.args, args.sizes, 4);
    REQUIRE_FALSE(launch);
    CHECK(launch.error().code == EPROTO);
    CHECK_THAT(launch.error().message, Catch::Contains("launching axpy (grid 1x1x1"));
    CHECK_THAT(launch.error().message, Catch::Contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"));
}

TEST_CASE("runtime: no driver, the stub, no device", "[loader][runtime]") {
    FakeDriver fake;
    struct Case {
        const char* env;
        const char* value;
        kcache_status status;
        const char* says;
    };
    for (const Case& c :
         {Case{"FAKE_CUDA_STUB", "1", KCACHE_ERROR_NO_DRIVER, "is the CUDA toolkit's stub library"},
          Case{"FAKE_CUDA_DEVICES", "0", KCACHE_ERROR_NO_DEVICE, "found no device"},
          Case{"FAKE_CUDA_FAIL", "cuInit:100", KCACHE_ERROR_NO_DEVICE, "found no device"},
          Case{"FAKE_CUDA_FAIL", "cuInit:3", KCACHE_ERROR_NO_DEVICE,
               "failed to start: CUDA_ERROR_NOT_INITIALIZED"}}) {
        INFO(c.env << "=" << c.value);
        fake.set(c.env, c.value);
        kcache_runtime_options options{};
        options.driver_library = KCACHE_FAKE_LIBCUDA;
        kcache_runtime* rt = nullptr;
        CHECK(kcache_runtime_open(&options, &rt) == c.status);
        CHECK(rt == nullptr);
        CHECK_THAT(kcache_last_error(), Catch::Contains(c.says));
        ::unsetenv(c.env);
    }
    kcache_runtime_options options{};
    options.driver_library = "libkcache-test-no-such-driver.so.1";
    kcache_runtime* rt = nullptr;
    CHECK(kcache_runtime_open(&options, &rt) == KCACHE_ERROR_NO_DRIVER);
    CHECK_THAT(kcache_last_error(), Catch::Contains("no NVIDIA driver: cannot load "
                                                    "libkcache-test-no-such-driver.so.1"));
    options.driver_library = KCACHE_FAKE_LIBCUDA;
    options.device = 3;
    CHECK(kcache_runtime_open(&options, &rt) == KCACHE_ERROR_NO_DEVICE);
    CHECK_THAT(kcache_last_error(), Catch::Contains("no CUDA device 3 (the driver found 1)"));
}

TEST_CASE("runtime: the C++ API over the C ABI launches with checked arguments",
          "[loader][runtime]") {
    FakeDriver fake;
    Entry entry({{"axpy.fatbin", axpy_fatbin({80, 90}, 0)}, {"axpy.json", axpy_signature()}});
    kcache::RuntimeOptions options;
    options.driver_library = KCACHE_FAKE_LIBCUDA;
    kcache::Runtime runtime(options);
    kcache::Cache cache((entry.dir / "db").string());
    auto kernel = runtime.kernel(cache, "k1");
    CHECK(kernel.name() == "axpy");
    CHECK(kernel.file() == "axpy.fatbin");
    CHECK(kernel.params().size() == 4);
    auto config = kernel.default_config();
    config.grid[0] = 2;
    const float a = 1;
    const std::uint64_t x = 1, y = 2;
    const int n = 3;
    kernel.launch(config, a, x, y, n);
    CHECK(fake.count("cuLaunchKernel axpy grid=2,1,1 block=128,1,1") == 1);
    try {
        kernel.launch(config, a, x, y, 3.0);  // a double where the kernel takes an int
        FAIL("no exception");
    } catch (const kcache::Error& e) {
        CHECK(e.status() == KCACHE_ERROR_ARGUMENT_MISMATCH);
        CHECK_THAT(e.what(), Catch::Contains("argument 3 is 8 bytes, the kernel expects 4"));
    }
    CHECK(fake.count("cuLaunchKernel") == 1);
    runtime.kernel(cache, "k1");
    CHECK(runtime.stats().hits == 1);
}

}  // namespace kcache::test
