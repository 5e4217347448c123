// The CUDA driver loaded at run time: the errors that must be clear without a GPU,
// and (where a driver and a device exist) that it starts.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>

#include "kcache/loader/driver.hpp"
#include "skip.hpp"

using kcache::loader::Driver;

namespace {

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

// The toolkit's link stub: present wherever the CUDA toolkit is installed.
std::string stub_library() {
    for (const char* p : {"/usr/local/cuda/lib64/stubs/libcuda.so",
                          "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so"}) {
        if (exists(p)) return p;
    }
    return {};
}

}  // namespace

TEST_CASE("driver: a missing driver library is a clear error", "[loader][driver]") {
    auto driver = Driver::load("libkcache-test-no-such-driver.so.1");
    REQUIRE_FALSE(driver);
    CHECK(driver.error().code == ELIBACC);
    CHECK_THAT(driver.error().message, Catch::Contains("no NVIDIA driver"));
    CHECK_THAT(driver.error().message, Catch::Contains("libkcache-test-no-such-driver.so.1"));
}

TEST_CASE("driver: the toolkit's stub library is recognised, not mistaken for a driver",
          "[loader][driver]") {
    const std::string stub = stub_library();
    if (stub.empty())
        kcache::test::skip("no CUDA toolkit stub library (libcuda.so) on this machine");
    auto driver = Driver::load(stub);
    REQUIRE_FALSE(driver);
    CHECK(driver.error().code == ELIBBAD);
    CHECK_THAT(driver.error().message, Catch::Contains("stub library"));
}

TEST_CASE("driver: the installed driver starts and counts its devices", "[loader][driver]") {
    auto driver = Driver::load();
    if (!driver) kcache::test::skip("no usable CUDA driver here: " + driver.error().message);
    CHECK((*driver)->version() >= 11030);  // cuGetProcAddress exists from CUDA 11.3
    CHECK((*driver)->device_count() >= 1);
    CHECK_THAT((*driver)->describe(2), Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY"));
}
