// The C ABI (kcache/loader.h): handles, accessors, statuses and per-thread errors.

#include <cstring>
#include <string>
#include <thread>

#include "builders.hpp"
#include "expected.hpp"
#include "kcache/loader.h"

extern "C" int kcache_c_abi_describe(const void* data, size_t size, char* out, size_t out_size);

namespace kcache::test {
namespace {

std::string cubin() {
    return build_cubin({{"axpy", kparam_info(3, 24, 4) + kparam_info(2, 16, 8) +
                                     kparam_info(1, 8, 8) + kparam_info(0, 0, 4)},
                        {"none", ""}});
}

const char* const kPtx = ".version 9.0\n.target sm_90\n.entry k(.param .u32 a) { ret; }\n";

std::string describe_in_c(const std::string& bytes) {
    char out[1024];
    kcache_c_abi_describe(bytes.data(), bytes.size(), out, sizeof out);
    return out;
}

}  // namespace

TEST_CASE("C ABI from C: a cubin, a fatbin, an error", "[loader][c_api]") {
    CHECK(describe_in_c(cubin()) == "cubin sm_90 axpy(0:4,8:8,16:8,24:4) none()");
    const std::string fatbin =
        build_container({{2, 75, 0x11, cubin()}, {1, 90, 0x11, kPtx, 0, 9, 0}, {8, 90, 0x11, "x"}});
    CHECK(describe_in_c(fatbin) ==
          "fatbin  | entry 0 cubin sm_75 none: cubin sm_75 axpy(0:4,8:8,16:8,24:4) none()"
          " | entry 0 ptx sm_90 none: ptx sm_90 k(0:4)"
          " | entry 0 ltoir sm_90 none: (no kernels)");
    CHECK(describe_in_c("hello") ==
          "KCACHE_ERROR_NOT_A_BINARY: not a cubin, fatbin or PTX file (text without a .version "
          "directive)");
    std::string broken = cubin();
    put_at(broken, kElfShoff, 1u << 30, 8);
    CHECK_THAT(describe_in_c(broken), Catch::StartsWith("KCACHE_ERROR_CORRUPT: cubin: "));
}

TEST_CASE("C ABI: lookups, argument checks and range errors", "[loader][c_api]") {
    const std::string bytes = cubin();
    kcache_binary* binary = nullptr;
    REQUIRE(kcache_inspect(bytes.data(), bytes.size(), &binary) == KCACHE_OK);
    REQUIRE(binary != nullptr);

    size_t axpy = 99;
    CHECK(kcache_binary_find_kernel(binary, "axpy", &axpy) == KCACHE_OK);
    CHECK(axpy == 0);
    CHECK(kcache_binary_find_kernel(binary, "nope", &axpy) == KCACHE_ERROR_NOT_FOUND);
    CHECK(std::string(kcache_last_error()) == "no kernel nope");

    const size_t good[] = {4, 8, 8, 4};
    const size_t bad[] = {4, 8, 4, 4};
    CHECK(kcache_check_arguments(binary, axpy, good, 4) == KCACHE_OK);
    CHECK(kcache_check_arguments(binary, axpy, bad, 4) == KCACHE_ERROR_ARGUMENT_MISMATCH);
    CHECK(std::string(kcache_last_error()) == "axpy: argument 2 is 4 bytes, the kernel expects 8");
    CHECK(kcache_check_arguments(binary, axpy, good, 3) == KCACHE_ERROR_ARGUMENT_MISMATCH);
    CHECK(kcache_check_arguments(binary, 1, nullptr, 0) == KCACHE_OK);  // "none" takes nothing
    CHECK(kcache_check_arguments(binary, 7, good, 4) == KCACHE_ERROR_OUT_OF_RANGE);
    CHECK(kcache_check_arguments(binary, axpy, nullptr, 2) == KCACHE_ERROR_INVALID_ARGUMENT);

    kcache_param param{};
    CHECK(kcache_binary_param(binary, 0, 4, &param) == KCACHE_ERROR_OUT_OF_RANGE);
    CHECK(std::string(kcache_last_error()) == "axpy: parameter 4 out of range (4 parameters)");
    CHECK(kcache_binary_param(binary, 5, 0, &param) == KCACHE_ERROR_OUT_OF_RANGE);
    CHECK(kcache_binary_param(binary, 0, 0, nullptr) == KCACHE_ERROR_INVALID_ARGUMENT);
    CHECK(kcache_binary_kernel_name(binary, 2) == nullptr);
    CHECK(kcache_binary_param_count(binary, 2) == 0);
    CHECK(kcache_binary_entry_count(binary) == 0);
    kcache_fatbin_entry entry{};
    CHECK(kcache_binary_entry(binary, 0, &entry) == KCACHE_ERROR_OUT_OF_RANGE);
    const kcache_binary* sub = nullptr;
    CHECK(kcache_binary_entry_binary(binary, 0, &sub) == KCACHE_ERROR_OUT_OF_RANGE);
    kcache_binary_free(binary);

    CHECK(kcache_inspect(nullptr, 4, &binary) == KCACHE_ERROR_INVALID_ARGUMENT);
    CHECK(kcache_inspect(bytes.data(), bytes.size(), nullptr) == KCACHE_ERROR_INVALID_ARGUMENT);
    CHECK(kcache_inspect(nullptr, 0, &binary) == KCACHE_ERROR_NOT_A_BINARY);
    CHECK(binary == nullptr);
    kcache_binary_free(nullptr);
    CHECK(kcache_binary_format(nullptr) == nullptr);
    CHECK(kcache_binary_kernel_count(nullptr) == 0);
    CHECK(std::string(kcache_status_name(KCACHE_ERROR_CORRUPT)) == "KCACHE_ERROR_CORRUPT");
    volatile int unknown = 99;  // a value from a newer library, at run time
    CHECK(std::string(kcache_status_name(static_cast<kcache_status>(unknown))) == "unknown");
}

TEST_CASE("C ABI: the last error is per thread", "[loader][c_api]") {
    kcache_binary* binary = nullptr;
    CHECK(kcache_inspect("nothing", 7, &binary) == KCACHE_ERROR_NOT_A_BINARY);
    const std::string mine = kcache_last_error();
    std::string theirs = "unset";
    std::thread other([&] { theirs = kcache_last_error(); });
    other.join();
    CHECK(theirs.empty());
    CHECK(mine == kcache_last_error());
}

TEST_CASE("C ABI: an nvcc fatbin's entries", "[loader][c_api]") {
    const std::string bytes = kernel_bytes("params.fatbin");
    kcache_binary* binary = nullptr;
    REQUIRE(kcache_inspect(bytes.data(), bytes.size(), &binary) == KCACHE_OK);
    CHECK(std::string(kcache_binary_format(binary)) == "fatbin");
    CHECK(std::string(kcache_binary_arch(binary)).empty());
    REQUIRE(kcache_binary_entry_count(binary) == 3);
    for (size_t e = 0; e < 3; ++e) {
        kcache_fatbin_entry entry{};
        REQUIRE(kcache_binary_entry(binary, e, &entry) == KCACHE_OK);
        CHECK(entry.has_kernels == 1);
        const kcache_binary* payload = nullptr;
        REQUIRE(kcache_binary_entry_binary(binary, e, &payload) == KCACHE_OK);
        CHECK(std::string(kcache_binary_format(payload)) == entry.kind);
        size_t by_value = 0;
        REQUIRE(kcache_binary_find_kernel(payload, "by_value", &by_value) == KCACHE_OK);
        const size_t sizes[] = {16, 24, 1, 2, 8};
        CHECK(kcache_check_arguments(payload, by_value, sizes, 5) == KCACHE_OK);
    }
    kcache_binary_free(binary);
}

}  // namespace kcache::test
